//! The newest lines of a container's log for a diagnostics bundle (`GET /containers/{id}/logs`), read as a
//! stream and bounded: at most [`LOG_READ_MAX`] bytes are read and only the newest [`LOG_KEEP_MAX`] are held,
//! so a workload that logged 100 MiB costs the agent a few dozen KiB. The body is de-chunked and its multiplexed
//! frames (`[stream, 0, 0, 0, size u32 BE]` + payload; a TTY container's log is raw) decoded as it arrives.

use super::api::{enc, status_error, Podman, PodmanError, API};
use super::http::{self, HttpError};
use std::io::Read;
use std::time::{Duration, Instant};

/// Most bytes of one log response read (after that the read stops, and the newest lines may be missing).
pub const LOG_READ_MAX: usize = 4 * 1024 * 1024;
/// Most bytes of decoded log held (its newest).
pub const LOG_KEEP_MAX: usize = 64 * 1024;
/// Largest response head accepted.
const HEAD_MAX: usize = 64 * 1024;
/// Longest chunk-size line accepted (size and extensions).
const CHUNK_LINE_MAX: usize = 256;

/// A log read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTail {
    /// The newest decoded bytes, as text (invalid UTF-8 replaced).
    pub text: String,
    /// Older bytes were dropped to stay within [`LOG_KEEP_MAX`].
    pub cut: bool,
    /// The read stopped at [`LOG_READ_MAX`] (or its deadline) before the log's end: newer lines were not read.
    pub stopped: Option<String>,
}

impl Podman {
    /// The newest `lines` lines of container `id` (both streams, with timestamps), logged since `since` (Unix
    /// seconds) if given; everything read within `timeout`.
    pub fn logs_tail(
        &self,
        id: &str,
        lines: u32,
        since: Option<i64>,
        timeout: Duration,
    ) -> Result<LogTail, PodmanError> {
        let mut path = format!(
            "{API}/containers/{}/logs?stdout=true&stderr=true&timestamps=true&tail={lines}",
            enc(id)
        );
        if let Some(s) = since {
            path.push_str(&format!("&since={s}"));
        }
        let deadline = Instant::now() + timeout;
        let stream = http::send(self.socket(), "GET", &path, None, &[], timeout)?;
        // Short reads, so the deadline is checked between them.
        stream
            .set_read_timeout(Some(
                timeout
                    .min(Duration::from_millis(500))
                    .max(Duration::from_millis(1)),
            ))
            .map_err(HttpError::Io)?;
        let mut src = Deadlined {
            inner: stream,
            deadline,
        };
        let (head, rest) = read_head(&mut src)?;
        if head.status != 200 {
            let mut body = rest;
            let _ = (&mut src)
                .take((HEAD_MAX - body.len().min(HEAD_MAX)) as u64)
                .read_to_end(&mut body);
            return Err(status_error(
                "GET",
                "/containers/{id}/logs",
                head.status,
                &body,
            ));
        }
        let mut chained = std::io::Cursor::new(rest).chain(src);
        read_log_body(&mut chained, head.chunked, LOG_READ_MAX, LOG_KEEP_MAX).map_err(|e| {
            PodmanError::Decode {
                call: "container logs".into(),
                message: e,
            }
        })
    }
}

/// A socket whose short read time-outs are retried until `deadline`, then reported as [`std::io::ErrorKind::TimedOut`].
struct Deadlined {
    inner: std::os::unix::net::UnixStream,
    deadline: Instant,
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    if Instant::now() >= self.deadline {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "Podman did not finish sending the log in time",
                        ));
                    }
                }
                r => return r,
            }
        }
    }
}

/// Reads up to the end of the response head; returns it and the body bytes read with it.
fn read_head(src: &mut impl Read) -> Result<(http::Head, Vec<u8>), HttpError> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = http::parse_head(&raw[..end])?;
            return Ok((head, raw[end + 4..].to_vec()));
        }
        if raw.len() > HEAD_MAX {
            return Err(HttpError::Malformed("response head too large".into()));
        }
        let n = src.read(&mut buf)?;
        if n == 0 {
            return Err(HttpError::Malformed("no end of headers".into()));
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// Reads a log body from `src` (chunked or not): at most `read_max` bytes, the newest `keep` decoded bytes held.
/// A time-out or the bound ends the read with what was kept, saying why in [`LogTail::stopped`].
pub fn read_log_body(
    src: &mut impl Read,
    chunked: bool,
    read_max: usize,
    keep: usize,
) -> Result<LogTail, String> {
    let mut dechunk = chunked.then(Dechunker::default);
    let mut frames = FrameDecoder::default();
    let mut tail = TailBuf::new(keep);
    let mut body = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut read = 0usize;
    let mut stopped = None;
    loop {
        if read >= read_max {
            stopped = Some(format!(
                "stopped reading the log after {} MiB: newer lines were not read",
                read_max / (1024 * 1024)
            ));
            break;
        }
        let want = buf.len().min(read_max - read);
        let n = match src.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                stopped = Some(format!("{e}: newer lines were not read"));
                break;
            }
            Err(e) => return Err(e.to_string()),
        };
        read += n;
        let decoded: &[u8] = match dechunk.as_mut() {
            Some(d) => {
                body.clear();
                if d.feed(&buf[..n], &mut body)? {
                    frames.feed(&body, &mut |p| tail.push(p));
                    break;
                }
                &body
            }
            None => &buf[..n],
        };
        frames.feed(decoded, &mut |p| tail.push(p));
    }
    let (mut bytes, cut) = tail.finish();
    if stopped.is_some() {
        // The read stopped inside a line: its start only is left out (unless it is the only one).
        if let Some(nl) = bytes.iter().rposition(|&b| b == b'\n') {
            bytes.truncate(nl + 1);
        }
    }
    Ok(LogTail {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        cut: cut || stopped.is_some(),
        stopped,
    })
}

