//! Reboots: the FleetLock server's holders per group and how long each has held its slot, and its recent grants
//! and releases as a chart of holds and a table, read from its `/v1/status` (with a client or admin token: the
//! status names hosts). Each holder is shown as the device whose own device info reports its FleetLock id, with
//! that device's DeviceGroups, or as an unknown holder ([`super::holder_devices`]).

use super::alerts::{Alert, Subject};
use super::holder_devices::{HolderDevice, Holders};
use super::holds::{chart, holds};
use super::html::{age, name, page, table, text, url_part, when};
use super::overview::some_alerts;
use super::state::FleetLockView;
use fleet_wire::fleetlock::{LockEventKind, ServerStatus, STATUS_PATH};
use fleet_wire::Timestamp;
use maud::{html, Markup};
use std::time::Duration;

/// Largest status document read.
pub const MAX_STATUS_BYTES: u64 = 1024 * 1024;
/// How long one status request may take.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to read the FleetLock server's status.
#[derive(Clone)]
pub struct FleetLockSource {
    /// Base URL, e.g. `http://fleetlock:8080`.
    pub url: String,
    /// Bearer token (a client or admin token of the server), if it needs one.
    pub token: Option<String>,
    /// DER certificates that alone are trusted for an `https://` URL (a private CA); empty: the built-in roots.
    pub ca: Vec<Vec<u8>>,
}

impl FleetLockSource {
    /// Reads the CA certificates of `pem` (a PEM file's text) into [`Self::ca`]; an error when it holds none.
    pub fn with_ca_pem(mut self, pem: &[u8]) -> Result<Self, String> {
        for item in ureq::tls::parse_pem(pem) {
            if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                self.ca.push(c.der().to_vec());
            }
        }
        if self.ca.is_empty() {
            return Err("no certificate in the FleetLock CA file".into());
        }
        Ok(self)
    }
}

impl std::fmt::Debug for FleetLockSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLockSource")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("ca", &self.ca.len())
            .finish()
    }
}

/// Reads `GET <url>/v1/status` (blocking; run it off the async workers): bounded in time and size.
pub fn fetch(src: &FleetLockSource) -> Result<ServerStatus, String> {
    use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
    let mut tls = TlsConfig::builder().provider(TlsProvider::Rustls);
    if !src.ca.is_empty() {
        let roots = src
            .ca
            .iter()
            .map(|d| Certificate::from_der(d).to_owned())
            .collect();
        tls = tls.root_certs(RootCerts::Specific(std::sync::Arc::new(roots)));
    }
    let config = ureq::Agent::config_builder()
        .tls_config(tls.build())
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(STATUS_TIMEOUT))
        .user_agent(concat!(
            "fleet-operator-dashboard/",
            env!("CARGO_PKG_VERSION")
        ))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let url = format!("{}{STATUS_PATH}", src.url.trim_end_matches('/'));
    let mut req = agent.get(&url);
    if let Some(t) = &src.token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.call().map_err(|e| format!("GET {url}: {e}"))?;
    let code = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_STATUS_BYTES)
        .read_to_vec()
        .map_err(|e| format!("GET {url}: {e}"))?;
    if code != 200 {
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        return Err(format!("GET {url}: HTTP {code}: {text}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not a FleetLock status: {e}"))
}

/// The reboots page.
pub fn render(
    view: Option<&FleetLockView>,
    names: &Holders,
    alerts: &[Alert],
    now: Timestamp,
) -> String {
    page(
        "Reboots",
        html! {
            (some_alerts(alerts, |a| matches!(a.subject, Subject::Holder { .. } | Subject::FleetLock), now))
            (holders(view, names, now))
            @if let Some(Ok(s)) = view.map(|v| &v.status) {
                h2 { "Recent holds" }
                (chart(&holds(s), names, now))
                h2 { "Recent grants and releases" }
                (recent(s, names, now))
            }
        },
    )
}

