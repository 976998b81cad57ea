//! Optional client and admin authentication: bearer tokens, or basic auth as Zincati sends it from the userinfo
//! of its base URL. Secrets are compared as SHA-256 digests in constant time and never logged.

use super::config::AuthConfig;
use base64::Engine;
use sha2::{Digest, Sha256};

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Compares two digests without an early exit.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Checks `presented` against every candidate (no early exit, so timing does not tell which one matched).
fn any_match<'a>(presented: &[u8], candidates: impl Iterator<Item = &'a [u8]>) -> bool {
    let p = digest(presented);
    candidates.fold(false, |ok, c| ct_eq(&p, &digest(c)) | ok)
}

/// A parsed `Authorization` header.
enum Presented {
    Bearer(Vec<u8>),
    Basic(Vec<u8>),
}

fn parse(header: Option<&[u8]>) -> Option<Presented> {
    let h = std::str::from_utf8(header?).ok()?.trim();
    let (scheme, rest) = h.split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        Some(Presented::Bearer(rest.as_bytes().to_vec()))
    } else if scheme.eq_ignore_ascii_case("basic") {
        base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()
            .map(Presented::Basic)
    } else {
        None
    }
}

/// Whether a client request may pass (always, when no client credentials are configured).
pub fn client_ok(auth: &AuthConfig, header: Option<&[u8]>) -> bool {
    if !auth.clients_need_auth() {
        return true;
    }
    match parse(header) {
        Some(Presented::Bearer(t)) => any_match(&t, auth.tokens.iter().map(|s| s.as_bytes())),
        Some(Presented::Basic(up)) => {
            let pairs: Vec<Vec<u8>> = auth
                .basic
                .iter()
                .map(|b| format!("{}:{}", b.username, b.password).into_bytes())
                .collect();
            any_match(&up, pairs.iter().map(Vec::as_slice))
        }
        None => false,
    }
}

/// Whether an admin request may pass (never, when no admin token is configured).
pub fn admin_ok(auth: &AuthConfig, header: Option<&[u8]>) -> bool {
    match parse(header) {
        Some(Presented::Bearer(t)) if !auth.admin_tokens.is_empty() => {
            any_match(&t, auth.admin_tokens.iter().map(|s| s.as_bytes()))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BasicCredential;

    #[test]
    fn bearer_basic_and_admin() {
        let none = AuthConfig::default();
        assert!(client_ok(&none, None));
        assert!(!admin_ok(&none, Some(b"Bearer x")));
        let a = AuthConfig {
            tokens: vec!["t1".into()],
            basic: vec![BasicCredential {
                username: "zincati".into(),
                password: "pw".into(),
            }],
            admin_tokens: vec!["adm".into()],
            token_files: Vec::new(),
        };
        assert!(client_ok(&a, Some(b"Bearer t1")));
        assert!(!client_ok(&a, Some(b"Bearer t2")));
        assert!(!client_ok(&a, None));
        // base64("zincati:pw")
        assert!(client_ok(&a, Some(b"Basic emluY2F0aTpwdw==")));
        assert!(!client_ok(&a, Some(b"Basic emluY2F0aTpwdX==")));
        assert!(admin_ok(&a, Some(b"bearer adm")));
        assert!(!admin_ok(&a, Some(b"Bearer t1")));
    }
}
