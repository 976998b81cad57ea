//! `scripts/device-setup` in a booted guest: what it installs, that a second run changes nothing, that it
//! refuses to run during an agent upgrade or a quarantine, and that the fleet-agent user's rootless Podman
//! answers on its socket; that `--repair-rollback-failed` refuses, changing nothing, on a device that is not
//! quarantined; and the root repair of `rollback-failed` with a rebuild of the damaged version. A notify stub (`src/bin/notify-stub.rs`)
//! stands in for the agent and the updater: the whole-device scenarios run the real ones.

use fleet_rig::nspawn::Guest;
use fleet_vm_tests::builds::{self, V1};
use fleet_vm_tests::device::{device_setup, stage_bytes, stage_file, stage_setup, text};
use fleet_vm_tests::fleet::{agent_config, guest_nats_url, start_nats, DEVICE, GUEST_TOKEN_FILE};
use fleet_vm_tests::fleetlock::FleetLockServer;
use std::path::Path;
use std::time::Duration;

const STUB: &str = env!("CARGO_BIN_EXE_notify-stub");

fn journal_with_phase(phase: &str) -> String {
    // Only the top-level "phase" matters to device-setup; the rest mimics the journal's shape.
    format!(
        r#"{{"format":1,"attempt":{{"attemptId":"6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a"}},"previousLink":"/usr/lib/harmony-fleet/fleet-agent-v0.9.0","phase":"{phase}","transitions":[{{"phase":"preparing"}}],"earlierAttempts":[{{"phase":"committed"}}]}}"#
    )
}

