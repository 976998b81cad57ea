//! The Debian packages on a booted Debian guest, the way an admin uses them: `apt install ./harmony-fleet-device…deb`
//! says what to write when there is no agent configuration yet; the admin writes it and runs
//! `dpkg-reconfigure`, which gives a working device (agent and updater ready, the agent's device info in NATS, the
//! fleet-reboot timer active); a reinstall changes nothing; `apt remove` is refused during an agent upgrade;
//! `fleetlock-server` installs disabled and serves once enabled; a misconfigured token refresher fails no unit;
//! `apt remove` says what stays and leaves the agent's workload running; `apt purge` of both says what goes,
//! keeps the agent user's Podman volume with data (and only that) and leaves no failed unit; otherwise the guest
//! is as it was. On another guest, a changed setting is applied by `dpkg-reconfigure`, which restarts exactly the
//! daemon whose config changed, and purge leaves no file of the removed user's uid.

use fleet_rig::nspawn::Guest;
use fleet_rig::wait_for;
use fleet_vm_tests::builds::V1;
use fleet_vm_tests::device::text;
use fleet_vm_tests::fleet::{
    agent_config, desired_one_workload, guest_nats_url, one_device_at_a_time, start_nats, Operator,
    GUEST_TOKEN_FILE, TEST_IMAGE,
};
use fleet_vm_tests::packages::{self, apt};
use std::process::Output;
use std::time::Duration;

/// What a clean device looks like: every path with owner and mode, plus the account files' content. Left out:
/// what the system itself changes while it runs or while apt works (logs, caches, apt and dpkg state, runtime
/// directories, systemd's own timestamps and the per-boot private temporary directories of its `PrivateTmp=`
/// units), where the test keeps the packages, and the shadow tools' backups of the previous account files
/// (`/etc/passwd-` …, which every user removal writes). Kept in: `/var/tmp` (where rootless Podman of the agent
/// user writes) and `/var/lib/systemd/linger` (the agent user's lingering).
const SNAPSHOT: &str = r#"find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp \
  -o -path '/var/tmp/systemd-private-*' -o -path /var/log -o -path /var/cache -o -path /var/lib/apt -o -path /var/lib/dpkg \
  -o -path /var/lib/systemd/timers -o -path /var/lib/systemd/deb-systemd-helper-enabled -o -path /root/pkgs \
  -o -name '*-' -path '/etc/*' \) -prune -o -printf '%p %u:%g %m\n' | sort;
  md5sum /etc/passwd /etc/group /etc/shadow /etc/gshadow /etc/subuid /etc/subgid 2>&1"#;

fn assert_ok(what: &str, out: &Output) -> String {
    let t = text(out);
    assert!(out.status.success(), "{what} failed:\n{t}");
    t
}

