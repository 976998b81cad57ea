#!/usr/bin/env bash
# QEMU (TCG) for the real-kernel whole-device tests (vm-tests/qemu/run): qemu-system-x86 from bookworm-backports
# (the machine's qemu-utils 10 is from backports; bookworm's qemu-system-x86 7.2 conflicts with it), installed
# with a PRIVATE apt configuration under $FLEET_CACHE/qemu/apt (own sources list and lists directory), so /etc/apt
# is left alone. Then a bootable disk image, cached under $FLEET_CACHE/qemu/<recipe>/: the nspawn tree (60) plus
# linux-image-amd64, initramfs-tools, socat and unattended-upgrades (whose /etc/kernel/postinst.d hook is what
# creates /run/reboot-required when a kernel package is installed: Debian's kernel postinst runs the hooks, it
# does not touch the file itself), a persistent journal, a static network setup for QEMU's user-mode network, and
# a command channel on a virtio-serial port; beside it, in kernel-upgrade/, Debian's linux-image-cloud-amd64 and
# the kernel package it depends on, downloaded with the image's own apt sources, for the task scenarios' local
# repository. Idempotent: built in a temp dir, renamed into place when complete.
set -euo pipefail
cache=${FLEET_CACHE:?FLEET_CACHE must be set (set by scripts/setup)}
here=$(cd "$(dirname "$0")" && pwd)
# Only vm-tests/qemu/run needs this (a few minutes and ~400 MB on a fresh machine): it sets FLEET_SETUP_QEMU=1.
if [ "${FLEET_SETUP_QEMU:-0}" != 1 ]; then
  echo "skipped: QEMU is set up by vm-tests/qemu/run (or FLEET_SETUP_QEMU=1 scripts/setup qemu)"; exit 0
fi

if ! command -v qemu-system-x86_64 >/dev/null || ! command -v qemu-img >/dev/null; then
  apt_dir=$cache/qemu/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  key=/usr/share/keyrings/debian-archive-keyring.gpg
  mirror=${FLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  cat >"$apt_dir/sources.list" <<SRC
deb [signed-by=$key] $mirror bookworm main
deb [signed-by=$key] $mirror bookworm-updates main
deb [signed-by=$key] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=$key] $mirror bookworm-backports main
SRC
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::Archives=$apt_dir/archives")
  echo "installing qemu-system-x86 from bookworm-backports (private apt config in $apt_dir)"
  apt-get "${apt_opts[@]}" update -qq
  # Name the backports versions per package instead of -t bookworm-backports: that would also upgrade
  # qemu-user-static, which the aarch64 tests use.
  DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends \
    qemu-system-x86/bookworm-backports qemu-system-common/bookworm-backports \
    qemu-system-data/bookworm-backports seabios/bookworm-backports qemu-utils/bookworm-backports ipxe-qemu \
    >/dev/null
fi
qemu-system-x86_64 --version | head -1

# The image starts from the nspawn tree.
bash "$here/60-nspawn-tree.sh" >/dev/null
base_recipe=$(cat "$cache/nspawn/bookworm-v3/etc/fleet-test-tree")
recipe=qemu-v3-$base_recipe
out=$cache/qemu/$recipe
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$recipe" ]; then
  echo "qemu image present: $out"; exit 0
fi
mkdir -p "$cache/qemu"
work=$(mktemp -d "$cache/qemu/.build-XXXXXX")
tree=$work/tree
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
cp -a "$cache/nspawn/bookworm-v3" "$tree"
for d in proc sys dev; do mount --rbind "/$d" "$tree/$d"; mounted+=("$tree/$d"); done
cp /etc/resolv.conf "$tree/etc/resolv.conf"
echo "installing a kernel, initramfs-tools, socat and unattended-upgrades into the image tree (a few minutes)"
chroot "$tree" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
chroot "$tree" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  linux-image-amd64 initramfs-tools socat unattended-upgrades >>"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
# The kernel the task scenarios install from their local repository: another flavour of the same Debian kernel
# (a new package, whatever the mirror's point release), with its real maintainer scripts.
mkdir -p "$tree/var/tmp/kernel-upgrade" "$work/out/kernel-upgrade"
kdep=$(chroot "$tree" apt-cache show linux-image-cloud-amd64 | sed -n 's/^Depends: \(linux-image-[^ ,]*\).*/\1/p' | head -1)
[ -n "$kdep" ] || { echo "65-qemu: no kernel package behind linux-image-cloud-amd64" >&2; exit 1; }
chroot "$tree" sh -c "cd /var/tmp/kernel-upgrade && apt-get download -q linux-image-cloud-amd64 $kdep" \
  >>"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