#[test]
fn device_setup_installs_idempotently_and_refuses_during_a_transaction() {
    let guest = Guest::boot();
    stage_setup(&guest);
    let agent = stage_file(&guest, Path::new(STUB), "fleet-agent-v0.9.0", 0o755);
    let updater = stage_file(&guest, Path::new(STUB), "fleet-updater", 0o755);
    stage_file(&guest, Path::new(STUB), "fleet-fetch", 0o755);
    stage_file(&guest, Path::new(STUB), "fleet-reboot", 0o755);
    let cfg = stage_bytes(&guest, b"device_id = \"device-1\"\n", "agent.toml", 0o644);
    let ucfg = stage_bytes(&guest, b"", "updater.toml", 0o644);
    // The device's NATS token (docs/auth.md), staged world-readable: setup installs it for fleet-agent only.
    let token = stage_bytes(&guest, b"eyJ.device-1-token.sig\n", "nats-token", 0o644);
    let args = [
        "--agent",
        agent.as_str(),
        "--updater",
        updater.as_str(),
        "--agent-config",
        cfg.as_str(),
        "--updater-config",
        ucfg.as_str(),
        "--nats-token",
        token.as_str(),
        "--no-start",
    ];

    let out = device_setup(&guest, &args);
    assert!(out.status.success(), "first run failed:\n{}", text(&out));
    let first = text(&out);
    assert!(first.contains("created user fleet-agent"), "{first}");

    // What a device needs, with the right owners and modes.
    let facts = guest.sh(
        "id fleet-agent; grep '^fleet-agent:' /etc/subuid /etc/subgid; ls /var/lib/systemd/linger; \
         readlink /usr/local/bin/fleet-agent; \
         stat -c '%n %U:%G %a' /usr/lib/harmony-fleet/fleet-agent-v0.9.0 /usr/local/sbin/fleet-updater /usr/local/sbin/fleet-fetch \
           /usr/local/sbin/fleet-reboot /etc/systemd/system/fleet-reboot.service /etc/systemd/system/fleet-reboot.timer \
           /etc/harmony-fleet /etc/harmony-fleet/agent.toml /etc/harmony-fleet/updater.toml \
           /etc/harmony-fleet/nats-token /var/lib/fleet-updater /var/lib/fleet-agent; \
         cat /etc/harmony-fleet/nats-token; cat /etc/harmony-fleet/updater.toml; \
         systemctl is-enabled fleet-agent.service fleet-updater.service fleet-reboot.timer; \
         systemctl show -p ExecStart fleet-reboot.service; grep ^Condition /etc/systemd/system/fleet-reboot.service; \
         systemctl show -p User -p Type -p NotifyAccess -p TimeoutStopUSec -p TimeoutStartUSec -p Restart \
           fleet-agent.service; \
         systemctl show -p User -p Type -p Restart fleet-updater.service; \
         cat /etc/systemd/system/system.slice.d/50-harmony-fleet.conf",
    );
    for want in [
        "groups=",
        "(fleet-agent)",
        "/etc/subuid:fleet-agent:100000:65536",
        "/etc/subgid:fleet-agent:100000:65536",
        "\nfleet-agent\n",
        "/usr/lib/harmony-fleet/fleet-agent-v0.9.0\n",
        "/usr/lib/harmony-fleet/fleet-agent-v0.9.0 root:root 755",
        "/usr/local/sbin/fleet-updater root:root 755",
        "/usr/local/sbin/fleet-fetch root:root 755",
        "/usr/local/sbin/fleet-reboot root:root 755",
        "/etc/systemd/system/fleet-reboot.service root:root 644",
        "/etc/systemd/system/fleet-reboot.timer root:root 644",
        "path=/usr/local/sbin/fleet-reboot ;",
        "ConditionPathExists=/etc/harmony-fleet/fleet-reboot.yaml\n",
        "/etc/harmony-fleet root:fleet-agent 750",
        "/etc/harmony-fleet/agent.toml root:fleet-agent 640",
        "/etc/harmony-fleet/nats-token fleet-agent:fleet-agent 600",
        "eyJ.device-1-token.sig\n",
        // The updater's own device id, from agent.toml (it refuses attempts for another device).
        "device_id = \"device-1\"\n",
        "/var/lib/fleet-updater root:root 700",
        "/var/lib/fleet-agent fleet-agent:fleet-agent 750",
        "enabled\nenabled\nenabled\n",
        "User=fleet-agent\n",
        "Type=notify\n",
        "NotifyAccess=main\n",
        "TimeoutStopUSec=1min\n",
        "TimeoutStartUSec=4min\n",
        "Restart=on-failure\n",
        "Restart=always\n",
        // system.slice's minimum, without which the units' MemoryMin protects nothing.
        "[Slice]\nMemoryMin=48M",
    ] {
        assert!(facts.contains(want), "missing {want:?} in:\n{facts}");
    }

    // The agent's rootless Podman answers on the fleet-agent user's socket.
    let ping = guest.sh(
        "curl -s --max-time 20 --unix-socket /run/user/$(id -u fleet-agent)/podman/podman.sock \
         http://d/v4.0.0/libpod/_ping",
    );
    assert_eq!(ping, "OK");

    // A second run with the same inputs changes nothing.
    let out = device_setup(&guest, &args);
    let second = text(&out);
    assert!(out.status.success(), "second run failed:\n{second}");
    assert!(
        !second.contains("installed")
            && !second.contains("created")
            && !second.contains("selected"),
        "a second run changed something:\n{second}"
    );

    // It refuses while an upgrade is in progress, and while quarantined without the repair flag.
    for (phase, why) in [
        ("preparing", "in progress"),
        ("activating", "in progress"),
        ("rolling-back", "in progress"),
        ("rollback-failed", "quarantined"),
    ] {
        guest.write_file(
            "/var/lib/fleet-updater/journal.json",
            journal_with_phase(phase).as_bytes(),
            0o600,
        );
        let out = device_setup(&guest, &args);
        assert!(!out.status.success(), "ran during {phase}");
        assert!(text(&out).contains(why), "{phase}: {}", text(&out));
    }
    for phase in ["committed", "failed"] {
        guest.write_file(
            "/var/lib/fleet-updater/journal.json",
            journal_with_phase(phase).as_bytes(),
            0o600,
        );
        let out = device_setup(&guest, &args);
        assert!(out.status.success(), "{phase}: {}", text(&out));
    }

    // Started, both units are active (the stub sends READY=1 like the real daemons).
    let started: Vec<&str> = args[..args.len() - 1].to_vec();
    let out = device_setup(&guest, &started);
    assert!(out.status.success(), "start: {}", text(&out));
    guest.wait_unit("fleet-updater.service", "active", Duration::from_secs(30));
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(30));
    guest.wait_unit("fleet-reboot.timer", "active", Duration::from_secs(30));

    // The repair of a device that is not quarantined is refused and changes nothing: no journal, committed,
    // failed. The updater keeps running (same process), the journal and the selection stay as they were.
    for phase in [None, Some("committed"), Some("failed")] {
        match phase {
            Some(p) => guest.write_file(
                "/var/lib/fleet-updater/journal.json",
                journal_with_phase(p).as_bytes(),
                0o600,
            ),
            None => {
                guest.sh("rm -f /var/lib/fleet-updater/journal.json");
            }
        }
        let state = || {
            guest.sh(
                "systemctl show -P MainPID fleet-updater.service fleet-agent.service; \
                 readlink /usr/local/bin/fleet-agent; ls -A /var/lib/fleet-updater; \
                 sha256sum /var/lib/fleet-updater/journal.json 2>/dev/null || true",
            )
        };
        let before = state();
        let out = device_setup(&guest, &["--repair-rollback-failed"]);
        assert!(
            !out.status.success(),
            "{phase:?}: repair ran: {}",
            text(&out)
        );
        assert!(
            text(&out).contains("nothing to repair") && text(&out).contains("Nothing was changed"),
            "{phase:?}: {}",
            text(&out)
        );
        assert_eq!(
            state(),
            before,
            "{phase:?}: the refused repair changed something"
        );
        assert_eq!(guest.unit_state("fleet-updater.service"), "active");
    }
}

