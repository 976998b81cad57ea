//! A whole Debian device booted with systemd-nspawn (test-rig.md): an overlay of the cached tree per guest, its
//! own network namespace with a veth pair to the host, its own cgroup, a restart loop for guest reboots, and
//! power cuts. Everything is torn down on drop.
//!
//! systemd is not PID 1 on the test machine, so nspawn runs with `--register=no --keep-unit` inside a private
//! mount namespace (`unshare -m --propagation private`) that has a tmpfs on `/run/systemd/nspawn`. The guest's
//! network namespace is created by the rig (`ip netns add`) and handed to nspawn, so it survives guest reboots:
//! the guest is `10.213.x.2`, the host side of the veth is `10.213.x.1`. Host services bound to 127.0.0.1 (NATS,
//! HTTPS artifact servers) are exposed to the guest with [`Guest::forward`].

mod cleanup;
mod forward;
mod netns;
mod tree;

pub use cleanup::sweep_stale;
pub use forward::{Forward, ForwardHandle};
pub use tree::{cached_tree, TREE_RECIPE};

use crate::util::require_binary;
use crate::wait::wait_for;
use cleanup::{remove_cgroup, sigkill};
use netns::{bind_in_netns, setup_network};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The exit code systemd-nspawn returns when the guest rebooted.
const NSPAWN_REBOOT_EXIT: i32 = 133;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Runs a host command, failing the test with its output when it fails.
fn host(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// How a guest boots.
#[derive(Debug, Clone, Default)]
pub struct GuestOptions {
    /// The tree to overlay; default [`cached_tree`].
    pub tree: Option<PathBuf>,
    /// Extra `systemd-nspawn` arguments.
    pub extra_nspawn_args: Vec<String>,
}

/// A booted nspawn guest. Killed, unmounted and removed on drop.
pub struct Guest {
    name: String,
    dir: tempfile::TempDir,
    tree: PathBuf,
    options: GuestOptions,
    host_ip: Ipv4Addr,
    guest_ip: Ipv4Addr,
    host_if: String,
    wrapper: Option<Child>,
    forwards: Vec<Forward>,
    mounted: bool,
}

impl Guest {
    /// Boots a guest from the cached tree and waits until systemd reports `running` or `degraded`.
    pub fn boot() -> Self {
        Self::boot_with(GuestOptions::default())
    }

    /// Boots a guest with `options` and waits until it is up.
    pub fn boot_with(options: GuestOptions) -> Self {
        let guest = Self::create(options);
        guest.wait_up(Duration::from_secs(60));
        guest
    }

    /// Prepares the overlay, the network and the cgroups, and starts nspawn without waiting for the boot.
    pub fn create(options: GuestOptions) -> Self {
        for tool in ["systemd-nspawn", "unshare", "nsenter", "ip"] {
            require_binary(
                tool,
                "FLEET_NO_SUCH_OVERRIDE",
                &[],
                "Run `scripts/setup` (apt packages systemd-container, util-linux, iproute2).",
            );
        }
        let tree = options.tree.clone().unwrap_or_else(cached_tree);
        sweep_stale();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("fleet-vm-{}-{n}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("fleet-guest-")
            .tempdir_in(std::env::var_os("FLEET_GUEST_DIR").unwrap_or_else(|| "/var/tmp".into()))
            .unwrap_or_else(|e| panic!("temp dir for a guest: {e}"));
        for d in ["upper", "work", "root"] {
            fs::create_dir(dir.path().join(d)).unwrap_or_else(|e| panic!("mkdir {d}: {e}"));
        }
        // The upper directory's mode is the guest's `/` mode: 0755 whatever the umask, and whatever the cached
        // tree's root has (trees built before 60-nspawn-tree.sh fixed it are 0700, which breaks dbus).
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir.path().join("upper"), fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod upper: {e}"));
        let (host_ip, guest_ip, host_if) = setup_network(&name);
        let mut g = Self {
            name,
            dir,
            tree,
            options,
            host_ip,
            guest_ip,
            host_if,
            wrapper: None,
            forwards: vec![],
            mounted: false,
        };
        g.mount_overlay();
        g.start_wrapper();
        g
    }

    fn mount_overlay(&mut self) {
        let d = self.dir.path();
        host(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(format!(
                    "lowerdir={},upperdir={},workdir={}",
                    self.tree.display(),
                    d.join("upper").display(),
                    d.join("work").display()
                ))
                .arg(d.join("root")),
        );
        self.mounted = true;
        // The cached tree carries dbus's /var/lib/dbus/machine-id, which systemd copies into an empty
        // /etc/machine-id: every guest would share one machine id. Point it at /etc/machine-id, as Debian does, so
        // that systemd takes the guest's own id from nspawn's --uuid.
        let dbus_id = d.join("root/var/lib/dbus/machine-id");
        if dbus_id.is_file() && !dbus_id.is_symlink() {
            let _ = std::fs::remove_file(&dbus_id);
            let _ = std::os::unix::fs::symlink("/etc/machine-id", &dbus_id);
        }
    }

    fn start_wrapper(&mut self) {
        let root = self.dir.path().join("root");
        let log = self.dir.path().join("console.log");
        let name = &self.name;
        let mut nspawn = vec![
            "systemd-nspawn".to_string(),
            "--quiet".into(),
            "--boot".into(),
            format!("--directory={}", root.display()),
            format!("--machine={name}"),
            // Its own machine id (stable across its reboots): an empty /etc/machine-id in the shared tree would
            // otherwise give every guest the same one, and FleetLock would see two devices as one.
            format!("--uuid={}", machine_uuid(name)),
            "--register=no".into(),
            "--keep-unit".into(),
            format!("--network-namespace-path=/run/netns/{name}"),
            "--system-call-filter=@keyring bpf".into(),
            "--console=read-only".into(),
            "--link-journal=no".into(),
            "--resolv-conf=off".into(),
            "--timezone=off".into(),
        ];
        nspawn.extend(self.options.extra_nspawn_args.iter().cloned());
        let quoted: Vec<String> = nspawn.iter().map(|a| shell_quote(a)).collect();
        // The wrapper moves itself into the guest's own cgroups before nspawn starts, mounts a private tmpfs on
        // /run/systemd/nspawn, and starts nspawn again whenever the guest reboots (exit 133).
        let script = format!(
            r#"set -u
for h in unified systemd; do
  mkdir -p /sys/fs/cgroup/$h/{name}
  echo $$ > /sys/fs/cgroup/$h/{name}/cgroup.procs
done
mkdir -p /run/systemd/nspawn
mount -t tmpfs tmpfs /run/systemd/nspawn
while :; do
  SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 {cmd}
  rc=$?
  echo "== nspawn exited with $rc" >&2
  [ $rc -eq {reboot} ] || exit $rc
done
"#,
            cmd = quoted.join(" "),
            reboot = NSPAWN_REBOOT_EXIT,
        );
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("console log: {e}"));
        let log2 = log
            .try_clone()
            .unwrap_or_else(|e| panic!("console log: {e}"));
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("start systemd-nspawn: {e}"));
        self.wrapper = Some(child);
    }

    /// The guest's machine name (also its cgroup and network namespace name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The guest's root directory as seen from the host (the overlay's merged view).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A path inside the guest, as seen from the host.
    pub fn path(&self, guest_path: &str) -> PathBuf {
        self.root().join(guest_path.trim_start_matches('/'))
    }

    /// The guest's address (it reaches the host at [`Self::host_ip`]).
    pub fn guest_ip(&self) -> Ipv4Addr {
        self.guest_ip
    }

    /// The host's address on the guest's veth pair.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// The console output of every boot so far (for failure messages).
    pub fn console(&self) -> String {
        fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default()
    }

    /// The PID (in the host's namespace) of the guest's PID 1, when a guest is running.
    pub fn pid1(&self) -> Option<u32> {
        let procs = fs::read_dir("/proc").ok()?;
        let marker = format!("/{}/", self.name);
        let own_depth = ns_pids("self").map_or(1, |ids| ids.len());
        for e in procs.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let is_init =
                ns_pids(&pid.to_string()).is_some_and(|ids| is_guest_init(&ids, own_depth));
            if !is_init {
                continue;
            }
            let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if cg.lines().any(|l| format!("{l}/").contains(&marker)) {
                return Some(pid);
            }
        }
        None
    }

    /// The PID of the guest's wrapper, the loop that starts nspawn again after each reboot: unlike the guest's
    /// PID 1 it lives as long as the guest runs, across its reboots (see [`guest_init_below`]).
    pub fn wrapper_pid(&self) -> Option<u32> {
        self.wrapper.as_ref().map(Child::id)
    }

    fn require_pid1(&self) -> u32 {
        self.pid1().unwrap_or_else(|| {
            panic!(
                "guest {} is not running. Console:\n{}",
                self.name,
                tail(&self.console(), 3000)
            )
        })
    }

    /// Runs a command inside the guest with `nsenter -a` (as root, outside nspawn's seccomp filter and cgroup: run
    /// what a test checks through units or [`Self::systemd_run`]).
    pub fn exec(&self, args: &[&str]) -> Output {
        let pid = self.require_pid1();
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-a", "--"])
            .args(args)
            // The host's temporary directory (a demo sets its own) does not exist in the guest.
            .env_remove("TMPDIR")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("nsenter into {}: {e}", self.name))
    }

    /// Runs `sh -c script` in the guest and returns stdout; fails the test when it fails.
    pub fn sh(&self, script: &str) -> String {
        let out = self.exec(&["sh", "-c", script]);
        assert!(
            out.status.success(),
            "in guest {}: `{script}` failed with {}:\n{}{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `sh -c script` in the guest; stdout, stderr and success, never failing the test.
    pub fn try_sh(&self, script: &str) -> (bool, String) {
        let out = self.exec(&["sh", "-c", script]);
        let mut text = String::from_utf8_lossy(&out.stdout).to_string();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// `systemctl <args>` in the guest; its trimmed stdout (whatever its exit code).
    pub fn systemctl(&self, args: &[&str]) -> String {
        let mut all = vec!["systemctl"];
        all.extend_from_slice(args);
        let out = self.exec(&all);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs `args` as a transient service inside the guest (`systemd-run --wait --pipe`), so that it runs under
    /// the guest's seccomp filter and cgroups like a real unit would.
    pub fn systemd_run(&self, args: &[&str]) -> Output {
        let pid = self.require_pid1();
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-a", "--"])
            .args(["systemd-run", "--quiet", "--wait", "--pipe", "--collect"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("systemd-run in {}: {e}", self.name))
    }

    /// The state of one unit (`active`, `inactive`, `failed`, `activating`, …).
    pub fn unit_state(&self, unit: &str) -> String {
        self.systemctl(&["is-active", unit])
    }

    /// Waits until `unit` reaches `state`; fails the test with the unit's status and journal otherwise.
    pub fn wait_unit(&self, unit: &str, state: &str, timeout: Duration) {
        let ok = wait_for(timeout, || (self.unit_state(unit) == state).then_some(()));
        if ok.is_none() {
            panic!(
                "{unit} did not become {state} within {timeout:?} (it is {}).\n{}\n{}",
                self.unit_state(unit),
                self.systemctl(&["status", "--no-pager", unit]),
                self.journal(unit, 60)
            );
        }
    }

    /// The last `lines` journal lines of `unit`.
    pub fn journal(&self, unit: &str, lines: u32) -> String {
        let out = self.exec(&[
            "journalctl",
            "--no-pager",
            "-o",
            "short-monotonic",
            "-n",
            &lines.to_string(),
            "-u",
            unit,
        ]);
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The guest's current boot id (nspawn gives every guest boot a new one).
    pub fn boot_id(&self) -> String {
        self.sh("cat /proc/sys/kernel/random/boot_id")
            .trim()
            .to_string()
    }

    /// Waits until the guest's systemd reports `running` or `degraded`; returns which.
    pub fn wait_up(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(c) = self.wrapper_exit() {
                panic!(
                    "guest {} stopped during boot ({c}). Console:\n{}",
                    self.name,
                    tail(&self.console(), 3000)
                );
            }
            if self.pid1().is_some() {
                last = self.systemctl(&["is-system-running"]);
                if last == "running" || last == "degraded" {
                    return last;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "guest {} did not reach running/degraded within {timeout:?} (last: {last:?}). Failed units: {}\n\
             Console:\n{}",
            self.name,
            self.pid1()
                .map(|_| self.systemctl(&["--failed", "--no-legend"]))
                .unwrap_or_default(),
            tail(&self.console(), 3000)
        );
    }

    fn wrapper_exit(&self) -> Option<String> {
        // try_wait needs &mut; a wrapper that is gone has no /proc entry that is not a zombie.
        let pid = self.wrapper.as_ref()?.id();
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next();
        matches!(state, None | Some("Z")).then(|| "the nspawn wrapper exited".to_string())
    }

    /// Reboots the guest (`systemctl reboot`) and waits until it is up again with a new boot id.
    pub fn reboot(&self) -> String {
        let before = self.boot_id();
        let old_pid1 = self.pid1();
        let _ = self.exec(&["systemctl", "reboot"]);
        let gone = wait_for(Duration::from_secs(60), || {
            (self.pid1() != old_pid1).then_some(())
        });
        assert!(
            gone.is_some(),
            "guest {} did not reboot within 60 s",
            self.name
        );
        self.wait_up(Duration::from_secs(60));
        let after = self.boot_id();
        assert_ne!(before, after, "the boot id did not change across a reboot");
        after
    }

    /// Cuts the power: SIGKILLs the guest's PID 1 (and so everything in its PID namespace) and the nspawn
    /// wrapper. The disk (the overlay's upper directory) is kept; [`Self::power_on`] boots it again. Note that the
    /// host's page cache survives, so unsynced writes are not lost as they would be on real hardware.
    pub fn power_cut(&mut self) {
        if let Some(pid) = self.pid1() {
            sigkill(pid);
        }
        if let Some(mut w) = self.wrapper.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        for root in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"] {
            remove_cgroup(&Path::new(root).join(&self.name));
        }
        let gone = wait_for(Duration::from_secs(30), || {
            self.pid1().is_none().then_some(())
        });
        assert!(gone.is_some(), "guest {} survived a power cut", self.name);
    }

    /// Boots the guest again after [`Self::power_cut`] and waits until it is up.
    pub fn power_on(&mut self) {
        self.power_on_nowait();
        self.wait_up(Duration::from_secs(60));
    }

    /// Boots the guest again after [`Self::power_cut`] without waiting for the boot: a flickering power supply
    /// cuts it again mid-boot. [`Self::wait_up`] waits for it.
    pub fn power_on_nowait(&mut self) {
        assert!(self.wrapper.is_none(), "power_on: the guest is running");
        self.start_wrapper();
    }

    /// Exposes the host's `127.0.0.1:<port>` to the guest at the guest's own `127.0.0.1:<port>`: a relay in this
    /// process whose listening socket lives in the guest's network namespace. URLs and certificates made for
    /// `127.0.0.1` (NATS, the test CA's HTTPS servers) therefore work unchanged inside the guest. Dropping the
    /// guest, or [`ForwardHandle::set_connected`]`(false)`, takes the relay down: the guest then sees its
    /// connections reset and new ones refused, as for a device that went offline.
    pub fn forward(&mut self, port: u16) -> ForwardHandle {
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let listener = bind_in_netns(&format!("/run/netns/{}", self.name), listen);
        let f = Forward::start(listener, listen, listen);
        let h = f.handle();
        self.forwards.push(f);
        h
    }

    /// Copies a host file into the guest at `guest_path` with `mode`, creating parent directories.
    pub fn install_file(&self, host_path: &Path, guest_path: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let dest = self.path(guest_path);
        if let Some(p) = dest.parent() {
            fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        }
        fs::copy(host_path, &dest)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", host_path.display(), dest.display()));
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", dest.display()));
    }

    /// Writes `contents` to `guest_path` in the guest with `mode`, creating parent directories.
    pub fn write_file(&self, guest_path: &str, contents: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let dest = self.path(guest_path);
        if let Some(p) = dest.parent() {
            fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        }
        fs::write(&dest, contents).unwrap_or_else(|e| panic!("write {}: {e}", dest.display()));
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", dest.display()));
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.forwards.clear();
        self.power_cut();
        if self.mounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path().join("root"))
                .output();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
    }
}

/// The `NSpid:` line of `/proc/<pid>/status`: the process's id in each PID namespace, outermost first.
/// The current PID 1 of the guest whose wrapper is `wrapper` ([`Guest::wrapper_pid`]): the guest init among the
/// wrapper's descendants, or `None` while it reboots or after it stopped. For tools that know only the recorded
/// wrapper (`scripts/demo --shell`), so that they follow the guest across reboots.
pub fn guest_init_below(wrapper: u32) -> Option<u32> {
    let own_depth = ns_pids("self").map_or(1, |ids| ids.len());
    let parents: std::collections::HashMap<u32, u32> = fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((pid, parent_pid(pid)?))
        })
        .collect();
    let below_wrapper = |mut pid: u32| {
        // A bounded walk up the tree: the guest's init is a grandchild of the wrapper (wrapper → nspawn → init).
        for _ in 0..16 {
            match parents.get(&pid) {
                Some(&p) if p == wrapper => return true,
                Some(&p) if p > 1 => pid = p,
                _ => return false,
            }
        }
        false
    };
    parents.keys().copied().find(|&pid| {
        below_wrapper(pid)
            && ns_pids(&pid.to_string()).is_some_and(|ids| is_guest_init(&ids, own_depth))
    })
}

/// A process killed when dropped (a test that panics leaves nothing running).
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// For tests of what follows a guest by its wrapper ([`guest_init_below`]): a guest's shape with real namespaces: a wrapper loop that starts an init of a PID namespace of its own
/// again and again (`period` seconds each: a guest that reboots).
pub fn guest_like_wrapper(period: u32) -> Killed {
    let script =
        format!("while :; do unshare --pid --fork --mount-proc sleep {period} || exit 1; done");
    Killed(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sh"),
    )
}

/// A process's parent (`PPid` of its status), while it runs.
fn parent_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

fn ns_pids(pid: &str) -> Option<Vec<String>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect(),
    )
}

