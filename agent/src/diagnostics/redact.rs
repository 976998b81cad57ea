//! Redaction of diagnostics text before it leaves the device (docs/diagnostics.md, "Redaction"): the values this
//! device was given, and strings that look like credentials whatever their origin. Pure and without a regex
//! crate: each rule is a small forward scanner, so the time is linear in the text (times the number of known
//! values for the first rule). A best effort against accidents; it cannot recognise every secret.

/// What a redacted string is replaced with.
pub const REDACTED: &str = "[redacted]";
/// Known values shorter than this (in characters) are not redacted: they would match ordinary text.
pub const MIN_VALUE_CHARS: usize = 4;
/// Each line of a multi-line known value is redacted on its own when it has at least this many characters.
pub const MIN_VALUE_LINE_CHARS: usize = 8;
/// Shortest run of the base64 alphabet judged a high-entropy string.
pub const MIN_ENTROPY_RUN: usize = 32;
/// Shortest credential after `Bearer ` / `Basic `.
const MIN_SCHEME_CREDENTIAL: usize = 8;
/// Longest label of a PEM header (`ENCRYPTED PRIVATE KEY` and the like).
const MAX_PEM_HEADER: usize = 64;
/// Longest user-info part of a URL looked at (keeps the scan linear on text full of `://`).
const MAX_USERINFO: usize = 512;
/// Words that make a `key=value` key sensitive (matched in the lower-cased key).
const SENSITIVE_KEYS: [&str; 9] = [
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "access_key",
    "private_key",
    "authorization",
];

/// Redacts text with the values this device was given.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Known values, longest first (so a value containing another is replaced whole).
    values: Vec<String>,
}

impl Redactor {
    /// A redactor of `values` (Secret values, registry passwords, the agent's NATS credential): each value of
    /// [`MIN_VALUE_CHARS`] or more, and each line of [`MIN_VALUE_LINE_CHARS`] or more of a multi-line one.
    pub fn new<I: IntoIterator<Item = String>>(values: I) -> Self {
        let mut out: Vec<String> = Vec::new();
        for v in values {
            if v.contains('\n') {
                for line in v.lines() {
                    let line = line.trim_end_matches('\r');
                    if line.trim().chars().count() >= MIN_VALUE_LINE_CHARS {
                        out.push(line.to_owned());
                    }
                }
                // Also the whole value without its final newline (printed as one block).
                let whole = v.trim_end_matches('\n');
                if whole.chars().count() >= MIN_VALUE_CHARS {
                    out.push(whole.to_owned());
                }
            } else if v.chars().count() >= MIN_VALUE_CHARS {
                out.push(v);
            }
        }
        out.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        out.dedup();
        Self { values: out }
    }

    /// How many values are looked for.
    pub fn known_values(&self) -> usize {
        self.values.len()
    }

    /// `text` with every known value and token-like string replaced by [`REDACTED`], and how many were.
    pub fn redact(&self, text: &str) -> (String, u32) {
        let mut count = 0;
        let mut s = text.to_owned();
        for v in &self.values {
            if s.contains(v.as_str()) {
                let n = s.matches(v.as_str()).count();
                s = s.replace(v.as_str(), REDACTED);
                count += n as u32;
            }
        }
        for rule in [
            pem_private_keys as fn(&str) -> Vec<(usize, usize)>,
            jwts,
            scheme_credentials,
            url_credentials,
            sensitive_values,
            high_entropy_runs,
        ] {
            let spans = rule(&s);
            if !spans.is_empty() {
                count += spans.len() as u32;
                s = replace_spans(&s, &spans);
            }
        }
        (s, count)
    }
}

