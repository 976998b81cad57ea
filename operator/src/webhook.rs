//! The operator's validating admission webhook, served over HTTPS (rustls), `operator/deploy/webhook.yaml`
//! registers it (in a cluster, in the demo and in the tests alike). Two checks, one path each: [`FIELDS_PATH`]
//! refuses a fleet object with every problem at once, each by its full path ([`crate::validation`], the very
//! functions the operator validates with: unknown fields, values that do not decode, the kind's own rules), and
//! FleetDeployments whose hardware and privileges no WorkloadPolicy allows ([`crate::deployments::policy`], read
//! from the operator's own policy cache); [`crate::tasks::webhook::PATH`] refuses changes to a TaskRun's spec. The
//! operator does not rely on it: it refuses to act on such objects by itself, naming the same problems
//! (`InvalidSpec`, [`crate::tasks::status::spec_check`], the planner's `NotAllowed`).

use crate::cache::Shared;
use crate::crd::policy::WorkloadPolicy;
use crate::deployments::policy;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The path of the unknown-field check (every fleet kind, CREATE and UPDATE).
pub const FIELDS_PATH: &str = "/validate-fields";
/// Largest request body: an AdmissionReview holds the old and the new object, both small.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Time for the TLS handshake, the request head and the body, each.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections served at once; more are closed right away.
pub const MAX_CONNECTIONS: usize = 256;

