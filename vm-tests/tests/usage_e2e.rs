//! A device's full disk as a person sees it (docs/crds.md, "Device: resources"), every part real: `kubectl` →
//! kube-apiserver → the `fleet-operator` binary (its dashboard on) → nats-server with the auth callout → three
//! nspawn Debian devices installed with device setup (the real agent, rootless Podman). Each device's Podman
//! storage (`~fleet-agent/.local/share/containers`, the `containers` filesystem the agent measures) is moved onto a
//! 320 MiB tmpfs inside its guest before anything runs, so that `usage-2`'s can be filled without touching the
//! host's disk, and what the others show does not depend on it (their root and agent state are the host's disk).
//! In order:
//!
//! 1. A FleetDeployment `usage-web` (one `sleep` workload) runs on all three.
//! 2. `usage-2`'s containers filesystem filled to 96 %: within 60 s `kubectl get fdev -o wide` shows it in the Disk
//!    column (read by position, as a person reads it), the dashboard's device page marks the filesystem, the Alerts
//!    page lists `Device disk full` for it naming `containers`, `/metrics` counts it in `DeviceDiskFull` and a
//!    Warning event `DeviceDiskFull` is on its Device. The other devices' containers filesystems are not full; their
//!    root is this host's disk, which may be (then they alert too: nothing here assumes it is not).
//! 3. A staged rollout of a changed spec (maxUnavailable 1) started after that: the other two run it, `usage-2`
//!    keeps its old container and its `status.blocking` (and the Waiting column) say `notEnoughSpace` with what it
//!    has and the floor; the deployment counts it pending, not failed, and does not halt.
//! 4. (When `FLEET_USAGE_E2E_FULL` is not `0`.) Filled to 100 %, the rollout section removed (every device gets
//!    the next spec at once, space or not): `usage-2` cannot create the new container, and its old one keeps
//!    running under its own name (`fleet-web`, no `fleet-web.previous` left).
//! 5. Space freed: `usage-2` reports room and gets the latest spec.

use fleet_vm_tests::fleet::TEST_IMAGE;
use fleet_vm_tests::local_fleet::{group_yaml, LocalFleet, API_VERSION};
use std::time::{Duration, Instant};

const DEVICES: [&str; 3] = ["usage-1", "usage-2", "usage-3"];
/// The device whose disk is filled.
const FULL: &str = "usage-2";
const GROUP: &str = "usage";
const DEPLOYMENT: &str = "usage-web";
/// The workload, so its container is `fleet-web`.
const WORKLOAD: &str = "web";
/// Where the agent user's rootless Podman keeps its storage (the `containers` role).
const STORAGE: &str = "/var/lib/fleet-agent/.local/share/containers";
/// The small filesystem's size: below the 256 MiB floor at 96 % (13 MiB free), and little RAM.
const TMPFS_MIB: u64 = 320;
/// What the issue asks: the full disk shows within a minute.
const SHOWN_WITHIN: Duration = Duration::from_secs(60);
/// A deployment's pull-free start on two loaded cores, well within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(180);

/// The deployment with its workload running `sleep <secs>` (the spec a device runs is told by that number);
/// `staged`: with a rollout section (maxUnavailable 1, a 5 s soak).
fn deployment(secs: u32, staged: bool) -> String {
    let rollout = if staged {
        "  rollout:\n    maxUnavailable: 1\n    soakSeconds: 5\n"
    } else {
        ""
    };
    format!(
        "apiVersion: {API_VERSION}\nkind: FleetDeployment\nmetadata:\n  name: {DEPLOYMENT}\nspec:\n  \
         allowedGroups: [{GROUP}]\n  targetSelector: {{}}\n{rollout}  workloads:\n    - name: {WORKLOAD}\n      \
         image: {TEST_IMAGE}\n      command: [sleep, \"{secs}\"]\n"
    )
}

/// The `sleep` argument of the running container `fleet-web` on `device`, if it runs.
fn running_secs(fleet: &LocalFleet, device: &str) -> Option<u32> {
    let c = fleet
        .device(device)
        .container(&format!("fleet-{WORKLOAD}"))?;
    if c["State"]["Running"] != true {
        return None;
    }
    c["Config"]["Cmd"]
        .as_array()?
        .last()?
        .as_str()?
        .parse()
        .ok()
}