/// `s` with each span (sorted, not overlapping, on character boundaries) replaced by [`REDACTED`].
fn replace_spans(s: &str, spans: &[(usize, usize)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for &(a, b) in spans {
        out.push_str(&s[at..a]);
        out.push_str(REDACTED);
        at = b;
    }
    out.push_str(&s[at..]);
    out
}

fn is_b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

fn is_b64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

/// The end of the run of bytes satisfying `f` from `i`.
fn run_end(s: &[u8], mut i: usize, f: impl Fn(u8) -> bool) -> usize {
    while i < s.len() && f(s[i]) {
        i += 1;
    }
    i
}

/// Whether `s[i..]` starts with `word`, ignoring ASCII case.
fn starts_with_ci(s: &[u8], i: usize, word: &str) -> bool {
    s.len() >= i + word.len() && s[i..i + word.len()].eq_ignore_ascii_case(word.as_bytes())
}

/// `-----BEGIN … PRIVATE KEY-----` to the end of its `-----END …-----` line (or of the text).
fn pem_private_keys(s: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(rel) = s[from..].find("-----BEGIN ") {
        let start = from + rel;
        // The header's closing dashes, looked for within a header's length (linear on text without them).
        let b = s.as_bytes();
        let look = (start + 11 + MAX_PEM_HEADER).min(b.len());
        let Some(close) = b[start + 11..look].windows(5).position(|w| w == b"-----") else {
            from = start + 1;
            continue;
        };
        let line_end = start + 11 + close + 5;
        if !s[start..line_end].contains("PRIVATE KEY") {
            from = start + 1;
            continue;
        }
        let end = match s[line_end..].find("-----END ") {
            Some(e) => {
                let e = line_end + e + "-----END ".len();
                // The END line's closing dashes, else its line end.
                let eol = s[e..].find('\n').map_or(s.len(), |i| e + i);
                s[e..eol].rfind("-----").map_or(eol, |i| e + i + 5)
            }
            None => s.len(),
        };
        spans.push((start, end));
        from = end;
    }
    spans
}

/// `eyJ<b64url>.<b64url>.<b64url>` starting at a run boundary.
fn jwts(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i + 3 <= b.len() {
        if &b[i..i + 3] != b"eyJ" || (i > 0 && is_b64url(b[i - 1])) {
            i += 1;
            continue;
        }
        let p1 = run_end(b, i, is_b64url);
        if p1 < b.len() && b[p1] == b'.' {
            let p2 = run_end(b, p1 + 1, is_b64url);
            if p2 > p1 + 1 && p2 < b.len() && b[p2] == b'.' {
                let p3 = run_end(b, p2 + 1, is_b64url);
                spans.push((i, p3));
                i = p3;
                continue;
            }
        }
        i = p1.max(i + 1);
    }
    spans
}

/// The credential after `Bearer ` or `Basic ` (any case): at least [`MIN_SCHEME_CREDENTIAL`] characters of a
/// token alphabet, not a plain lower-case word (`Basic authentication failed` stays readable).
fn scheme_credentials(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word = if starts_with_ci(b, i, "bearer") {
            6
        } else if starts_with_ci(b, i, "basic") {
            5
        } else {
            i += 1;
            continue;
        };
        if i > 0 && b[i - 1].is_ascii_alphanumeric() {
            i += 1;
            continue;
        }
        let sp = run_end(b, i + word, |c| c == b' ' || c == b'\t');
        if sp == i + word {
            i += word;
            continue;
        }
        let end = run_end(b, sp, |c| {
            c.is_ascii_alphanumeric() || b"-._~+/=".contains(&c)
        });
        let tok = &s[sp..end];
        let plain = tok.bytes().all(|c| c.is_ascii_lowercase());
        if end - sp >= MIN_SCHEME_CREDENTIAL && !plain {
            spans.push((sp, end));
        }
        i = end.max(i + word);
    }
    spans
}

/// The user-info of `scheme://user:pass@host` (the scheme and host stay).
fn url_credentials(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(rel) = s[from..].find("://") {
        let at = from + rel;
        from = at + 3;
        if at == 0 || !b[at - 1].is_ascii_alphanumeric() {
            continue;
        }
        let start = at + 3;
        let limit = (start + MAX_USERINFO).min(b.len());
        let mut j = start;
        while j < limit && !b"/?#@\"' \t\r\n<>".contains(&b[j]) {
            j += 1;
        }
        if j < b.len() && b[j] == b'@' && j > start && s[start..j].contains(':') {
            if &s[start..j] != REDACTED {
                spans.push((start, j));
            }
            from = j + 1;
        }
    }
    spans
}

