//! The dashboard's HTTP side: routing, token check, read-only (GET and HEAD only), every answer built from the
//! shared [`State`]. Pages carry a Content-Security-Policy that allows no script at all.

use super::auth::Token;
use super::html::{page, url_decode};
use super::state::State;
use super::{device, metrics, overview, reboots, rollouts, runs};
use bytes::Bytes;
use fleet_wire::{AttemptId, DeviceId, Timestamp};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::runtime::reflector::ObjectRef;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Connections served at once; more are closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Largest request head.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client may take to send its request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Highest page number accepted in `?page=`.
const MAX_PAGE: usize = 1_000_000;

type Resp = Response<Full<Bytes>>;

fn respond(code: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'"),
    );
    r
}

fn html(code: StatusCode, body: String) -> Resp {
    respond(code, "text/html; charset=utf-8", body)
}

fn not_found(what: &str) -> Resp {
    html(
        StatusCode::NOT_FOUND,
        page("Not found", maud::html! { p { (what) } }),
    )
}

/// The value of query parameter `key`.
fn query(q: Option<&str>, key: &str) -> Option<String> {
    q?.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| url_decode(v))
}

fn page_param(q: Option<&str>) -> usize {
    query(q, "page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_PAGE)
}

/// Answers one request.
pub async fn handle(
    state: Arc<State>,
    token: Arc<Token>,
    req: Request<Incoming>,
) -> Result<Resp, Infallible> {
    let path = req.uri().path().to_owned();
    if path == "/healthz" {
        return Ok(respond(StatusCode::OK, "text/plain", "ok\n"));
    }
    if !token.accepts(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes())) {
        let mut r = respond(
            StatusCode::UNAUTHORIZED,
            "text/plain; charset=utf-8",
            "the dashboard needs its token: Authorization: Bearer <token>, or as the Basic password\n",
        );
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Basic realm=\"Harmony Fleet dashboard\", charset=\"UTF-8\""),
        );
        return Ok(r);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "read-only: GET only\n",
        );
        r.headers_mut()
            .insert("allow", HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    let q = req.uri().query().map(str::to_owned);
    let q = q.as_deref();
    let now = Timestamp::now();
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| url_decode(s).unwrap_or_default())
        .collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let resp = match seg.as_slice() {
        [] => html(
            StatusCode::OK,
            overview::render(
                &overview::Objects {
                    devices: &state.devices.state(),
                    groups: &state.groups.state(),
                    runs: &state.runs.state(),
                    releases: &state.releases.state(),
                    deployments: &state.deployments.state(),
                    version_history: &state.version_samples(),
                },
                &state.alerts(),
                &|d| state.last_heartbeat(d),
                now,
            ),
        ),
        ["alerts"] => {
            let body = overview::alert_list(&state.alerts(), now);
            html(StatusCode::OK, page("Alerts", body))
        }
        ["devices"] => html(
            StatusCode::OK,
            device::list(
                &state.devices.state(),
                page_param(q),
                query(q, "phase").as_deref(),
                &|d| state.last_heartbeat(d),
                now,
            ),
        ),
        ["devices", name] => {
            let Ok(id) = DeviceId::try_from(*name) else {
                return Ok(not_found("not a device id"));
            };
            let Some(d) = state.devices.get(&ObjectRef::new(id.as_str())) else {
                return Ok(not_found(&format!("no Device {id}")));
            };
            let kv = device::read(&state, &id, &state.runs.state()).await;
            html(
                StatusCode::OK,
                device::render(&d, &kv, &state.alerts(), now),
            )
        }
        ["runs"] => html(
            StatusCode::OK,
            runs::list(&state.runs.state(), page_param(q), &state.alerts(), now),
        ),
        ["runs", ns, name] => {
            let Some(r) = state.runs.get(&ObjectRef::new(name).within(ns)) else {
                return Ok(not_found(&format!("no TaskRun {ns}/{name}")));
            };
            let page = page_param(q);
            let uid = r
                .metadata
                .uid
                .as_deref()
                .and_then(|u| AttemptId::try_from(u).ok());
            let plan = match (state.buckets(), uid) {
                (Err(e), _) => Err(e.to_string()),
                (_, None) => Ok(None),
                (Ok(b), Some(uid)) => runs::read_plan_page(&b, &uid, page)
                    .await
                    .map_err(|e| e.to_string()),
            };
            html(
                StatusCode::OK,
                runs::render(&r, plan, page, &state.alerts(), now),
            )
        }
        ["releases"] => html(StatusCode::OK, rollouts::releases(&state.releases.state())),
        // AgentRelease and FleetDeployment are cluster-scoped: a name is the whole key.
        ["releases", name] => {
            let Some(r) = state.releases.get(&ObjectRef::new(name)) else {
                return Ok(not_found(&format!("no AgentRelease {name}")));
            };
            let upgrade_of = |id: &DeviceId| {
                let d = state.devices.get(&ObjectRef::new(id.as_str()))?;
                let u = d.status.as_ref()?.agent_upgrade.as_ref()?;
                let phase = crate::fleet::rollout::phase_word(u.phase);
                Some(match u.reason {
                    Some(reason) => format!("{phase}: {}", super::html::name(&reason)),
                    None => phase,
                })
            };
            html(StatusCode::OK, rollouts::release(&r, &upgrade_of, now))
        }
        ["deployments"] => html(
            StatusCode::OK,
            rollouts::deployments(&state.deployments.state()),
        ),
        ["deployments", name] => {
            let Some(d) = state.deployments.get(&ObjectRef::new(name)) else {
                return Ok(not_found(&format!("no FleetDeployment {name}")));
            };
            html(StatusCode::OK, rollouts::deployment(&d, now))
        }
        ["reboots"] => {
            let view = state.fleetlock();
            let names = super::holder_devices::Holders::of_view(view.as_ref(), &state);
            html(
                StatusCode::OK,
                reboots::render(view.as_ref(), &names, &state.alerts(), now),
            )
        }
        ["metrics"] => respond(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            metrics::render(&state),
        ),
        _ => not_found("no such page"),
    };
    Ok(resp)
}

/// Serves the dashboard on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<State>, token: Arc<Token>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                log::warn!("dashboard: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            log::warn!(
                "dashboard: more than {MAX_CONNECTIONS} connections: closing one from {peer}"
            );
            continue;
        };
        let (state, token) = (state.clone(), token.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(state.clone(), token.clone(), req));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                log::debug!("dashboard: connection from {peer}: {e}");
            }
            drop(permit);
        });
    }
}
