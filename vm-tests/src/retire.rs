//! Retiring a device and enrolling it again as a person does (docs/device-lifecycle.md), for the scenarios:
//! [`retire`] is `kubectl delete fdev NAME` and waits until the Device is gone; [`stays_gone`] checks it does not
//! come back; [`keys_left`] lists what the device still has in the buckets (nothing, once retired); [`tombstone`]
//! reads its `device-retired` value; [`enrol_again`] creates its Device with the enrolment annotation.

use crate::cluster::Cluster;
use fleet_rig::nats_client::Connection;
use fleet_wire::kv;
use std::time::{Duration, Instant};

/// The finalizer the operator keeps on every Device (fleet-operator's `crd::RETIRE_FINALIZER`).
pub const FINALIZER: &str = "fleet.nationtech.io/retire";
/// The enrolment annotation (fleet-operator's `crd::ENROL_ANNOTATION`).
pub const ENROL_ANNOTATION: &str = "fleet.nationtech.io/enrol";
/// How long a retirement takes at most once the operator sees the deletion (tombstone, keys, finalizer: well under
/// a second on a test machine; the rest is slack for a loaded one).
pub const RETIRE_WITHIN: Duration = Duration::from_secs(60);

/// Retires device `name`: `kubectl delete fdev NAME --wait=false` (the documented step), then waits until the
/// Device is gone (the operator recorded its tombstone, deleted its keys and removed its finalizer). Returns how
/// long that took.
pub fn retire(c: &Cluster, name: &str) -> Duration {
    let started = Instant::now();
    c.kubectl(&["delete", "fdev", name, "--wait=false"]);
    c.wait(
        &format!("Device {name} retired (gone from kubectl get fdev)"),
        RETIRE_WITHIN,
        || gone(c, name).then_some(()),
    );
    started.elapsed()
}

/// True when `kubectl get fdev NAME` says it is not found.
pub fn gone(c: &Cluster, name: &str) -> bool {
    match c.try_kubectl(&["get", "fdev", name, "-o", "name"]) {
        Ok(_) => false,
        Err(e) => e.contains("NotFound") || e.contains("not found"),
    }
}

/// Checks every 2 s for `span` that Device `name` stays gone (the device may still be reporting meanwhile); fails
/// the test, with the operator's log, the moment it is back.
pub fn stays_gone(c: &Cluster, name: &str, span: Duration) {
    let until = Instant::now() + span;
    while Instant::now() < until {
        assert!(
            gone(c, name),
            "Device {name} is back after its retirement: {:?}\n--- fleet-operator log ---\n{}",
            c.try_kubectl(&["get", "fdev", name, "-o", "yaml"]),
            c.operator_log(60)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The keys device `device` still holds a value under, in every per-device bucket of the layout
/// (`bucket/key`), read on `conn` (a services' connection: [`fleet_rig::callout::FleetNats::connect`]). Empty once
/// it is retired. A bucket that does not exist is skipped.
pub fn keys_left(conn: &Connection, device: &str) -> Vec<String> {
    let js = fleet_rig::nats_client::jetstream::new(conn.clone());
    let mut left = Vec::new();
    for spec in kv::per_device_buckets() {
        let Ok(store) = js.key_value(spec.name) else {
            continue;
        };
        let keys: Vec<String> = match spec.key {
            kv::KeyShape::Device => vec![device.to_owned()],
            _ => store
                .keys()
                .map(|k| k.filter(|k| k.starts_with(&format!("{device}."))).collect())
                .unwrap_or_default(),
        };
        for k in keys {
            if matches!(store.get(&k), Ok(Some(v)) if !v.is_empty()) {
                left.push(format!("{}/{k}", spec.name));
            }
        }
    }
    left
}

/// The device's tombstone in `device-retired`, if it has one.
pub fn tombstone(conn: &Connection, device: &str) -> Option<fleet_wire::DeviceRetirement> {
    let js = fleet_rig::nats_client::jetstream::new(conn.clone());
    let raw = js.key_value(kv::DEVICE_RETIRED).ok()?.get(device).ok()??;
    serde_json::from_slice(&raw).ok()
}

/// Waits until device `device` holds no key in any per-device bucket (its retirement deleted them; keys it wrote
/// after its tombstone are deleted again within the operator's sweep, 30 s).
pub fn wait_keys_gone(c: &Cluster, conn: &Connection, device: &str) {
    c.wait(
        &format!("every key of retired device {device} deleted"),
        RETIRE_WITHIN,
        || keys_left(conn, device).is_empty().then_some(()),
    );
}

/// Enrols retired device `name` again, as docs/device-lifecycle.md says: creates its Device with the enrolment
/// annotation and `labels`, then waits until the operator lifted the tombstone (read on `conn`).
pub fn enrol_again(c: &Cluster, conn: &Connection, name: &str, labels: &[(&str, &str)]) {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
        .collect();
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!("  labels:\n{labels}")
    };
    c.create(&format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: {name}\n  annotations:\n    \
         {ENROL_ANNOTATION}: \"true\"\n{labels}spec: {{}}\n"
    ));
    c.wait(
        &format!("the tombstone of {name} lifted"),
        RETIRE_WITHIN,
        || tombstone(conn, name).is_none().then_some(()),
    );
}
