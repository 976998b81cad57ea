//! The TCP relay that exposes a host port inside a guest's network namespace, and can take the device offline.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running TCP relay (see [`Guest::forward`]); stopped on drop.
pub struct Forward {
    state: Arc<ForwardState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct ForwardState {
    stop: AtomicBool,
    connected: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    listen: SocketAddr,
}

/// A handle that switches a [`Forward`] relay between connected and offline.
#[derive(Clone)]
pub struct ForwardHandle(Arc<ForwardState>);

impl ForwardHandle {
    /// `false` resets every relayed connection and refuses new ones (the device is offline); `true` relays again.
    pub fn set_connected(&self, connected: bool) {
        self.0.connected.store(connected, Ordering::SeqCst);
        if !connected {
            let mut conns = self.0.conns.lock().unwrap_or_else(|p| p.into_inner());
            for c in conns.drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    /// The address the guest connects to.
    pub fn addr(&self) -> SocketAddr {
        self.0.listen
    }
}

impl Forward {
    pub(super) fn start(listener: TcpListener, listen: SocketAddr, target: SocketAddr) -> Self {
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("relay: nonblocking: {e}"));
        let state = Arc::new(ForwardState {
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(true),
            conns: Mutex::new(vec![]),
            listen,
        });
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            while !st.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if !st.connected.load(Ordering::SeqCst) {
                            drop(client);
                            continue;
                        }
                        let _ = client.set_nonblocking(false);
                        let Ok(server) =
                            TcpStream::connect_timeout(&target, Duration::from_secs(5))
                        else {
                            continue;
                        };
                        relay(&st, client, server);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            state,
            thread: Some(thread),
        }
    }

    pub(super) fn handle(&self) -> ForwardHandle {
        ForwardHandle(self.state.clone())
    }
}

fn relay(st: &Arc<ForwardState>, client: TcpStream, server: TcpStream) {
    let pairs = [
        (client.try_clone(), server.try_clone()),
        (server.try_clone(), client.try_clone()),
    ];
    {
        let mut conns = st.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.push(client);
        conns.push(server);
    }
    for pair in pairs {
        if let (Ok(mut from), Ok(mut to)) = pair {
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
            });
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        ForwardHandle(self.state.clone()).set_connected(false);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
