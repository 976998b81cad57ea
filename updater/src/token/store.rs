//! Writing the device's token file: a temporary file beside it (mode 0600, owned like the token file it replaces,
//! else by the `fleet-agent` user), fsync, rename over the old one, fsync of the directory. The agent reads the
//! old token or the new one, never a part of either.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The user the token file belongs to when there is none yet (the agent reads it).
pub const AGENT_USER: &str = "fleet-agent";

/// The token file could not be replaced (the old one, if any, stays); the text names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// There is no token file and the user it would belong to is unknown.
    #[error("{} does not exist and its owner cannot be found: {source}", path.display())]
    NoOwner {
        /// The token file.
        path: PathBuf,
        /// The lookup error.
        source: crate::users::LookupError,
    },
    /// The token file's owner cannot be read.
    #[error("{}: {source}", path.display())]
    Stat {
        /// The token file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Writing the new file failed.
    #[error("write {}: {source}", path.display())]
    Write {
        /// The token file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Replaces `path` with `token` (and a newline), as described above.
pub fn write_token(path: &Path, token: &str) -> Result<(), StoreError> {
    let (uid, gid) = match fs::metadata(path) {
        Ok(m) => (m.uid(), m.gid()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let u =
                crate::users::user_by_name(AGENT_USER).map_err(|source| StoreError::NoOwner {
                    path: path.to_path_buf(),
                    source,
                })?;
            (u.uid, u.gid)
        }
        Err(source) => {
            return Err(StoreError::Stat {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut bytes = token.as_bytes().to_vec();
    bytes.push(b'\n');
    // The one durable write of the tree (fleet_wire::durable), with the owner set between stage and commit.
    fleet_wire::durable::remove_stale_temps(path);
    let result = (|| -> io::Result<()> {
        let tmp = fleet_wire::durable::temp_beside(path)?;
        fleet_wire::durable::stage(&tmp, &bytes, 0o600)?;
        std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))
            .and_then(|()| fleet_wire::durable::commit(&tmp, path))
            .inspect_err(|_| {
                let _ = fs::remove_file(&tmp);
            })
    })();
    result.map_err(|source| StoreError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_the_file_keeping_its_owner_with_mode_0600() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("nats-token");
        fs::write(&p, "old\n").expect("old");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod");
        let before = fs::metadata(&p).expect("meta");
        write_token(&p, "new-token").expect("write");
        let after = fs::metadata(&p).expect("meta");
        assert_eq!(fs::read_to_string(&p).expect("read"), "new-token\n");
        assert_eq!(after.mode() & 0o777, 0o600);
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert_eq!(
            fs::read_dir(dir.path()).expect("ls").count(),
            1,
            "a temporary file stayed"
        );
    }
}
