//! HTTP range resumption, decided without I/O: the headers of a resumed GET, and whether a response continues
//! the bytes the updater already holds, starts the artifact over from zero, or must be asked for again without
//! a range (docs/artifacts.md, "Resumed downloads").

use super::FetchError;
use fleet_wire::fetch::{ResumePoint, Validators};

/// The parts of a response head that decide a resume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Head<'a> {
    /// HTTP status.
    pub status: u16,
    /// `Content-Length`, when declared and numeric.
    pub content_length: Option<u64>,
    /// `Content-Range`, as sent.
    pub content_range: Option<&'a str>,
    /// `ETag`, as sent.
    pub etag: Option<&'a str>,
    /// `Last-Modified`, as sent.
    pub last_modified: Option<&'a str>,
}

/// What to do with a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Stream the body: it begins at the point's offset (0: the whole artifact), with these validators.
    Stream(ResumePoint),
    /// The server cannot continue the held bytes (416, or a `Content-Range` or validator that does not match
    /// them): ask again without a range and start from zero. The text says why, for the log.
    Restart(String),
    /// Not a usable success: the caller's status handling applies.
    NotOk,
}

/// The headers of a GET that resumes after `resume` (none for a fresh download). `If-Range` makes a server
/// whose content changed answer `200` with the whole new artifact instead of splicing; it takes a strong
/// `ETag` or else `Last-Modified` (RFC 9110 §13.1.5), and is left out when the held bytes have neither.
pub(crate) fn request_headers(resume: Option<&ResumePoint>) -> Vec<(&'static str, String)> {
    let Some(p) = resume.filter(|p| p.offset > 0) else {
        return Vec::new();
    };
    let mut h = vec![("Range", format!("bytes={}-", p.offset))];
    let strong = p.validators.etag.as_ref().filter(|e| !e.starts_with("W/"));
    if let Some(v) = strong.or(p.validators.last_modified.as_ref()) {
        h.push(("If-Range", v.clone()));
    }
    h
}

/// Decides what `head`, the answer to a GET with [`request_headers`]`(resume)`, means. A declared whole size
/// above `limit` is refused before any body byte is read.
pub(crate) fn decide(
    resume: Option<&ResumePoint>,
    head: &Head<'_>,
    limit: u64,
) -> Result<Decision, FetchError> {
    let resume = resume.filter(|p| p.offset > 0);
    let validators = |total: Option<u64>| Validators {
        total,
        etag: head.etag.map(str::to_owned),
        last_modified: head.last_modified.map(str::to_owned),
    };
    let within = |total: Option<u64>| match total {
        Some(declared) if declared > limit => Err(FetchError::DeclaredTooLarge { declared, limit }),
        _ => Ok(()),
    };
    match (head.status, resume) {
        // The whole artifact: a fresh download, or a server that ignores Range or saw If-Range fail.
        (200, _) => {
            within(head.content_length)?;
            Ok(Decision::Stream(ResumePoint {
                offset: 0,
                validators: validators(head.content_length),
            }))
        }
        (206, None) => Ok(Decision::Restart(
            "partial content to a request without Range".into(),
        )),
        (206, Some(held)) => {
            let Some((first, last, total)) = head.content_range.and_then(parse_content_range)
            else {
                return Ok(Decision::Restart(format!(
                    "Content-Range {:?} is not a single byte range",
                    head.content_range.unwrap_or("(absent)")
                )));
            };
            if first != held.offset {
                return Ok(Decision::Restart(format!(
                    "Content-Range starts at {first}, the held bytes end at {}",
                    held.offset
                )));
            }
            let total = total.or(held.validators.total);
            if total.is_some_and(|t| last.checked_add(1) != Some(t)) {
                return Ok(Decision::Restart(
                    "Content-Range does not reach the end of the artifact".into(),
                ));
            }
            if head
                .content_length
                .is_some_and(|n| Some(n) != (last - first).checked_add(1))
            {
                return Ok(Decision::Restart(
                    "Content-Length disagrees with Content-Range".into(),
                ));
            }
            let now = validators(total);
            if !held.validators.same_content(&now) {
                return Ok(Decision::Restart(format!(
                    "the content changed (held {:?}, now {:?})",
                    held.validators, now
                )));
            }
            within(total)?;
            Ok(Decision::Stream(ResumePoint {
                offset: first,
                validators: now,
            }))
        }
        (416, Some(_)) => Ok(Decision::Restart(
            "416: the held bytes are not a prefix of the artifact".into(),
        )),
        _ => Ok(Decision::NotOk),
    }
}

