#!/usr/bin/env bash
# The Debian bookworm tree the whole-device tests boot with systemd-nspawn (vm-tests, scripts/demo), cached under
# $FLEET_CACHE/nspawn/. systemd + rootless Podman for the fleet-agent user inside the guest (../shared test-rig.md).
# Idempotent: the tree is built in a temp dir and renamed into place only when complete; a stamp names its recipe.
set -euo pipefail
cache=${FLEET_CACHE:?FLEET_CACHE must be set (set by scripts/setup)}/nspawn
recipe=bookworm-v3
tree=$cache/$recipe
if [ -f "$tree/etc/fleet-test-tree" ] && [ "$(cat "$tree/etc/fleet-test-tree")" = "$recipe" ]; then
  echo "nspawn tree present: $tree"; exit 0
fi
for tool in debootstrap systemd-nspawn unshare nsenter; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/setup apt (debootstrap systemd-container)" >&2; exit 1; }
done
mkdir -p "$cache"
work=$(mktemp -d "$cache/.build-XXXXXX")
# mktemp makes it 0700; as a root directory that breaks dbus (and anything not root) in a guest booted from the
# tree without an overlay.
chmod 0755 "$work"
mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do m=${mounted[$i]}; umount -l "$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
mirror=${FLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
echo "debootstrap bookworm into $work (about 80 s)"
debootstrap --variant=minbase --include=systemd-sysv,dbus,udev,iproute2,ifupdown,procps \
  bookworm "$work" "$mirror" >"$cache/.debootstrap.log" 2>&1 || { tail -20 "$cache/.debootstrap.log" >&2; exit 1; }

for d in proc sys dev; do mount --rbind "/$d" "$work/$d"; mounted+=("$work/$d"); done
echo "installing Podman and friends inside the tree"
chroot "$work" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  podman runc busybox-static uidmap slirp4netns fuse-overlayfs curl dbus-user-session libpam-systemd \
  >"$cache/.apt.log" 2>&1 || { tail -20 "$cache/.apt.log" >&2; exit 1; }
chroot "$work" apt-get clean
for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}"; done
mounted=()

# The guest's cgroup2 tree has no controllers and the sandbox lacks CAP_SYS_RESOURCE (test-rig.md).
mkdir -p "$work/etc/containers"
cat >"$work/etc/containers/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
pids_limit = 0

[engine]
runtime = "runc"
EOF
# Power-off with running containers must not wait 90 s on stop time-outs.
for mgr in system user; do
  mkdir -p "$work/etc/systemd/$mgr.conf.d"
  printf '[Manager]\nDefaultTimeoutStopSec=10s\n' >"$work/etc/systemd/$mgr.conf.d/10-fleet-test.conf"
done
# No console login, no network configuration, no timers that would run apt or fstrim during a test.
for unit in console-getty.service getty@tty1.service systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer systemd-timesyncd.service; do
  ln -sf /dev/null "$work/etc/systemd/system/$unit"
done
echo fleet-device >"$work/etc/hostname"
: >"$work/etc/machine-id"
# A busybox image tarball for `podman import` inside the guest (no registry is reachable).
img=$(mktemp -d)
mkdir -p "$img/bin"
cp /bin/busybox "$img/bin/busybox" 2>/dev/null || cp "$work/bin/busybox" "$img/bin/busybox"
for a in sh sleep cat echo ls true; do ln -s busybox "$img/bin/$a"; done
mkdir -p "$work/usr/share/fleet-test"
tar -C "$img" -cf "$work/usr/share/fleet-test/busybox-rootfs.tar" .
rm -rf "$img"
echo "$recipe" >"$work/etc/fleet-test-tree"

rm -rf --one-file-system "$tree"
mv "$work" "$tree"
trap - EXIT
# Older recipes are garbage now.
for old in "$cache"/bookworm-*; do [ "$old" = "$tree" ] || rm -rf --one-file-system "$old"; done
du -sh "$tree"
