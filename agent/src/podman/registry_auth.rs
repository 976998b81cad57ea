//! Registry credentials for one libpod pull: the `X-Registry-Auth` header built from the device's delivered
//! credentials (`fleet_wire::secrets::RegistryAuth`), and how a refused pull is told apart from other failures.
//!
//! Podman 4.3's libpod API (`pkg/auth`) decodes the header as base64url (padded) JSON. A single auth config
//! `{"username","password","serveraddress"}` is handed to the pull in memory; only a map of several registries
//! is written to a temporary auth file, so the agent always sends the single form. The header value is never
//! logged and never part of an error.

use base64::Engine;
use fleet_wire::secrets::RegistryAuth;

/// The request header libpod reads a pull's credentials from.
pub const HEADER: &str = "X-Registry-Auth";

/// The header value for `auth` at registry `host` (`host[:port]`): base64url, padded, of the single auth config.
pub fn header_value(host: &str, auth: &RegistryAuth) -> String {
    let json = serde_json::json!({
        "username": auth.username,
        "password": auth.password.0,
        "serveraddress": host,
    });
    base64::engine::general_purpose::URL_SAFE.encode(json.to_string())
}

/// True when a pull's error says the registry refused the credentials (or wanted some): Podman 4.3 passes the
/// registry's answer through, e.g. `reading manifest 1 in host/app: unauthorized: authentication required`.
pub fn is_unauthorized(podman_message: &str) -> bool {
    let m = podman_message.to_ascii_lowercase();
    m.contains("unauthorized")
        || m.contains("authentication required")
        || m.contains("requested access to the resource is denied")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::secrets::Hidden;

    #[test]
    fn header_is_base64url_of_the_single_auth_config() {
        let auth = RegistryAuth {
            username: "fleet".into(),
            // Bytes whose standard base64 would hold '+' or '/'.
            password: Hidden("p>?~w".into()),
        };
        let h = header_value("registry.example:5000", &auth);
        assert!(!h.contains('+') && !h.contains('/'), "{h}");
        let json = base64::engine::general_purpose::URL_SAFE
            .decode(&h)
            .expect("base64url");
        let v: serde_json::Value = serde_json::from_slice(&json).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"username": "fleet", "password": "p>?~w", "serveraddress": "registry.example:5000"})
        );
    }

    #[test]
    fn unauthorized_pulls_are_recognised() {
        // Podman 4.3.1's text for a wrong password and for none (measured against distribution 2.8, htpasswd).
        assert!(is_unauthorized("initializing source docker://127.0.0.1:5999/team/app:1: reading manifest 1 in 127.0.0.1:5999/team/app: unauthorized: authentication required"));
        assert!(!is_unauthorized(
            "initializing source docker://x/y:1: reading manifest 1 in x/y: manifest unknown: manifest unknown"
        ));
    }
}
