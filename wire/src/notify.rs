//! The one systemd notification sender (feature `os`): `sd_notify` with std only, one datagram to
//! `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). Used by the agent and the updater.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`, `STOPPING=1`) to `$NOTIFY_SOCKET`. `Ok(false)` when not run by systemd.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = target.as_encoded_bytes().strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &target)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sends_to_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("notify");
        let rx = std::os::unix::net::UnixDatagram::bind(&p).expect("bind");
        // The only test of this crate that touches NOTIFY_SOCKET.
        std::env::set_var("NOTIFY_SOCKET", &p);
        assert!(super::notify("READY=1").expect("send"));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("fleet-wire-test-{}", std::process::id());
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let rx = std::os::unix::net::UnixDatagram::bind_addr(&addr).expect("bind abstract");
        std::env::set_var("NOTIFY_SOCKET", format!("@{name}"));
        assert!(super::notify("STOPPING=1").expect("send abstract"));
        std::env::remove_var("NOTIFY_SOCKET");
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"STOPPING=1");
        assert!(
            !super::notify("READY=1").expect("unset"),
            "nothing is sent without NOTIFY_SOCKET"
        );
    }
}
