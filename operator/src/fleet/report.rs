//! Writes to the Kubernetes API: status patches of fleet objects, Warning events for conditions that turned
//! False, and creation of Device objects for devices that reported in NATS.

use crate::conditions;
use crate::crd::{Device, DeviceSpec, DeviceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Field manager and event reporter name.
pub const MANAGER: &str = "fleet-operator";

/// The event reporter for this process (`instance`: e.g. the pod name, to tell replicas apart).
pub fn recorder(client: Client, instance: Option<String>) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: MANAGER.into(),
            instance,
        },
    )
}

/// Replaces the `status` of the cluster-scoped object `obj` and publishes one Warning event per
/// condition in `failing` (conditions that just turned bad).
pub async fn write_status<K, S>(
    client: &Client,
    recorder: &Recorder,
    obj: &K,
    status: &S,
    failing: &[&Condition],
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
    S: Serialize,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let reference = obj.object_ref(&());
    for c in failing {
        let ev = Event {
            type_: EventType::Warning,
            reason: c.reason.clone(),
            note: Some(c.message.clone()),
            action: match c.type_.as_str() {
                conditions::NATS_REACHABLE => "WriteNats".into(),
                conditions::DEGRADED => "Upgrade".into(),
                conditions::HALTED => "Rollout".into(),
                _ => "Place".into(),
            },
            secondary: None,
        };
        if let Err(e) = publish_cluster_scoped(client, recorder, &ev, &reference).await {
            // Events are best effort: the condition carries the same message.
            log::warn!("event {} for {name}: {e}", c.reason);
        }
    }
    let api: Api<K> = Api::all(client.clone());
    api.patch_status(&name, &PatchParams::default(), &replace_status(status)?)
        .await?;
    Ok(())
}

/// Records `ev` about the cluster-scoped object `reference` (kind, name, uid) so that `kubectl describe` shows
/// it: a core/v1 Event of the old form (no `eventTime`) in `default` whose `involvedObject` has no namespace, as
/// kubelets record Node events. 1.20 API servers refuse that for events of the new form (events.k8s.io): their
/// `regarding` must carry the event's namespace, and then `kubectl describe`, which looks for no namespace, never
/// finds them. `recorder` is kept for the reporter's name (the source component is [`MANAGER`]).
pub async fn publish_cluster_scoped(
    client: &Client,
    recorder: &Recorder,
    ev: &Event,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
) -> Result<(), kube::Error> {
    let _ = recorder;
    let now = k8s_openapi::jiff::Timestamp::now();
    let name = reference.name.clone().unwrap_or_default();
    publish_named(
        client,
        ev,
        reference,
        &format!("{name}.{:x}", now.as_nanosecond()),
    )
    .await
}

/// [`publish_cluster_scoped`] under the event name `event_name`: a second create of the same name is refused
/// (409), which lets replicas that decide the same event publish it once.
pub async fn publish_named(
    client: &Client,
    ev: &Event,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    event_name: &str,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut involved = reference.clone();
    involved.namespace = None;
    let event = CoreEvent {
        metadata: ObjectMeta {
            name: Some(event_name.to_owned()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: involved,
        type_: Some(
            match ev.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        reason: Some(ev.reason.clone()),
        message: ev.note.clone(),
        // An event of the old form (no eventTime): only for those does the API server accept the `default`
        // namespace for an object without one.
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        source: Some(EventSource {
            component: Some(MANAGER.into()),
            host: None,
        }),
        ..Default::default()
    };
    Api::<CoreEvent>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

/// A patch that replaces `status` whole. A merge patch would keep every key the new status lacks (an earlier
/// attempt's `reason` or `error`, a group's old `memberCount`), so a person would read fields that are no longer
/// true; JSON patch `add` on `/status` replaces the object (and creates it when absent).
pub fn replace_status<S: Serialize>(status: &S) -> Result<Patch<()>, kube::Error> {
    let value = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "add", "path": "/status", "value": value }
    ]))
    .map_err(kube::Error::SerdeError)?;
    Ok(Patch::Json(patch))
}

/// Creates the Device object `name` if it does not exist (a device that reported in NATS), with `labels` and the
/// retirement finalizer ([`crate::crd::RETIRE_FINALIZER`]); `hold`: with [`crate::crd::HOLD_ANNOTATION`] (the device
/// already has workloads placed).
pub async fn create_device(
    client: &Client,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    hold: bool,
) -> Result<(), kube::Error> {
    let api: Api<Device> = Api::all(client.clone());
    let mut device = Device::new(name, DeviceSpec::default());
    device.metadata.finalizers = Some(vec![crate::crd::RETIRE_FINALIZER.to_owned()]);
    if !labels.is_empty() {
        device.metadata.labels = Some(labels.clone());
    }
    if hold {
        device.metadata.annotations =
            Some([(crate::crd::HOLD_ANNOTATION.to_owned(), "true".to_owned())].into());
    }
    match api
        .create(
            &PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            &device,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: keys `new` lacks become `null`, so a merge
/// patch that must also carry a `resourceVersion` precondition still leaves no field of an earlier status behind.
/// Objects are compared key by key; anything else (arrays included) is replaced whole.
pub fn merge_diff(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) => {
                        out.insert(k.clone(), merge_diff(ov, nv));
                    }
                    None => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

/// Replaces a Device's mirrored status.
/// Returns the resourceVersion of the object written, when the API server's is a number (etcd's revision).
pub async fn write_device_status(
    client: &Client,
    name: &str,
    status: &DeviceStatus,
) -> Result<Option<u64>, kube::Error> {
    let api: Api<Device> = Api::all(client.clone());
    let written = api
        .patch_status(name, &PatchParams::default(), &replace_status(status)?)
        .await?;
    Ok(written
        .metadata
        .resource_version
        .and_then(|v| v.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::merge_diff;
    use serde_json::json;

    #[test]
    fn merge_diff_table() {
        let cases = [
            (json!({}), json!({"a": 1}), json!({"a": 1})),
            (json!({"a": 1, "b": 2}), json!({"a": 1}), json!({"b": null})),
            (
                json!({"run": {"reason": "GroupSourceError", "targets": 0}}),
                json!({"run": {"targets": 3}}),
                json!({"run": {"reason": null, "targets": 3}}),
            ),
            (json!({"c": [1, 2]}), json!({"c": [2]}), json!({"c": [2]})),
            (json!(null), json!({"a": 1}), json!({"a": 1})),
        ];
        for (i, (old, new, want)) in cases.iter().enumerate() {
            assert_eq!(&merge_diff(old, new), want, "case {i}");
            // applying the patch to old gives new
            let mut applied = old.clone();
            json_patch::merge(&mut applied, &merge_diff(old, new));
            assert_eq!(&applied, new, "case {i} applied");
        }
    }
}
