//! An arm64 device on a real arm64 kernel: Debian bookworm arm64 laid out like Raspberry Pi OS, booted by
//! `qemu-system-aarch64` (TCG, `-M virt -cpu cortex-a72`, the Raspberry Pi 4's core) from the cached image of
//! `scripts/setup.d/66-qemu-arm64.sh`, driven over the same virtio-serial command channel as [`crate::qemu`]'s
//! amd64 guest, on QEMU's user-mode network (the host's 127.0.0.1 is the guest's
//! [`crate::qemu::HOST_FROM_GUEST`]). Used by `vm-tests/arm64-vm/run`.
//!
//! It is a second copy of [`crate::qemu::Vm`]'s machinery for another QEMU binary and machine (the amd64 one
//! hard-codes both); the two could become one `Vm` taking a machine description.

use crate::qemu::Answer;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest answer accepted on the command channel.
const MAX_ANSWER: usize = 16 << 20;
/// How long one boot may take to answer: a Debian boot under aarch64 TCG on two shared cores takes minutes.
pub const BOOT_WAIT: Duration = Duration::from_secs(900);
/// The longest a guest command may run before [`ArmVm::sh`] gives up (the guest's own bound is 600 s).
const COMMAND_WAIT: Duration = Duration::from_secs(620);

/// The cached image: kernel, initrd, the partitioned root disk and the kernel command line.
pub struct ArmImage {
    /// Debian's arm64 `vmlinuz` from the image tree.
    pub kernel: PathBuf,
    /// Its `initrd.img`.
    pub initrd: PathBuf,
    /// The MBR disk (raw; p1 FAT32 `/boot/firmware`, p2 ext4 `/`), never written: each run boots an overlay.
    pub disk: PathBuf,
    /// The kernel command line (`root=PARTUUID=…-02`, as Raspberry Pi OS's `cmdline.txt`).
    pub cmdline: String,
}

impl ArmImage {
    /// The image 66-qemu-arm64.sh built under `$FLEET_CACHE/qemu-arm64/`; fails with a hint when it is missing.
    pub fn cached() -> Self {
        let cache = std::env::var_os("FLEET_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| fleet_rig::workspace_root().join(".cache"));
        let dir = std::fs::read_dir(cache.join("qemu-arm64"))
            .ok()
            .and_then(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .find(|p| p.join("stamp").is_file())
            })
            .unwrap_or_else(|| {
                panic!(
                    "no arm64 VM image under {cache:?}/qemu-arm64: run vm-tests/arm64-vm/run (it builds it with \
                     FLEET_SETUP_QEMU_ARM64=1 scripts/setup qemu-arm64)"
                )
            });
        let cmdline = std::fs::read_to_string(dir.join("cmdline"))
            .unwrap_or_else(|e| panic!("{dir:?}/cmdline: {e}"))
            .trim()
            .to_string();
        Self {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            disk: dir.join("disk.raw"),
            cmdline,
        }
    }
}

/// An aarch64 QEMU guest: the QEMU process (killed on drop) and the command channel.
pub struct ArmVm {
    dir: PathBuf,
    image: ArmImage,
    stage: PathBuf,
    child: Option<Child>,
    shell: Option<UnixStream>,
    buf: Vec<u8>,
    next_id: u64,
    boots: u32,
}

