//! A whole device on a real kernel: a Debian guest booted by QEMU (TCG) from a cached disk image, driven over a
//! virtio-serial command channel, on QEMU's user-mode network (the host's 127.0.0.1 is the guest's 10.0.2.2). Two
//! machines ([`Machine`]): amd64 (`qemu-system-x86_64`, image of `scripts/setup.d/65-qemu.sh`, used by
//! `vm-tests/qemu/run`) and arm64 (`qemu-system-aarch64 -M virt -cpu cortex-a72`, the Raspberry Pi 4's core; the
//! Raspberry Pi OS-style image of `scripts/setup.d/66-qemu-arm64.sh`, used by `vm-tests/arm64-vm/run`).
//!
//! Each boot runs on a qcow2 overlay of the cached image, so a power cut (`kill -9` of QEMU) and the next boot
//! see the same disk. The binaries and configuration reach the guest on a second, read-only disk (`/dev/vdb`).
//! Neither machine boots through firmware: QEMU loads the image's kernel and initrd itself (`-kernel/-initrd`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The guest's address of the host's loopback on QEMU's user-mode network.
pub const HOST_FROM_GUEST: &str = "10.0.2.2";
/// Where the staging disk is mounted in the guest.
pub const GUEST_STAGE: &str = "/mnt/stage";
/// Longest answer accepted on the command channel.
const MAX_ANSWER: usize = 16 << 20;

/// What differs between the two guests: the QEMU binary and its machine flags, how the disks are attached, the
/// devices beyond disks, network and command channel, and how long things take under that emulation.
pub struct Machine {
    /// `qemu-system-x86_64` or `qemu-system-aarch64`.
    pub binary: &'static str,
    /// Machine, accelerator, CPU, vCPUs, memory and display flags.
    pub flags: &'static [&'static str],
    /// Extra `-device` arguments.
    pub devices: &'static [&'static str],
    /// Where `scripts/setup` builds the image under `$FLEET_CACHE`, and the command that builds it (for the error
    /// message when it is missing).
    pub cache_dir: &'static str,
    /// The command that builds the image, named when it is missing.
    pub setup_hint: &'static str,
    /// How long the first answer of a boot may take.
    pub boot_wait: Duration,
    /// How long one probe of the command channel for the boot id may take.
    pub probe_wait: Duration,
    /// How long a guest command may run before [`Vm::sh`] gives up: just over the guest shell's own `timeout`
    /// (300 s in 65-qemu.sh's channel, 600 s in 66-qemu-arm64.sh's).
    pub command_wait: Duration,
}

impl Machine {
    /// The amd64 guest: q35, the host's CPU model as far as TCG has it, 2 vCPUs, 2 GiB.
    pub const AMD64: Machine = Machine {
        binary: "qemu-system-x86_64",
        flags: &[
            "-machine",
            "q35,accel=tcg",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "2048",
            "-display",
            "none",
            "-vga",
            "none",
            "-monitor",
            "none",
        ],
        devices: &[],
        cache_dir: "qemu",
        setup_hint: "run `scripts/setup qemu` (vm-tests/qemu/run does)",
        boot_wait: Duration::from_secs(300),
        probe_wait: Duration::from_secs(5),
        command_wait: Duration::from_secs(310),
    };

    /// The arm64 guest: QEMU's virt machine with a Cortex-A72 (the Raspberry Pi 4's core) on multi-threaded TCG (the
    /// host has two cores), 2 vCPUs, 2 GiB as a mid-size Raspberry Pi 4; an RNG (the Raspberry Pi has a hardware
    /// one; without one, early boot waits for entropy under TCG). A Debian boot under aarch64 TCG on two shared
    /// cores takes minutes, hence the longer waits.
    pub const ARM64: Machine = Machine {
        binary: "qemu-system-aarch64",
        flags: &[
            "-machine", "virt", "-accel", "tcg,thread=multi", "-cpu", "cortex-a72", "-smp", "2", "-m", "2048",
            "-display", "none", "-monitor", "none",
        ],
        devices: &["-device", "virtio-rng-pci"],
        cache_dir: "qemu-arm64",
        setup_hint: "run vm-tests/arm64-vm/run (it builds it with FLEET_SETUP_QEMU_ARM64=1 scripts/setup qemu-arm64)",
        boot_wait: Duration::from_secs(900),
        probe_wait: Duration::from_secs(10),
        command_wait: Duration::from_secs(620),
    };
}

/// The cached image: kernel, initrd, root disk and kernel command line, and the machine it is for.
pub struct Image {
    /// The machine that boots it.
    pub machine: &'static Machine,
    /// `vmlinuz` from the image tree.
    pub kernel: PathBuf,
    /// `initrd.img` from the image tree.
    pub initrd: PathBuf,
    /// The root disk (raw), never written: each run boots an overlay. amd64: one ext4 file system; arm64: an MBR
    /// disk, p1 FAT32 `/boot/firmware`, p2 ext4 `/`.
    pub disk: PathBuf,
    /// The kernel command line (arm64: `root=PARTUUID=…-02`, as Raspberry Pi OS's `cmdline.txt`).
    pub cmdline: String,
    /// amd64: Debian's `linux-image-cloud-amd64` and the kernel package it depends on (`.deb` files), downloaded
    /// with the image's apt sources when the image was built: the kernel the task scenarios' local repository
    /// offers. The arm64 image has none (the directory does not exist).
    pub kernel_upgrade: PathBuf,
}

