//! The NATS client protocol without I/O: what the server sends (`INFO`, `MSG`, `HMSG`, `PING`, `PONG`, `+OK`,
//! `-ERR`) parsed from a byte buffer that may hold part of a frame or several, and what the client sends, encoded.
//! Every frame is bounded: a control line longer than [`Limits::max_control_line`] or a message larger than
//! [`Limits::max_payload`] is an error as soon as it is known, never a buffer that grows.

use serde::Deserialize;

/// Default bound of a control line (the `INFO` JSON included; nats-server's own limit for client lines is 4 KiB).
pub const MAX_CONTROL_LINE: usize = 64 * 1024;
/// nats-server's default `max_payload`, used until the server's `INFO` says otherwise.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// The bounds a frame must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest control line, without its `\r\n`.
    pub max_control_line: usize,
    /// Largest message (headers and payload together, as the server counts it).
    pub max_payload: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_control_line: MAX_CONTROL_LINE,
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }
}

/// The fields of the server's `INFO` the client uses (others are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ServerInfo {
    /// The server's id.
    pub server_id: String,
    /// The server's version.
    pub version: String,
    /// Largest message the server accepts (0 when not said: [`DEFAULT_MAX_PAYLOAD`]).
    pub max_payload: usize,
    /// The server requires TLS.
    pub tls_required: bool,
    /// The server offers TLS.
    pub tls_available: bool,
    /// The server understands `HPUB` / sends `HMSG`.
    pub headers: bool,
}

impl ServerInfo {
    /// Whether TLS can be started on this connection.
    pub fn offers_tls(&self) -> bool {
        self.tls_required || self.tls_available
    }

    /// The message bound this server announced.
    pub fn max_payload(&self) -> usize {
        if self.max_payload == 0 {
            DEFAULT_MAX_PAYLOAD
        } else {
            self.max_payload
        }
    }
}

/// Headers of an `HMSG` (or for an `HPUB`): the status line's code and description, and the fields in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// Status code of a status message (`404`, `503` …), when the first line has one.
    pub status: Option<String>,
    /// Text after the status code.
    pub description: Option<String>,
    /// `Name: value` fields, in order (a name may repeat).
    pub fields: Vec<(String, String)>,
}

impl Headers {
    /// The first value of field `name` (names compared without case).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Adds a field.
    pub fn insert(&mut self, name: &str, value: &str) {
        self.fields.push((name.to_owned(), value.to_owned()));
    }

    /// Parses a header block (`NATS/1.0[ code[ description]]\r\n`, fields, blank line).
    pub fn parse(block: &[u8]) -> Result<Headers, ProtoError> {
        let text = std::str::from_utf8(block).map_err(|_| malformed("headers are not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or_default();
        let rest = first
            .strip_prefix("NATS/1.0")
            .ok_or_else(|| malformed("headers do not start with NATS/1.0"))?;
        let mut h = Headers::default();
        let rest = rest.trim();
        if !rest.is_empty() {
            let (code, desc) = rest.split_once(' ').unwrap_or((rest, ""));
            h.status = Some(code.to_owned());
            let desc = desc.trim();
            if !desc.is_empty() {
                h.description = Some(desc.to_owned());
            }
        }
        for line in lines {
            if line.is_empty() {
                continue;
            }
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| malformed("header line without ':'"))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(malformed("header with an empty name"));
            }
            h.fields.push((name.to_owned(), value.trim().to_owned()));
        }
        Ok(h)
    }

    /// The header block as sent in an `HPUB` (no status line: only the server sends those).
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let mut out = b"NATS/1.0\r\n".to_vec();
        for (n, v) in &self.fields {
            if n.is_empty() || n.contains([':', '\r', '\n']) || v.contains(['\r', '\n']) {
                return Err(malformed("a header name or value with ':', CR or LF"));
            }
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        Ok(out)
    }
}

/// A message delivered on a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// The subscription it is for.
    pub sid: u64,
    /// The subject it was published to.
    pub subject: String,
    /// Its reply subject.
    pub reply: Option<String>,
    /// Its headers (an `HMSG`).
    pub headers: Option<Headers>,
    /// The payload.
    pub payload: Vec<u8>,
}