impl ArmVm {
    /// Prepares a guest in `dir` (qcow2 overlay, sockets, console logs) with `stage` as its second disk (`/dev/vdb`);
    /// not booted.
    pub fn new(dir: &Path, image: ArmImage, stage: &Path) -> Self {
        let overlay = dir.join("root.qcow2");
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&image.disk)
            .arg(&overlay)
            .output()
            .unwrap_or_else(|e| panic!("cannot run qemu-img (apt-get install qemu-utils): {e}"));
        assert!(
            out.status.success(),
            "qemu-img create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            dir: dir.to_path_buf(),
            image,
            stage: stage.to_path_buf(),
            child: None,
            shell: None,
            buf: Vec::new(),
            next_id: 1,
            boots: 0,
        }
    }

    /// Starts QEMU and waits until the guest answers on the command channel; returns the boot id.
    pub fn power_on(&mut self) -> String {
        assert!(self.child.is_none(), "power_on: QEMU is running");
        self.boots += 1;
        let sock = self.dir.join("shell.sock");
        let _ = std::fs::remove_file(&sock);
        let console = self.dir.join(format!("console-{}.log", self.boots));
        let mut cmd = Command::new("qemu-system-aarch64");
        // Two vCPUs on multi-threaded TCG (the host has two cores); 2 GiB as a mid-size Raspberry Pi 4. The disk
        // order fixes the names: vda is the Raspberry Pi-style disk, vdb the staging disk.
        cmd.args(["-machine", "virt", "-accel", "tcg,thread=multi"])
            .args(["-cpu", "cortex-a72", "-smp", "2", "-m", "2048"])
            .args(["-display", "none", "-monitor", "none"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-pidfile")
            .arg(self.dir.join("qemu.pid"))
            .arg("-kernel")
            .arg(&self.image.kernel)
            .arg("-initrd")
            .arg(&self.image.initrd)
            .arg("-append")
            .arg(&self.image.cmdline)
            .arg("-drive")
            .arg(format!(
                "file={},format=qcow2,if=none,id=root,cache=writeback",
                self.dir.join("root.qcow2").display()
            ))
            .args(["-device", "virtio-blk-pci,drive=root"])
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=none,id=stage,readonly=on",
                self.stage.display()
            ))
            .args(["-device", "virtio-blk-pci,drive=stage"])
            .args([
                "-netdev",
                "user,id=n0",
                "-device",
                "virtio-net-pci,netdev=n0",
            ])
            // The Raspberry Pi has a hardware RNG; without one, early boot waits for entropy under TCG.
            .args(["-device", "virtio-rng-pci"])
            .args(["-device", "virtio-serial-pci", "-chardev"])
            .arg(format!(
                "socket,id=sh,path={},server=on,wait=off",
                sock.display()
            ))
            .args(["-device", "virtserialport,chardev=sh,name=fleet.shell"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(self.dir.join(format!("qemu-{}.err", self.boots)))
                    .unwrap_or_else(|e| panic!("qemu stderr file: {e}")),
            ));
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start qemu-system-aarch64 (FLEET_SETUP_QEMU_ARM64=1 scripts/setup qemu-arm64 installs it): {e}"
            )
        });
        self.child = Some(child);
        let stream =
            fleet_rig::wait_for(Duration::from_secs(30), || UnixStream::connect(&sock).ok())
                .unwrap_or_else(|| panic!("QEMU did not open {sock:?}.\n{}", self.diagnostics()));
        self.shell = Some(stream);
        self.buf.clear();
        self.wait_boot(None, BOOT_WAIT)
    }

    /// Waits until the guest answers with a boot id other than `not` (a reboot finished); returns it.
    pub fn wait_boot(&mut self, not: Option<&str>, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(a) = self.try_run(
                "cat /proc/sys/kernel/random/boot_id",
                Duration::from_secs(10),
            ) {
                let id = a.output.trim().to_string();
                if a.code == 0 && !id.is_empty() && Some(id.as_str()) != not {
                    return id;
                }
            }
            self.check_alive();
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "the guest did not come up (boot {}) within {timeout:?}.\n{}",
            self.boots,
            self.diagnostics()
        )
    }

    /// Runs `cmd` with bash in the guest (as root, in the channel's service); `None` when no answer came within
    /// `timeout`.
    pub fn try_run(&mut self, cmd: &str, timeout: Duration) -> Option<Answer> {
        let id = self.next_id;
        self.next_id += 1;
        let stream = self.shell.as_mut()?;
        let line = format!("{id} {}\n", b64::encode(cmd.as_bytes()));
        stream.write_all(line.as_bytes()).ok()?;
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
                let raw: Vec<u8> = self.buf.drain(..=nl).collect();
                let text = String::from_utf8_lossy(&raw);
                let mut parts = text.trim_end().splitn(3, ' ');
                let (Some(rid), Some(code)) = (parts.next(), parts.next()) else {
                    continue;
                };
                // Answers to requests that timed out earlier (or to a previous boot's channel) are skipped.
                if rid != id.to_string() {
                    continue;
                }
                let output = b64::decode(parts.next().unwrap_or(""));
                return Some(Answer {
                    code: code.parse().unwrap_or(-1),
                    output: String::from_utf8_lossy(&output).into_owned(),
                });
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            let stream = self.shell.as_mut()?;
            stream
                .set_read_timeout(Some(left.max(Duration::from_millis(10))))
                .ok()?;
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > MAX_ANSWER {
                        self.buf.clear();
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return None;
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Runs `cmd` and returns its output; fails on a non-zero exit or no answer.
    pub fn sh(&mut self, cmd: &str) -> String {
        let (code, out) = self.sh_code(cmd);
        assert!(code == 0, "guest command failed ({code}): {cmd}\n{out}");
        out
    }

    /// Runs `cmd` and returns its exit code and output; fails when no answer comes.
    pub fn sh_code(&mut self, cmd: &str) -> (i32, String) {
        match self.try_run(cmd, COMMAND_WAIT) {
            Some(a) => (a.code, a.output),
            None => panic!("no answer from the guest to: {cmd}\n{}", self.diagnostics()),
        }
    }

    /// This boot's id.
    pub fn boot_id(&mut self) -> String {
        self.sh("cat /proc/sys/kernel/random/boot_id")
            .trim()
            .to_string()
    }

    /// A power cut: SIGKILL to QEMU (no shutdown, no flush of the guest's page cache).
    pub fn power_cut(&mut self) {
        self.shell = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn check_alive(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("QEMU exited ({status}).\n{}", self.diagnostics());
            }
        }
    }

    /// The tail of this boot's serial console and QEMU's stderr, for failure messages.
    pub fn diagnostics(&self) -> String {
        let tail = |p: PathBuf| {
            let s = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = s.lines().collect();
            let from = lines.len().saturating_sub(40);
            format!("--- {} ---\n{}", p.display(), lines[from..].join("\n"))
        };
        format!(
            "{}\n{}",
            tail(self.dir.join(format!("console-{}.log", self.boots))),
            tail(self.dir.join(format!("qemu-{}.err", self.boots)))
        )
    }
}

impl Drop for ArmVm {
    fn drop(&mut self) {
        self.power_cut();
    }
}

/// Base64 (standard alphabet, padded) for the command channel; the guest side uses coreutils' `base64`.
mod b64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /// Encodes `data`.
    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    /// Decodes `text`, skipping characters outside the alphabet (padding, line breaks).
    pub fn decode(text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len() / 4 * 3);
        let (mut acc, mut bits) = (0u32, 0u32);
        for c in text.bytes() {
            let Some(v) = ALPHABET.iter().position(|a| *a == c) else {
                continue;
            };
            acc = (acc << 6) | v as u32;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push(((acc >> bits) & 0xff) as u8);
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn round_trips() {
            for s in [
                "",
                "a",
                "ab",
                "abc",
                "abcd",
                "echo 'hi' | base64 -d\n\u{e9}",
            ] {
                assert_eq!(super::decode(&super::encode(s.as_bytes())), s.as_bytes());
            }
            assert_eq!(super::encode(b"fleet"), "ZmxlZXQ=");
        }
    }
}
