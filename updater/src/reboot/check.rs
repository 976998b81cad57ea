//! `fleet-reboot --check`: validates the config and reaches the FleetLock server with the configured token,
//! without taking or releasing a slot, so that an administrator can test a set-up.

use super::config::RebootConfig;
use super::lock::LockClient;
use super::system::Paths;
use super::RebootError;

/// Checks `cfg` and the server; `Ok` is a one-line summary, `Err` says what is wrong.
pub fn check(cfg: &RebootConfig) -> Result<String, RebootError> {
    let timeout = cfg.timeout()?;
    cfg.health_wait()?;
    if let Some(w) = &cfg.window {
        super::window::Window::from_config(w).map_err(RebootError::Window)?;
    }
    let who = super::identity(&Paths::new(&cfg.root))?;
    let client = LockClient::from_config(cfg, timeout)?;
    let status = client.status()?;
    let group = status
        .groups
        .iter()
        .find(|g| g.name == cfg.group)
        .ok_or_else(|| RebootError::NoGroup {
            server: cfg.server.clone(),
            group: cfg.group.clone(),
            groups: status
                .groups
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let holding = group.holders.iter().any(|h| h.id == who.id);
    Ok(format!(
        "config ok; server {} reachable, {}; group {}: {} slot(s), {} held{}",
        cfg.server,
        token_words(cfg.token.is_some(), status.client_auth),
        group.name,
        group.slots,
        group.holders.len(),
        if holding { ", one by this host" } else { "" }
    ))
}

/// What the server's answer to `GET /v1/status` says about the token: a server that needs client credentials
/// answers only with a good one, and one that needs none answers anyone (`client_auth` false), so a 200 proves a
/// token only where the server needs one. Servers before `client_auth` do not say (`None`).
fn token_words(have_token: bool, client_auth: Option<bool>) -> &'static str {
    match (have_token, client_auth) {
        (true, Some(false)) => {
            "token not checked: the server needs no client credentials (anyone who reaches it can take slots)"
        }
        (true, _) => "token accepted",
        (false, Some(false)) => {
            "no token configured: the server needs none (anyone who reaches it can take slots)"
        }
        (false, _) => "no token configured: the server answered without one",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A server answering every request with this `GET /v1/status` document (`client_auth` as given).
    fn status_server(client_auth: Option<bool>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut doc = serde_json::json!({"store": "file", "config_valid": true,
            "groups": [{"name": "default", "slots": 1, "holders": []}], "recent": []});
        if let Some(a) = client_auth {
            doc["client_auth"] = a.into();
        }
        let body = doc.to_string();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        format!("http://{addr}")
    }

    fn check_with(token: Option<&str>, client_auth: Option<bool>) -> String {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/machine-id"),
            "0123456789abcdef0123456789abcdef\n",
        )
        .unwrap();
        let token = token.map(|t| format!("token: {t}\n")).unwrap_or_default();
        let cfg = RebootConfig::parse(&format!(
            "server: {}\ngroup: default\ntimeout: 5\nroot: {}\n{token}",
            status_server(client_auth),
            root.path().display()
        ))
        .unwrap();
        check(&cfg).unwrap()
    }

    #[test]
    fn no_token_is_never_called_accepted() {
        for auth in [Some(false), None] {
            let out = check_with(None, auth);
            assert!(!out.contains("token accepted"), "{out}");
            assert!(out.contains("no token configured"), "{out}");
        }
        assert!(check_with(None, Some(false)).contains("the server needs none"));
        // A token the server does not need is not said to be accepted either.
        let out = check_with(Some("t0ken"), Some(false));
        assert!(out.contains("token not checked"), "{out}");
        assert!(check_with(Some("t0ken"), Some(true)).contains("token accepted"));
        assert!(check_with(Some("t0ken"), None).contains("token accepted"));
    }
}