/// The `AdmissionReview` answer for request `uid`: allowed, or refused with `denial` (HTTP 403 in the status the
/// API server shows the client).
pub fn answer(uid: Option<&Value>, denial: Option<&str>) -> Value {
    let mut response =
        json!({"uid": uid.cloned().unwrap_or(Value::Null), "allowed": denial.is_none()});
    if let Some(message) = denial {
        response["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// The check of one `AdmissionReview` of a fleet object (pure): refused with every problem at once, each named by
/// its full path (`FleetDeployment "d": spec.rollout.soakSeconds: …; spec.rollout.maxUnavailable: …`): fields its
/// kind's schema does not know, values that do not decode, the kind's own rules ([`crate::validation::problems`],
/// the same the operator applies), a changed spec of a kind whose spec is immutable (DeviceDiagnostics), and (a
/// FleetDeployment) hardware or privileges that `policies` do not allow (`None`: the policy cache has not synced,
/// and a deployment that needs a policy is refused, fail closed). Objects of other kinds, and deletes, are allowed.
pub fn fields_review(request: &Value, policies: Option<&[Arc<WorkloadPolicy>]>) -> Value {
    let uid = request.pointer("/request/uid");
    let kind = request
        .pointer("/request/kind/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (Some(_), Some(object)) = (crate::schema::of(kind), request.pointer("/request/object"))
    else {
        return answer(uid, None);
    };
    if object.is_null() {
        return answer(uid, None);
    }
    let name = object
        .pointer("/metadata/name")
        .or_else(|| request.pointer("/request/name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if unchanged_but_metadata(request, object) {
        return answer(uid, None);
    }
    let problems = review_problems(kind, request, object, policies);
    if problems.is_empty() {
        return answer(uid, None);
    }
    let message = format!("{kind} {name:?}: {}", problems.join("; "));
    log::info!("admission refused: {message}");
    answer(uid, Some(&message))
}

/// True for an update that changes nothing but `metadata` (labels, annotations, finalizers) and `status`: the object
/// is as it was stored, so it is not checked again. Refusing it would change nothing about its problems (the
/// operator names them in its condition) and would keep a finalizer from being removed, and an object stored before
/// the webhook from being deleted.
fn unchanged_but_metadata(request: &Value, object: &Value) -> bool {
    let Some(old) = request
        .pointer("/request/oldObject")
        .and_then(Value::as_object)
    else {
        return false;
    };
    let Some(new) = object.as_object() else {
        return false;
    };
    let rest = |m: &serde_json::Map<String, Value>| -> Vec<(String, Value)> {
        m.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    rest(old) == rest(new)
}

/// Every problem [`fields_review`] refuses `object` for.
fn review_problems(
    kind: &str,
    request: &Value,
    object: &Value,
    policies: Option<&[Arc<WorkloadPolicy>]>,
) -> Vec<String> {
    if kind == "DeviceDiagnostics" && request.pointer("/request/oldObject/spec").is_some() {
        // The spec was checked when the object was created and cannot change since: only that is checked, so that
        // an old object stays deletable and its metadata editable.
        return crate::diagnostics::admission::problem(request)
            .into_iter()
            .collect();
    }
    let mut problems = crate::validation::problems(kind, object);
    problems.extend(policy_problems(kind, request, object, policies));
    problems
}

/// Why the WorkloadPolicies do not allow a FleetDeployment's hardware and privileges (checked when its every
/// workload decodes, whatever else is wrong with it); `None`: allowed, nothing needs a policy, or not a
/// FleetDeployment. An update that leaves the spec as it was is not checked again, so that a deployment a narrowed
/// policy no longer allows can still be labelled, annotated (a retry) or have its finalizers removed; the operator
/// holds it either way (`NotAllowed`).
fn policy_problems(
    kind: &str,
    request: &Value,
    object: &Value,
    policies: Option<&[Arc<WorkloadPolicy>]>,
) -> Option<String> {
    if kind != "FleetDeployment" {
        return None;
    }
    let spec = object.get("spec")?;
    if request.pointer("/request/oldObject/spec") == Some(spec) {
        return None;
    }
    let workloads: Vec<fleet_wire::WorkloadSpec> = spec
        .get("workloads")?
        .as_array()?
        .iter()
        .map(|w| serde_json::from_value(w.clone()).ok())
        .collect::<Option<_>>()?;
    if !policy::needs_policy(&workloads) {
        return None;
    }
    let Some(policies) = policies else {
        return Some(
            "its workloads ask for hardware or privileges that need a WorkloadPolicy, and the operator has not \
             read the WorkloadPolicies yet (its cache has not synced); try again shortly"
                .into(),
        );
    };
    let allowed_groups: Vec<String> = spec
        .get("allowedGroups")
        .and_then(|g| serde_json::from_value(g.clone()).ok())
        .unwrap_or_default();
    let views: Vec<policy::Policy> = policies.iter().map(|p| policy::Policy::of(p)).collect();
    let d = policy::Deployment {
        namespace: object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str),
        allowed_groups: &allowed_groups,
        workloads: &workloads,
    };
    policy::check(&d, &views).err()
}

/// The server's TLS configuration from PEM files (certificate chain, private key).
pub fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("webhook certificate {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("webhook key {}: {e}", key.display()))?;
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| format!("webhook TLS: {e}"))
}

fn respond(code: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn not_found() -> Response<Full<Bytes>> {
    respond(
        StatusCode::NOT_FOUND,
        json!({"error": format!("POST an AdmissionReview to {FIELDS_PATH} or {}", crate::tasks::webhook::PATH)}),
    )
}

/// Which check a path asks for.
#[derive(Clone, Copy)]
enum Check {
    Fields,
    TaskRun,
}

async fn handle(
    req: Request<Incoming>,
    policies: Shared<WorkloadPolicy>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let check = match req.uri().path() {
        FIELDS_PATH => Check::Fields,
        crate::tasks::webhook::PATH => Check::TaskRun,
        _ => return Ok(not_found()),
    };
    if req.method() != Method::POST {
        return Ok(not_found());
    }
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES);
    let bytes = match tokio::time::timeout(READ_TIMEOUT, body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => {
            return Ok(respond(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": format!("body: {e} (at most {MAX_BODY_BYTES} bytes)")}),
            ))
        }
        Err(_) => {
            return Ok(respond(
                StatusCode::REQUEST_TIMEOUT,
                json!({"error": format!("body not received within {READ_TIMEOUT:?}")}),
            ))
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if v.pointer("/request/uid").is_some() => {
            let answer = match check {
                Check::Fields => {
                    let current = policies.synced().then(|| policies.state());
                    fields_review(&v, current.as_deref())
                }
                Check::TaskRun => crate::tasks::webhook::review(&v),
            };
            Ok(respond(StatusCode::OK, answer))
        }
        Ok(_) => Ok(respond(
            StatusCode::BAD_REQUEST,
            json!({"error": "not an AdmissionReview request"}),
        )),
        Err(e) => Ok(respond(
            StatusCode::BAD_REQUEST,
            json!({"error": format!("invalid JSON: {e}")}),
        )),
    }
}

/// Serves the webhook on `listener` over TLS until the task is dropped, reading the WorkloadPolicies from
/// `policies` (the operator's cache of them: `crate::cache::Caches::policies`).
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    policies: Shared<WorkloadPolicy>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                log::warn!("webhook accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let acceptor = acceptor.clone();
        let policies = policies.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(READ_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    log::debug!("webhook TLS from {peer}: {e}");
                    return;
                }
                Err(_) => return,
            };
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .max_buf_size(16 * 1024)
                .serve_connection(
                    TokioIo::new(tls),
                    service_fn(move |req| handle(req, policies.clone())),
                );
            if let Err(e) = conn.await {
                log::debug!("webhook connection from {peer}: {e}");
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: &str, object: Value) -> Value {
        json!({"request": {"uid": "u-1", "kind": {"group": "fleet.nationtech.io", "version": "v1alpha1", "kind": kind},
               "operation": "CREATE", "object": object}})
    }

    #[test]
    fn fields_review_table() {
        let cases = [
            (
                req(
                    "DeviceGroup",
                    json!({"metadata": {"name": "g"}, "spec": {"selectAll": true}}),
                ),
                None,
            ),
            (
                req(
                    "DeviceGroup",
                    json!({"metadata": {"name": "g"}, "spec": {"devicez": ["dev-2"], "selector": {}}}),
                ),
                Some("DeviceGroup \"g\": unknown field spec.devicez"),
            ),
            (
                req(
                    "FleetDeployment",
                    json!({"metadata": {"name": "d"}, "spec": {"allowedGroups": [], "workloads": [], "extra": 1, "more": 2}}),
                ),
                Some("FleetDeployment \"d\": unknown fields spec.extra, spec.more"),
            ),
            // inside the fleet-wire parts, validated as the operator validates them
            (
                req(
                    "FleetDeployment",
                    json!({"metadata": {"name": "d"}, "spec": {"allowedGroups": ["g"], "workloads": [{"name": "w", "imag": "x"}]}}),
                ),
                Some("FleetDeployment \"d\": spec.workloads[0].imag: unknown field `imag`, expected one of `name`, `image`"),
            ),
            // a health check: accepted when valid, refused with the field's path otherwise
            (
                req(
                    "FleetDeployment",
                    json!({"metadata": {"name": "d"}, "spec": {"allowedGroups": ["g"], "workloads": [{"name": "w", "image": "nginx:1",
                           "ports": [{"hostPort": 8080, "containerPort": 80}],
                           "healthCheck": {"http": {"port": 80, "path": "/healthz"}, "intervalSeconds": 10}}]}}),
                ),
                None,
            ),
            (
                req(
                    "FleetDeployment",
                    json!({"metadata": {"name": "d"}, "spec": {"allowedGroups": ["g"], "workloads": [{"name": "w", "image": "nginx:1",
                           "healthCheck": {"tcp": {"port": 5432}, "intervalSeconds": 1}}]}}),
                ),
                Some("FleetDeployment \"d\": spec.workloads[0]: invalid workload: w: healthCheck.intervalSeconds: 1 is outside 5–3600"),
            ),
            (
                req(
                    "FleetDeployment",
                    json!({"metadata": {"name": "d"}, "spec": {"allowedGroups": ["g"], "workloads": [{"name": "w", "image": "nginx:1",
                           "healthCheck": {"command": ["pg_isready"], "retrys": 3}}]}}),
                ),
                Some("FleetDeployment \"d\": spec.workloads[0].healthCheck.retrys: unknown field `retrys`"),
            ),
            (
                req(
                    "TaskSchedule",
                    json!({"metadata": {"name": "s"}, "spec": {"schedule": {"daily": {"at": "03:00"}, "cron": "0 3 * * *"},
                           "template": {"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}}}),
                ),
                Some("TaskSchedule \"s\": spec.schedule: must be exactly one of daily, weekly, yearly or cron, always UTC (there is no time-zone field); it has cron, daily"),
            ),
            (
                req(
                    "AgentRelease",
                    json!({"metadata": {"name": "r"}, "spec": {"allowedGroups": ["g"], "builds": [{"architecture": "amd64",
                           "version": "1.2.0", "artifact": "https://example.com/a", "sha256": "xyz", "byteLimit": 10}]}}),
                ),
                Some("AgentRelease \"r\": spec.builds[0].sha256: "),
            ),
            // an update that changes only metadata (a finalizer removed) is not checked again; one that changes
            // the spec is
            (
                json!({"request": {"uid": "u-1", "kind": {"kind": "FleetDeployment"}, "operation": "UPDATE",
                    "object": {"metadata": {"name": "d"}, "spec": {"allowedGroups": [], "workloads": [], "extra": 1}},
                    "oldObject": {"metadata": {"name": "d", "finalizers": ["x"]},
                                  "spec": {"allowedGroups": [], "workloads": [], "extra": 1}}}}),
                None,
            ),
            (
                json!({"request": {"uid": "u-1", "kind": {"kind": "FleetDeployment"}, "operation": "UPDATE",
                    "object": {"metadata": {"name": "d"}, "spec": {"allowedGroups": ["g"], "workloads": [], "extra": 1}},
                    "oldObject": {"metadata": {"name": "d"}, "spec": {"allowedGroups": [], "workloads": [], "extra": 1}}}}),
                Some("FleetDeployment \"d\": unknown field spec.extra "),
            ),
            // not ours, or nothing to check
            (
                req("ConfigMap", json!({"data": {"x": "y"}, "extra": 1})),
                None,
            ),
            (
                json!({"request": {"uid": "u-1", "kind": {"kind": "Device"}, "operation": "DELETE", "object": null}}),
                None,
            ),
        ];
        for (i, (r, denied)) in cases.iter().enumerate() {
            let out = fields_review(r, Some(&[]));
            assert_eq!(out["response"]["uid"], "u-1", "case {i}");
            assert_eq!(out["kind"], "AdmissionReview", "case {i}");
            assert_eq!(out["response"]["allowed"], denied.is_none(), "case {i}");
            if let Some(frag) = denied {
                let m = out["response"]["status"]["message"]
                    .as_str()
                    .unwrap_or_default();
                assert!(m.starts_with(frag), "case {i}: {m}");
                assert_eq!(out["response"]["status"]["code"], 403);
            }
        }
    }

    fn deployment(spec: Value) -> Value {
        req(
            "FleetDeployment",
            json!({"metadata": {"name": "d"}, "spec": spec}),
        )
    }

    fn policy(name: &str, spec: Value) -> Arc<WorkloadPolicy> {
        Arc::new(WorkloadPolicy::new(
            name,
            serde_json::from_value(spec).expect("policy spec"),
        ))
    }

    fn verdict(out: &Value) -> Result<(), String> {
        match out["response"]["allowed"].as_bool() {
            Some(true) => Ok(()),
            _ => Err(out["response"]["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()),
        }
    }

    #[test]
    fn policy_review_table() {
        let serial = json!({"allowedGroups": ["field"], "workloads": [{"name": "reader", "image": "busybox:1",
            "devices": ["/dev/ttyS0"], "capabilities": ["NET_ADMIN"]}]});
        let plain = json!({"allowedGroups": ["field"], "workloads": [{"name": "web", "image": "nginx:1",
            "volumes": [{"source": "html", "target": "/usr/share/nginx/html"}]}]});
        let host = json!({"allowedGroups": ["field"], "workloads": [{"name": "web", "image": "nginx:1",
            "volumes": [{"source": "/srv/html", "target": "/usr/share/nginx/html", "readOnly": true}]}]});
        let allows = policy(
            "serial",
            json!({"groups": ["field", "lab"], "devices": ["/dev/ttyS*"], "capabilities": ["NET_ADMIN"]}),
        );
        let narrow = policy(
            "narrow",
            json!({"groups": ["field"], "devices": ["/dev/ttyUSB*"]}),
        );
        let typo: Arc<WorkloadPolicy> = {
            // as the cache marks a policy with unknown fields
            let mut p = (*policy(
                "typo",
                json!({"groups": ["field"], "capabilities": ["NET_ADMIN"]}),
            ))
            .clone();
            crate::schema::mark_unknown(&mut p.metadata, &["spec.devicez".to_string()]);
            Arc::new(p)
        };
        // (what, request, the policies (`None`: cache not synced), verdict)
        type Case<'a> = (
            &'a str,
            Value,
            Option<Vec<Arc<WorkloadPolicy>>>,
            Result<(), &'a str>,
        );
        let cases: Vec<Case> = vec![
            ("no policy", deployment(serial.clone()), Some(vec![]),
                Err("FleetDeployment \"d\": spec.workloads[0] (reader): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [field]: no WorkloadPolicy applies")),
            ("allowed", deployment(serial.clone()), Some(vec![narrow.clone(), allows.clone()]), Ok(())),
            ("a narrower policy names what it allows", deployment(serial.clone()), Some(vec![narrow.clone()]),
                Err("WorkloadPolicy \"narrow\" allows devices [/dev/ttyUSB*] and capabilities [] only")),
            ("a policy with unknown fields allows nothing", deployment(serial.clone()), Some(vec![typo]),
                Err("no WorkloadPolicy applies, WorkloadPolicy \"typo\" is ignored: unknown field spec.devicez")),
            ("the cache not synced: refused, fail closed", deployment(serial.clone()), None,
                Err("the operator has not read the WorkloadPolicies yet")),
            ("nothing asked: no policy, even before the cache synced", deployment(plain.clone()), None, Ok(())),
            ("a host path needs a policy", deployment(host.clone()), Some(vec![allows.clone()]),
                Err("host path /srv/html (read-only) is not allowed for groups [field]: WorkloadPolicy \"serial\" allows hostPaths [] only")),
            ("an update that keeps the spec is not checked again",
                json!({"request": {"uid": "u-1", "kind": {"kind": "FleetDeployment"}, "operation": "UPDATE",
                    "object": {"metadata": {"name": "d", "labels": {"x": "y"}}, "spec": serial.clone()},
                    "oldObject": {"metadata": {"name": "d"}, "spec": serial.clone()}}}),
                Some(vec![]), Ok(())),
            ("an update that changes it is",
                json!({"request": {"uid": "u-1", "kind": {"kind": "FleetDeployment"}, "operation": "UPDATE",
                    "object": {"metadata": {"name": "d"}, "spec": serial.clone()},
                    "oldObject": {"metadata": {"name": "d"}, "spec": plain.clone()}}}),
                Some(vec![]), Err("no WorkloadPolicy applies")),
            // the policies themselves
            ("a valid policy", req("WorkloadPolicy", json!({"metadata": {"name": "p"},
                "spec": {"groups": ["field"], "devices": ["/dev/ttyUSB*"], "hostPaths": [{"path": "/srv", "readOnly": true}]}})),
                None, Ok(())),
            ("an unknown field in a policy", req("WorkloadPolicy", json!({"metadata": {"name": "p"},
                "spec": {"groups": ["field"], "device": ["/dev/ttyUSB0"]}})),
                None, Err("WorkloadPolicy \"p\": unknown field spec.device ")),
            ("an unknown field in a host path", req("WorkloadPolicy", json!({"metadata": {"name": "p"},
                "spec": {"groups": ["field"], "hostPaths": [{"path": "/srv", "readOnly": true, "recursive": true}]}})),
                None, Err("WorkloadPolicy \"p\": unknown field spec.hostPaths[0].recursive")),
            ("an invalid entry in a policy", req("WorkloadPolicy", json!({"metadata": {"name": "p"},
                "spec": {"groups": ["field"], "capabilities": ["CAP_SYS_ADMIN"]}})),
                None, Err("WorkloadPolicy \"p\": spec.capabilities[0]: capability \"CAP_SYS_ADMIN\" is written without CAP_")),
        ];
        for (what, r, policies, want) in cases {
            let out = fields_review(&r, policies.as_deref());
            match (verdict(&out), want) {
                (Ok(()), Ok(())) => {}
                (Err(m), Err(frag)) => assert!(m.contains(frag), "{what}: {m}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }
}
