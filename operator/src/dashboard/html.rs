//! HTML building blocks for the dashboard's server-rendered pages, on `maud` (compile-time templates that escape
//! every inserted value): the page frame (a little CSS, no JavaScript), tables, times and ages. Values from a CR,
//! NATS or the FleetLock server go into templates as text (`(value)`), never as markup: `PreEscaped` appears only
//! for constant strings and markup maud built itself.

use fleet_wire::Timestamp;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use std::fmt::Write;
use std::time::Duration;

/// Percent-encodes one URL path segment or query value (names are DNS labels, but nothing is assumed).
pub fn url_part(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                o.push(b as char)
            }
            b => {
                let _ = write!(o, "%{b:02X}");
            }
        }
    }
    o
}

/// Reverses [`url_part`] (and `+` as space in query values); `None` for invalid encodings.
pub fn url_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A duration as a person reads it: `42s`, `7m`, `3h 5m`, `2d 4h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// `time (age ago)`, or `—` when absent.
pub fn when(t: Option<Timestamp>, now: Timestamp) -> Markup {
    match t {
        Some(t) => html! {
            time datetime=(t) { (t) } " " span.age { "(" (age(now.since(t))) " ago)" }
        },
        None => html! { "—" },
    }
}

/// The serialized name of a value that serializes as a string (a phase, a reason, a version) as plain text (the
/// template escapes it); `—` for anything else.
pub fn name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "—".into(),
    }
}

/// [`name`] of an optional value.
pub fn opt_name<T: serde::Serialize>(v: Option<&T>) -> String {
    v.map(name).unwrap_or_else(|| "—".into())
}

/// Plain text as a table cell (escaped).
pub fn text(s: impl AsRef<str>) -> Markup {
    html! { (s.as_ref()) }
}

/// Parses an RFC 3339 UTC time as the CRs carry it.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}\
header{background:#23395d;color:#fff;padding:.5em 1em}header a{color:#fff;margin-right:1.2em;text-decoration:none}\
header b{margin-right:2em}main{padding:1em}h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em}\
table{border-collapse:collapse;background:#fff;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;\
text-align:left;vertical-align:top}th{background:#eef}.age{color:#777}.bad{color:#b00;font-weight:600}\
.ok{color:#070}.alert{border-left:4px solid #b00;background:#fff3f3;padding:.4em .8em;margin:.4em 0}\
.alert h3{margin:0;font-size:1em}.muted{color:#777}nav.pages a{margin-right:1em}code{font-size:.95em}figure.bar{margin:.2em 0}.minibar{width:16em}\
@media(max-width:700px){main{padding:.5em}table{display:block;overflow-x:auto;max-width:100%}header a{display:inline-block}}";

/// A whole page titled `title`: the frame with the navigation bar around `body`.
pub fn page(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Harmony Fleet" }
                // A constant string: no value reaches the style sheet.
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    b { "Harmony Fleet" }
                    nav {
                        a href="/" { "Overview" }
                        a href="/devices" { "Devices" }
                        a href="/runs" { "Task runs" }
                        a href="/releases" { "Releases" }
                        a href="/deployments" { "Deployments" }
                        a href="/reboots" { "Reboots" }
                        a href="/alerts" { "Alerts" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
    .into_string()
}

/// A table whose header row names the columns and whose cells are markup (built by maud, values escaped).
pub fn table(head: &[&str], rows: impl IntoIterator<Item = Vec<Markup>>) -> Markup {
    html! {
        table {
            thead { tr { @for h in head { th { (h) } } } }
            tbody {
                @for row in rows {
                    tr { @for cell in row { td { (cell) } } }
                }
            }
        }
    }
}

/// A two-column table of names and values, without a header row.
pub fn pairs(rows: impl IntoIterator<Item = (&'static str, Markup)>) -> Markup {
    html! {
        table { tbody { @for (k, v) in rows { tr { th { (k) } td { (v) } } } } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        let hostile = "<script>alert('x')</script> & \"q\"";
        let page = page(hostile, html! { p title=(hostile) { (hostile) } });
        assert!(!page.contains("<script"), "{page}");
        assert!(page.contains("&lt;script&gt;alert('x')&lt;/script&gt; &amp; &quot;q&quot;"));
        assert!(
            page.contains("title=\"&lt;script&gt;alert('x')&lt;/script&gt; &amp; &quot;q&quot;\"")
        );
    }

    #[test]
    fn urls_round_trip() {
        for s in ["device-1", "a b/c?d&e", "ü"] {
            assert_eq!(url_decode(&url_part(s)).as_deref(), Some(s));
        }
        assert_eq!(url_decode("%zz"), None);
    }

    #[test]
    fn ages() {
        let cases = [(5, "5s"), (61, "1m"), (3700, "1h 1m"), (90_000, "1d 1h")];
        for (s, want) in cases {
            assert_eq!(age(Duration::from_secs(s)), want);
        }
    }
}