/// Incremental `Transfer-Encoding: chunked` decoding.
#[derive(Debug, Default)]
pub struct Dechunker {
    state: ChunkState,
    line: Vec<u8>,
}

#[derive(Debug, Default)]
enum ChunkState {
    #[default]
    Size,
    Data(usize),
    /// The CRLF after a chunk's data: how many of its bytes are still to come.
    DataEnd(u8),
    Done,
}

impl Dechunker {
    /// Decodes `input` into `out`; true once the last chunk was seen (trailers are ignored).
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<bool, String> {
        while !input.is_empty() {
            match self.state {
                ChunkState::Done => return Ok(true),
                ChunkState::Size => {
                    let nl = input.iter().position(|&b| b == b'\n');
                    let take = nl.map_or(input.len(), |i| i + 1);
                    self.line.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.line.len() > CHUNK_LINE_MAX {
                        return Err("chunk size line too long".into());
                    }
                    if nl.is_some() {
                        let text = String::from_utf8_lossy(&self.line);
                        let hex = text.split(';').next().unwrap_or("").trim();
                        let size = usize::from_str_radix(hex, 16)
                            .map_err(|_| format!("bad chunk size {hex:?}"))?;
                        self.line.clear();
                        self.state = if size == 0 {
                            ChunkState::Done
                        } else {
                            ChunkState::Data(size)
                        };
                    }
                }
                ChunkState::Data(left) => {
                    let take = left.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = if take == left {
                        ChunkState::DataEnd(2)
                    } else {
                        ChunkState::Data(left - take)
                    };
                }
                ChunkState::DataEnd(left) => {
                    input = &input[1..];
                    self.state = if left == 1 {
                        ChunkState::Size
                    } else {
                        ChunkState::DataEnd(left - 1)
                    };
                }
            }
        }
        Ok(matches!(self.state, ChunkState::Done))
    }
}

/// Incremental decoding of Podman's multiplexed log stream: each frame's payload is passed on; a stream whose
/// first eight bytes are no frame header (a TTY container's) is passed on as it is.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    left: usize,
    raw: bool,
}

impl FrameDecoder {
    /// Decodes `input`, passing payload bytes to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut dyn FnMut(&[u8])) {
        while !input.is_empty() {
            if self.raw {
                out(input);
                return;
            }
            if self.left > 0 {
                let take = self.left.min(input.len());
                out(&input[..take]);
                self.left -= take;
                input = &input[take..];
                continue;
            }
            let take = (8 - self.header.len()).min(input.len());
            self.header.extend_from_slice(&input[..take]);
            input = &input[take..];
            if self.header.len() < 8 {
                // A partial header: a raw stream's first bytes are decided once eight are in.
                if self.header[0] > 2 || self.header[1..].iter().any(|&b| b != 0) {
                    self.raw = true;
                    let h = std::mem::take(&mut self.header);
                    out(&h);
                }
                continue;
            }
            let h = std::mem::take(&mut self.header);
            if h[0] > 2 || h[1..4] != [0, 0, 0] {
                self.raw = true;
                out(&h);
                continue;
            }
            self.left = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        }
    }
}

/// The newest `keep` bytes pushed, and whether older ones were dropped; memory at most twice `keep`.
#[derive(Debug)]
pub struct TailBuf {
    keep: usize,
    buf: Vec<u8>,
    dropped: bool,
}

impl TailBuf {
    /// An empty buffer keeping `keep` bytes.
    pub fn new(keep: usize) -> Self {
        Self {
            keep,
            buf: Vec::new(),
            dropped: false,
        }
    }