/// The value of `key=value`, `key: value`, `"key":"value"` where the key names a credential.
fn sensitive_values(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let is_key = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.';
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_key(b[i]) {
            i += 1;
            continue;
        }
        let key_end = run_end(b, i, is_key);
        let key = s[i..key_end].to_ascii_lowercase();
        i = key_end;
        if !SENSITIVE_KEYS.iter().any(|k| key.contains(k)) {
            continue;
        }
        // An optional closing quote, spaces, `=` or `:`, spaces, an optional opening quote.
        let mut j = key_end;
        if j < b.len() && (b[j] == b'"' || b[j] == b'\'') {
            j += 1;
        }
        j = run_end(b, j, |c| c == b' ' || c == b'\t');
        if j >= b.len() || !(b[j] == b'=' || b[j] == b':') {
            continue;
        }
        j = run_end(b, j + 1, |c| c == b' ' || c == b'\t');
        let (start, cred, end) = if j < b.len() && (b[j] == b'"' || b[j] == b'\'') {
            let q = b[j];
            let start = j + 1;
            let end = run_end(b, start, |c| c != q && c != b'\n');
            (start, start, end)
        } else {
            let stop = |c: u8| !(c.is_ascii_whitespace() || b",;&\"'}]".contains(&c));
            let mut end = run_end(b, j, stop);
            let mut cred = j;
            // `Authorization: Bearer x`: the scheme word and its credential.
            let word = s[j..end].to_ascii_lowercase();
            if ["bearer", "basic", "token", "digest"].contains(&word.as_str()) {
                let sp = run_end(b, end, |c| c == b' ' || c == b'\t');
                if sp > end {
                    cred = sp;
                    end = run_end(b, sp, stop);
                }
            }
            (j, cred, end)
        };
        // Already redacted by an earlier rule (e.g. `Authorization: Bearer [redacted]`).
        if end > start && !s[cred..].starts_with(REDACTED) {
            spans.push((start, end));
            i = end.max(i);
        }
    }
    spans
}

/// Runs of at least [`MIN_ENTROPY_RUN`] base64/base64url characters (with `=` padding) holding an upper-case
/// letter, a lower-case letter and a digit. A run that starts with `/` is a path: judged piece by piece.
fn high_entropy_runs(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_b64(b[i]) || (i > 0 && b[i - 1] == b'=') {
            i += 1;
            continue;
        }
        let mut end = run_end(b, i, is_b64);
        end = run_end(b, end, |c| c == b'=').min(end + 2);
        if b[i] == b'/' {
            let mut p = i;
            while p < end {
                let q = run_end(b, p + 1, |c| c != b'/').min(end);
                if entropic(&b[p + 1..q]) {
                    spans.push((p + 1, q));
                }
                p = q;
            }
        } else if entropic(&b[i..end]) {
            spans.push((i, end));
        }
        i = end.max(i + 1);
    }
    spans
}

