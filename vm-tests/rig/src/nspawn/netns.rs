//! A guest's network: its own network namespace with a veth pair to the host, and binding sockets inside it.

use super::{host, COUNTER};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::atomic::Ordering;

/// Creates the guest's network namespace with a veth pair to the host on a free 10.213.0.0/16 /30.
pub(super) fn setup_network(name: &str) -> (Ipv4Addr, Ipv4Addr, String) {
    host(Command::new("ip").args(["netns", "add", name]));
    let used = String::from_utf8_lossy(
        &host(Command::new("ip").args(["-4", "-o", "addr", "show"])).stdout,
    )
    .to_string();
    let seed = std::process::id().wrapping_mul(2654435761) ^ COUNTER.load(Ordering::SeqCst);
    for i in 0..64u32 {
        let slot = (seed.wrapping_add(i.wrapping_mul(97))) % 16000;
        let (a, b) = ((slot * 4) / 256, (slot * 4) % 256);
        let host_ip = Ipv4Addr::new(10, 213, a as u8, (b + 1) as u8);
        let guest_ip = Ipv4Addr::new(10, 213, a as u8, (b + 2) as u8);
        if used.contains(&format!("inet {host_ip}/")) {
            continue;
        }
        let host_if = format!("fv{:x}", slot + 0x10000 * (std::process::id() % 0x100));
        let ok = Command::new("ip")
            .args([
                "link", "add", &host_if, "type", "veth", "peer", "name", "host0", "netns", name,
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            continue;
        }
        host(Command::new("ip").args(["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]));
        host(Command::new("ip").args(["link", "set", &host_if, "up"]));
        host(Command::new("ip").args([
            "-n",
            name,
            "addr",
            "add",
            &format!("{guest_ip}/30"),
            "dev",
            "host0",
        ]));
        host(Command::new("ip").args(["-n", name, "link", "set", "host0", "up"]));
        host(Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]));
        host(Command::new("ip").args([
            "-n",
            name,
            "route",
            "add",
            "default",
            "via",
            &host_ip.to_string(),
        ]));
        return (host_ip, guest_ip, host_if);
    }
    let _ = Command::new("ip").args(["netns", "del", name]).output();
    panic!("no free 10.213.x.y/30 for a guest veth pair");
}

/// Binds a TCP listener inside the network namespace at `netns_path`: a short-lived thread enters the namespace
/// (setns affects only the calling thread), binds, and hands the socket back. The socket stays in that namespace;
/// connections the relay makes from other threads are made in the host's namespace.
pub(super) fn bind_in_netns(netns_path: &str, addr: SocketAddr) -> TcpListener {
    use std::os::fd::AsRawFd;
    let ns = fs::File::open(netns_path).unwrap_or_else(|e| panic!("open {netns_path}: {e}"));
    let t = std::thread::spawn(move || -> std::io::Result<TcpListener> {
        // SAFETY: setns(2) on a valid, open namespace file descriptor; it changes only this thread, which ends
        // right after binding.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        TcpListener::bind(addr)
    });
    t.join()
        .unwrap_or_else(|_| panic!("relay bind thread panicked"))
        .unwrap_or_else(|e| panic!("relay: bind {addr} in {netns_path}: {e}"))
}