/// The server's recent events, newest first, with how long each ended hold lasted.
fn recent(s: &ServerStatus, names: &Holders, now: Timestamp) -> Markup {
    let since = html! {
        "What this server made durable since it started (" (when(s.started_at, now)) "), newest first, at most "
        (fleet_wire::fleetlock::MAX_RECENT_EVENTS) ". It keeps them in memory: a restart empties the list, and "
        "each replica of an HA server shows only its own."
    };
    if s.recent.is_empty() {
        return html! { p.muted { (since) " None yet." } };
    }
    let rows = s.recent.iter().map(|e| {
        let held = match e.kind {
            LockEventKind::Granted => text("—"),
            _ => text(age(e.at.since(e.holder.taken_at))),
        };
        let what = name(&e.kind);
        vec![
            when(Some(e.at), now),
            html! { span.bad[e.kind != LockEventKind::Granted && e.kind != LockEventKind::Released] data-event=(what) { (what) } },
            text(&e.group),
            device(names, &e.holder.id),
            text(e.holder.hostname.as_deref().unwrap_or("—")),
            text(&e.holder.ip),
            held,
        ]
    });
    html! {
        p.muted { (since) }
        (table(&["when", "what", "group", "device", "host (as sent)", "address", "held for"], rows))
    }
}

/// The FleetLock server's settings and its holders per group.
fn holders(view: Option<&FleetLockView>, names: &Holders, now: Timestamp) -> Markup {
    let Some(v) = view else {
        return html! {
            p.muted {
                "No FleetLock server configured (" code { "--dashboard-fleetlock-url" } "), or not read yet."
            }
        };
    };
    let s = match &v.status {
        Ok(s) => s,
        Err(e) => {
            return html! {
                p.bad { "Could not read the FleetLock status (" (when(Some(v.fetched_at), now)) "): " (e) }
            }
        }
    };
    let rows = s.groups.iter().flat_map(|g| {
        let head = || {
            vec![
                text(&g.name),
                text(format!("{} of {} used", g.holders.len(), g.slots)),
            ]
        };
        if g.holders.is_empty() {
            let mut row = head();
            row.extend([text("—"), text(""), text(""), text(""), text(""), text("")]);
            return vec![row];
        }
        g.holders
            .iter()
            .map(|x| {
                let mut row = head();
                row.extend([
                    device(names, &x.id),
                    device_groups(names.get(&x.id)),
                    text(x.hostname.as_deref().unwrap_or("—")),
                    text(&x.ip),
                    when(Some(x.taken_at), now),
                    text(age(now.since(x.taken_at))),
                ]);
                row
            })
            .collect()
    });
    html! {
        p {
            "Store " b { (s.store) } ", config "
            @if s.config_valid {
                span.ok { "valid" }
            } @else {
                span.bad { "invalid: " (s.config_error.as_deref().unwrap_or("")) }
            }
            @if let Some(t) = s.ttl_secs { ", lock TTL " (age(Duration::from_secs(t))) }
            @match s.client_auth {
                Some(true) => { ", client authentication " span.ok { "required" } }
                Some(false) => { ", client authentication " span.bad { "off" } }
                None => {}
            }
            ", read " (when(Some(v.fetched_at), now)) "."
        }
        // What the server itself warns about (e.g. anyone on the network may take and give back slots).
        @for w in &s.warnings {
            p.bad { "fleetlock-server warns: " (w) }
        }
        p.muted {
            "A holder is the device whose own device info reports the FleetLock id it sent; an id that no device "
            "reports, or that several report, is an unknown holder. The host is the name the holder sent."
        }
        (table(
            &["group", "slots", "device", "device groups", "host (as sent)", "address", "held since", "held for"],
            rows,
        ))
    }
}

/// The holder `id` as the device it is (a link to its page), or as an unknown holder; `data-holder` carries the
/// FleetLock id and `data-device` the device (empty when unknown).
fn device(names: &Holders, id: &str) -> Markup {
    match names.get(id) {
        HolderDevice::Device { id: d, .. } => html! {
            span data-holder=(id) data-device=(d) title={ "FleetLock id " (id) } {
                a href={ "/devices/" (url_part(d.as_str())) } { (d) }
            }
        },
        HolderDevice::Unknown => html! {
            span.bad data-holder=(id) data-device="" { "unknown holder " code { (id) } }
        },
        HolderDevice::Contested(claimants, n) => html! {
            span.bad data-holder=(id) data-device="" {
                "unknown holder " code { (id) } " (reported by " (n) " devices: "
                @for (i, c) in claimants.iter().enumerate() {
                    @if i > 0 { ", " }
                    (c)
                }
                @if *n > claimants.len() { ", …" }
                ")"
            }
        },
    }
}

/// The DeviceGroups of a holder's device, `—` for none or an unknown holder.
fn device_groups(d: &HolderDevice) -> Markup {
    match d {
        HolderDevice::Device { groups, .. } if !groups.is_empty() => {
            html! { span data-groups=(groups.join(",")) { (groups.join(", ")) } }
        }
        _ => text("—"),
    }
}
