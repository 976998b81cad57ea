//! The TaskRun validating admission webhook, served over HTTPS (rustls): refuses any change to a TaskRun's spec
//! (the run UID identifies one immutable plan and operation). The 1.20 API server has no CEL, so immutability is
//! enforced here; `operator/deploy/webhook.yaml` registers it.

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

/// The path the API server posts `AdmissionReview`s to.
pub const PATH: &str = "/validate-taskrun";
/// Largest request body: an AdmissionReview holds the old and the new TaskRun, both small.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Time for the TLS handshake, the request head and the body, each.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections served at once; more are closed right away.
pub const MAX_CONNECTIONS: usize = 256;

/// The answer to one `AdmissionReview` request (pure): allowed unless an UPDATE changes `spec`.
pub fn review(request: &Value) -> Value {
    let uid = request
        .pointer("/request/uid")
        .cloned()
        .unwrap_or(Value::Null);
    let op = request
        .pointer("/request/operation")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let new = request.pointer("/request/object/spec");
    let old = request.pointer("/request/oldObject/spec");
    let denied = op == "UPDATE" && new != old;
    let mut response = json!({"uid": uid, "allowed": !denied});
    if denied {
        response["status"] = json!({
            "code": 403,
            "reason": "Forbidden",
            "message": "TaskRun spec is immutable: its UID names one frozen target plan and operation; create a new TaskRun instead",
        });
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
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

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.method() != Method::POST || req.uri().path() != PATH {
        return Ok(respond(
            StatusCode::NOT_FOUND,
            json!({"error": format!("POST AdmissionReview to {PATH}")}),
        ));
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
        Ok(v) if v.pointer("/request/uid").is_some() => Ok(respond(StatusCode::OK, review(&v))),
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

    #[test]
    fn review_table() {
        let spec = json!({"allowedGroups": ["p"], "targetSelector": {}, "deadlineSeconds": 60, "systemUpgradeV1": {}});
        let mut changed = spec.clone();
        changed["deadlineSeconds"] = json!(61);
        let req = |op: &str, new: &Value, old: Option<&Value>| {
            let mut r =
                json!({"request": {"uid": "u-1", "operation": op, "object": {"spec": new}}});
            if let Some(o) = old {
                r["request"]["oldObject"] = json!({"spec": o});
            }
            r
        };
        let cases = [
            (req("CREATE", &spec, None), true),
            (req("UPDATE", &spec, Some(&spec)), true),
            (req("UPDATE", &changed, Some(&spec)), false),
            (req("DELETE", &spec, Some(&changed)), true),
        ];
        for (i, (r, allowed)) in cases.iter().enumerate() {
            let out = review(r);
            assert_eq!(out["response"]["uid"], "u-1", "case {i}");
            assert_eq!(out["response"]["allowed"], *allowed, "case {i}");
            assert_eq!(out["kind"], "AdmissionReview");
        }
        let denied = review(&cases[2].0);
        assert!(denied["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("immutable")));
    }
}
