//! The operator's validating admission webhook, served over HTTPS (rustls), `operator/deploy/webhook.yaml`
//! registers it (in a cluster, in the demo and in the tests alike). Two checks, one path each: [`FIELDS_PATH`]
//! refuses unknown fields in every fleet object ([`crate::schema`]) and invalid fleet-wire parts (workloads, release
//! builds, a schedule: open in the CRD schema), [`crate::tasks::webhook::PATH`] refuses changes to a TaskRun's spec.
//! The operator does not rely on it: it refuses to act on such objects by itself (`crate::cache`,
//! [`crate::tasks::status::spec_check`]).

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

/// The unknown-field check of one `AdmissionReview` (pure): refused when the new object has a field its kind's
/// schema does not know, naming every such field; objects of other kinds, and deletes, are allowed.
pub fn fields_review(request: &Value) -> Value {
    let uid = request.pointer("/request/uid");
    let kind = request
        .pointer("/request/kind/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (Some(root), Some(object)) = (crate::schema::of(kind), request.pointer("/request/object"))
    else {
        return answer(uid, None);
    };
    let name = object
        .pointer("/metadata/name")
        .or_else(|| request.pointer("/request/name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let unknown = crate::schema::unknown_fields(root, object);
    let message = if !unknown.is_empty() {
        crate::schema::denial(kind, name, root, &unknown)
    } else if let Some(problem) = wire_problems(kind, object) {
        format!("{kind} {name:?}: {problem}")
    } else {
        return answer(uid, None);
    };
    log::info!("admission refused: {message}");
    answer(uid, Some(&message))
}

/// What is wrong in the parts of a spec whose shape is a fleet-wire contract (open in the CRD schema: workloads,
/// release builds, a schedule), validated exactly as the operator validates them, so that a typo inside them is
/// refused too instead of becoming an `InvalidSpec` condition later. `None`: valid, or not such a kind.
fn wire_problems(kind: &str, object: &Value) -> Option<String> {
    let spec = object.get("spec")?;
    match kind {
        "FleetDeployment" => {
            let s: crate::crd::FleetDeploymentSpec = serde_json::from_value(spec.clone()).ok()?;
            crate::deployments::validate::deployment_workloads(&s)
                .err()
                .map(|e| format!("spec.{e}"))
        }
        "AgentRelease" => {
            let s: crate::crd::AgentReleaseSpec = serde_json::from_value(spec.clone()).ok()?;
            crate::deployments::validate::release_builds(&s)
                .err()
                .map(|e| format!("spec.{e}"))
        }
        "TaskSchedule" => crate::tasks::schedule::Schedule::parse(spec.get("schedule")?)
            .err()
            .map(|e| format!("spec.{e}")),
        _ => None,
    }
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

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let check: fn(&Value) -> Value = match req.uri().path() {
        FIELDS_PATH => fields_review,
        crate::tasks::webhook::PATH => crate::tasks::webhook::review,
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
        Ok(v) if v.pointer("/request/uid").is_some() => Ok(respond(StatusCode::OK, check(&v))),
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

/// Serves the webhook on `listener` over TLS until the task is dropped.
pub async fn serve(listener: TcpListener, tls: rustls::ServerConfig) {
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
                .serve_connection(TokioIo::new(tls), service_fn(handle));
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
                Some("FleetDeployment \"d\": spec.workloads[0]: "),
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
                Some("FleetDeployment \"d\": spec.workloads[0]: unknown field `retrys`"),
            ),
            (
                req(
                    "TaskSchedule",
                    json!({"metadata": {"name": "s"}, "spec": {"schedule": {"daily": {"at": "03:00"}, "cron": "0 3 * * *"},
                           "template": {"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}}}),
                ),
                Some("TaskSchedule \"s\": spec.schedule must be exactly one of daily, weekly, yearly or cron, always UTC (there is no time-zone field); it has cron, daily"),
            ),
            (
                req(
                    "AgentRelease",
                    json!({"metadata": {"name": "r"}, "spec": {"allowedGroups": ["g"], "builds": [{"architecture": "amd64",
                           "version": "1.2.0", "artifact": "https://example.com/a", "sha256": "xyz", "byteLimit": 10}]}}),
                ),
                Some("AgentRelease \"r\": spec.builds[0].sha256: "),
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
            let out = fields_review(r);
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
}
