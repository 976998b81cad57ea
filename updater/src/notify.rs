//! systemd readiness notification (`sd_notify`) with std only: one datagram to `$NOTIFY_SOCKET`.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to `$NOTIFY_SOCKET`. `Ok(false)` when not run by systemd.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &path)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_a_datagram() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("notify");
        let server = UnixDatagram::bind(&p).expect("bind");
        // Only this test touches NOTIFY_SOCKET in this process.
        std::env::set_var("NOTIFY_SOCKET", &p);
        assert!(notify("READY=1").expect("sent"));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");
    }
}