/// Every container name of the agent's Podman on `device`.
fn container_names(fleet: &LocalFleet, device: &str) -> Vec<String> {
    let (_, out) = fleet.device(device).podman("ps -a --format '{{.Names}}'");
    out.lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// `(size, available)` bytes of the filesystem of `path` in the guest of `device`.
fn df(fleet: &LocalFleet, device: &str, path: &str) -> (u64, u64) {
    let out = fleet
        .device(device)
        .guest
        .sh(&format!("df -B1 --output=size,avail {path} | tail -1"));
    let n: Vec<u64> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(n.len(), 2, "df of {path}: {out}");
    (n[0], n[1])
}

/// The cell of column `name` in the row of `device` of `kubectl get fdev -o wide`, read by the header's
/// positions (a cell runs to the next column's start).
fn wide_cell(table: &str, device: &str, name: &str) -> Option<String> {
    let mut lines = table.lines();
    let header = lines.next()?;
    let start = header.find(&format!(" {name}")).map(|i| i + 1)?;
    let end = header[start..]
        .char_indices()
        .skip_while(|(_, c)| !c.is_whitespace())
        .find(|(_, c)| !c.is_whitespace())
        .map(|(i, _)| start + i);
    let row = lines.find(|l| l.split_whitespace().next() == Some(device))?;
    let cell = match end {
        Some(e) => row.get(start..e.min(row.len()))?,
        None => row.get(start..)?,
    };
    Some(cell.trim().to_owned())
}

/// The containers filesystem's percent in a Disk cell (`root 41%, agentState 41%, containers 97% (11 MiB free)`).
fn containers_percent(disk: &str) -> Option<u32> {
    disk.split("containers ")
        .nth(1)?
        .split('%')
        .next()?
        .parse()
        .ok()
}

/// Moves the agent user's Podman storage of `device` onto a [`TMPFS_MIB`] tmpfs mounted in its guest (the agent
/// and the user's Podman stopped meanwhile, the storage copied as it is).
fn small_containers_filesystem(fleet: &LocalFleet, device: &str) {
    let g = &fleet.device(device).guest;
    g.systemctl(&["stop", "fleet-agent.service"]);
    g.sh("systemctl stop user@$(id -u fleet-agent).service");
    g.sh(&format!(
        "set -e; mkdir -p /srv/small; mount -t tmpfs -o size={TMPFS_MIB}m,mode=0700 tmpfs /srv/small; \
         cp -a {STORAGE}/. /srv/small/; chown fleet-agent:fleet-agent /srv/small; \
         mount --bind /srv/small {STORAGE}"
    ));
    g.sh("systemctl start user@$(id -u fleet-agent).service");
    g.systemctl(&["start", "fleet-agent.service"]);
    let (size, _) = df(fleet, device, STORAGE);
    assert_eq!(size, TMPFS_MIB << 20, "the tmpfs under {STORAGE}");
}

/// Fills the filesystem of [`STORAGE`] on [`FULL`] to `percent` used (`df`'s rounding: up), as root.
fn fill_to(fleet: &LocalFleet, percent: u64) {
    let g = &fleet.device(FULL).guest;
    if percent >= 100 {
        // Every last page: written until ENOSPC.
        g.try_sh(&format!("cat /dev/zero > {STORAGE}/fill-100"));
    } else {
        let (size, avail) = df(fleet, FULL, STORAGE);
        // Leave a bit under (100 - percent) % free.
        let keep = size * (100 - percent) / 100 - (1 << 20);
        let take = avail.saturating_sub(keep);
        g.sh(&format!("fallocate -l {take} {STORAGE}/fill-{percent}"));
    }
    let (size, avail) = df(fleet, FULL, STORAGE);
    let used = (size - avail) * 100 / size;
    eprintln!("{FULL}: {STORAGE} {used}% used, {avail} bytes free");
    assert!(used >= percent.min(99), "filled to {used}%");
}

fn logs(fleet: &LocalFleet) -> String {
    fleet.device_logs()
        + &format!(
            "\n--- fleet-operator ---\n{}",
            fleet.cluster.operator_log(80)
        )
}

#[test]
fn a_full_disk_shows_alerts_and_holds_a_staged_rollout() {
    let fleet = LocalFleet::start(&DEVICES);
    let cluster = &fleet.cluster;
    // Every device's containers on a filesystem of its own, so that what they show does not depend on this
    // host's disk (their root and agent state are on it).
    for d in DEVICES {
        small_containers_filesystem(&fleet, d);
    }
    for d in DEVICES {
        cluster.kubectl(&["label", "fdev", d, "site=usage"]);
    }
    cluster.apply(&group_yaml(GROUP, &[("site", "usage")]));

    // Every device reports its usage; the small filesystem shows as the containers role.
    let usage = cluster.wait("every Device shows status.usage", STEP_TIMEOUT, || {
        let all: Vec<serde_json::Value> = DEVICES
            .iter()
            .map(|d| {
                cluster
                    .get_json(&["fdev", d])
                    .map(|o| o["status"]["usage"].clone())
            })
            .collect::<Option<_>>()?;
        all.iter().all(|u| u.is_object()).then_some(all)
    });
    eprintln!("{FULL}'s status.usage: {:#}", usage[1]);
    let roles: Vec<&str> = usage[1]["filesystems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["role"].as_str())
        .collect();
    assert!(roles.contains(&"containers"), "{:#}", usage[1]);

    // 1. The workload runs everywhere.
    cluster.apply(&deployment(100_000, false));
    cluster.wait("usage-web running on every device", STEP_TIMEOUT, || {
        DEVICES
            .iter()
            .all(|d| running_secs(&fleet, d) == Some(100_000))
            .then_some(())
    });

    // 2. Filled to 96 %: shown within a minute.
    fill_to(&fleet, 96);
    let filled = Instant::now();
    let mut last = String::new();
    let table = cluster.wait("the Disk column shows usage-2 full", SHOWN_WITHIN, || {
        let t = cluster.kubectl(&["get", "fdev", "-o", "wide"]);
        let disk = wide_cell(&t, FULL, "DISK")?;
        if disk != last {
            eprintln!(
                "{:?} after the fill, Disk of {FULL}: {disk}",
                filled.elapsed()
            );
            last = disk.clone();
        }
        (containers_percent(&disk)? >= 96 && disk.contains(" free)")).then_some(t)
    });
    eprintln!("shown {:?} after the fill:\n{table}", filled.elapsed());
    // The others' containers filesystems are not full (their root may be: it is this host's disk).
    for d in ["usage-1", "usage-3"] {
        let disk = wide_cell(&table, d, "DISK").unwrap_or_default();
        assert!(
            containers_percent(&disk).is_some_and(|p| p < 90),
            "{d}'s containers are not full: {disk}\n{table}"
        );
    }
    let mem = wide_cell(&table, FULL, "MEM").unwrap_or_default();
    assert!(mem.contains("% available"), "Mem column: {mem}\n{table}");
    let page = cluster.wait(
        "the device page marks the full filesystem",
        SHOWN_WITHIN,
        || {
            cluster
                .dashboard_page(&format!("/devices/{FULL}"))
                .filter(|p| p.contains("data-disk-full=\"containers\""))
        },
    );
    assert!(
        page.contains("containers 9"),
        "the device page names the filesystem's percent"
    );
    // Only usage-2's containers filesystem is full: an alert naming it is usage-2's.
    cluster.wait(
        "the Alerts page lists the full containers filesystem",
        SHOWN_WITHIN,
        || {
            cluster.dashboard_page("/alerts").filter(|p| {
                p.contains("Device disk full")
                    && p.contains(&format!("/devices/{FULL}"))
                    && p.contains("containers 9")
            })
        },
    );
    // One alert per full device: at least usage-2 (the others too when this host's own disk is 90 % full).
    let metrics = cluster.dashboard_page("/metrics").unwrap_or_default();
    let counted: Option<u32> = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fleet_alerts{alert=\"DeviceDiskFull\"} "))
        .and_then(|n| n.trim().parse().ok());
    assert!(
        counted.is_some_and(|n| n >= 1),
        "/metrics: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("fleet_alerts"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    cluster.wait("the DeviceDiskFull Warning event", SHOWN_WITHIN, || {
        Some(cluster.warnings("Device", FULL))
            .filter(|e| e.iter().any(|m| m.starts_with("DeviceDiskFull: ")))
    });
    eprintln!(
        "alert, page, metric and event within {:?}",
        filled.elapsed()
    );

    // 3. A staged rollout started now: the others get it, usage-2 is held with the reason.
    cluster.apply(&deployment(100_001, true));
    cluster.wait("the others run the new spec", STEP_TIMEOUT, || {
        ["usage-1", "usage-3"]
            .iter()
            .all(|d| running_secs(&fleet, d) == Some(100_001))
            .then_some(())
    });
    let (kind, message) = cluster.wait("usage-2 held for space", STEP_TIMEOUT, || {
        cluster
            .blocking()
            .get(FULL)?
            .iter()
            .find(|(_, m)| m.starts_with(&format!("FleetDeployment/{DEPLOYMENT}")))
            .cloned()
    });
    assert_eq!(kind, "notEnoughSpace", "{message}");
    assert!(
        message.starts_with(&format!(
            "FleetDeployment/{DEPLOYMENT} waits for free space: "
        )) && message.contains(" free on containers, needs 256 MiB"),
        "{message}"
    );
    assert_eq!(
        running_secs(&fleet, FULL),
        Some(100_000),
        "usage-2 keeps its container"
    );
    let status = cluster.wait("the rollout counts it pending", STEP_TIMEOUT, || {
        let s = cluster.get_json(&["fdep", DEPLOYMENT])?["status"]["rollout"].clone();
        (s["healthy"] == 2 && s["pending"] == 1).then_some(s)
    });
    assert_eq!(status["failed"], 0, "{status:#}");
    assert_ne!(status["phase"], "Halted", "{status:#}");
    let table = cluster.kubectl(&["get", "fdev", "-o", "wide"]);
    let waiting = wide_cell(&table, FULL, "WAITING").unwrap_or_default();
    assert!(
        waiting.contains("waits for free space"),
        "Waiting: {waiting}\n{table}"
    );
    println!("kubectl get fdev -o wide, usage-2 held:\n{table}");

    // 4. At 100 %, a change every device gets at once: the old container keeps running under its own name.
    let latest = if std::env::var("FLEET_USAGE_E2E_FULL").as_deref() == Ok("0") {
        eprintln!("step 4 (100 %) left out: FLEET_USAGE_E2E_FULL=0");
        100_001
    } else {
        fill_to(&fleet, 100);
        cluster.apply(&deployment(100_002, false));
        cluster.wait("the others run the unstaged spec", STEP_TIMEOUT, || {
            ["usage-1", "usage-3"]
                .iter()
                .all(|d| running_secs(&fleet, d) == Some(100_002))
                .then_some(())
        });
        // The agent tried (its report says the workload failed) and left the old container as it was.
        cluster.wait(
            "usage-2 reports the failed replacement",
            STEP_TIMEOUT,
            || {
                let o = cluster.get_json(&["fdev", FULL])?;
                (o["status"]["workloads"]["failed"].as_u64()? >= 1).then_some(())
            },
        );
        let names = container_names(&fleet, FULL);
        assert_eq!(
            running_secs(&fleet, FULL),
            Some(100_000),
            "containers: {names:?}\n{}",
            logs(&fleet)
        );
        assert!(
            !names.iter().any(|n| n.ends_with(".previous")),
            "a renamed container is left: {names:?}"
        );
        100_002
    };

    // 5. Space freed: usage-2 gets the latest spec.
    fleet
        .device(FULL)
        .guest
        .sh(&format!("rm -f {STORAGE}/fill-*"));
    let freed = Instant::now();
    cluster.wait(
        "usage-2 runs the latest spec once it has room",
        STEP_TIMEOUT,
        || (running_secs(&fleet, FULL) == Some(latest)).then_some(()),
    );
    eprintln!(
        "usage-2 updated {:?} after space was freed",
        freed.elapsed()
    );
    cluster.wait("usage-2's containers shown with room", SHOWN_WITHIN, || {
        let t = cluster.kubectl(&["get", "fdev", FULL, "-o", "wide"]);
        containers_percent(&wide_cell(&t, FULL, "DISK")?)
            .filter(|p| *p < 90)
            .map(|_| ())
    });
    assert!(
        cluster.blocking().get(FULL).is_none_or(|b| b.is_empty()),
        "{:?}",
        cluster.blocking().get(FULL)
    );
    fleet.assert_no_secrets_in_logs();
}
