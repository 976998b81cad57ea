//! Access to the dashboard: one bearer token, read from a file. Browsers cannot attach a bearer header, so the same
//! token is also accepted as the password of HTTP Basic authentication (any user name); the answer to a request
//! without it asks for Basic credentials.

use base64::Engine;
use std::path::Path;

/// Shortest token accepted: a guessable token would make the dashboard public.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Largest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// The dashboard's access token.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// A token from its text (surrounding whitespace removed); at least [`MIN_TOKEN_CHARS`] characters.
    pub fn new(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.chars().count() < MIN_TOKEN_CHARS || t.chars().any(|c| c.is_whitespace()) {
            return Err(format!(
                "the dashboard token must be one word of at least {MIN_TOKEN_CHARS} characters"
            ));
        }
        Ok(Self(t.to_owned()))
    }

    /// Reads the token from `path` (at most 4 KiB). The error never contains the file's content.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = fleet_wire::bounded::read_text(path, MAX_TOKEN_FILE_BYTES)
            .map_err(|e| format!("dashboard token file {e}"))?;
        Self::new(&text).map_err(|e| format!("dashboard token file {}: {e}", path.display()))
    }

    /// True when the `Authorization` header value carries this token (`Bearer <token>` or Basic with the token as
    /// the password). Compared in constant time.
    pub fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
            return false;
        };
        let presented = if let Some(t) = h.strip_prefix("Bearer ") {
            t.trim().to_owned()
        } else if let Some(b) = h.strip_prefix("Basic ") {
            let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b.trim()) else {
                return false;
            };
            let Ok(pair) = String::from_utf8(raw) else {
                return false;
            };
            match pair.split_once(':') {
                Some((_, password)) => password.to_owned(),
                None => return false,
            }
        } else {
            return false;
        };
        constant_time_eq(presented.as_bytes(), self.0.as_bytes())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_longer_than_the_bound_is_refused_not_cut() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("token");
        std::fs::write(&p, "a".repeat(MAX_TOKEN_FILE_BYTES as usize + 10)).expect("write");
        let e = Token::from_file(&p).expect_err("too long");
        assert!(e.contains("larger than 4096 bytes"), "{e}");
    }

    #[test]
    fn accepted_forms() {
        let t = Token::new(" 0123456789abcdef\n").expect("token");
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        let cases: &[(Option<&str>, bool)] = &[
            (Some("Bearer 0123456789abcdef"), true),
            (Some(&basic("admin:0123456789abcdef")), true),
            (Some(&basic(":0123456789abcdef")), true),
            (Some("Bearer 0123456789abcdeX"), false),
            (Some("Bearer 0123456789abcde"), false),
            (Some(&basic("0123456789abcdef")), false),
            (Some("Basic !!!"), false),
            (Some("0123456789abcdef"), false),
            (None, false),
        ];
        for (h, want) in cases {
            assert_eq!(t.accepts(h.map(str::as_bytes)), *want, "{h:?}");
        }
        assert!(Token::new("short").is_err());
        assert!(Token::new("0123456789 abcdef").is_err());
        assert_eq!(format!("{t:?}"), "Token(…)");
    }
}