#[test]
fn root_repair_leaves_quarantine_only_when_the_selected_agent_starts() {
    let guest = Guest::boot();
    stage_setup(&guest);
    let agent = stage_file(&guest, Path::new(STUB), "fleet-agent-v1.0.0", 0o755);
    // A good rebuild of the damaged version (other bytes than the damaged file, same --version).
    let rebuilt = stage_file(&guest, Path::new(STUB), "rebuilt-fleet-agent-v1.0.0", 0o755);
    let updater = stage_file(&guest, Path::new(STUB), "fleet-updater", 0o755);
    stage_file(&guest, Path::new(STUB), "fleet-fetch", 0o755);
    stage_file(&guest, Path::new(STUB), "fleet-reboot", 0o755);
    let cfg = stage_bytes(&guest, b"device_id = \"device-1\"\n", "agent.toml", 0o644);
    let out = device_setup(
        &guest,
        &[
            "--agent",
            &agent,
            "--updater",
            &updater,
            "--agent-config",
            &cfg,
            "--updater-config",
            &cfg,
        ],
    );
    assert!(out.status.success(), "setup: {}", text(&out));
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(30));

    // Quarantine with an unstartable selected binary (the previous one was damaged).
    guest.write_file(
        "/var/lib/fleet-updater/journal.json",
        journal_with_phase("rollback-failed").as_bytes(),
        0o600,
    );
    guest.sh("f=/usr/lib/harmony-fleet/fleet-agent-v1.0.0; rm $f && printf 'not an executable' > $f && chmod 755 $f");
    let out = device_setup(&guest, &[]);
    assert!(
        !out.status.success() && text(&out).contains("quarantined"),
        "{}",
        text(&out)
    );

    // Repair keeping the broken selection: the agent does not start, so the quarantine stays.
    let out = device_setup(&guest, &["--repair-rollback-failed"]);
    assert!(
        !out.status.success(),
        "repair with a broken agent succeeded: {}",
        text(&out)
    );
    assert!(text(&out).contains("stays quarantined"), "{}", text(&out));
    guest.sh("grep -q '\"phase\":\"rollback-failed\"' /var/lib/fleet-updater/journal.json");
    assert_eq!(guest.unit_state("fleet-updater.service"), "active");

    // Repair with a good rebuild of the damaged version: it replaces the damaged file, starts, the journal is
    // moved aside, both units are active.
    let out = device_setup(&guest, &["--agent", &rebuilt, "--repair-rollback-failed"]);
    assert!(out.status.success(), "repair: {}", text(&out));
    assert!(text(&out).contains("repair: replacing"), "{}", text(&out));
    assert_eq!(
        guest.sh("readlink /usr/local/bin/fleet-agent").trim(),
        "/usr/lib/harmony-fleet/fleet-agent-v1.0.0"
    );
    guest.sh(&format!(
        "cmp {rebuilt} /usr/lib/harmony-fleet/fleet-agent-v1.0.0"
    ));
    guest.sh("test ! -e /var/lib/fleet-updater/journal.json && ls /var/lib/fleet-updater/journal.json.rollback-failed.*");
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(30));
    guest.wait_unit("fleet-updater.service", "active", Duration::from_secs(30));
    // And setup runs normally again.
    let out = device_setup(&guest, &[]);
    assert!(out.status.success(), "after repair: {}", text(&out));
}

