//! systemd notifications (`READY=1`, `STOPPING=1`) as a datagram to `$NOTIFY_SOCKET`, written with std only.

use std::os::unix::net::UnixDatagram;

/// Sends `state` to `$NOTIFY_SOCKET` if it is set. Abstract-namespace addresses (`@name`) are handled.
/// Returns whether a notification was sent.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let target = target.to_string_lossy().into_owned();
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &target)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sends_to_path_socket() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("notify");
        let rx = std::os::unix::net::UnixDatagram::bind(&p).expect("bind");
        // Tests in this module run alone with respect to NOTIFY_SOCKET.
        std::env::set_var("NOTIFY_SOCKET", &p);
        assert!(super::notify("READY=1").expect("send"));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");

        // An abstract-namespace address, as systemd may hand out: `@name`.
        use std::os::linux::net::SocketAddrExt;
        let name = format!("fleet-agent-test-{}", std::process::id());
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
