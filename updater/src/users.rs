//! Looking up users and groups in the system's user database (libc `getpwnam_r`, `getgrnam_r`, `getgrouplist`).

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// A user and every group it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserIds {
    /// The user's name.
    pub name: String,
    /// uid.
    pub uid: libc::uid_t,
    /// Primary gid.
    pub gid: libc::gid_t,
    /// Every group id (primary included), as `getgrouplist` reports.
    pub groups: Vec<libc::gid_t>,
    /// Home directory.
    pub home: PathBuf,
}

/// A user or group lookup failed: the name does not exist ([`LookupError::not_found`]), or the user database
/// could not be read (NSS, LDAP, an I/O error), which is a different repair.
#[derive(Debug, thiserror::Error)]
#[error("{what} {name:?}: {why}")]
pub struct LookupError {
    what: &'static str,
    name: String,
    why: String,
    not_found: bool,
}

impl LookupError {
    /// True when the database answered and has no such user or group.
    pub fn not_found(&self) -> bool {
        self.not_found
    }
}

/// First buffer for a `get*_r` call, in bytes; doubled on `ERANGE`.
const START_BUF_BYTES: usize = 16 * 1024;
/// Largest buffer tried, in bytes (an entry larger than this is an error, not a loop).
const MAX_BUF_BYTES: usize = 4 * 1024 * 1024;
/// Most supplementary groups read for one user.
const MAX_GROUPS: usize = 65_536;

/// Runs a reentrant `get*_r` lookup in `buf`, doubling `buf` while it answers `ERANGE` (up to
/// [`MAX_BUF_BYTES`]). Ok means the call returned 0 (found or not found); Err carries any other error.
fn retry_erange(
    buf: &mut Vec<libc::c_char>,
    mut call: impl FnMut(&mut [libc::c_char]) -> libc::c_int,
) -> std::io::Result<()> {
    loop {
        match call(buf) {
            0 => return Ok(()),
            libc::ERANGE if buf.len() < MAX_BUF_BYTES => {
                let grown = (buf.len() * 2).min(MAX_BUF_BYTES);
                buf.resize(grown, 0);
            }
            rc => return Err(std::io::Error::from_raw_os_error(rc)),
        }
    }
}

fn lookup_failed(what: &'static str, name: &str, e: std::io::Error) -> LookupError {
    LookupError {
        what,
        name: name.into(),
        why: format!("the user database could not be read: {e}"),
        not_found: false,
    }
}

fn cstring(what: &'static str, name: &str) -> Result<CString, LookupError> {
    CString::new(name).map_err(|_| LookupError {
        what,
        name: name.into(),
        why: "contains a NUL byte".into(),
        not_found: true,
    })
}

/// Looks a user up by name, with its supplementary groups.
pub fn user_by_name(name: &str) -> Result<UserIds, LookupError> {
    let c = cstring("user", name)?;
    let mut buf = vec![0 as libc::c_char; START_BUF_BYTES];
    // SAFETY: passwd is plain data; getpwnam_r fills it, pointing into `buf`, which outlives every read below.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    retry_erange(&mut buf, |b| {
        // SAFETY: every pointer is valid for the sizes given.
        unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, b.as_mut_ptr(), b.len(), &mut out) }
    })
    .map_err(|e| lookup_failed("user", name, e))?;
    if out.is_null() {
        return Err(LookupError {
            what: "user",
            name: name.into(),
            why: "no such user (create it: scripts/setup.d/30-users.sh or device setup)".into(),
            not_found: true,
        });
    }
    // SAFETY: pw_dir is a NUL-terminated string inside `buf`.
    let home = unsafe { CStr::from_ptr(pw.pw_dir) }
        .to_string_lossy()
        .into_owned();
    // getgrouplist says how many groups there are when the array is too small: grow it once or twice.
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = libc::c_int::try_from(groups.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `groups` has room for `n` entries.
        let rc = unsafe { libc::getgrouplist(c.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) };
        let wanted = usize::try_from(n).unwrap_or(0);
        if rc >= 0 {
            groups.truncate(wanted);
            break;
        }
        if wanted <= groups.len() || wanted > MAX_GROUPS {
            return Err(LookupError {
                what: "user",
                name: name.into(),
                why: format!("its groups could not be listed (more than {MAX_GROUPS}?)"),
                not_found: false,
            });
        }
        groups.resize(wanted, 0);
    }
    Ok(UserIds {
        name: name.into(),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        groups,
        home: PathBuf::from(home),
    })
}

