//! Host paths as written: a WorkloadPolicy allows a host-path volume by the path the spec names, and the cluster
//! cannot see the device's file system, so the agent refuses a source that leads elsewhere through a symlink (one
//! planted under an allowed, writable path would otherwise give another workload whatever it points at).

use std::path::Path;

/// Checks every host-path volume of `sources` (absolute paths; named volumes are skipped): each must exist and
/// resolve to itself. `Err((path, why))` for the first that does not.
pub fn check<'a>(sources: impl Iterator<Item = &'a str>) -> Result<(), (String, String)> {
    for source in sources.filter(|s| s.starts_with('/')) {
        let written = Path::new(source);
        match std::fs::canonicalize(written) {
            Ok(real) if real == written => {}
            Ok(real) => {
                return Err((
                    source.to_owned(),
                    format!(
                        "leads through a symlink to {}; a WorkloadPolicy allows host paths as written, so the agent \
                         mounts no path that resolves elsewhere",
                        real.display()
                    ),
                ))
            }
            Err(e) => return Err((source.to_owned(), format!("cannot be resolved: {e}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_anywhere_in_the_path_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let real = dir.path().join("data");
        std::fs::create_dir(&real).expect("data");
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).expect("link");
        let real = std::fs::canonicalize(&real).expect("canonical");
        let base = real
            .parent()
            .expect("parent")
            .to_str()
            .expect("utf-8")
            .to_owned();
        assert_eq!(
            check([format!("{base}/data").as_str(), "named-volume"].into_iter()),
            Ok(())
        );
        let (path, why) =
            check([format!("{base}/link/ssl").as_str()].into_iter()).expect_err("symlink");
        assert!(
            path.ends_with("/link/ssl") && why.contains("symlink to /etc/ssl"),
            "{why}"
        );
        let (_, why) =
            check([format!("{base}/missing").as_str()].into_iter()).expect_err("missing");
        assert!(why.contains("cannot be resolved"), "{why}");
        assert_eq!(check(["/"].into_iter()), Ok(()));
    }
}
