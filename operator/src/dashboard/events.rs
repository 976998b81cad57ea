//! Alerts as Kubernetes events: one Warning event when an alert appears, regarding the Device or TaskRun it is
//! about; FleetLock alerts, which concern no fleet object, regard the operator's own Pod.

use super::alerts::{Alert, Subject};
use crate::crd::tasks::TaskRun;
use crate::crd::Device;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

/// Where the operator runs, for events about the FleetLock server.
#[derive(Debug, Clone)]
pub struct OwnPod {
    /// `POD_NAME` (default `fleet-operator`).
    pub name: String,
    /// `POD_NAMESPACE` (default `default`).
    pub namespace: String,
}

/// The object `a` regards: the cached object's own reference (kind, name, namespace, uid), so that `kubectl
/// describe` finds the event; by name alone while the object is not cached.
fn reference(
    a: &Alert,
    pod: &OwnPod,
    devices: &Store<Device>,
    runs: &Store<TaskRun>,
) -> ObjectReference {
    match &a.subject {
        Subject::Device(name) | Subject::Workload { device: name, .. } => devices
            .get(&ObjectRef::new(name))
            .map(|d| d.object_ref(&()))
            .unwrap_or_else(|| Device::new(name, Default::default()).object_ref(&())),
        Subject::Run { namespace, name } => runs
            .get(&ObjectRef::new(name).within(namespace))
            .map(|r| r.object_ref(&()))
            .unwrap_or_else(|| {
                let mut r = TaskRun::new(
                    name,
                    crate::crd::tasks::TaskRunSpec {
                        placement: Default::default(),
                        deadline_seconds: 1,
                        system_upgrade_v1: Default::default(),
                    },
                )
                .object_ref(&());
                r.namespace = Some(namespace.clone());
                r
            }),
        Subject::Holder { .. } | Subject::FleetLock => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
    }
}

/// Publishes one Warning event for `a` (best effort: the dashboard and metrics carry the same alert).
pub async fn publish(
    client: &kube::Client,
    recorder: &Recorder,
    a: &Alert,
    pod: &OwnPod,
    devices: &Store<Device>,
    runs: &Store<TaskRun>,
) {
    let mut note = format!("{}: {}. {}", a.kind.title(), a.subject, a.detail);
    // The Events API bounds a note at 1 KiB.
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    let ev = Event {
        type_: EventType::Warning,
        reason: a.kind.as_str().into(),
        note: Some(note),
        action: "Alert".into(),
        secondary: None,
    };
    let reference = reference(a, pod, devices, runs);
    let published = match &a.subject {
        // cluster-scoped: recorded so that `kubectl describe` finds it (see crate::fleet::report)
        Subject::Device(_) | Subject::Workload { .. } => {
            crate::fleet::report::publish_cluster_scoped(client, recorder, &ev, &reference).await
        }
        _ => recorder.publish(&ev, &reference).await,
    };
    if let Err(e) = published {
        log::warn!("alert event {} for {}: {e}", a.kind.as_str(), a.subject);
    }
}