#[test]
fn packages_install_a_working_device_and_purge_clean() {
    let _one = one_device_at_a_time();
    let debs = packages::amd64(V1);
    let nats = start_nats();
    let operator = Operator::new(&nats);
    let mut guest = Guest::boot();
    let link = guest.forward(nats.port());
    let before = guest.sh(SNAPSHOT);
    assert!(
        before.contains("/usr/local/bin root:root 755\n") && before.contains("/etc/subuid"),
        "the snapshot sees nothing:\n{before}"
    );
    for name in ["harmony-fleet-device", "fleetlock-server"] {
        let file = packages::file_name(name);
        guest.install_file(&debs.join(&file), &format!("/root/pkgs/{file}"), 0o644);
    }
    let device_deb = format!("/root/pkgs/{}", packages::file_name("harmony-fleet-device"));
    let lock_deb = format!("/root/pkgs/{}", packages::file_name("fleetlock-server"));

    // No configuration yet: installed, not set up, and it says what to do.
    let out = assert_ok("apt install", &apt(&guest, &["install", &device_deb]));
    assert!(
        out.contains("/etc/harmony-fleet/agent.toml does not exist yet")
            && out.contains("dpkg-reconfigure harmony-fleet-device"),
        "{out}"
    );
    assert_eq!(guest.unit_state("fleet-agent.service"), "inactive");

    // The admin writes the agent's configuration (root-only, as an editor leaves it) and finishes.
    // With the auth callout on, the device's own token too (root's 0600 file; setup hands it to fleet-agent).
    let token = nats.device_token("device-1");
    if let Some(t) = &token {
        guest.write_file(GUEST_TOKEN_FILE, t.as_bytes(), 0o600);
    }
    let cfg = agent_config(
        "device-1",
        &guest_nats_url(&guest, &nats, &link),
        token.as_ref().map(|_| GUEST_TOKEN_FILE),
    );
    guest.write_file("/etc/harmony-fleet/agent.toml", cfg.as_bytes(), 0o600);
    let out = guest.systemd_run(&[
        "--service-type=exec",
        "--setenv=DEBIAN_FRONTEND=noninteractive",
        "dpkg-reconfigure",
        "harmony-fleet-device",
    ]);
    assert_ok("dpkg-reconfigure", &out);
    if token.is_some() {
        let st = guest.sh(&format!("stat -c '%U:%G %a' {GUEST_TOKEN_FILE}"));
        assert_eq!(
            st.trim(),
            "fleet-agent:fleet-agent 600",
            "the token file after setup"
        );
    }
    for unit in [
        "fleet-updater.service",
        "fleet-agent.service",
        "fleet-reboot.timer",
        "fleet-boot-watchdog.timer",
    ] {
        guest.wait_unit(unit, "active", Duration::from_secs(120));
    }
    let info = wait_for(Duration::from_secs(60), || {
        operator.has_device_info().then_some(())
    });
    assert!(
        info.is_some(),
        "no device info in NATS:\n{}",
        guest.journal("fleet-agent.service", 40)
    );
    let facts = guest.sh(
        "stat -c '%n %U:%G %a' /etc/harmony-fleet /etc/harmony-fleet/agent.toml /etc/harmony-fleet/updater.toml \
           /usr/local/sbin/fleet-updater /usr/local/sbin/fleet-tools \
           /var/lib/fleet-updater /var/lib/fleet-agent; readlink /usr/local/bin/fleet-agent; \
         /usr/local/bin/fleet-agent --version; systemctl is-enabled fleet-reboot-release.service; \
         for t in fetch reboot token boot-watchdog; do echo \"fleet-$t -> $(readlink /usr/local/sbin/fleet-$t)\"; done",
    );
    for want in [
        "/etc/harmony-fleet root:fleet-agent 750",
        "/etc/harmony-fleet/agent.toml root:fleet-agent 640",
        "/etc/harmony-fleet/updater.toml root:root 644",
        "/usr/local/sbin/fleet-updater root:root 755",
        // One multicall binary; the tools are links to it (one HTTPS stack on the device, not four).
        "/usr/local/sbin/fleet-tools root:root 755",
        "fleet-fetch -> fleet-tools\n",
        "fleet-reboot -> fleet-tools\n",
        "fleet-token -> fleet-tools\n",
        "fleet-boot-watchdog -> fleet-tools\n",
        "/var/lib/fleet-updater root:root 700",
        "/var/lib/fleet-agent fleet-agent:fleet-agent 750",
        &format!("/usr/lib/harmony-fleet/fleet-agent-v{V1}\n{V1}\n"),
        "enabled",
    ] {
        assert!(facts.contains(want), "missing {want:?} in:\n{facts}");
    }

    printed_commands_run_on_the_device(&guest);

    // A reinstall runs setup again and changes nothing: the agent keeps its process.
    let pid = guest.systemctl(&["show", "-P", "MainPID", "fleet-agent.service"]);
    let out = assert_ok(
        "apt reinstall",
        &apt(&guest, &["install", "--reinstall", &device_deb]),
    );
    assert!(
        !out.contains("device-setup: installed") && !out.contains("device-setup: selected"),
        "{out}"
    );
    assert_eq!(
        guest.systemctl(&["show", "-P", "MainPID", "fleet-agent.service"]),
        pid
    );

    boot_watchdog_holds_its_cap(&guest);

    // An agent upgrade in progress: removal is refused and nothing is removed.
    let journal = guest.path("/var/lib/fleet-updater/journal.json");
    let saved = std::fs::read(&journal).ok();
    guest.systemctl(&["stop", "fleet-updater.service"]);
    guest.write_file(
        "/var/lib/fleet-updater/journal.json",
        br#"{"phase":"activating","previousLink":"/usr/lib/harmony-fleet/fleet-agent-v1.0.0"}"#,
        0o600,
    );
    let out = apt(&guest, &["remove", "harmony-fleet-device"]);
    assert!(!out.status.success(), "removed during an upgrade");
    assert!(
        text(&out).contains("an agent upgrade is in progress"),
        "{}",
        text(&out)
    );
    assert!(guest
        .sh("dpkg-query -W -f='${Status}' harmony-fleet-device")
        .contains("install ok installed"));
    guest.sh("test -x /usr/local/bin/fleet-agent && test -x /usr/local/sbin/fleet-updater");
    match saved {
        Some(s) => std::fs::write(&journal, s).unwrap_or_else(|e| panic!("restore journal: {e}")),
        None => std::fs::remove_file(&journal).unwrap_or_else(|e| panic!("rm journal: {e}")),
    }
    guest.systemctl(&["start", "fleet-updater.service"]);

    // fleetlock-server: installed disabled; the admin enables it and it serves its health check.
    assert_ok(
        "apt install fleetlock-server",
        &apt(&guest, &["install", &lock_deb]),
    );
    assert_eq!(
        guest.systemctl(&["is-enabled", "fleetlock-server.service"]),
        "disabled"
    );
    // The unit serves HTTPS: the admin brings a certificate and key (here from a CA of the test).
    let ca = fleet_rig::tls::TestCa::new();
    let cert = ca.server_cert("fleetlock");
    let read = |p: &std::path::Path| std::fs::read(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    guest.write_file("/etc/fleetlock/tls/cert.pem", &read(&cert.cert_file), 0o644);
    guest.write_file("/etc/fleetlock/tls/key.pem", &read(&cert.key_file), 0o640);
    guest.write_file("/root/pkgs/fleetlock-ca.pem", &read(ca.ca_file()), 0o644);
    guest.sh("chgrp fleetlock /etc/fleetlock/tls/key.pem && chmod 0755 /etc/fleetlock/tls");
    guest.sh("systemctl enable --now fleetlock-server.service");
    let healthy = wait_for(Duration::from_secs(30), || {
        guest
            .try_sh(
                "curl -sf --max-time 2 --cacert /root/pkgs/fleetlock-ca.pem https://127.0.0.1:7450/healthz",
            )
            .0
            .then_some(())
    });
    assert!(
        healthy.is_some(),
        "fleetlock-server does not answer:\n{}",
        guest.journal("fleetlock-server.service", 30)
    );
    let facts = guest
        .sh("stat -c '%n %U:%G %a' /etc/fleetlock /etc/fleetlock/config.yaml /var/lib/fleetlock");
    for want in [
        "/etc/fleetlock root:fleetlock 750",
        "/etc/fleetlock/config.yaml root:fleetlock 640",
        "/var/lib/fleetlock fleetlock:fleetlock 750",
    ] {
        assert!(facts.contains(want), "missing {want:?} in:\n{facts}");
    }

    // A misconfigured token refresher logs its reason but fails no unit (a failed unit makes the system
    // degraded, which holds back coordinated reboots); a failed unit of the package is forgotten once it is gone.
    guest.write_file(
        "/etc/harmony-fleet/fleet-token.yaml",
        b"token_endpoint: [not, a, url\n",
        0o644,
    );
    guest.systemctl(&["start", "fleet-token.service"]);
    assert_eq!(
        guest.systemctl(&["is-failed", "fleet-token.service"]),
        "inactive",
        "a failed refresh failed the unit:\n{}",
        guest.journal("fleet-token.service", 20)
    );
    let log = guest.journal("fleet-token.service", 20);
    assert!(
        log.contains("ERROR"),
        "the failure is in the unit's journal:\n{log}"
    );
    guest.write_file(
        "/etc/harmony-fleet/fleet-reboot.yaml",
        b"server: [\n",
        0o644,
    );
    guest.systemctl(&["start", "fleet-reboot.service"]);
    assert_eq!(
        guest.systemctl(&["is-failed", "fleet-reboot.service"]),
        "failed",
        "the test needs a failed unit of the package"
    );

    // A workload of the agent, and two volumes of its user: one with data, one empty.
    let as_agent =
        "cd / && runuser -u fleet-agent -- env XDG_RUNTIME_DIR=/run/user/$(id -u fleet-agent)";
    guest.sh(&format!(
        "{as_agent} podman import --quiet /usr/share/fleet-test/busybox-rootfs.tar {TEST_IMAGE} >/dev/null"
    ));
    operator.put_desired(&desired_one_workload(1, "web"));
    let running = || {
        guest
            .try_sh(&format!(
                "{as_agent} podman inspect --format '{{{{.State.Running}}}}' fleet-web"
            ))
            .1
            .trim()
            == "true"
    };
    assert!(
        wait_for(Duration::from_secs(120), || running().then_some(())).is_some(),
        "the workload does not run:\n{}",
        guest.journal("fleet-agent.service", 40)
    );
    guest.sh(&format!(
        "{as_agent} sh -c 'podman volume create data >/dev/null && podman volume create empty >/dev/null && \
         echo precious > \"$(podman volume inspect --format {{{{.Mountpoint}}}} data)/f\"'"
    ));

    // Remove says what goes and what stays; the workload keeps running, unmanaged.
    let out = assert_ok(
        "apt remove",
        &apt(&guest, &["remove", "harmony-fleet-device"]),
    );
    for want in [
        "Kept until purge: /etc/harmony-fleet",
        "Still running, now unmanaged (nothing updates or restarts them): fleet-web",
        "HARMONY_FLEET_PURGE_VOLUMES=yes",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(running(), "the workload stopped with the package");
    assert_eq!(
        guest.systemctl(&["is-active", "fleet-agent.service"]),
        "inactive"
    );

    // Purge both: it says what it stops and keeps the volume with data; otherwise the guest is as it was before,
    // with no failed unit of the package, and nothing of theirs still runs.
    let out = assert_ok(
        "apt purge",
        &apt(
            &guest,
            &["purge", "harmony-fleet-device", "fleetlock-server"],
        ),
    );
    for want in [
        "stopped the agent user's containers: fleet-web",
        "kept the data of Podman volume data in /var/lib/harmony-fleet-kept-volumes/data",
        "purged /etc/harmony-fleet",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(!out.contains("volume empty"), "{out}");
    let (_, failed) = guest.try_sh("systemctl --failed --plain --no-legend");
    assert!(
        !failed.contains("fleet-"),
        "a failed unit of the package is left behind:\n{failed}"
    );
    assert_eq!(
        guest
            .sh("cat /var/lib/harmony-fleet-kept-volumes/data/f")
            .trim(),
        "precious"
    );
    let after = guest.sh(SNAPSHOT);
    let changes = diff(&before, &after);
    let other: Vec<&str> = changes
        .lines()
        .filter(|l| !l.contains("/var/lib/harmony-fleet-kept-volumes"))
        .collect();
    assert_eq!(other, Vec::<&str>::new(), "purge left the guest changed");
    guest.sh("rm -rf /var/lib/harmony-fleet-kept-volumes");
    let after = guest.sh(SNAPSHOT);
    assert_eq!(diff(&before, &after), "", "purge left the guest changed");
    // Ours: fleet-* processes, and Podman of the (deleted) agent user; the distribution's own root Podman units
    // (podman-restart and the like at boot) are not the package's.
    let (_, ps) = guest.try_sh(
        "ps -eo user:20,comm | awk '$2 ~ /fleet/ || ($2 ~ /podman|conmon/ && $1 != \"root\")'",
    );
    assert!(ps.trim().is_empty(), "still running after purge:\n{ps}");
    drop(link);
}

/// The guest's MainPID of `unit`; fails the test when it does not run.
fn main_pid(guest: &Guest, unit: &str) -> String {
    let pid = guest.systemctl(&["show", "-P", "MainPID", unit]);
    assert!(pid != "0" && !pid.is_empty(), "{unit} does not run");
    pid
}

/// `dpkg-reconfigure harmony-fleet-device`, the documented step after a config edit (docs/packages.md).
fn reconfigure(guest: &Guest) -> Output {
    guest.systemd_run(&[
        "--service-type=exec",
        "--setenv=DEBIAN_FRONTEND=noninteractive",
        "dpkg-reconfigure",
        "harmony-fleet-device",
    ])
}

/// Changing a setting on the installed package, as docs/packages.md says: edit `updater.toml` or `agent.toml`,
/// run `dpkg-reconfigure harmony-fleet-device`. It restarts exactly the daemon whose config changed, which then
/// runs with the new setting; with nothing changed it restarts nothing; during an agent upgrade it refuses and
/// restarts nothing. Before that, the directory the package makes for the admin and its message; after it,
/// purge with a Podman command of the agent user still running: the user's lingering and every file of its uid
/// (`podman load`'s temporary file in /var/tmp) go with it, and the guest is as it was.
#[test]
fn a_changed_setting_applies_through_dpkg_reconfigure() {
    let _one = one_device_at_a_time();
    let debs = packages::amd64(V1);
    let nats = start_nats();
    let operator = Operator::new(&nats);
    let mut guest = Guest::boot();
    let link = guest.forward(nats.port());
    let before = guest.sh(SNAPSHOT);
    let file = packages::file_name("harmony-fleet-device");
    guest.install_file(&debs.join(&file), &format!("/root/pkgs/{file}"), 0o644);
    let deb = format!("/root/pkgs/{file}");

    // The package makes the directory the admin writes into, root's alone until setup; its message names every
    // file to write there, the NATS CA too.
    let out = assert_ok("apt install", &apt(&guest, &["install", &deb]));
    assert!(out.contains("/etc/harmony-fleet/nats-ca.pem"), "{out}");
    assert_eq!(
        guest.sh("stat -c '%U:%G %a' /etc/harmony-fleet").trim(),
        "root:root 700"
    );
    let token = nats.device_token("device-1");
    if let Some(t) = &token {
        guest.write_file(GUEST_TOKEN_FILE, t.as_bytes(), 0o600);
    }
    let cfg = agent_config(
        "device-1",
        &guest_nats_url(&guest, &nats, &link),
        token.as_ref().map(|_| GUEST_TOKEN_FILE),
    );
    guest.write_file("/etc/harmony-fleet/agent.toml", cfg.as_bytes(), 0o600);
    assert_ok("dpkg-reconfigure", &reconfigure(&guest));
    for unit in ["fleet-updater.service", "fleet-agent.service"] {
        guest.wait_unit(unit, "active", Duration::from_secs(120));
    }
    assert!(
        wait_for(Duration::from_secs(60), || operator
            .has_device_info()
            .then_some(()))
        .is_some(),
        "no device info in NATS:\n{}",
        guest.journal("fleet-agent.service", 40)
    );
    let pids = || {
        (
            main_pid(&guest, "fleet-agent.service"),
            main_pid(&guest, "fleet-updater.service"),
        )
    };
    let socket_group = || guest.sh("stat -c %G /run/fleet-updater/updater.sock");

    // Nothing changed: nothing restarts.
    let (agent, updater) = pids();
    let out = assert_ok("dpkg-reconfigure (unchanged)", &reconfigure(&guest));
    assert!(!out.contains("restarting"), "{out}");
    assert_eq!(pids(), (agent.clone(), updater.clone()), "{out}");

    // updater.toml changed (the group of the updater's socket): the updater restarts with it, the agent does not.
    assert_eq!(socket_group().trim(), "fleet-agent");
    guest.sh("echo 'socket_group = \"adm\"' >>/etc/harmony-fleet/updater.toml");
    let out = assert_ok("dpkg-reconfigure (updater.toml)", &reconfigure(&guest));
    assert!(out.contains("restarting fleet-updater"), "{out}");
    assert!(!out.contains("restarting fleet-agent"), "{out}");
    let (agent2, updater2) = pids();
    assert_eq!(
        agent2, agent,
        "the agent restarted for the updater's config"
    );
    assert_ne!(updater2, updater, "the updater kept its process:\n{out}");
    assert_eq!(
        socket_group().trim(),
        "adm",
        "the new setting is not in effect"
    );

    // During an agent upgrade the step refuses and restarts nothing, whatever changed.
    guest.sh("sed -i '/^socket_group/d' /etc/harmony-fleet/updater.toml");
    guest.sh("printf '\\n[podman]\\nfleet_test_marker = 1\\n' >>/etc/harmony-fleet/agent.toml");
    let journal = "/var/lib/fleet-updater/journal.json";
    let saved = guest.try_sh(&format!("cat {journal}"));
    guest.write_file(
        journal,
        br#"{"phase":"activating","previousLink":"/usr/lib/harmony-fleet/fleet-agent-v1.0.0"}"#,
        0o600,
    );
    let out = reconfigure(&guest);
    assert!(!out.status.success(), "reconfigured during an upgrade");
    assert!(
        text(&out).contains("an agent upgrade is in progress"),
        "{}",
        text(&out)
    );
    assert_eq!(pids(), (agent.clone(), updater2.clone()));
    match saved {
        (true, s) => guest.write_file(journal, s.as_bytes(), 0o600),
        _ => {
            guest.sh(&format!("rm -f {journal}"));
        }
    }

    // Both changed (agent.toml gained a key, updater.toml lost one): both restart, each with its new config.
    let out = assert_ok("dpkg-reconfigure (both)", &reconfigure(&guest));
    assert!(
        out.contains("restarting fleet-updater") && out.contains("restarting fleet-agent"),
        "{out}"
    );
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(120));
    let (agent3, updater3) = pids();
    assert_ne!(agent3, agent, "the agent kept its process:\n{out}");
    assert_ne!(updater3, updater2, "the updater kept its process:\n{out}");
    assert_eq!(socket_group().trim(), "fleet-agent");
    // The new agent read the new file: it warns about the key this release does not know, the old one never did.
    let log = guest.sh(&format!("journalctl --no-pager _PID={agent3}"));
    assert!(
        log.contains("unknown key `podman.fleet_test_marker` ignored"),
        "{log}"
    );

    // And unchanged again: nothing restarts; a reinstall neither.
    let out = assert_ok("dpkg-reconfigure (unchanged)", &reconfigure(&guest));
    assert!(!out.contains("restarting"), "{out}");
    let out = assert_ok(
        "apt reinstall",
        &apt(&guest, &["install", "--reinstall", &deb]),
    );
    assert!(!out.contains("restarting"), "{out}");
    assert_eq!(pids(), (agent3, updater3));

    // Then purge: no lingering, no directory of the package, no file of the removed uid anywhere.
    let uid = guest.sh("id -u fleet-agent").trim().to_string();
    // A Podman command of the agent user that is still running when purge stops its manager, as an image
    // brought by hand (`podman save … | podman load`) is: `podman load` copies standard input to a temporary file
    // in /var/tmp first, and a stopped podman leaves that file behind, owned by the uid.
    guest.sh(
        "systemd-run --quiet --user -M fleet-agent@ --unit fleet-test-load sh -c 'sleep infinity | podman load'",
    );
    let loading = wait_for(Duration::from_secs(60), || {
        let (_, f) = guest.try_sh(&format!("find /var/tmp -xdev -uid {uid}"));
        (!f.trim().is_empty()).then_some(f)
    });
    let loading = loading.unwrap_or_else(|| panic!("podman load made no file in /var/tmp"));
    assert!(guest
        .sh("ls /var/lib/systemd/linger")
        .contains("fleet-agent"));
    let out = assert_ok(
        "apt purge",
        &apt(&guest, &["purge", "harmony-fleet-device"]),
    );
    assert!(
        out.contains("removed what the fleet-agent user left in /var/tmp and /tmp")
            && out.contains(loading.trim()),
        "{out}"
    );
    let left = guest
        .try_sh(&format!(
            "find / -xdev -uid {uid} 2>/dev/null | grep -v '^/proc\\|^/sys' | head"
        ))
        .1;
    assert_eq!(
        left.trim(),
        "",
        "files of the removed user's uid {uid} after purge"
    );
    let after = guest.sh(SNAPSHOT);
    assert_eq!(diff(&before, &after), "", "purge left the guest changed");
    drop(link);
}

/// The hanging remote mount of the seed: its mount helper never returns, so remote-fs.target, and with it
/// systemd-user-sessions.service (and /run/nologin), never finish.
const HANGING_MOUNT: &str = "[Unit]\nDescription=A remote mount whose server never answers (test)\n\n[Mount]\n\
    What=nfs.example.lan:/export\nWhere=/mnt/hang\nType=hang\nOptions=_netdev\nTimeoutSec=infinity\n\n\
    [Install]\nWantedBy=remote-fs.target\n";

/// The host PID of the guest's running systemd (not nspawn's set-up before it, not `systemd-shutdown` after it),
/// read without entering the guest: every boot has a new one. The boots the watchdog ends are watched from the host
/// only, because an `nsenter` into a guest that is shutting down can be frozen by the guest's SIGSTOP broadcast and
/// then keep its PID namespace from ever finishing.
fn systemd_pid(guest: &Guest) -> Option<u32> {
    let pid = guest.pid1()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "systemd").then_some(pid)
}

/// Waits for a boot other than the one whose systemd is `than`; returns its systemd's host PID.
fn next_boot(guest: &Guest, than: u32, what: &str) -> u32 {
    wait_for(Duration::from_secs(90), || {
        systemd_pid(guest).filter(|p| *p != than)
    })
    .unwrap_or_else(|| panic!("{what}: no new boot within 90 s.\n{}", guest.console()))
}

/// The boot watchdog on the installed device, the way the seed's host got stuck: with a hanging remote mount
/// every boot stays `starting`. The first stuck boot writes diagnostics and reboots once; the second writes
/// diagnostics, holds the cap (max_reboots = 1) and stays up, saying so on the console's login message.
fn boot_watchdog_holds_its_cap(guest: &Guest) {
    assert_eq!(
        guest.systemctl(&["is-enabled", "fleet-boot-watchdog.timer"]),
        "enabled"
    );
    guest.write_file(
        "/etc/harmony-fleet/boot-watchdog.toml",
        b"max_reboots = 1\nwindow_hours = 24\n",
        0o644,
    );
    // Seconds instead of minutes, the way an admin changes the delay.
    guest.write_file(
        "/etc/systemd/system/fleet-boot-watchdog.timer.d/test.conf",
        b"[Timer]\nOnActiveSec=\nOnActiveSec=3s\n",
        0o644,
    );
    guest.write_file(
        "/usr/sbin/mount.hang",
        b"#!/bin/sh\nexec sleep infinity\n",
        0o755,
    );
    guest.write_file(
        "/etc/systemd/system/mnt-hang.mount",
        HANGING_MOUNT.as_bytes(),
        0o644,
    );
    guest.sh("systemctl daemon-reload && systemctl enable --quiet mnt-hang.mount");
    let healthy = systemd_pid(guest).unwrap_or_else(|| panic!("the guest is not up"));
    let _ = guest.exec(&["systemctl", "reboot"]);

    let first = next_boot(guest, healthy, "the reboot into the hanging mount");
    let second = next_boot(guest, first, "the watchdog's reboot of the stuck boot");
    let motd = wait_for(Duration::from_secs(60), || {
        // /run is the guest's own tmpfs: read through its systemd's view of the file system.
        std::fs::read_to_string(format!(
            "/proc/{second}/root/run/motd.d/fleet-boot-watchdog"
        ))
        .ok()
    })
    .unwrap_or_else(|| {
        panic!(
            "no cap message in the second stuck boot:\n{}",
            guest.journal("fleet-boot-watchdog.service", 40)
        )
    });
    assert!(
        motd.contains("did not finish booting")
            && motd.contains("reboot cap reached: 1 watchdog reboot(s)"),
        "{motd}"
    );
    // The cap holds: no third boot, still stuck, the unit failed with the reason.
    // why: "no third boot" has no event; a window past the watchdog's own time-out is the assertion
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(systemd_pid(guest), Some(second), "rebooted past the cap");
    assert_eq!(guest.systemctl(&["is-system-running"]), "starting");
    assert_eq!(guest.unit_state("fleet-boot-watchdog.service"), "failed");
    let journal = guest.journal("fleet-boot-watchdog.service", 40);
    assert!(journal.contains("the host stays up"), "{journal}");

    // Diagnostics of both stuck boots, the first one deciding the reboot, the second the cap.
    let listing = guest.sh("ls /var/log/fleet-boot-watchdog/");
    let files: Vec<&str> = listing.lines().collect();
    assert_eq!(files.len(), 2, "{listing}");
    let read = |f: &str| guest.sh(&format!("cat /var/log/fleet-boot-watchdog/{f}"));
    let (one, two) = (read(files[0]), read(files[1]));
    for d in [&one, &two] {
        for want in [
            "is-system-running says starting",
            "systemd-user-sessions.service is inactive",
            "/run/nologin exists",
            "== jobs: systemctl list-jobs",
            "mnt-hang.mount",
            "== failed units",
            "== ordering cycles",
            "== dpkg audit",
            "== mounts",
        ] {
            assert!(d.contains(want), "missing {want:?} in:\n{d}");
        }
    }
    assert!(one.contains("decision: rebooting"), "{one}");
    assert!(two.contains("decision: reboot cap reached"), "{two}");
    let record = guest.sh("cat /var/lib/fleet-boot-watchdog/reboots.json");
    assert_eq!(
        record.matches('Z').count(),
        1,
        "one watchdog reboot recorded: {record}"
    );

    // The person fixes the mount and reboots: the host comes up, the agent with it.
    guest.sh(
        "systemctl disable --quiet mnt-hang.mount; rm -f /etc/systemd/system/mnt-hang.mount /usr/sbin/mount.hang; \
         rm -rf /etc/systemd/system/fleet-boot-watchdog.timer.d /mnt/hang",
    );
    let _ = guest.exec(&["systemctl", "reboot"]);
    next_boot(guest, second, "the reboot after the fix");
    guest.wait_up(Duration::from_secs(60));
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(120));
}

