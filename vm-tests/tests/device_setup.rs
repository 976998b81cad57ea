//! `scripts/device-setup` in a booted guest: what it installs, that a second run changes nothing, that it
//! refuses to run during an agent upgrade or a quarantine, and that the fleet-agent user's rootless Podman
//! answers on its socket; and the root repair of `rollback-failed`. A notify stub (`src/bin/notify-stub.rs`)
//! stands in for the agent and the updater: the whole-device scenarios run the real ones.

use fleet_rig::nspawn::Guest;
use fleet_vm_tests::device::{device_setup, stage_bytes, stage_file, stage_setup, text};
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
           /etc/harmony-fleet /etc/harmony-fleet/agent.toml /etc/harmony-fleet/updater.toml \
           /etc/harmony-fleet/nats-token /var/lib/fleet-updater /var/lib/fleet-agent; \
         cat /etc/harmony-fleet/nats-token; \
         systemctl is-enabled fleet-agent.service fleet-updater.service; \
         systemctl show -p User -p Type -p NotifyAccess -p TimeoutStopUSec -p TimeoutStartUSec -p Restart \
           fleet-agent.service; \
         systemctl show -p User -p Type -p Restart fleet-updater.service",
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
        "/etc/harmony-fleet root:fleet-agent 750",
        "/etc/harmony-fleet/agent.toml root:fleet-agent 640",
        "/etc/harmony-fleet/nats-token fleet-agent:fleet-agent 600",
        "eyJ.device-1-token.sig\n",
        "/var/lib/fleet-updater root:root 700",
        "/var/lib/fleet-agent fleet-agent:fleet-agent 750",
        "enabled\nenabled\n",
        "User=fleet-agent\n",
        "Type=notify\n",
        "NotifyAccess=main\n",
        "TimeoutStopUSec=1min\n",
        "TimeoutStartUSec=4min\n",
        "Restart=on-failure\n",
        "Restart=always\n",
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
}

#[test]
fn root_repair_leaves_quarantine_only_when_the_selected_agent_starts() {
    let guest = Guest::boot();
    stage_setup(&guest);
    let agent = stage_file(&guest, Path::new(STUB), "fleet-agent-v1.0.0", 0o755);
    let good = stage_file(&guest, Path::new(STUB), "fleet-agent-v1.0.1", 0o755);
    let updater = stage_file(&guest, Path::new(STUB), "fleet-updater", 0o755);
    stage_file(&guest, Path::new(STUB), "fleet-fetch", 0o755);
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

    // Repair selecting a good agent: it starts, the journal is moved aside, both units are active.
    let out = device_setup(&guest, &["--agent", &good, "--repair-rollback-failed"]);
    assert!(out.status.success(), "repair: {}", text(&out));
    assert_eq!(
        guest.sh("readlink /usr/local/bin/fleet-agent").trim(),
        "/usr/lib/harmony-fleet/fleet-agent-v1.0.1"
    );
    guest.sh("test ! -e /var/lib/fleet-updater/journal.json && ls /var/lib/fleet-updater/journal.json.rollback-failed.*");
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(30));
    guest.wait_unit("fleet-updater.service", "active", Duration::from_secs(30));
    // And setup runs normally again.
    let out = device_setup(&guest, &[]);
    assert!(out.status.success(), "after repair: {}", text(&out));
}