/// True for the init of a PID namespace one level below ours (`own_depth` levels deep), given a process's
/// `NSpid` ids: a guest's PID 1. A container in the guest (Podman's `sleep`, say) is PID 1 of a namespace further
/// down, in the guest's cgroup too: not the guest's init.
fn is_guest_init(ns_pids: &[String], own_depth: usize) -> bool {
    ns_pids.len() == own_depth + 1 && ns_pids.last().map(String::as_str) == Some("1")
}

fn tail(s: &str, max: usize) -> &str {
    let start = s.len().saturating_sub(max);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    &s[start..]
}

/// A 128-bit id in hex derived from the guest's name (unique per guest, the same for every boot of it).
fn machine_uuid(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    [0u8, 1]
        .iter()
        .map(|salt| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (salt, name).hash(&mut h);
            format!("{:016x}", h.finish())
        })
        .collect()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::{guest_init_below, guest_like_wrapper, is_guest_init, Killed};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    #[test]
    fn only_the_init_one_namespace_down_is_the_guests() {
        let ids = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        // (NSpid ids, our own depth, is the guest's PID 1)
        for (nspid, depth, want) in [
            ("32640 1", 1, true),
            // A container's init inside the guest (it was picked when its host PID was lower).
            ("397 177 1", 1, false),
            ("32641 2", 1, false),
            ("1", 1, false),
            // The tests themselves in a PID namespace (a CI container): one level further down.
            ("900 40 1", 2, true),
            ("900 1", 2, false),
        ] {
            assert_eq!(
                is_guest_init(&ids(nspid), depth),
                want,
                "{nspid} at depth {depth}"
            );
        }
    }

    /// The init is found below the wrapper, again after it is replaced (a reboot), and nothing below an
    /// unrelated process. Needs root, as every guest does.
    #[test]
    fn the_guest_init_is_found_below_its_wrapper_across_restarts() {
        let wrapper = guest_like_wrapper(2);
        let pid = wrapper.0.id();
        let found = |other_than: Option<u32>| {
            crate::wait_for(Duration::from_secs(10), || {
                guest_init_below(pid).filter(|p| Some(*p) != other_than)
            })
        };
        let first = found(None).expect("the init below the wrapper");
        assert_ne!(first, pid);
        // After the init exits, the wrapper starts another: the new one is found.
        let second = found(Some(first)).expect("the next init below the wrapper");
        assert_ne!(first, second);
        let unrelated = Killed(
            Command::new("sleep")
                .arg("5")
                .stdout(Stdio::null())
                .spawn()
                .expect("sleep"),
        );
        assert_eq!(guest_init_below(unrelated.0.id()), None);
    }
}