/// One frame from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOp {
    /// `INFO {json}`.
    Info(Box<ServerInfo>),
    /// `MSG` or `HMSG`.
    Msg(Msg),
    /// `PING`: answer `PONG`.
    Ping,
    /// `PONG`: the answer to our oldest unanswered `PING`.
    Pong,
    /// `+OK` (verbose mode only; the client does not ask for it).
    Ok,
    /// `-ERR 'text'`.
    Err(String),
}

/// Why a frame was refused; the connection cannot go on after one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// No `\r\n` within the control-line bound.
    #[error("NATS control line longer than {limit} bytes")]
    ControlLineTooLong {
        /// The bound.
        limit: usize,
    },
    /// A message larger than `max_payload`.
    #[error("NATS message of {size} bytes is larger than max_payload {limit}")]
    PayloadTooLarge {
        /// Its announced size.
        size: usize,
        /// The bound.
        limit: usize,
    },
    /// Anything else that is not the protocol.
    #[error("NATS protocol error: {0}")]
    Malformed(String),
}

fn malformed(what: &str) -> ProtoError {
    ProtoError::Malformed(what.to_owned())
}

fn number(s: &str) -> Result<usize, ProtoError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed("a size or sid that is not a number"));
    }
    s.parse()
        .map_err(|_| malformed("a size or sid out of range"))
}

/// Parses the first frame of `buf`: `Ok(None)` when it is not complete yet (read more), otherwise the frame and
/// how many bytes it took. An error is final (close the connection).
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(ServerOp, usize)>, ProtoError> {
    let window = &buf[..buf.len().min(limits.max_control_line.saturating_add(2))];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() > limits.max_control_line.saturating_add(1) {
            return Err(ProtoError::ControlLineTooLong {
                limit: limits.max_control_line,
            });
        }
        return Ok(None);
    };
    if end > limits.max_control_line {
        return Err(ProtoError::ControlLineTooLong {
            limit: limits.max_control_line,
        });
    }
    let line =
        std::str::from_utf8(&buf[..end]).map_err(|_| malformed("control line is not UTF-8"))?;
    let after = end + 2;
    let (word, rest) = match line.find([' ', '\t']) {
        Some(i) => (&line[..i], line[i..].trim_start_matches([' ', '\t'])),
        None => (line, ""),
    };
    let op = word.to_ascii_uppercase();
    let simple = |op: ServerOp| -> Result<Option<(ServerOp, usize)>, ProtoError> {
        if rest.trim().is_empty() {
            Ok(Some((op, after)))
        } else {
            Err(malformed("arguments after PING, PONG or +OK"))
        }
    };
    match op.as_str() {
        "PING" => simple(ServerOp::Ping),
        "PONG" => simple(ServerOp::Pong),
        "+OK" => simple(ServerOp::Ok),
        "-ERR" => {
            let text = rest.trim();
            let text = text
                .strip_prefix('\'')
                .and_then(|t| t.strip_suffix('\''))
                .unwrap_or(text);
            Ok(Some((ServerOp::Err(text.to_owned()), after)))
        }
        "INFO" => {
            let info: ServerInfo = serde_json::from_str(rest).map_err(|e| {
                ProtoError::Malformed(format!("INFO is not the JSON expected: {e}"))
            })?;
            Ok(Some((ServerOp::Info(Box::new(info)), after)))
        }
        "MSG" | "HMSG" => {
            let args: Vec<&str> = rest.split([' ', '\t']).filter(|a| !a.is_empty()).collect();
            let with_headers = op == "HMSG";
            let fixed = if with_headers { 4 } else { 3 };
            if args.len() != fixed && args.len() != fixed + 1 {
                return Err(malformed("MSG/HMSG with the wrong number of arguments"));
            }
            let subject = args[0].to_owned();
            let sid = number(args[1])? as u64;
            let reply = (args.len() == fixed + 1).then(|| args[2].to_owned());
            let sizes = &args[args.len() - if with_headers { 2 } else { 1 }..];
            let total = number(sizes[sizes.len() - 1])?;
            let header_len = if with_headers { number(sizes[0])? } else { 0 };
            if total > limits.max_payload {
                return Err(ProtoError::PayloadTooLarge {
                    size: total,
                    limit: limits.max_payload,
                });
            }
            if header_len > total {
                return Err(malformed("HMSG header size larger than its total size"));
            }
            // The frame's end, `\r\n` included; `total` is bounded, so this cannot overflow.
            let frame_end = after + total + 2;
            if buf.len() < frame_end {
                return Ok(None);
            }
            if &buf[after + total..frame_end] != b"\r\n" {
                return Err(malformed("message not followed by CR LF"));
            }
            let body = &buf[after..after + total];
            let headers = if with_headers {
                Some(Headers::parse(&body[..header_len])?)
            } else {
                None
            };
            Ok(Some((
                ServerOp::Msg(Msg {
                    sid,
                    subject,
                    reply,
                    headers,
                    payload: body[header_len..].to_vec(),
                }),
                frame_end,
            )))
        }
        _ => Err(ProtoError::Malformed(format!(
            "unknown operation {:?}",
            word.chars().take(16).collect::<String>()
        ))),
    }
}