/// The name of the user with `uid`, if it has one.
/// `None` also when the database cannot be read: callers use it to admit a peer, and refusing is the safe side.
pub fn user_name(uid: libc::uid_t) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; START_BUF_BYTES];
    // SAFETY: as in `user_by_name`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    retry_erange(&mut buf, |b| {
        // SAFETY: every pointer is valid for the sizes given.
        unsafe { libc::getpwuid_r(uid, &mut pw, b.as_mut_ptr(), b.len(), &mut out) }
    })
    .ok()?;
    if out.is_null() {
        return None;
    }
    // SAFETY: pw_name is a NUL-terminated string inside `buf`.
    Some(
        unsafe { CStr::from_ptr(pw.pw_name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The gid of the group `name`.
pub fn group_gid(name: &str) -> Result<libc::gid_t, LookupError> {
    let c = cstring("group", name)?;
    let mut buf = vec![0 as libc::c_char; START_BUF_BYTES];
    // SAFETY: group is plain data filled by getgrnam_r.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    retry_erange(&mut buf, |b| {
        // SAFETY: every pointer is valid for the sizes given.
        unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, b.as_mut_ptr(), b.len(), &mut out) }
    })
    .map_err(|e| lookup_failed("group", name, e))?;
    if out.is_null() {
        return Err(LookupError {
            what: "group",
            name: name.into(),
            why: "no such group (create it: scripts/setup.d/30-users.sh or device setup)".into(),
            not_found: true,
        });
    }
    Ok(gr.gr_gid)
}

/// True when the user `uid` (primary group `gid`) is root or belongs to `allowed_gid`.
pub fn uid_in_group(uid: libc::uid_t, gid: libc::gid_t, allowed_gid: libc::gid_t) -> bool {
    if uid == 0 || gid == allowed_gid {
        return true;
    }
    user_name(uid)
        .and_then(|n| user_by_name(&n).ok())
        .is_some_and(|u| u.groups.contains(&allowed_gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erange_grows_the_buffer_and_other_errors_are_lookup_errors() {
        let mut buf = vec![0 as libc::c_char; START_BUF_BYTES];
        let mut calls = 0;
        retry_erange(&mut buf, |b| {
            calls += 1;
            if b.len() < 4 * START_BUF_BYTES {
                libc::ERANGE
            } else {
                0
            }
        })
        .expect("grows until it fits");
        assert_eq!((calls, buf.len()), (3, 4 * START_BUF_BYTES));
        let e = retry_erange(&mut buf, |_| libc::ERANGE).expect_err("bounded");
        assert_eq!(e.raw_os_error(), Some(libc::ERANGE));
        assert_eq!(buf.len(), MAX_BUF_BYTES);
        let e = retry_erange(&mut buf, |_| libc::EIO).expect_err("io");
        assert!(!lookup_failed("user", "x", e).not_found());
    }

    #[test]
    fn looks_up_root() {
        let r = user_by_name("root").expect("root");
        assert_eq!((r.uid, r.gid), (0, 0));
        assert!(r.groups.contains(&0));
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(group_gid("root").expect("group"), 0);
        let e = user_by_name("no-such-user-xyz").expect_err("missing");
        assert!(e.not_found(), "{e}");
        assert!(group_gid("no-such-group-xyz")
            .expect_err("missing")
            .not_found());
        assert!(uid_in_group(0, 0, 12345));
        assert!(!uid_in_group(65534, 65534, 0));
    }
}
