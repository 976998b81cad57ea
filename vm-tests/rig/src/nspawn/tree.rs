//! The cached Debian tree every guest overlays (built by `scripts/setup.d/60-nspawn-tree.sh`).

use crate::util::workspace_root;
use std::path::PathBuf;

/// The recipe name `scripts/setup.d/60-nspawn-tree.sh` builds (its `recipe=` line).
pub const TREE_RECIPE: &str = "bookworm-v3";

const INSTALL_HINT: &str = "Run `scripts/setup` (scripts/setup.d/60-nspawn-tree.sh debootstraps the Debian \
    bookworm tree with systemd and Podman into $FLEET_CACHE/nspawn/), or point FLEET_NSPAWN_TREE at such a tree.";

/// The cached Debian tree: `$FLEET_NSPAWN_TREE`, else `$FLEET_CACHE/nspawn/<recipe>` (default cache
/// `<repo>/.cache`). Panics with an install hint when it is missing or incomplete.
pub fn cached_tree() -> PathBuf {
    let tree = match std::env::var_os("FLEET_NSPAWN_TREE") {
        Some(t) => PathBuf::from(t),
        None => std::env::var_os("FLEET_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(".cache"))
            .join("nspawn")
            .join(TREE_RECIPE),
    };
    let stamp = tree.join("etc/fleet-test-tree");
    assert!(
        stamp.is_file(),
        "no complete nspawn tree at {} (missing {}). {INSTALL_HINT}",
        tree.display(),
        stamp.display()
    );
    tree
}
