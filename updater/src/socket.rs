//! The updater's Unix socket server: bounded handlers (the 33rd connection gets `busy`), a request-read deadline,
//! peer credentials checked, status always answered, mutating requests handed to the transaction.

use crate::durable;
use crate::fault::Crashed;
use crate::paths::Paths;
use crate::peer;
use crate::transaction::{Accepted, Refused, Updater};
use fleet_wire::limits::{
    SOCKET_FRAME_MAX_BYTES, SOCKET_MAX_HANDLERS, SOCKET_REQUEST_READ_TIMEOUT,
    SOCKET_STATUS_RESPONSE_TIMEOUT,
};
use fleet_wire::socket::{parse_request, read_frame, write_frame, FrameError, PROTOCOL_VERSION};
use fleet_wire::{ErrorCode, Request, Response, ResponseFrame};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

/// Handles one connection: credentials, one request line, one answer.
fn handle(stream: &UnixStream, updater: &Updater, cfg: &ServerConfig) {
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
    let line = match read_frame(&mut reader, SOCKET_FRAME_MAX_BYTES) {
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

/// Serves connections on `listener` forever (each on its own thread, at most `cfg.max_handlers` at once).
pub fn serve(listener: UnixListener, updater: Updater, cfg: ServerConfig) -> io::Result<()> {
    let active = Arc::new(AtomicUsize::new(0));
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
        if active.load(Ordering::SeqCst) >= cfg.max_handlers {
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
        let (u, a) = (updater.clone(), Arc::clone(&active));
        let spawned = thread::Builder::new()
            .name("socket-handler".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let _slot = Slot(a);
                handle(&stream, &u, &cfg);
            });
        if let Err(e) = spawned {
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