    /// Appends `bytes`, dropping the oldest beyond the bound.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if bytes.len() > self.keep {
            self.dropped = true;
            self.buf.clear();
            bytes = &bytes[bytes.len() - self.keep..];
        }
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > 2 * self.keep {
            let over = self.buf.len() - self.keep;
            self.buf.drain(..over);
            self.dropped = true;
        }
    }

    /// The kept bytes (starting at a line when one starts after a drop) and whether anything was dropped.
    pub fn finish(mut self) -> (Vec<u8>, bool) {
        if self.buf.len() > self.keep {
            let over = self.buf.len() - self.keep;
            self.buf.drain(..over);
            self.dropped = true;
        }
        if self.dropped {
            // A line whose start was dropped is left out whole (unless it is the only one).
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                if nl + 1 < self.buf.len() {
                    self.buf.drain(..=nl);
                }
            }
        }
        (self.buf, self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![stream, 0, 0, 0];
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn decode_in_pieces(input: &[u8], piece: usize) -> Vec<u8> {
        let mut d = FrameDecoder::default();
        let mut out = Vec::new();
        for c in input.chunks(piece) {
            d.feed(c, &mut |p| out.extend_from_slice(p));
        }
        out
    }

    #[test]
    fn frames_are_decoded_whatever_the_read_boundaries() {
        let mut s = frame(1, b"out line\n");
        s.extend(frame(2, b"err line\n"));
        s.extend(frame(1, b""));
        s.extend(frame(1, b"last\n"));
        for piece in [1, 3, 7, 8, 9, 1000] {
            assert_eq!(
                decode_in_pieces(&s, piece),
                b"out line\nerr line\nlast\n",
                "{piece}"
            );
        }
        // A TTY container's log is not multiplexed: passed on as it is.
        for piece in [1, 5, 100] {
            assert_eq!(decode_in_pieces(b"plain text\n", piece), b"plain text\n");
        }
    }

    #[test]
    fn chunked_bodies_are_decoded_incrementally() {
        let body = b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n";
        for piece in [1, 2, 5, 100] {
            let mut d = Dechunker::default();
            let mut out = Vec::new();
            let mut done = false;
            for c in body.chunks(piece) {
                done = d.feed(c, &mut out).expect("decodes");
            }
            assert!(done);
            assert_eq!(out, b"abcde");
        }
        assert!(Dechunker::default()
            .feed(b"zz\r\n", &mut Vec::new())
            .is_err());
    }

    #[test]
    fn the_tail_keeps_the_newest_bytes_from_a_line_start() {
        let mut t = TailBuf::new(10);
        for l in ["one\n", "two\n", "three\n", "four\n"] {
            t.push(l.as_bytes());
        }
        assert_eq!(t.finish(), (b"four\n".to_vec(), true));
        let mut t = TailBuf::new(100);
        t.push(b"a\nb\n");
        assert_eq!(t.finish(), (b"a\nb\n".to_vec(), false));
    }

    /// A synthetic log of `total` bytes in frames of 1 KiB lines, made as it is read (never held).
    struct Synthetic {
        left: usize,
        pending: Vec<u8>,
        line: u64,
    }

    impl Read for Synthetic {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.pending.is_empty() {
                if self.left == 0 {
                    return Ok(0);
                }
                let mut text = format!("line {} ", self.line).into_bytes();
                text.resize(1023, b'x');
                text.push(b'\n');
                self.line += 1;
                self.pending = frame(1, &text);
                self.left = self.left.saturating_sub(self.pending.len());
            }
            let n = buf.len().min(self.pending.len());
            buf[..n].copy_from_slice(&self.pending[..n]);
            self.pending.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn a_100_mib_log_yields_at_most_the_bound_and_says_it_was_cut() {
        let mut src = Synthetic {
            left: 100 * 1024 * 1024,
            pending: Vec::new(),
            line: 0,
        };
        let t = read_log_body(&mut src, false, LOG_READ_MAX, LOG_KEEP_MAX).expect("reads");
        assert!(t.text.len() <= LOG_KEEP_MAX, "{}", t.text.len());
        assert!(t.cut && t.stopped.is_some());
        assert!(t.text.starts_with("line ") && t.text.ends_with("x\n"));
        // It read at most the bound: the newest line held is within the first 4 MiB of frames.
        let last: u64 = t
            .text
            .lines()
            .last()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|n| n.parse().ok())
            .expect("a numbered line");
        assert!(last < (LOG_READ_MAX / 1024) as u64, "{last}");
        // A small log is read whole.
        let mut small = std::io::Cursor::new(frame(1, b"hello\n"));
        let t = read_log_body(&mut small, false, LOG_READ_MAX, LOG_KEEP_MAX).expect("reads");
        assert_eq!(
            (t.text.as_str(), t.cut, t.stopped),
            ("hello\n", false, None)
        );
    }
}