/// Lines only in `a` (`-`) or only in `b` (`+`).
fn diff(a: &str, b: &str) -> String {
    let left: std::collections::BTreeSet<&str> = a.lines().collect();
    let right: std::collections::BTreeSet<&str> = b.lines().collect();
    let mut out = String::new();
    for l in left.difference(&right) {
        out.push_str(&format!("- {l}\n"));
    }
    for l in right.difference(&left) {
        out.push_str(&format!("+ {l}\n"));
    }
    out
}

/// Where the product tells a person what to run on a device: alert texts, the example alerting rules, docs, the
/// maintainer scripts' messages.
const INSTRUCTION_SOURCES: [&str; 13] = [
    "operator/src/dashboard/alerts.rs",
    "docs/dashboard/prometheus-rules.yaml",
    "docs/dashboard.md",
    "docs/device-setup.md",
    "docs/packages.md",
    "docs/updater.md",
    "docs/fleetlock.md",
    "docs/auth.md",
    "docs/boot-watchdog.md",
    "docs/agent-config.md",
    "README.md",
    "scripts/debian/harmony-fleet-device/postinst",
    "scripts/debian/harmony-fleet-device/postrm",
];

/// The commands a person runs on a device (the first word of an instruction).
const DEVICE_COMMANDS: [&str; 11] = [
    "fleet-device-setup",
    "fleet-updater",
    "fleet-agent",
    "fleet-reboot",
    "fleet-token",
    "fleet-boot-watchdog",
    "fleet-fetch",
    "systemctl",
    "journalctl",
    "dpkg-reconfigure",
    "apt",
];