/// Parses `bytes <first>-<last>/<total or *>` with `first <= last < total`.
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let digits = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (first, last) = (digits(first)?, digits(last)?);
    let total = match total {
        "*" => None,
        t => Some(digits(t)?),
    };
    (first <= last && total.is_none_or(|t| last < t)).then_some((first, last, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(offset: u64, total: Option<u64>, etag: Option<&str>, lm: Option<&str>) -> ResumePoint {
        ResumePoint {
            offset,
            validators: Validators {
                total,
                etag: etag.map(str::to_owned),
                last_modified: lm.map(str::to_owned),
            },
        }
    }

    fn head<'a>(
        status: u16,
        len: Option<u64>,
        range: Option<&'a str>,
        etag: Option<&'a str>,
    ) -> Head<'a> {
        Head {
            status,
            content_length: len,
            content_range: range,
            etag,
            last_modified: None,
        }
    }

    #[test]
    fn request_headers_table() {
        assert!(request_headers(None).is_empty());
        assert!(request_headers(Some(&held(0, Some(9), Some("\"a\""), None))).is_empty());
        assert_eq!(
            request_headers(Some(&held(5, Some(9), Some("\"a\""), Some("d")))),
            vec![("Range", "bytes=5-".into()), ("If-Range", "\"a\"".into())]
        );
        // A weak tag never guards a range; the date does.
        assert_eq!(
            request_headers(Some(&held(5, Some(9), Some("W/\"a\""), Some("d")))),
            vec![("Range", "bytes=5-".into()), ("If-Range", "d".into())]
        );
        assert_eq!(
            request_headers(Some(&held(5, Some(9), None, None))),
            vec![("Range", "bytes=5-".into())]
        );
    }

    #[test]
    fn decision_table() {
        let h = held(100, Some(1000), Some("\"a\""), None);
        let total_only = held(100, Some(1000), None, None);
        let nothing = held(100, None, None, None);
        fn stream(offset: u64, total: Option<u64>, etag: &str) -> Decision {
            Decision::Stream(held(offset, total, Some(etag), None))
        }
        let restart = |d: Decision| matches!(d, Decision::Restart(_));
        type Row<'a> = (
            Option<&'a ResumePoint>,
            Head<'a>,
            Box<dyn Fn(Decision) -> bool>,
        );
        let table: Vec<Row> = vec![
            // Fresh download.
            (
                None,
                head(200, Some(1000), None, Some("\"a\"")),
                Box::new(|d| d == stream(0, Some(1000), "\"a\"")),
            ),
            // Resumed as asked.
            (
                Some(&h),
                head(206, Some(900), Some("bytes 100-999/1000"), Some("\"a\"")),
                Box::new(|d| d == stream(100, Some(1000), "\"a\"")),
            ),
            // Unknown total in Content-Range: the held total stands.
            (
                Some(&h),
                head(206, None, Some("bytes 100-999/*"), Some("\"a\"")),
                Box::new(|d| d == stream(100, Some(1000), "\"a\"")),
            ),
            // The server ignored Range (or If-Range failed): the whole artifact from zero.
            (
                Some(&h),
                head(200, Some(1000), None, Some("\"b\"")),
                Box::new(|d| d == stream(0, Some(1000), "\"b\"")),
            ),
            // 206 for other content (a server that ignores If-Range), elsewhere, or short.
            (
                Some(&h),
                head(206, Some(900), Some("bytes 100-999/1000"), Some("\"b\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(206, Some(900), Some("bytes 100-999/1001"), Some("\"a\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(206, Some(900), Some("bytes 0-999/1000"), Some("\"a\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(206, Some(100), Some("bytes 100-199/1000"), Some("\"a\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(206, Some(5), Some("bytes 100-999/1000"), Some("\"a\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(206, None, Some("bytes 100-999"), Some("\"a\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(206, None, None, Some("\"a\"")),
                Box::new(restart),
            ),
            (
                Some(&h),
                head(
                    206,
                    None,
                    Some("bytes 100-999/1000, 0-1/1000"),
                    Some("\"a\""),
                ),
                Box::new(restart),
            ),
            // No validator on both sides but the total: compared on it.
            (
                Some(&total_only),
                head(206, None, Some("bytes 100-999/1000"), None),
                Box::new(|d| matches!(d, Decision::Stream(p) if p.offset == 100)),
            ),
            // Nothing to compare at all: never spliced.
            (
                Some(&nothing),
                head(206, None, Some("bytes 100-999/*"), None),
                Box::new(restart),
            ),
            // 416, and partial content nobody asked for.
            (Some(&h), head(416, None, None, None), Box::new(restart)),
            (
                None,
                head(206, Some(900), Some("bytes 100-999/1000"), None),
                Box::new(restart),
            ),
            // Anything else is for the status check.
            (
                Some(&h),
                head(404, None, None, None),
                Box::new(|d| d == Decision::NotOk),
            ),
            (
                None,
                head(416, None, None, None),
                Box::new(|d| d == Decision::NotOk),
            ),
            (
                None,
                head(302, None, None, None),
                Box::new(|d| d == Decision::NotOk),
            ),
        ];
        for (i, (resume, head, ok)) in table.into_iter().enumerate() {
            let d = decide(resume, &head, 1 << 20).expect("decides");
            assert!(ok(d.clone()), "row {i}: {head:?} -> {d:?}");
        }
    }

    #[test]
    fn declared_sizes_above_the_limit_are_refused() {
        let e = decide(None, &head(200, Some(11), None, None), 10).expect_err("200");
        assert!(
            matches!(
                e,
                FetchError::DeclaredTooLarge {
                    declared: 11,
                    limit: 10
                }
            ),
            "{e}"
        );
        let h = held(5, None, Some("\"a\""), None);
        let e = decide(
            Some(&h),
            &head(206, None, Some("bytes 5-10/11"), Some("\"a\"")),
            10,
        )
        .expect_err("206");
        assert!(
            matches!(e, FetchError::DeclaredTooLarge { declared: 11, .. }),
            "{e}"
        );
    }

    #[test]
    fn content_ranges() {
        assert_eq!(parse_content_range("bytes 0-0/1"), Some((0, 0, Some(1))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, 9, None)));
        for bad in [
            "bytes 5-4/10",
            "bytes 5-10/10",
            "bytes -5/10",
            "bytes 1-2",
            "items 1-2/3",
            "bytes +1-2/3",
            "bytes 1-2/x",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }
}