/// A subject or reply subject as the protocol carries it: not empty, no white space or control characters
/// (which would end the frame early: one line could then smuggle another).
pub fn check_subject(s: &str) -> Result<(), ProtoError> {
    if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ProtoError::Malformed(format!(
            "invalid subject {:?}",
            s.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// `PUB` (or `HPUB` with headers) of `payload` to `subject`, with an optional reply subject.
pub fn publish(
    subject: &str,
    reply: Option<&str>,
    headers: Option<&Headers>,
    payload: &[u8],
) -> Result<Vec<u8>, ProtoError> {
    check_subject(subject)?;
    if let Some(r) = reply {
        check_subject(r)?;
    }
    let reply = reply.map(|r| format!(" {r}")).unwrap_or_default();
    let mut out;
    match headers {
        Some(h) => {
            let block = h.encode()?;
            out = format!(
                "HPUB {subject}{reply} {} {}\r\n",
                block.len(),
                block.len() + payload.len()
            )
            .into_bytes();
            out.reserve(block.len() + payload.len() + 2);
            out.extend_from_slice(&block);
        }
        None => {
            out = format!("PUB {subject}{reply} {}\r\n", payload.len()).into_bytes();
            out.reserve(payload.len() + 2);
        }
    }
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Ok(out)
}

/// `SUB subject sid`.
pub fn subscribe(subject: &str, sid: u64) -> Result<Vec<u8>, ProtoError> {
    check_subject(subject)?;
    Ok(format!("SUB {subject} {sid}\r\n").into_bytes())
}

/// `UNSUB sid`.
pub fn unsubscribe(sid: u64) -> Vec<u8> {
    format!("UNSUB {sid}\r\n").into_bytes()
}

/// `PING`.
pub const PING: &[u8] = b"PING\r\n";
/// `PONG`.
pub const PONG: &[u8] = b"PONG\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> (ServerOp, usize) {
        parse(buf, &Limits::default())
            .expect("valid")
            .expect("complete")
    }

    #[test]
    fn control_frames() {
        assert_eq!(one(b"PING\r\n"), (ServerOp::Ping, 6));
        assert_eq!(one(b"pong\r\nPING\r\n"), (ServerOp::Pong, 6));
        assert_eq!(one(b"+OK\r\n"), (ServerOp::Ok, 5));
        assert_eq!(
            one(b"-ERR 'Authorization Violation'\r\n").0,
            ServerOp::Err("Authorization Violation".into())
        );
        let (op, n) = one(b"INFO {\"server_id\":\"S1\",\"max_payload\":2048,\"tls_required\":true,\"headers\":true,\"connect_urls\":[\"a:1\"]}\r\n");
        let ServerOp::Info(info) = op else {
            panic!("{op:?}")
        };
        assert_eq!(
            (
                info.server_id.as_str(),
                info.max_payload(),
                info.offers_tls(),
                info.headers
            ),
            ("S1", 2048, true, true)
        );
        assert!(n > 0);
        assert!(parse(b"INFO {nope}\r\n", &Limits::default()).is_err());
        assert!(parse(b"PING extra\r\n", &Limits::default()).is_err());
        assert!(parse(b"HELLO\r\n", &Limits::default()).is_err());
    }

    #[test]
    fn messages_with_and_without_reply_and_headers() {
        let (op, n) = one(b"MSG a.b 7 5\r\nhello\r\nPING\r\n");
        assert_eq!(n, 20);
        assert_eq!(
            op,
            ServerOp::Msg(Msg {
                sid: 7,
                subject: "a.b".into(),
                reply: None,
                headers: None,
                payload: b"hello".to_vec()
            })
        );
        let ServerOp::Msg(m) = one(b"MSG a 1 _INBOX.x 0\r\n\r\n").0 else {
            panic!()
        };
        assert_eq!((m.reply.as_deref(), m.payload.len()), (Some("_INBOX.x"), 0));
        let block = b"NATS/1.0 503\r\n\r\n";
        let frame = format!("HMSG _INBOX.x.1 2 {} {}\r\n", block.len(), block.len());
        let mut buf = frame.into_bytes();
        buf.extend_from_slice(block);
        buf.extend_from_slice(b"\r\n");
        let ServerOp::Msg(m) = one(&buf).0 else {
            panic!()
        };
        let h = m.headers.expect("headers");
        assert_eq!(h.status.as_deref(), Some("503"));
        assert!(m.payload.is_empty());
        let block =
            b"NATS/1.0 404 Message Not Found\r\nNats-Sequence: 12\r\nKV-Operation: DEL\r\n\r\n";
        let mut buf = format!("HMSG s 3 r {} {}\r\n", block.len(), block.len() + 2).into_bytes();
        buf.extend_from_slice(block);
        buf.extend_from_slice(b"ok\r\n");
        let ServerOp::Msg(m) = one(&buf).0 else {
            panic!()
        };
        let h = m.headers.expect("headers");
        assert_eq!(h.description.as_deref(), Some("Message Not Found"));
        assert_eq!(h.get("nats-sequence"), Some("12"));
        assert_eq!(h.get("KV-Operation"), Some("DEL"));
        assert_eq!(m.payload, b"ok");
    }

    #[test]
    fn split_frames_wait_for_the_rest() {
        let frame = b"MSG a.b 7 5\r\nhello\r\n";
        for cut in 0..frame.len() {
            assert_eq!(
                parse(&frame[..cut], &Limits::default()).expect("no error"),
                None,
                "cut at {cut}"
            );
        }
        assert_eq!(one(frame).1, frame.len());
    }

    #[test]
    fn oversize_frames_are_refused_early() {
        let limits = Limits {
            max_control_line: 32,
            max_payload: 10,
        };
        // Refused as soon as the announced size is read, before the payload arrives.
        assert_eq!(
            parse(b"MSG a 1 11\r\n", &limits),
            Err(ProtoError::PayloadTooLarge {
                size: 11,
                limit: 10
            })
        );
        assert_eq!(
            parse(&[b'x'; 40], &limits),
            Err(ProtoError::ControlLineTooLong { limit: 32 })
        );
        assert_eq!(parse(&[b'x'; 33], &limits), Ok(None));
        assert!(matches!(
            parse(b"MSG a 1 999999999999999999999\r\n", &limits),
            Err(ProtoError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"HMSG a 1 5 3\r\nabc\r\n", &limits),
            Err(ProtoError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"MSG a 1 3\r\nabcX\r\n", &limits),
            Err(ProtoError::Malformed(_))
        ));
    }

    #[test]
    fn client_frames_refuse_injection() {
        assert_eq!(
            publish("a.b", Some("r.1"), None, b"hi").expect("pub"),
            b"PUB a.b r.1 2\r\nhi\r\n"
        );
        let mut h = Headers::default();
        h.insert("K", "v");
        let f = publish("a", None, Some(&h), b"x").expect("hpub");
        assert_eq!(f, b"HPUB a 18 19\r\nNATS/1.0\r\nK: v\r\n\r\nx\r\n");
        assert!(publish("a b", None, None, b"").is_err());
        assert!(publish("a\r\nPUB x 0", None, None, b"").is_err());
        assert!(subscribe("", 1).is_err());
        let mut bad = Headers::default();
        bad.insert("K", "v\r\nX: y");
        assert!(publish("a", None, Some(&bad), b"").is_err());
        assert_eq!(subscribe("a.>", 3).expect("sub"), b"SUB a.> 3\r\n");
    }
}
