//! HTML building blocks for the dashboard's server-rendered pages: escaping, the page frame (a little CSS, no
//! JavaScript), tables, times and ages. Every value that comes from a CR, NATS or the FleetLock server passes
//! through [`esc`] (or [`Html::text`]) before it reaches a page.

use fleet_wire::Timestamp;
use std::fmt::Write;
use std::time::Duration;

/// Escapes `s` for HTML text and double-quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

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
pub fn when(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        Some(t) => format!(
            "<time datetime=\"{t}\">{t}</time> <span class=\"age\">({} ago)</span>",
            age(now.since(t))
        ),
        None => "—".into(),
    }
}

/// The serialized name of a value that serializes as a string (a phase, a reason, a version), escaped; `—`
/// for anything else.
pub fn name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => esc(&s),
        _ => "—".into(),
    }
}

/// [`name`] of an optional value.
pub fn opt_name<T: serde::Serialize>(v: Option<&T>) -> String {
    v.map(name).unwrap_or_else(|| "—".into())
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
.alert h3{margin:0;font-size:1em}.muted{color:#777}nav.pages a{margin-right:1em}code{font-size:.95em}";

/// A page under construction: the frame's head is written by [`Html::page`], the body by the caller.
pub struct Html {
    out: String,
}

impl Html {
    /// Starts a page titled `title` with the navigation bar.
    pub fn page(title: &str) -> Self {
        let mut out = String::with_capacity(16 * 1024);
        let _ = write!(
            out,
            "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width\"><title>{} · Harmony Fleet</title>\
             <style>{CSS}</style></head><body><header><b>Harmony Fleet</b>\
             <a href=\"/\">Overview</a><a href=\"/devices\">Devices</a><a href=\"/runs\">Task runs</a>\
             <a href=\"/reboots\">Reboots</a><a href=\"/alerts\">Alerts</a></header><main><h1>{}</h1>",
            esc(title),
            esc(title)
        );
        Self { out }
    }

    /// Appends trusted markup (built by this module's callers from escaped parts).
    pub fn raw(&mut self, s: &str) -> &mut Self {
        self.out.push_str(s);
        self
    }

    /// Appends escaped text.
    pub fn text(&mut self, s: &str) -> &mut Self {
        self.out.push_str(&esc(s));
        self
    }

    /// Appends a table whose cells are trusted markup: `head` names the columns.
    pub fn table(
        &mut self,
        head: &[&str],
        rows: impl IntoIterator<Item = Vec<String>>,
    ) -> &mut Self {
        self.out.push_str("<table><thead><tr>");
        for h in head {
            let _ = write!(self.out, "<th>{}</th>", esc(h));
        }
        self.out.push_str("</tr></thead><tbody>");
        for row in rows {
            self.out.push_str("<tr>");
            for cell in row {
                let _ = write!(self.out, "<td>{cell}</td>");
            }
            self.out.push_str("</tr>");
        }
        self.out.push_str("</tbody></table>");
        self
    }

    /// Appends a two-column table of names and values (trusted markup), without a header row.
    pub fn pairs(&mut self, rows: impl IntoIterator<Item = (&'static str, String)>) -> &mut Self {
        self.out.push_str("<table><tbody>");
        for (k, v) in rows {
            let _ = write!(self.out, "<tr><th>{}</th><td>{v}</td></tr>", esc(k));
        }
        self.out.push_str("</tbody></table>");
        self
    }

    /// Closes the page.
    pub fn finish(mut self) -> String {
        self.out.push_str("</main></body></html>");
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        let mut p = Html::page("<b>");
        p.text("<i>");
        let page = p.finish();
        assert!(!page.contains("<b>&") && !page.contains("<i>"));
        assert!(page.contains("&lt;i&gt;"));
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
