//! The updater's Unix socket server: bounded handlers, a request-read deadline, peer credentials checked, status
//! always answered (idle or slow peers cannot hold every handler: a new connection evicts the oldest one that has
//! not sent its request yet), mutating requests handed to the transaction, diagnostics to [`crate::diagnostics`].

use crate::agent_upgrade::transaction::{Accepted, Refused, Updater};
use crate::durable;
use crate::fault::Crashed;
use crate::paths::Paths;
use crate::peer;
use fleet_wire::limits::{
    SOCKET_FRAME_MAX_BYTES, SOCKET_MAX_HANDLERS, SOCKET_REQUEST_READ_TIMEOUT,
    SOCKET_STATUS_RESPONSE_TIMEOUT,
};
use fleet_wire::socket::{parse_request, read_frame, write_frame, FrameError, PROTOCOL_VERSION};
use fleet_wire::{ErrorCode, Request, Response, ResponseFrame};
use std::collections::VecDeque;
use std::io::{self, BufReader, Read};
use std::net::Shutdown;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How the server admits and bounds connections.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Peers must be root or members of this group.
    pub allowed_gid: libc::gid_t,
    /// Time a client has to send its complete request line.
    pub read_timeout: Duration,
    /// Connections handled at once; one more gets `busy`.
    pub max_handlers: usize,
}

impl ServerConfig {
    /// The limits of the seed, admitting `allowed_gid`.
    pub fn new(allowed_gid: libc::gid_t) -> Self {
        Self {
            allowed_gid,
            read_timeout: SOCKET_REQUEST_READ_TIMEOUT,
            max_handlers: SOCKET_MAX_HANDLERS,
        }
    }
}

/// Creates `<root>/run/fleet-updater/updater.sock`, mode 0660, owned by root and the group `socket_gid`.
pub fn bind(paths: &Paths, socket_gid: libc::gid_t) -> io::Result<UnixListener> {
    let dir = paths.run_dir();
    durable::ensure_dir(&dir, 0o755)?;
    let path = paths.socket();
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
    std::os::unix::fs::chown(&path, None, Some(socket_gid))?;
    Ok(listener)
}

/// Reads with one deadline for the whole request, however slowly the bytes trickle in.
struct DeadlineReader<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        (&*self.stream).read(buf)
    }
}

fn frame(response: Response) -> ResponseFrame {
    ResponseFrame {
        protocol: PROTOCOL_VERSION,
        response,
    }
}

fn answer(stream: &UnixStream, response: Response) {
    let mut w = stream;
    if let Err(e) = write_frame(&mut w, &frame(response)) {
        log::debug!("socket: answering failed: {e}");
    }
}

/// Connections whose handler is still waiting for the request line, oldest first: the ones a new connection may
/// evict when every handler is taken (a complete request is never evicted, so status cannot be starved by idle or
/// slow peers; each handler still keeps its own read deadline).
#[derive(Default)]
struct Reading {
    next: AtomicU64,
    conns: Mutex<VecDeque<(u64, UnixStream)>>,
}

impl Reading {
    fn conns(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, UnixStream)>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers `stream` as waiting for its request; `None` when it cannot be cloned (then it is never evicted).
    fn enter(&self, stream: &UnixStream) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns().push_back((id, clone));
        Some(id)
    }

    /// The request line arrived (or reading ended): the connection is no longer evictable.
    fn leave(&self, id: Option<u64>) {
        if let Some(id) = id {
            self.conns().retain(|(i, _)| *i != id);
        }
    }

    /// Answers the oldest waiting connection `busy` and shuts it down; false when none is waiting.
    fn evict_oldest(&self, max_handlers: usize) -> bool {
        let Some((_, stream)) = self.conns().pop_front() else {
            return false;
        };
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        answer(
            &stream,
            Response::error(
                ErrorCode::Busy,
                format!(
                    "all {max_handlers} handlers were taken and this connection had not sent its request: closed for a newer one; try again"
                ),
            ),
        );
        // Wakes the handler's blocked read (it sees end of file) so its slot frees at once.
        let _ = stream.shutdown(Shutdown::Both);
        true
    }
}

