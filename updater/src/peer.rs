//! Who is on the other end of a Unix socket (`SO_PEERCRED`), and whether they may use the updater.

use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;

/// The peer's credentials at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: libc::pid_t,
    /// User id.
    pub uid: libc::uid_t,
    /// Primary group id.
    pub gid: libc::gid_t,
}

/// Reads `SO_PEERCRED` of a connected stream.
pub fn peer_cred(stream: &UnixStream) -> std::io::Result<PeerCred> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(std::io::Error::other)?;
    // SAFETY: valid fd, pointer and length.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// True for root and for members (primary or supplementary, per the user database) of `allowed_gid`.
pub fn allowed(cred: PeerCred, allowed_gid: libc::gid_t) -> bool {
    crate::users::uid_in_group(cred.uid, cred.gid, allowed_gid)
}