impl Image {
    /// The amd64 image 65-qemu.sh built under `$FLEET_CACHE/qemu/`; fails with a hint when it is missing.
    pub fn amd64() -> Self {
        let dir = Self::find(&Machine::AMD64);
        Self {
            machine: &Machine::AMD64,
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            disk: dir.join("disk.raw"),
            cmdline: "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=5".into(),
            kernel_upgrade: dir.join("kernel-upgrade"),
        }
    }

    /// The arm64 image 66-qemu-arm64.sh built under `$FLEET_CACHE/qemu-arm64/`, with its command line; fails with a
    /// hint when it is missing.
    pub fn arm64() -> Self {
        let dir = Self::find(&Machine::ARM64);
        let cmdline = std::fs::read_to_string(dir.join("cmdline"))
            .unwrap_or_else(|e| panic!("{dir:?}/cmdline: {e}"))
            .trim()
            .to_string();
        Self {
            machine: &Machine::ARM64,
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            disk: dir.join("disk.raw"),
            cmdline,
            kernel_upgrade: dir.join("kernel-upgrade"),
        }
    }

    /// The image directory (the one with a `stamp`) under `$FLEET_CACHE/<machine's cache dir>`.
    fn find(machine: &Machine) -> PathBuf {
        let cache = std::env::var_os("FLEET_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| fleet_rig::workspace_root().join(".cache"));
        let sub = machine.cache_dir;
        std::fs::read_dir(cache.join(sub))
            .ok()
            .and_then(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .find(|p| p.join("stamp").is_file())
            })
            .unwrap_or_else(|| {
                panic!(
                    "no QEMU image under {cache:?}/{sub}: {}",
                    machine.setup_hint
                )
            })
    }
}

/// The result of one command in the guest.
pub struct Answer {
    /// The command's exit code.
    pub code: i32,
    /// Its stdout and stderr together.
    pub output: String,
}

/// A QEMU guest: the QEMU process (killed on drop) and the command channel.
pub struct Vm {
    dir: PathBuf,
    image: Image,
    stage: PathBuf,
    child: Option<Child>,
    shell: Option<UnixStream>,
    buf: Vec<u8>,
    next_id: u64,
    boots: u32,
}