/// Handles one connection: credentials, one request line, one answer.
/// `waiting` is its entry in `reading` (made at accept, in accept order), left once the request line is read.
fn handle(
    stream: &UnixStream,
    updater: &Updater,
    cfg: &ServerConfig,
    reading: &Reading,
    waiting: Option<u64>,
) {
    let _ = stream.set_write_timeout(Some(SOCKET_STATUS_RESPONSE_TIMEOUT));
    match peer::peer_cred(stream) {
        Ok(c) if peer::allowed(c, cfg.allowed_gid) => {}
        Ok(c) => {
            log::warn!("socket: refused peer uid {} pid {}", c.uid, c.pid);
            return answer(
                stream,
                Response::error(
                    ErrorCode::Forbidden,
                    "only root and members of the fleet-agent group may use the updater",
                ),
            );
        }
        Err(e) => {
            return answer(
                stream,
                Response::error(ErrorCode::Forbidden, format!("peer credentials: {e}")),
            )
        }
    }
    let mut reader = BufReader::with_capacity(
        64 * 1024,
        DeadlineReader {
            stream,
            deadline: Instant::now() + cfg.read_timeout,
        },
    );
    let read = read_frame(&mut reader, SOCKET_FRAME_MAX_BYTES);
    reading.leave(waiting);
    let line = match read {
        Ok(Some(line)) => line,
        Ok(None) => return,
        Err(FrameError::TooLarge { limit }) => {
            return answer(
                stream,
                Response::error(
                    ErrorCode::FrameTooLarge,
                    format!("the request line exceeds {limit} bytes"),
                ),
            )
        }
        Err(FrameError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) =>
        {
            return answer(
                stream,
                Response::error(
                    ErrorCode::Timeout,
                    format!("no complete request line within {:?}", cfg.read_timeout),
                ),
            )
        }
        Err(e) => {
            log::debug!("socket: reading a request: {e}");
            return answer(stream, Response::error(ErrorCode::Malformed, e.to_string()));
        }
    };
    let response = match parse_request(&line) {
        Err(e) => Response::error(e.code, e.message),
        Ok(Request::Status {}) => Response::Status {
            status: updater.status(),
        },
        Ok(Request::Upgrade { attempt }) => started(updater.accept(attempt), "transaction", {
            let u = updater.clone();
            move || u.run_transaction()
        }),
        Ok(Request::SystemUpgrade { attempt }) => {
            started(updater.accept_system(attempt), "system-upgrade", {
                let u = updater.clone();
                move || u.run_system()
            })
        }
        // Read-only: never the mutating lock, so it is answered during an upgrade too.
        Ok(Request::Diagnostics { request }) => crate::diagnostics::answer(updater, &request),
    };
    answer(stream, response);
}

/// The answer to a mutating request: a refusal, the current status, or (for a new transaction) its status once
/// `run` has been started on its own thread named `name`.
fn started(
    accepted: Result<Accepted, Refused>,
    name: &str,
    run: impl FnOnce() -> Result<(), Crashed> + Send + 'static,
) -> Response {
    let status = match accepted {
        Err(r) => return r.into(),
        Ok(Accepted::Current(status)) => return Response::Accepted { status },
        Ok(Accepted::Started(status)) => status,
    };
    let spawned = thread::Builder::new().name(name.into()).spawn(move || {
        if let Err(c) = run() {
            log::error!("{c}");
        }
    });
    match spawned {
        Ok(_) => Response::Accepted { status },
        Err(e) => Response::error(
            ErrorCode::Internal,
            format!(
                "could not start the {name} thread: {e}; restart fleet-updater (start-up recovery takes over the journaled attempt)"
            ),
        ),
    }
}

/// One handler slot, released even if the handler panics.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves connections on `listener` forever (each on its own thread, at most `cfg.max_handlers` at once, plus
/// as many again briefly while evicted handlers exit).
pub fn serve(listener: UnixListener, updater: Updater, cfg: ServerConfig) -> io::Result<()> {
    let active = Arc::new(AtomicUsize::new(0));
    let reading = Arc::new(Reading::default());
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                log::warn!("socket: accept failed: {e}");
                // Out of file descriptors, for example: do not spin.
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let n = active.load(Ordering::SeqCst);
        let full = n >= cfg.max_handlers.saturating_mul(2)
            || (n >= cfg.max_handlers && !reading.evict_oldest(cfg.max_handlers));
        if full {
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            answer(
                &stream,
                Response::error(
                    ErrorCode::Busy,
                    format!("all {} handlers are busy; try again", cfg.max_handlers),
                ),
            );
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (u, a, r) = (updater.clone(), Arc::clone(&active), Arc::clone(&reading));
        let waiting = reading.enter(&stream);
        let spawned = thread::Builder::new()
            .name("socket-handler".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let _slot = Slot(a);
                handle(&stream, &u, &cfg, &r, waiting);
                r.leave(waiting);
            });
        if let Err(e) = spawned {
            reading.leave(waiting);
            active.fetch_sub(1, Ordering::SeqCst);
            log::warn!("socket: could not start a handler: {e}");
        }
    }
    Ok(())
}

/// Serves on a background thread (tests and the daemon's main thread alike).
pub fn spawn(
    listener: UnixListener,
    updater: Updater,
    cfg: ServerConfig,
) -> io::Result<thread::JoinHandle<io::Result<()>>> {
    thread::Builder::new()
        .name("socket-accept".into())
        .spawn(move || serve(listener, updater, cfg))
}