fn entropic(run: &[u8]) -> bool {
    run.len() >= MIN_ENTROPY_RUN
        && run.iter().any(u8::is_ascii_uppercase)
        && run.iter().any(u8::is_ascii_lowercase)
        && run.iter().any(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(text: &str) -> (String, u32) {
        Redactor::default().redact(text)
    }

    #[test]
    fn a_known_value_in_log_text_is_redacted_and_counted() {
        let red = Redactor::new(["s3cr3t-Value".to_owned(), "abc".to_owned()]);
        let (out, n) = red.redact("start\ntoken is s3cr3t-Value; again s3cr3t-Value\nabc stays\n");
        assert_eq!(
            out,
            "start\ntoken is [redacted]; again [redacted]\nabc stays\n"
        );
        assert_eq!(n, 2);
        assert_eq!(
            red.known_values(),
            1,
            "a value under 4 characters is not looked for"
        );
    }

    #[test]
    fn each_long_line_of_a_multi_line_value_is_redacted() {
        let cert =
            "-----BEGIN TEST CERT-----\nc2VjcmV0LWNlcnQtYm9keQ==\nshort\n-----END TEST CERT-----\n";
        let red = Redactor::new([cert.to_owned()]);
        let (out, n) = red.redact("printed: c2VjcmV0LWNlcnQtYm9keQ== and short");
        assert_eq!(out, "printed: [redacted] and short");
        assert_eq!(n, 1);
        let (out, n) = red.redact(cert);
        assert_eq!(
            (out.as_str(), n),
            ("[redacted]\n", 1),
            "the whole block at once"
        );
    }

    #[test]
    fn jwts_are_redacted() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJkZXYifQ.c2lnbmF0dXJl";
        assert_eq!(r(&format!("tok={jwt} x")).0, "tok=[redacted] x");
        assert_eq!(r(&format!("got {jwt}\n")), ("got [redacted]\n".into(), 1));
        assert_eq!(r("eyJ alone").1, 0);
    }

    #[test]
    fn bearer_and_basic_credentials_are_redacted() {
        assert_eq!(
            r("curl -H 'Authorization: Bearer abc.DEF-123_x'").0,
            "curl -H 'Authorization: Bearer [redacted]'"
        );
        assert_eq!(r("basic dXNlcjpwYXNz").0, "basic [redacted]");
        assert_eq!(r("Basic authentication failed").1, 0);
        assert_eq!(r("a bearer of news").1, 0);
    }

    #[test]
    fn sensitive_keys_lose_their_values() {
        for (text, want) in [
            ("DB_PASSWORD=hunter22 next", "DB_PASSWORD=[redacted] next"),
            ("passwd: abc", "passwd: [redacted]"),
            (
                r#"{"user":"x","client_secret": "y z"}"#,
                r#"{"user":"x","client_secret": "[redacted]"}"#,
            ),
            (r#"{"api_key":"k1"}"#, r#"{"api_key":"[redacted]"}"#),
            ("AWS_ACCESS_KEY_ID=AKIA1", "AWS_ACCESS_KEY_ID=[redacted]"),
            ("private_key='--x--'", "private_key='[redacted]'"),
            ("X-Auth-Token: t", "X-Auth-Token: [redacted]"),
        ] {
            assert_eq!(r(text).0, want, "{text}");
        }
        // Keys are matched lower-cased: `apiKey` contains `apikey`.
        assert_eq!(r(r#""apiKey":"v""#).0, r#""apiKey":"[redacted]""#);
        assert_eq!(r("Authorization: Basic dXNlcjpwYXNz").1, 1, "counted once");
        assert_eq!(r("pin=1234 the password is hunter2").1, 0);
    }

    #[test]
    fn url_credentials_are_redacted() {
        assert_eq!(
            r("connecting to postgres://app:pw@db:5432/x").0,
            "connecting to postgres://[redacted]@db:5432/x"
        );
        assert_eq!(r("https://example.com/a@b").1, 0);
        assert_eq!(r("see https://user@example.com").1, 0);
    }

    #[test]
    fn pem_private_keys_are_redacted_whole() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\ndef\n-----END RSA PRIVATE KEY-----";
        assert_eq!(r(&format!("a\n{pem}\nb")), ("a\n[redacted]\nb".into(), 1));
        assert_eq!(r("x -----BEGIN PRIVATE KEY-----\nMIIab").0, "x [redacted]");
        assert_eq!(r("-----BEGIN CERTIFICATE-----\nMIIab\n").1, 0);
    }

    #[test]
    fn high_entropy_runs_are_redacted_but_digests_and_paths_stay() {
        let key = "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MEFCQ0RFRg==";
        assert_eq!(r(&format!("k {key} end")), ("k [redacted] end".into(), 1));
        let readable = [
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "container 3f4e5d6c7b8a99887766554433221100ffeeddccbbaa",
            "uuid 123e4567-e89b-12d3-a456-426614174000",
            "/usr/lib/x86_64-linux-gnu/libSomething2/Another_Dir3/file",
            "ShortMixed123",
        ];
        for t in readable {
            assert_eq!(r(t), (t.to_owned(), 0), "{t}");
        }
    }

    #[test]
    fn a_large_text_is_redacted_in_bounded_time() {
        // Many rule triggers that never complete: each scanner moves on, so this stays linear.
        let text = "eyJeyJ.://password basic -----BEGIN ".repeat(50_000);
        let (out, _) = r(&text);
        assert!(out.len() <= text.len() * 2);
    }

    proptest! {
        #[test]
        fn a_known_value_never_survives(
            before in "[ -~\n]{0,80}",
            after in "[ -~\n]{0,80}",
            value in "[A-Za-z0-9!-/]{4,30}",
        ) {
            let red = Redactor::new([value.clone()]);
            let (out, n) = red.redact(&format!("{before}{value}{after}"));
            prop_assert!(!out.contains(&value), "{out}");
            prop_assert!(n >= 1);
        }

        #[test]
        fn any_text_is_scanned_without_panic(text in "\\PC{0,300}") {
            let (out, n) = r(&text);
            prop_assert!(n > 0 || out == text);
        }

        #[test]
        fn plain_words_are_left_alone(text in "[a-z ,.\n]{0,200}") {
            let (out, n) = r(&text);
            prop_assert_eq!(out, text);
            prop_assert_eq!(n, 0);
        }
    }
}