impl Vm {
    /// Prepares a guest in `dir` (overlay, sockets, console logs) with `stage` as its second disk; not booted.
    pub fn new(dir: &Path, image: Image, stage: &Path) -> Self {
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

    /// How long a boot of this machine may take to answer.
    pub fn boot_wait(&self) -> Duration {
        self.image.machine.boot_wait
    }

    /// Starts QEMU and waits until the guest answers on the command channel; returns the boot id.
    pub fn power_on(&mut self) -> String {
        assert!(self.child.is_none(), "power_on: QEMU is running");
        self.boots += 1;
        let machine = self.image.machine;
        let sock = self.dir.join("shell.sock");
        let _ = std::fs::remove_file(&sock);
        let console = self.dir.join(format!("console-{}.log", self.boots));
        let mut cmd = Command::new(machine.binary);
        // The disk order fixes the names: vda is the root disk, vdb the staging disk.
        cmd.args(machine.flags)
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
            .args(machine.devices)
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
                "cannot start {} ({}): {e}",
                machine.binary, machine.setup_hint
            )
        });
        self.child = Some(child);
        let stream =
            fleet_rig::wait_for(Duration::from_secs(30), || UnixStream::connect(&sock).ok())
                .unwrap_or_else(|| panic!("QEMU did not open {sock:?}.\n{}", self.diagnostics()));
        self.shell = Some(stream);
        self.buf.clear();
        self.wait_boot(None, machine.boot_wait)
    }

    /// Waits until the guest answers with a boot id other than `not` (a reboot finished); returns it.
    pub fn wait_boot(&mut self, not: Option<&str>, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(a) = self.try_run(
                "cat /proc/sys/kernel/random/boot_id",
                self.image.machine.probe_wait,
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

    /// Runs `cmd` with bash in the guest; `None` when no answer came within `timeout`.
    pub fn try_run(&mut self, cmd: &str, timeout: Duration) -> Option<Answer> {
        use base64_lite::{decode, encode};
        let id = self.next_id;
        self.next_id += 1;
        let stream = self.shell.as_mut()?;
        let line = format!("{id} {}\n", encode(cmd.as_bytes()));
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
                let output = decode(parts.next().unwrap_or(""));
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

    /// Runs `cmd` and returns its output; fails on a non-zero exit or no answer within the machine's command wait.
    pub fn sh(&mut self, cmd: &str) -> String {
        let (code, out) = self.sh_code(cmd);
        assert!(code == 0, "guest command failed ({code}): {cmd}\n{out}");
        out
    }

    /// Runs `cmd` and returns its exit code and output; fails when no answer comes within the machine's command
    /// wait.
    pub fn sh_code(&mut self, cmd: &str) -> (i32, String) {
        match self.try_run(cmd, self.image.machine.command_wait) {
            Some(a) => (a.code, a.output),
            None => panic!("no answer from the guest to: {cmd}\n{}", self.diagnostics()),
        }
    }

    /// The guest's current boot id; fails when the guest does not answer.
    pub fn boot_id(&mut self) -> String {
        self.sh("cat /proc/sys/kernel/random/boot_id")
            .trim()
            .to_string()
    }

    /// Asks the guest to reboot itself (`systemctl reboot`); QEMU restarts the machine in the same process.
    pub fn reboot(&mut self) {
        // The answer may never come: the channel goes down with the guest.
        let _ = self.try_run(
            "systemd-run --on-active=1 systemctl reboot",
            Duration::from_secs(30),
        );
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

/// What a person checks on a device, through the command channel.
impl Vm {
    /// The updater's and the agent's journal of this boot, and the agent user's (Podman); what the guest answers,
    /// or a line saying it does not answer.
    pub fn unit_logs(&mut self) -> String {
        self.try_run(
            "journalctl -b --no-pager -n 80 -u fleet-updater.service; echo ---; \
             journalctl -b --no-pager -n 80 -u fleet-agent.service; echo ---; \
             journalctl -b --no-pager -n 30 _UID=$(id -u fleet-agent 2>/dev/null || echo 0)",
            Duration::from_secs(60),
        )
        .map(|a| a.output)
        .unwrap_or_else(|| "(the guest does not answer)".into())
    }

    /// Waits until `systemctl is-active unit` says `state`; fails after `wait` with the units' logs.
    pub fn wait_unit(&mut self, unit: &str, state: &str, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.sh_code(&format!("systemctl is-active {unit}")).1;
            if last.trim() == state {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "{unit} did not become {state} within {wait:?} (it is {}).\n{}",
            last.trim(),
            self.unit_logs()
        );
    }

    /// Where `/usr/local/bin/fleet-agent` points (the selected agent version's binary).
    pub fn active_link(&mut self) -> String {
        self.sh("readlink /usr/local/bin/fleet-agent")
            .trim()
            .to_string()
    }

    /// What the selected agent says to `--version`.
    pub fn active_version(&mut self) -> String {
        self.sh("/usr/local/bin/fleet-agent --version")
            .trim()
            .to_string()
    }

    /// The agent service's main PID (0 when it has none).
    pub fn agent_pid(&mut self) -> u32 {
        self.sh("systemctl show -p MainPID --value fleet-agent.service")
            .trim()
            .parse()
            .unwrap_or(0)
    }

    /// The `phase` of the updater's journal `/var/lib/fleet-updater/<file>` (`journal.json`: the agent upgrade's,
    /// `system-upgrade.json`: the system upgrade's); `none` without one.
    pub fn journal_phase(&mut self, file: &str) -> String {
        let (code, raw) = self.sh_code(&format!("cat /var/lib/fleet-updater/{file}"));
        if code != 0 {
            return "none".into();
        }
        let v: serde_json::Value =
            serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{file} is not JSON: {e}: {raw}"));
        v["phase"].as_str().unwrap_or("unknown").to_string()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.power_cut();
    }
}

/// A guest service relaying the guest's 127.0.0.1:`port` to the host's (through [`HOST_FROM_GUEST`]): the test
/// CA's certificates and the artifact URLs name 127.0.0.1, as on the nspawn devices. `what` names the server.
pub fn relay_unit(what: &str, port: u16) -> String {
    format!(
        "[Unit]\nDescription=Relay of the test {what} (guest 127.0.0.1:{port} -> host)\nAfter=fleet-qemu-net.service\n\n\
         [Service]\nExecStart=/usr/bin/socat TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr TCP:{HOST_FROM_GUEST}:{port}\n\
         Restart=always\n\n[Install]\nWantedBy=multi-user.target\n"
    )
}

/// Builds a read-only ext4 disk holding the contents of `dir` (the guest mounts it at [`GUEST_STAGE`]).
pub fn make_stage_disk(dir: &Path, disk: &Path) {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-L", "fleet-stage", "-d"])
        .arg(dir)
        .arg(disk)
        .arg("1G")
        .output()
        .unwrap_or_else(|e| panic!("cannot run mkfs.ext4 (apt-get install e2fsprogs): {e}"));
    assert!(
        out.status.success(),
        "mkfs.ext4 -d {dir:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A stripped copy of `bin` at `to` (the debug binaries are ~75 MB; the guest downloads one over slirp).
pub fn stripped_copy(bin: &Path, to: &Path) {
    let out = Command::new("strip")
        .arg("-o")
        .arg(to)
        .arg(bin)
        .output()
        .unwrap_or_else(|e| panic!("cannot run strip (apt-get install binutils): {e}"));
    assert!(
        out.status.success(),
        "strip {bin:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Base64 (standard alphabet, padded) for the command channel; the guest side uses coreutils' `base64`.
mod base64_lite {
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