/// The administrator's path through docs/device-setup.md on a fresh guest, with the real binaries and no operator:
/// set up before the NATS buckets exist — with the auth callout on (docs/auth.md), with the device's Zitadel
/// machine key instead of a token: device setup runs fleet-token, which gets the token from the token endpoint
/// with the JWT-profile grant, and fleet-token.timer refreshes it (a run rotates it; the agent goes on) (the agent waits with one INFO line, no restart), create them with
/// `fleet-operator buckets` (the documented way), then a ready agent and updater and an active reboot timer whose
/// service does nothing without a config and succeeds with one; `fleet-reboot --check` against a real
/// fleetlock-server passes, and fails clearly with a wrong token or a wrong URL, taking no lock.
#[test]
fn a_device_set_up_from_the_docs_before_its_buckets_exist() {
    let nats = start_nats();
    let token = "fleet-reboot-test-token";
    let lock_server = FleetLockServer::start_with_token(token);
    let mut guest = Guest::boot();
    let nats_link = guest.forward(nats.port());
    guest.forward(lock_server.port());
    stage_setup(&guest);
    let agent = stage_file(
        &guest,
        &builds::agent(V1),
        &format!("fleet-agent-v{V1}"),
        0o755,
    );
    let updater = stage_file(&guest, &builds::updater(), "fleet-updater", 0o755);
    stage_file(&guest, &builds::tools(), "fleet-fetch", 0o755);
    stage_file(&guest, &builds::tools(), "fleet-reboot", 0o755);
    let url = guest_nats_url(&guest, &nats, &nats_link);
    // With the callout: the machine key, fleet-token's config naming the Zitadel stand-in (relayed into the
    // guest at the same URL) and the CA its certificate is from, and fleet-token beside the updater.
    let refresher = nats.machine_key(DEVICE).map(|key| {
        let (issuer, port) = nats.zitadel().expect("zitadel");
        guest.forward(port);
        let ca = nats.zitadel_ca_pem().expect("ca");
        guest.write_file("/etc/harmony-fleet-ca/zitadel-ca.pem", &ca, 0o644);
        stage_file(&guest, &builds::tools(), "fleet-token", 0o755);
        let config = format!(
            "issuer: \"{issuer}\"\nproject_id: \"{}\"\nca_file: /etc/harmony-fleet-ca/zitadel-ca.pem\n",
            fleet_rig::callout::AUDIENCE
        );
        (
            stage_bytes(&guest, key.as_bytes(), "zitadel-key.json", 0o600),
            stage_bytes(&guest, config.as_bytes(), "fleet-token.yaml", 0o644),
        )
    });
    let acfg = stage_bytes(
        &guest,
        agent_config(DEVICE, &url, refresher.as_ref().map(|_| GUEST_TOKEN_FILE)).as_bytes(),
        "agent.toml",
        0o644,
    );
    // An empty updater configuration is fine (docs/device-setup.md).
    let ucfg = stage_bytes(&guest, b"", "updater.toml", 0o644);

    // Set up before anyone created the buckets: setup succeeds and says the agent waits for them.
    let mut args = vec![
        "--agent",
        &agent,
        "--updater",
        &updater,
        "--agent-config",
        &acfg,
        "--updater-config",
        &ucfg,
    ];
    if let Some((key, config)) = &refresher {
        args.extend([
            "--zitadel-key",
            key.as_str(),
            "--token-config",
            config.as_str(),
        ]);
    }
    let out = device_setup(&guest, &args);
    assert!(
        out.status.success(),
        "device-setup:\n{}\n{}",
        text(&out),
        guest.journal("fleet-agent.service", 40)
    );
    assert!(
        text(&out).contains("waiting for the NATS buckets"),
        "{}",
        text(&out)
    );
    assert_eq!(guest.unit_state("fleet-agent.service"), "activating");
    let token_facts = || {
        guest.sh(&format!(
            "stat -c '%U:%G %a' {GUEST_TOKEN_FILE} /etc/harmony-fleet/zitadel-key.json; sha256sum {GUEST_TOKEN_FILE}"
        ))
    };
    let first_token = refresher.as_ref().map(|_| {
        assert!(
            text(&out).contains("fleet-token got the device's NATS token"),
            "{}",
            text(&out)
        );
        assert_eq!(nats.grants_issued(DEVICE), 1, "{}", nats.auth_logs());
        let facts = token_facts();
        assert!(
            facts.starts_with("fleet-agent:fleet-agent 600\nroot:root 600\n"),
            "{facts}"
        );
        guest.wait_unit("fleet-token.timer", "active", Duration::from_secs(30));
        facts
    });

    // The documented check says what is missing; the documented command creates them.
    let operator = builds::operator();
    let buckets = |extra: &[&str]| {
        let mut cmd = std::process::Command::new(&operator);
        if let Some(ca) = nats.ca_file() {
            cmd.env("FLEET_NATS_CA_FILE", ca);
        }
        let out = cmd
            .arg("buckets")
            .args(extra)
            .env("FLEET_NATS_URL", nats.service_url())
            .output()
            .unwrap_or_else(|e| panic!("run fleet-operator buckets: {e}"));
        (out.status.success(), text(&out))
    };
    let (ok, check) = buckets(&["--check"]);
    assert!(
        !ok && check.contains("desired-state") && check.contains("missing"),
        "{check}"
    );
    let (ok, created) = buckets(&[]);
    assert!(ok && created.contains("created"), "{created}");
    let (ok, check) = buckets(&["--check"]);
    assert!(ok && !check.contains("missing"), "{check}");

    // The waiting agent goes on by itself: ready, never restarted, one INFO line about the wait.
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(60));
    let ready = std::time::Instant::now();
    guest.wait_unit("fleet-updater.service", "active", Duration::from_secs(30));
    assert_eq!(
        guest
            .systemctl(&["show", "-P", "NRestarts", "fleet-agent.service"])
            .trim(),
        "0"
    );
    // With the callout, the agent got in with the token fleet-token fetched. A refresh (the timer's next run)
    // rotates the token on disk: a new grant, a new file, the agent untouched; the token is in no journal.
    if let Some(before) = &first_token {
        assert!(nats.admitted(DEVICE), "{}", nats.auth_logs());
        guest.systemctl(&["start", "fleet-token.service"]);
        assert_eq!(nats.grants_issued(DEVICE), 2, "{}", nats.auth_logs());
        let after = token_facts();
        assert_ne!(&after, before, "the refresh did not replace the token");
        assert!(
            after.starts_with("fleet-agent:fleet-agent 600\n"),
            "{after}"
        );
        let token = std::fs::read_to_string(guest.path(GUEST_TOKEN_FILE)).expect("token");
        let journal = guest.sh("journalctl -o cat --no-pager");
        assert!(
            !journal.contains(token.trim()) && journal.contains("wrote a new NATS token"),
            "the token is in the journal, or fleet-token said nothing"
        );
    }
    let log = guest.sh("journalctl -b -o cat -u fleet-agent.service");
    let waits: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("does not exist"))
        .collect();
    assert_eq!(waits.len(), 1, "one line about the wait:\n{log}");
    assert!(
        waits[0].contains("INFO") && waits[0].contains("fleet-operator buckets"),
        "{log}"
    );

    // The reboot timer is active; its service does nothing (skipped, not failed) until its config exists.
    guest.wait_unit("fleet-reboot.timer", "active", Duration::from_secs(30));
    guest.systemctl(&["start", "fleet-reboot.service"]);
    let show = |p: &str| {
        guest
            .systemctl(&["show", "-P", p, "fleet-reboot.service"])
            .trim()
            .to_string()
    };
    assert_eq!(show("Result"), "success");
    assert_eq!(show("ConditionResult"), "no");
    assert_eq!(guest.unit_state("fleet-reboot.service"), "inactive");

    // fleet-reboot --check: passes against the server, fails clearly with a wrong token or URL.
    let server = format!("http://127.0.0.1:{}", lock_server.port());
    let check = |server: &str, token: &str| {
        guest.write_file(
            "/etc/harmony-fleet/fleet-reboot.yaml",
            format!("server: {server}\ngroup: default\ntoken: {token}\n").as_bytes(),
            0o600,
        );
        guest.try_sh("/usr/local/sbin/fleet-reboot --check 2>&1")
    };
    let (ok, out) = check(&server, token);
    assert!(
        ok && out.contains("token accepted") && out.contains("group default: 1 slot(s), 0 held"),
        "{out}"
    );
    let (ok, out) = check(&server, "wrong-token");
    assert!(!ok && out.contains("unauthorized"), "{out}");
    let (ok, out) = check(
        &format!("http://127.0.0.1:{}", fleet_rig::free_port()),
        token,
    );
    assert!(!ok && out.contains("unreachable"), "{out}");
    // The checks took no slot.
    let (ok, out) = check(&server, token);
    assert!(ok && out.contains("0 held"), "{out}");

    // With a valid config the timer's service runs and finds nothing to do: success, words in its log.
    guest.systemctl(&["start", "fleet-reboot.service"]);
    assert_eq!(show("Result"), "success");
    let log = guest.sh("journalctl -b -o cat -u fleet-reboot.service");
    assert!(log.contains("done: no reboot this time"), "{log}");

    // A healthy agent without desired state logs no ERROR over half a minute (a key without a value is normal).
    // why: "no ERROR over half a minute" is the property: the window since the agent was ready is the assertion
    std::thread::sleep(Duration::from_secs(31).saturating_sub(ready.elapsed()));
    let log = guest.sh("journalctl -b -o cat -u fleet-agent.service");
    assert!(!log.contains("ERROR"), "{log}");

    // A coordinated reboot: fleet-reboot takes the slot and reboots; right after the boot,
    // fleet-reboot-release.service gives it back once the host is healthy, not at the timer's first run (5 min).
    guest.write_file(
        "/etc/harmony-fleet/fleet-reboot.yaml",
        format!("server: {server}\ngroup: default\ntoken: {token}\nallow_degraded: true\nhealth_wait: 120\n")
            .as_bytes(),
        0o600,
    );
    guest.sh("touch /run/reboot-required");
    let first_boot = guest.boot_id();
    let old_pid1 = guest.pid1();
    let _ = guest.exec(&["systemctl", "start", "--no-block", "fleet-reboot.service"]);
    let down = fleet_rig::wait_for(Duration::from_secs(60), || {
        (guest.pid1() != old_pid1).then_some(())
    });
    assert!(
        down.is_some(),
        "no reboot:\n{}",
        guest.journal("fleet-reboot.service", 30)
    );
    guest.wait_up(Duration::from_secs(120));
    assert_ne!(guest.boot_id(), first_boot);
    let released = fleet_rig::wait_for(Duration::from_secs(90), || {
        let (ok, out) = guest.try_sh("/usr/local/sbin/fleet-reboot --check 2>&1");
        (ok && out.contains("0 held")).then_some(())
    });
    assert!(
        released.is_some(),
        "the slot was not given back after the boot:\n{}\n{}",
        guest.journal("fleet-reboot-release.service", 30),
        guest
            .try_sh("systemctl is-system-running; systemctl list-jobs --no-pager; systemctl --failed --no-pager")
            .1
    );
    // The server hears the release a moment before the service logs it: wait for the line.
    let log = || guest.sh("journalctl -b -o cat -u fleet-reboot-release.service");
    let logged = fleet_rig::wait_for(Duration::from_secs(10), || {
        log().contains("lock released").then_some(())
    });
    assert!(logged.is_some(), "{}", log());
    guest.sh("test ! -e /var/lib/fleet-reboot/marker.json");
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(60));
}
