//! A real rootful Podman API service per test: `podman system service --time=0 unix://<sock>` with temporary
//! `--root/--runroot` (vfs storage, no mounts left behind) and the sandbox settings of test-rig.md through
//! `CONTAINERS_CONF`. Test images are built with `podman import` of a static-busybox tarball (no registry).

use crate::util::require_binary;
use crate::wait::wait_for;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const INSTALL_HINT: &str =
    "Run `scripts/setup` (it installs Debian's podman, runc and busybox-static: apt-get install podman runc busybox-static).";

/// The containers.conf that makes `podman run` work in this sandbox (no CAP_SYS_RESOURCE, hybrid cgroups,
/// systemd not PID 1). Containers get no network namespace wiring, so tests leave no bridges or iptables rules.
pub const CONTAINERS_CONF: &str = r#"[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"#;

/// A running Podman API service with its own storage; containers are removed and the service killed on drop.
pub struct PodmanService {
    dir: tempfile::TempDir,
    /// Podman's `--root` (images, containers and its database): `<dir>/root` unless the test chose one.
    root: PathBuf,
    binary: PathBuf,
    child: Option<Child>,
}

impl PodmanService {
    /// Starts the service and waits until it answers `/_ping`. Panics (failing the test) if it cannot.
    pub fn start() -> Self {
        Self::start_with_root(None)
    }

    /// Like [`Self::start`] with Podman's storage (`--root`: images, containers and its database) in `root`,
    /// e.g. on a small file system a test fills; `None`: in the service's own directory.
    pub fn start_with_root(root: Option<&Path>) -> Self {
        let binary = require_binary("podman", "FLEET_PODMAN", &[], INSTALL_HINT);
        require_binary(
            "runc",
            "FLEET_RUNC",
            &[PathBuf::from("/usr/sbin/runc")],
            INSTALL_HINT,
        );
        let dir = tempfile::Builder::new()
            .prefix("fleet-podman-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for podman: {e}"));
        std::fs::write(dir.path().join("containers.conf"), CONTAINERS_CONF)
            .unwrap_or_else(|e| panic!("write containers.conf: {e}"));
        std::fs::create_dir_all(dir.path().join("home"))
            .unwrap_or_else(|e| panic!("HOME for podman: {e}"));
        let root = root.map_or_else(|| dir.path().join("root"), Path::to_path_buf);
        let mut s = Self {
            dir,
            root,
            binary,
            child: None,
        };
        let sock = s.socket();
        let child = s
            .command()
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", sock.display()))
            // Its conmon writes an `oom` marker into this working directory when a container is OOM-killed: keep
            // it in the service's own directory, not the test's (the crate's source tree).
            .current_dir(s.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start podman system service: {e}"));
        s.child = Some(child);
        let up = wait_for(Duration::from_secs(30), || {
            UnixStream::connect(&sock).ok().filter(|_| s.ping())
        });
        assert!(
            up.is_some(),
            "podman system service did not answer on {} within 30 s",
            sock.display()
        );
        s
    }

    fn ping(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut c) = UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        if c.write_all(b"GET /v4.0.0/libpod/_ping HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out.starts_with("HTTP/1.1 200")
    }

    /// The API socket (`<dir>/podman.sock`).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("podman.sock")
    }

    /// The service's working directory (storage, config).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Makes this Podman (service and [`Self::command`]) trust `ca_file` (PEM) for the registry at `host`
    /// (`host:port`): `$HOME/.config/containers/certs.d/<host>/ca.crt`, which containers/image reads before
    /// `/etc/containers/certs.d` for root too; HOME is the service's own directory, so the host's /etc and /root
    /// are not touched.
    pub fn trust_registry(&self, host: &str, ca_file: &Path) {
        let dir = self.home().join(".config/containers/certs.d").join(host);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        std::fs::copy(ca_file, dir.join("ca.crt"))
            .unwrap_or_else(|e| panic!("copy {} to certs.d: {e}", ca_file.display()));
    }

    /// The HOME of the service and its commands (registry certificates, no credentials).
    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// A `podman` command bound to this service's storage and configuration.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.binary);
        c.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .env("HOME", self.home())
            .arg("--root")
            .arg(&self.root)
            .arg("--runroot")
            .arg(self.dir.path().join("runroot"))
            .args(["--storage-driver", "vfs"]);
        c
    }

    /// Points a script that runs `podman` itself (e.g. `scripts/operator-image`) at this service's storage and
    /// configuration, through `CONTAINERS_CONF` and the `PODMAN_OPTS` the project's scripts pass to podman.
    pub fn bind_script<'a>(&self, script: &'a mut Command) -> &'a mut Command {
        let d = self.dir.path();
        script
            .env("CONTAINERS_CONF", d.join("containers.conf"))
            .env(
                "PODMAN_OPTS",
                format!(
                    "--root {} --runroot {} --storage-driver vfs",
                    self.root.display(),
                    d.join("runroot").display()
                ),
            )
    }

    /// Runs `podman <args>` against this storage; panics with its stderr on failure.
    pub fn podman(&self, args: &[&str]) -> String {
        let out = self.try_podman(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs `podman <args>` and returns its output whatever the status.
    pub fn try_podman(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run podman {args:?}: {e}"))
    }

    /// Builds image `name` (e.g. `localhost/busybox:test`) with `podman import` of a tarball holding a static
    /// busybox as `/bin/busybox` with `sh`, `sleep` and `httpd` links.
    pub fn import_busybox(&self, name: &str) {
        let busybox = require_binary(
            "busybox",
            "FLEET_BUSYBOX",
            &[PathBuf::from("/bin/busybox")],
            INSTALL_HINT,
        );
        let tree = self.dir.path().join("image-tree");
        let bin = tree.join("bin");
        std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        std::fs::copy(&busybox, bin.join("busybox"))
            .unwrap_or_else(|e| panic!("copy busybox: {e}"));
        for applet in ["sh", "sleep", "httpd", "cat", "true"] {
            let link = bin.join(applet);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link)
                    .unwrap_or_else(|e| panic!("{}: {e}", link.display()));
            }
        }
        let tar = self.dir.path().join("busybox.tar");
        let st = Command::new("tar")
            .arg("-C")
            .arg(&tree)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap_or_else(|e| panic!("tar: {e}"));
        assert!(st.success(), "tar of the busybox tree failed");
        self.podman(&[
            "import",
            "--change",
            "CMD [\"/bin/sh\"]",
            &tar.to_string_lossy(),
            name,
        ]);
    }
}

impl Drop for PodmanService {
    fn drop(&mut self) {
        let _ = self.try_podman(&["rm", "--all", "--force", "--time", "0"]);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
