//! The production download path: the root updater runs the real `fleet-fetch` helper as the agent user against
//! a real HTTPS server, and re-checks what the helper streams. Scripted helpers stand in only where a real one
//! cannot misbehave on purpose: lying about the bytes, a forged reason, garbage, a hang.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fleet_rig::https::{HttpsServer, Reply};
use fleet_rig::tls::TestCa;
use fleet_updater::fetch_runner::{production, DownloadError, Fetcher, HelperFetcher};
use fleet_wire::{AgentUpgradeAttempt, UpgradeReason};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A temp dir the agent user can reach (helpers and scripts live here) and a private download dir.
struct Scene {
    dir: tempfile::TempDir,
    downloads: tempfile::TempDir,
}

impl Scene {
    fn new() -> Self {
        require_agent_user();
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        Self {
            dir,
            downloads: tempfile::tempdir().expect("tmp"),
        }
    }

    fn real(&self, ca: Option<&TestCa>) -> HelperFetcher {
        production(
            fetch_helper_in(self.dir.path()),
            "fleet-agent",
            ca.map(|c| c.ca_file()),
        )
        .expect("fetcher")
    }

    /// A scripted helper: `body` is a shell script run as the agent user.
    fn script(&self, name: &str, body: &str) -> HelperFetcher {
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        production(path, "fleet-agent", None).expect("fetcher")
    }

    fn fetch(&self, f: &HelperFetcher, a: &AgentUpgradeAttempt) -> Result<Vec<u8>, DownloadError> {
        let d = f.fetch(a, self.downloads.path())?;
        assert_eq!(d.path.parent(), Some(self.downloads.path()));
        assert_eq!(d.sha256, a.sha256);
        let bytes = std::fs::read(&d.path).expect("read");
        assert_eq!(bytes.len() as u64, d.bytes);
        std::fs::remove_file(&d.path).expect("rm");
        Ok(bytes)
    }

    fn assert_no_leftovers(&self) {
        assert_empty(self.downloads.path());
    }
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).expect("ls").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn attempt(url: &str, bytes: &[u8], limit: u64) -> AgentUpgradeAttempt {
    let mut a = attempt_for(bytes, TARGET);
    a.artifact = url.parse().expect("url");
    a.byte_limit = limit.try_into().expect("limit");
    a
}

#[test]
fn the_real_helper_downloads_over_https_and_the_updater_verifies() {
    let scene = Scene::new();
    let ca = TestCa::new();
    let artifact: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let server = HttpsServer::serve(&ca, Reply::ok(artifact.clone()));
    let fetcher = scene.real(Some(&ca));
    let a = attempt(&server.url("/agent"), &artifact, 20 << 20);
    assert_eq!(scene.fetch(&fetcher, &a).expect("fetch"), artifact);

    // The helper's own checks arrive as the typed reasons the status carries.
    let wrong = attempt(&server.url("/agent"), b"other", 20 << 20);
    let e = scene.fetch(&fetcher, &wrong).expect_err("digest");
    assert_eq!(e.reason, UpgradeReason::DigestMismatch, "{}", e.message);
    let small = attempt(&server.url("/agent"), &artifact, 1 << 20);
    let e = scene.fetch(&fetcher, &small).expect_err("too large");
    assert_eq!(e.reason, UpgradeReason::ArtifactTooLarge, "{}", e.message);
    assert!(
        e.message.contains("declares 3000000 bytes"),
        "{}",
        e.message
    );
    // Without the extra CA the helper does not trust the server.
    let e = scene.fetch(&scene.real(None), &a).expect_err("untrusted");
    assert_eq!(e.reason, UpgradeReason::DownloadFailed);
    assert!(e.message.contains("request to https://"), "{}", e.message);
    scene.assert_no_leftovers();
}

#[test]
fn the_helper_runs_as_the_agent_user_with_a_clean_environment() {
    let scene = Scene::new();
    let agent = fleet_updater::users::user_by_name("fleet-agent").expect("user");
    let spy = scene.script(
        "spy",
        r#"cat >/dev/null
who="uid=$(id -u) gid=$(id -g) env=$(env | cut -d= -f1 | sort | tr '\n' ' ')"
printf '{"reason":"download-failed","message":"%s"}\n' "$who" >&2
exit 1"#,
    );
    let e = scene
        .fetch(&spy, &attempt("https://a.example/x", b"x", 1024))
        .expect_err("spy fails");
    assert!(
        e.message
            .contains(&format!("uid={} gid={} ", agent.uid, agent.gid)),
        "{}",
        e.message
    );
    let env = e.message.split("env=").nth(1).expect("env").trim();
    for name in env.split(' ') {
        assert!(
            [
                "HOME",
                "LANG",
                "LOGNAME",
                "PATH",
                "PWD",
                "SHLVL",
                "USER",
                "_",
                // Passed on from the updater's service environment when set there.
                "SSL_CERT_FILE",
                "SSL_CERT_DIR",
            ]
            .contains(&name),
            "unexpected {name} in the helper's environment: {env}"
        );
    }
    scene.assert_no_leftovers();
}

