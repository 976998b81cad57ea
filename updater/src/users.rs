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

/// A user or group lookup failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {name:?}: {why}")]
pub struct LookupError {
    what: &'static str,
    name: String,
    why: String,
}

const BUF_BYTES: usize = 64 * 1024;
const MAX_GROUPS: usize = 1024;

fn cstring(what: &'static str, name: &str) -> Result<CString, LookupError> {
    CString::new(name).map_err(|_| LookupError {
        what,
        name: name.into(),
        why: "contains a NUL byte".into(),
    })
}

/// Looks a user up by name, with its supplementary groups.
pub fn user_by_name(name: &str) -> Result<UserIds, LookupError> {
    let c = cstring("user", name)?;
    let mut buf = vec![0 as libc::c_char; BUF_BYTES];
    // SAFETY: passwd is plain data; getpwnam_r fills it, pointing into `buf`, which outlives every read below.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc =
        unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return Err(LookupError {
            what: "user",
            name: name.into(),
            why: if rc == 0 {
                "no such user (create it: scripts/setup.d/30-users.sh or device setup)".into()
            } else {
                std::io::Error::from_raw_os_error(rc).to_string()
            },
        });
    }
    // SAFETY: pw_dir is a NUL-terminated string inside `buf`.
    let home = unsafe { CStr::from_ptr(pw.pw_dir) }
        .to_string_lossy()
        .into_owned();
    let mut groups = vec![0 as libc::gid_t; MAX_GROUPS];
    let mut n = libc::c_int::try_from(MAX_GROUPS).unwrap_or(libc::c_int::MAX);
    // SAFETY: `groups` has room for `n` entries.
    let rc = unsafe { libc::getgrouplist(c.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) };
    if rc < 0 {
        return Err(LookupError {
            what: "user",
            name: name.into(),
            why: format!("is in more than {MAX_GROUPS} groups"),
        });
    }
    groups.truncate(usize::try_from(n).unwrap_or(0));
    Ok(UserIds {
        name: name.into(),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        groups,
        home: PathBuf::from(home),
    })
}

/// The name of the user with `uid`, if it has one.
pub fn user_name(uid: libc::uid_t) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; BUF_BYTES];
    // SAFETY: as in `user_by_name`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
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
    let mut buf = vec![0 as libc::c_char; BUF_BYTES];
    // SAFETY: group is plain data filled by getgrnam_r.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc =
        unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return Err(LookupError {
            what: "group",
            name: name.into(),
            why: "no such group (create it: scripts/setup.d/30-users.sh or device setup)".into(),
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
    fn looks_up_root() {
        let r = user_by_name("root").expect("root");
        assert_eq!((r.uid, r.gid), (0, 0));
        assert!(r.groups.contains(&0));
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(group_gid("root").expect("group"), 0);
        assert!(user_by_name("no-such-user-xyz").is_err());
        assert!(uid_in_group(0, 0, 12345));
        assert!(!uid_in_group(65534, 65534, 0));
    }
}
