//! The one tokio runtime the rig's blocking NATS client runs async-nats on, and the call that blocks a test thread
//! on it.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// Bound of any one blocking call, a safety net over async-nats's own time-outs (requests 10 s, JetStream API
/// 5 s, connect 5 s): a call that takes longer fails the test instead of hanging it.
pub const CALL_BOUND: Duration = Duration::from_secs(120);

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fleet-rig-nats")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("the test rig's NATS runtime: {e}"))
    })
}

/// Runs `fut` on the rig's runtime and blocks the calling thread until it ends. The future is spawned rather than
/// `block_on`-ed so that a caller inside another runtime (a `#[tokio::test]`, an operator test's `block_on`) may
/// call too, as it could with a blocking client.
pub fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    match rx.recv_timeout(CALL_BOUND) {
        Ok(out) => out,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a NATS call of the test rig took over {CALL_BOUND:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("a NATS call of the test rig panicked")
        }
    }
}

/// An async-nats error as text with its sources (async-nats puts the server's description in a source).
pub fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cur = s.source();
    }
    text
}

/// An async-nats error as an `io::Error` (the blocking API's error type), time-outs as `TimedOut`.
pub fn io_error(e: impl std::error::Error + 'static) -> std::io::Error {
    let text = error_text(&e);
    let kind = if text.contains("timed out") {
        std::io::ErrorKind::TimedOut
    } else {
        std::io::ErrorKind::Other
    };
    std::io::Error::new(kind, text)
}