/// Every device command the sources name (their first word one of [`DEVICE_COMMANDS`]); (source, command).
fn printed_device_commands() -> Vec<(String, String)> {
    fleet_vm_tests::instructions::printed(&INSTRUCTION_SOURCES, &DEVICE_COMMANDS)
}

/// Each printed device command exists on root's PATH of the installed device, and its `--help` names every long
/// option the instruction gives.
fn printed_commands_run_on_the_device(guest: &Guest) {
    let commands = printed_device_commands();
    assert!(
        commands
            .iter()
            .any(|(_, c)| c == "fleet-device-setup --repair-rollback-failed"),
        "the repair instruction is among them: {commands:#?}"
    );
    let path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let mut bad = Vec::new();
    for (src, command) in &commands {
        let word = command.split_whitespace().next().unwrap_or_default();
        let (found, _) = guest.try_sh(&format!("{path} command -v {word}"));
        if !found {
            bad.push(format!("{src}: `{command}`: {word} is not on root's PATH"));
            continue;
        }
        let (_, help) = guest.try_sh(&format!("{path} {word} --help 2>&1"));
        for opt in command.split_whitespace().filter(|w| w.starts_with("--")) {
            let opt = opt
                .trim_end_matches([']', ')', ',', '.', ';', ':'])
                .split('=')
                .next()
                .unwrap_or_default();
            if opt.len() > 2 && !help.contains(opt) {
                bad.push(format!(
                    "{src}: `{command}`: {word} --help does not name {opt}"
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "instructions that cannot be run as printed:\n{}",
        bad.join("\n")
    );
    // The repair's refusal on a healthy device names a command that exists, and changes nothing.
    let (ok, out) = guest.try_sh(&format!(
        "{path} fleet-device-setup --repair-rollback-failed"
    ));
    assert!(!ok && out.contains("nothing to repair"), "{out}");
    assert!(
        out.contains("Run /usr/sbin/fleet-device-setup without --repair-rollback-failed"),
        "{out}"
    );
}
