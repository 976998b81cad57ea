//! Request routing and the FleetLock protocol endpoints, status, metrics, health and admin release.

use super::server::App;
use super::state::{Op, OpResult, Releaser};
use super::store::Applied;
use super::{audit, auth};
use bytes::Bytes;
use fleet_wire::fleetlock::{
    validate_group, validate_id, AdminRelease, AuditAction, AuditRecord, ErrorBody, ErrorKind,
    GroupStatus, Holder, LockRequest, ServerStatus, ADMIN_RELEASE_PATH, MAX_BODY_BYTES,
    PRE_REBOOT_PATH, PROTOCOL_HEADER, STATUS_PATH, STEADY_STATE_PATH,
};
use fleet_wire::Timestamp;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

type Resp = Response<Full<Bytes>>;

/// An error answer: kind plus explanation.
struct Fail(ErrorKind, String);

fn respond(code: u16, content_type: &'static str, body: Vec<u8>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json<T: serde::Serialize>(code: u16, v: &T) -> Resp {
    respond(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

fn error_response(app: &App, f: Fail) -> Resp {
    app.metrics.error(f.0);
    json(
        f.0.http_status(),
        &ErrorBody {
            kind: f.0,
            value: f.1,
        },
    )
}

/// Handles one request; never fails at the HTTP level (errors are JSON answers).
pub async fn handle(
    app: Arc<App>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Resp, Infallible> {
    let path = req.uri().path().to_string();
    // Served under `path_prefix` (a base URL such as `https://host/fleetlock/`) as well as at the root.
    let config_prefix = app.config().path_prefix.clone();
    let routed = config_prefix
        .as_deref()
        .and_then(|p| path.strip_prefix(p))
        .filter(|rest| rest.starts_with('/'))
        .unwrap_or(&path);
    let (endpoint, post_only) = match routed {
        PRE_REBOOT_PATH => ("pre-reboot", true),
        STEADY_STATE_PATH => ("steady-state", true),
        ADMIN_RELEASE_PATH => ("admin-release", true),
        STATUS_PATH => ("status", false),
        "/metrics" => ("metrics", false),
        "/healthz" => ("healthz", false),
        _ => ("other", false),
    };
    let method_ok = if endpoint == "other" {
        true
    } else if post_only {
        req.method() == Method::POST
    } else {
        req.method() == Method::GET || req.method() == Method::HEAD
    };
    let result = if !method_ok {
        let mut r = error_response(
            &app,
            Fail(
                ErrorKind::MethodNotAllowed,
                format!("{} takes {}", path, if post_only { "POST" } else { "GET" }),
            ),
        );
        let allow = if post_only { "POST" } else { "GET, HEAD" };
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allow));
        Ok(r)
    } else {
        let ip = peer.ip().to_canonical().to_string();
        match endpoint {
            "pre-reboot" => protocol(&app, req, &ip, true).await,
            "steady-state" => protocol(&app, req, &ip, false).await,
            "admin-release" => admin_release(&app, req, &ip).await,
            "status" => {
                let hdr = authorization(&req);
                status(&app, hdr).await
            }
            "metrics" => metrics(&app).await,
            "healthz" => Ok(respond(200, "text/plain", b"ok\n".to_vec())),
            _ => Err(Fail(ErrorKind::NotFound, format!("no endpoint {path}"))),
        }
    };
    let resp = match result {
        Ok(r) => r,
        Err(f) => error_response(&app, f),
    };
    app.metrics.request(endpoint, resp.status().as_u16());
    Ok(resp)
}

async fn read_body(req: Request<Incoming>, timeout: std::time::Duration) -> Result<Bytes, Fail> {
    let too_large = || {
        Fail(
            ErrorKind::BodyTooLarge,
            format!("body longer than {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES);
    match tokio::time::timeout(timeout, body.collect()).await {
        Err(_) => Err(Fail(
            ErrorKind::Timeout,
            format!("request body not received within {timeout:?}"),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(Fail(ErrorKind::InvalidBody, format!("reading body: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

fn authorization(req: &Request<Incoming>) -> Option<Vec<u8>> {
    req.headers()
        .get(AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec())
}

fn unavailable(e: impl std::fmt::Display) -> Fail {
    Fail(ErrorKind::StoreUnavailable, e.to_string())
}

async fn protocol(app: &App, req: Request<Incoming>, ip: &str, lock: bool) -> Result<Resp, Fail> {
    let header_ok = req
        .headers()
        .get(PROTOCOL_HEADER)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    if !header_ok {
        return Err(Fail(
            ErrorKind::MissingProtocolHeader,
            format!("the header `{PROTOCOL_HEADER}: true` is required"),
        ));
    }
    let config = app.config();
    if !auth::client_ok(&config.auth, authorization(&req).as_deref()) {
        return Err(Fail(
            ErrorKind::Unauthorized,
            "missing or wrong credentials (bearer token or basic auth)".into(),
        ));
    }
    let body = read_body(req, config.client_timeout).await?;
    let r = LockRequest::parse(&body).map_err(|(k, v)| Fail(k, v))?;
    let p = r.client_params;
    let op = if lock {
        let membership = config
            .membership(&p.id, p.hostname.as_deref(), ip, &p.group)
            .map_err(|e| Fail(ErrorKind::UnknownGroup, e))?;
        Op::Lock {
            groups: membership.groups,
            holder: Holder {
                id: p.id.clone(),
                hostname: p.hostname.clone(),
                ip: ip.to_string(),
                taken_at: Timestamp::now(),
            },
        }
    } else {
        // Release everywhere the id holds a slot, whatever the config says now: a group removed or a membership
        // changed between lock and release strands nothing.
        Op::Unlock {
            groups: Vec::new(),
            id: p.id.clone(),
            by: Releaser::Holder,
        }
    };
    // Grants and releases are logged by the store once durable, in commit order.
    let applied = app.store.apply(op, config.ttl).await.map_err(unavailable)?;
    record_expired(app, &applied, config.ttl, &config.audit_path()).await;
    match applied.result {
        OpResult::Locked | OpResult::Unlocked { .. } => {
            Ok(respond(200, "application/json", b"{}".to_vec()))
        }
        OpResult::Full { group, held, slots } => Err(Fail(
            ErrorKind::AllSlotsTaken,
            format!("group {group}: {held} of {slots} slots taken"),
        )),
    }
}

async fn record_expired(
    app: &App,
    applied: &Applied,
    ttl: Option<std::time::Duration>,
    path: &std::path::Path,
) {
    for (group, h) in &applied.expired {
        app.metrics.ttl_expired.fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "ttl: {} ({}) held a slot in {group} since {} and lost it",
            h.id,
            h.ip,
            h.taken_at
        );
        let rec = AuditRecord {
            at: Timestamp::now(),
            action: AuditAction::TtlExpired,
            group: group.clone(),
            id: h.id.clone(),
            removed: true,
            actor: "server".into(),
            reason: format!(
                "ttl {}",
                humantime::format_duration(ttl.unwrap_or_default())
            ),
        };
        write_audit(path, rec).await;
    }
}

async fn write_audit(path: &std::path::Path, rec: AuditRecord) {
    let p = path.to_path_buf();
    let res = tokio::task::spawn_blocking(move || audit::append(&p, &rec)).await;
    match res {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::error!("{e}"),
        Err(e) => log::error!("audit log: {e}"),
    }
}

async fn admin_release(app: &App, req: Request<Incoming>, ip: &str) -> Result<Resp, Fail> {
    let config = app.config();
    if !auth::admin_ok(&config.auth, authorization(&req).as_deref()) {
        return Err(Fail(
            ErrorKind::Unauthorized,
            "admin release needs a bearer token listed in auth.admin_tokens".into(),
        ));
    }
    let body = read_body(req, config.client_timeout).await?;
    let r: AdminRelease = serde_json::from_slice(&body)
        .map_err(|e| Fail(ErrorKind::InvalidBody, format!("not an admin release: {e}")))?;
    validate_group(&r.group).map_err(|e| Fail(ErrorKind::InvalidGroup, e.to_string()))?;
    validate_id(&r.id).map_err(|e| Fail(ErrorKind::InvalidId, e.to_string()))?;
    if r.reason.trim().is_empty() || r.reason.len() > 1024 {
        return Err(Fail(
            ErrorKind::InvalidBody,
            "reason must be 1 to 1024 bytes: it goes into the audit log".into(),
        ));
    }
    let op = Op::Unlock {
        groups: vec![r.group.clone()],
        id: r.id.clone(),
        by: Releaser::Admin,
    };
    let applied = app.store.apply(op, config.ttl).await.map_err(unavailable)?;
    record_expired(app, &applied, config.ttl, &config.audit_path()).await;
    let removed = matches!(applied.result, OpResult::Unlocked { removed } if removed > 0);
    app.metrics.admin_releases.fetch_add(1, Ordering::Relaxed);
    log::warn!(
        "admin release by {ip}: {} in {} (removed: {removed}): {}",
        r.id,
        r.group,
        r.reason
    );
    let rec = AuditRecord {
        at: Timestamp::now(),
        action: AuditAction::AdminRelease,
        group: r.group,
        id: r.id,
        removed,
        actor: ip.to_string(),
        reason: r.reason,
    };
    write_audit(&config.audit_path(), rec.clone()).await;
    Ok(json(200, &rec))
}

/// The status document (holders per group, the server's start and its recent history).
async fn status_doc(app: &App) -> Result<ServerStatus, Fail> {
    let config = app.config();
    let names = config.group_names();
    let mut holders = app.store.holders(&names).await.map_err(unavailable)?;
    let mut groups: Vec<GroupStatus> = names
        .iter()
        .map(|n| GroupStatus {
            name: n.clone(),
            slots: config.slots(n).unwrap_or(0),
            holders: holders.remove(n).unwrap_or_default(),
        })
        .collect();
    // Groups no longer configured that still have holders stay visible (slots 0).
    groups.extend(holders.into_iter().map(|(name, holders)| GroupStatus {
        name,
        slots: 0,
        holders,
    }));
    let config_error = app.config_error();
    Ok(ServerStatus {
        store: app.store.kind().to_string(),
        config_valid: config_error.is_none(),
        config_error,
        ttl_secs: config.ttl.map(|t| t.as_secs()),
        client_auth: Some(config.auth.clients_need_auth()),
        warnings: config.warnings(),
        groups,
        started_at: Some(app.started_at),
        recent: app.store.recent(),
    })
}

async fn status(app: &App, hdr: Option<Vec<u8>>) -> Result<Resp, Fail> {
    let config = app.config();
    if !auth::client_ok(&config.auth, hdr.as_deref())
        && !auth::admin_ok(&config.auth, hdr.as_deref())
    {
        return Err(Fail(
            ErrorKind::Unauthorized,
            "status shows hosts: it needs the clients' or an admin's credentials".into(),
        ));
    }
    Ok(json(200, &status_doc(app).await?))
}

async fn metrics(app: &App) -> Result<Resp, Fail> {
    let s = status_doc(app).await?;
    let text = app.metrics.render(
        &s.groups,
        s.config_valid,
        &s.store,
        app.store.commits(),
        app.store.conflicts(),
    ) + &app
        .metrics
        .render_guards(s.client_auth == Some(true), app.conns.refusals());
    Ok(respond(200, "text/plain; version=0.0.4", text.into_bytes()))
}