/// The start line a protocol-2 helper writes before the whole artifact.
const START: &str = r#"printf '{"offset":0,"validators":{}}\n'"#;

#[test]
fn a_lying_or_broken_helper_never_gets_bad_bytes_installed() {
    let scene = Scene::new();
    let good = b"the real agent".to_vec();
    let a = attempt("https://a.example/agent", &good, 4096);

    // Exit 0 after more bytes than the limit: the updater cuts it off itself.
    let flood = scene.script(
        "flood",
        &format!("cat >/dev/null\n{START}\nhead -c 1000000 /dev/zero"),
    );
    let e = scene.fetch(&flood, &a).expect_err("flood");
    assert_eq!(e.reason, UpgradeReason::ArtifactTooLarge, "{}", e.message);
    // Exit 0 after other bytes: the updater's own SHA-256 refuses them.
    let liar = scene.script(
        "liar",
        &format!("cat >/dev/null\n{START}\nprintf 'not the agent'"),
    );
    let e = scene.fetch(&liar, &a).expect_err("liar");
    assert_eq!(e.reason, UpgradeReason::DigestMismatch, "{}", e.message);
    // Good bytes, but the helper says it failed: its word stands, the file goes.
    let quitter = scene.script(
        "quitter",
        &format!("cat >/dev/null\n{START}\nprintf 'the real agent'\necho '{{\"reason\":\"artifact-invalid\",\"message\":\"late\"}}' >&2\nexit 1"),
    );
    let e = scene.fetch(&quitter, &a).expect_err("quitter");
    assert_eq!(
        (e.reason, e.message.as_str()),
        (UpgradeReason::ArtifactInvalid, "late")
    );
    // A reason outside the download reasons is not believed.
    let forger = scene.script(
        "forger",
        "cat >/dev/null\necho '{\"reason\":\"quarantined\",\"message\":\"forged\"}' >&2\nexit 1",
    );
    let e = scene.fetch(&forger, &a).expect_err("forger");
    assert_eq!(e.reason, UpgradeReason::DownloadFailed);
    // Garbage on stderr: reported, bounded, as a download failure.
    let crash = scene.script(
        "crash",
        "cat >/dev/null\necho 'thread main panicked' >&2\nexit 101",
    );
    let e = scene.fetch(&crash, &a).expect_err("crash");
    assert_eq!(e.reason, UpgradeReason::DownloadFailed);
    assert!(e.message.contains("thread main panicked"), "{}", e.message);
    // A hang is killed at the bound, with its whole process group, even after sending the right bytes.
    let hang = scene
        .script(
            "hang",
            &format!(
                "cat >/dev/null\n{START}\nprintf 'the real agent'\nexec >&-\nsleep 60 &\nsleep 60"
            ),
        )
        .with_deadline(Duration::from_millis(400), Duration::from_millis(400));
    let started = Instant::now();
    let e = scene.fetch(&hang, &a).expect_err("hang");
    assert!(e.message.contains("killed"), "{}", e.message);
    assert!(started.elapsed() < Duration::from_secs(30));
    // A missing helper is a clear download failure.
    let missing = production(scene.dir.path().join("absent"), "fleet-agent", None).expect("f");
    let e = scene.fetch(&missing, &a).expect_err("missing");
    assert!(
        e.message.contains("cannot start the download helper"),
        "{}",
        e.message
    );
    // And an honest scripted helper passes through the same checks.
    let honest = scene.script(
        "honest",
        &format!("cat >/dev/null\n{START}\nprintf 'the real agent'"),
    );
    assert_eq!(scene.fetch(&honest, &a).expect("honest"), good);
    // Raw bytes without the start line, or a resume the updater never asked for: a broken protocol.
    let raw = scene.script("raw", "cat >/dev/null\nprintf 'the real agent'");
    let e = scene.fetch(&raw, &a).expect_err("raw");
    assert_eq!(e.reason, UpgradeReason::DownloadFailed);
    assert!(e.message.contains("no start line"), "{}", e.message);
    let skipper = scene.script(
        "skipper",
        r#"cat >/dev/null
printf '{"offset":4,"validators":{"etag":"\"x\""}}\n'
printf 'real agent'"#,
    );
    let e = scene.fetch(&skipper, &a).expect_err("skipper");
    assert!(e.message.contains("resumed at byte 4"), "{}", e.message);
    scene.assert_no_leftovers();
}

#[test]
fn a_bad_extra_ca_file_stops_the_updater_at_start() {
    let scene = Scene::new();
    let pem = scene.dir.path().join("empty.pem");
    std::fs::write(&pem, "no certificates here\n").expect("write");
    let e = production(
        scene.dir.path().join("fleet-fetch"),
        "fleet-agent",
        Some(&pem),
    )
    .expect_err("bad bundle");
    assert!(
        e.contains("extra_ca_file") && e.contains("no PEM certificate"),
        "{e}"
    );
}
