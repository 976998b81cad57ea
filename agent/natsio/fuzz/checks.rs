//! The fuzz target's properties (shared by `fuzz_targets/proto.rs` and the normal test suite, which replays the
//! seeds and every input a fuzzer ever failed on: `agent/natsio/tests/fuzz_regressions.rs`). Each check panics
//! when a property fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use fleet_nats::proto::{parse, Limits, ProtoError, ServerOp};

/// Every frame of `stream` parsed from one buffer, and how the stream ended (`None`: an incomplete tail).
fn parse_all(stream: &[u8], limits: &Limits) -> (Vec<ServerOp>, Option<ProtoError>) {
    let mut ops = Vec::new();
    let mut pos = 0;
    loop {
        match parse(&stream[pos..], limits) {
            Ok(Some((op, n))) => {
                assert!(
                    n > 0 && n <= stream.len() - pos,
                    "consumed {n} of {}",
                    stream.len() - pos
                );
                if let ServerOp::Msg(m) = &op {
                    let headers = n - m.payload.len();
                    assert!(
                        m.payload.len() <= limits.max_payload,
                        "payload past max_payload"
                    );
                    assert!(headers > 0);
                }
                ops.push(op);
                pos += n;
            }
            Ok(None) => return (ops, None),
            Err(e) => return (ops, Some(e)),
        }
    }
}

/// The same stream arriving in pieces (cut where the input says), parsed as the I/O thread does: the buffer
/// never holds more than one frame's bound plus one piece.
fn parse_pieces(
    stream: &[u8],
    cuts: &[u8],
    limits: &Limits,
) -> (Vec<ServerOp>, Option<ProtoError>) {
    let bound = limits.max_control_line + limits.max_payload + 4;
    let mut ops = Vec::new();
    let mut buf = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < stream.len() {
        let piece = usize::from(cuts.get(i % cuts.len().max(1)).copied().unwrap_or(7)) + 1;
        i += 1;
        let end = (at + piece).min(stream.len());
        buf.extend_from_slice(&stream[at..end]);
        at = end;
        loop {
            match parse(&buf, limits) {
                Ok(Some((op, n))) => {
                    ops.push(op);
                    buf.drain(..n);
                }
                Ok(None) => break,
                Err(e) => return (ops, Some(e)),
            }
        }
        assert!(
            buf.len() <= bound + piece,
            "buffer of {} bytes past its bound",
            buf.len()
        );
    }
    (ops, None)
}

/// The parser on arbitrary bytes: no panic, no frame past its bounds, and the same frames (and the same
/// ending) whether the stream comes at once or in pieces. The first byte picks small limits (so that the bounds
/// are hit), the second the piece sizes.
pub fn proto(data: &[u8]) {
    let (limits, cuts, stream) = match data {
        [l, c, rest @ ..] => (
            Limits {
                max_control_line: 8 + usize::from(l & 0x3f) * 4,
                max_payload: usize::from(l >> 6) * 64,
            },
            [*c, c.rotate_left(3), c.rotate_left(5)],
            rest,
        ),
        _ => (Limits::default(), [7, 7, 7], data),
    };
    let whole = parse_all(stream, &limits);
    let pieces = parse_pieces(stream, &cuts, &limits);
    assert_eq!(whole.0, pieces.0, "different frames when split");
    assert_eq!(
        whole.1.is_some(),
        pieces.1.is_some(),
        "an error in one reading only: {:?} / {:?}",
        whole.1,
        pieces.1
    );
    // Also with the default (large) limits.
    let _ = parse_all(stream, &Limits::default());
}