mv "$tree"/var/tmp/kernel-upgrade/*.deb "$work/out/kernel-upgrade/"
rmdir "$tree/var/tmp/kernel-upgrade"
chroot "$tree" apt-get clean
rm -rf "$tree"/var/lib/apt/lists/*
for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}"; done
mounted=()
: >"$tree/etc/resolv.conf"

# Upgrades are the fleet's job (TaskRuns): apt's own daily timers (and with them unattended-upgrade) stay off, and
# so does unattended-upgrades' shutdown helper (a Python daemon that only guards its own upgrades; under TCG it
# costs seconds at every boot and shutdown). Its kernel hook in /etc/kernel/postinst.d is what the image is for.
for t in apt-daily.timer apt-daily-upgrade.timer unattended-upgrades.service; do
  ln -sf /dev/null "$tree/etc/systemd/system/$t"
done
# A persistent journal: a scenario reads the boot before a reboot or a power cut (journalctl -b -1).
mkdir -p "$tree/var/log/journal"
# The root file system is /dev/vda (the kernel command line mounts it read-write).
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$tree/etc/fstab"
# QEMU user-mode network: the guest is 10.0.2.15, the host's loopback is 10.0.2.2 (net.ifnames=0: eth0).
cat >"$tree/etc/systemd/system/fleet-qemu-net.service" <<'UNIT'
[Unit]
Description=Static address on QEMU's user-mode network
Before=network.target
Wants=network.target
DefaultDependencies=no
After=systemd-udevd.service sys-subsystem-net-devices-eth0.device
BindsTo=sys-subsystem-net-devices-eth0.device

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/ip link set lo up
ExecStart=/sbin/ip link set eth0 up
ExecStart=/sbin/ip addr replace 10.0.2.15/24 dev eth0
ExecStart=/sbin/ip route replace default via 10.0.2.2

[Install]
WantedBy=multi-user.target
UNIT
# The host drives the guest through a virtio-serial port: one request per line "<id> <base64 command>", one
# answer per line "<id> <exit code> <base64 output>". No login, no ssh, nothing to parse on a console.
cat >"$tree/usr/local/sbin/fleet-qemu-shell" <<'SH'
#!/bin/bash
# Runs commands the test host sends over the virtio-serial port fleet.shell (vm-tests/qemu).
port=/dev/virtio-ports/fleet.shell
for _ in $(seq 600); do [ -e "$port" ] && break; sleep 0.1; done
exec 3<>"$port"
while IFS= read -r line <&3; do
  id=${line%% *}
  cmd=$(printf '%s' "${line#* }" | base64 -d 2>/dev/null) || continue
  out=$(timeout 300 bash -c "$cmd" 2>&1 </dev/null); rc=$?
  printf '%s %s %s\n' "$id" "$rc" "$(printf '%s' "$out" | base64 -w0)" >&3
done
SH
chmod 0755 "$tree/usr/local/sbin/fleet-qemu-shell"
cat >"$tree/etc/systemd/system/fleet-qemu-shell.service" <<'UNIT'
[Unit]
Description=Command channel for the vm-tests/qemu host (virtio-serial port fleet.shell)
After=systemd-udevd.service systemd-udev-trigger.service

[Service]
ExecStart=/usr/local/sbin/fleet-qemu-shell
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
UNIT
for u in fleet-qemu-net fleet-qemu-shell; do
  ln -sf "/etc/systemd/system/$u.service" "$tree/etc/systemd/system/multi-user.target.wants/$u.service"
done

mkdir -p "$work/out"
cp -L "$tree/vmlinuz" "$work/out/vmlinuz"
cp -L "$tree/initrd.img" "$work/out/initrd.img"
echo "making the ext4 disk image"
mkfs.ext4 -q -L fleet-root -d "$tree" "$work/out/disk.raw" 3G
echo "$recipe" >"$work/out/stamp"
rm -rf --one-file-system "$out"
mv "$work/out" "$out"
for old in "$cache"/qemu/qemu-v*; do [ "$old" = "$out" ] || rm -rf --one-file-system "$old"; done
du -sh --apparent-size "$out"/*
