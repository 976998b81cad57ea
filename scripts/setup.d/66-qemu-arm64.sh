#!/usr/bin/env bash
# QEMU for the arm64 real-kernel device (vm-tests/arm64-vm/run): qemu-system-aarch64 (Debian's qemu-system-arm)
# from bookworm-backports, to match the machine's qemu-utils 10 as 65-qemu.sh does, with a PRIVATE apt
# configuration under $FLEET_CACHE/qemu-arm64/apt (/etc/apt is left alone), and ipxe-qemu (the virtio-net option
# ROM QEMU loads); fdisk, dosfstools and mtools for the
# disk. Then a bootable Raspberry Pi-style disk image, cached under $FLEET_CACHE/qemu-arm64/<recipe>/, from the arm64
# nspawn tree (vm-tests/arm64/build-tree) plus Debian's linux-image-arm64, initramfs-tools, raspi-firmware (its
# kernel hooks fill /boot/firmware as on Debian's own Raspberry Pi images), busybox-static (the test image), socat
# and sudo; laid out like Raspberry Pi OS: an MBR disk whose first partition (FAT32 "bootfs", 512 MiB at 4 MiB) is
# /boot/firmware and second (ext4 "rootfs") is /, mounted by PARTUUID; hostname raspberrypi; a first user `pi`
# (uid 1000, Raspberry Pi OS's groups that Debian has, passwordless sudo). What differs from Raspberry Pi OS:
# docs/device-setup.md, "arm64 VM". Needs qemu-aarch64 registered with binfmt_misc (the package scripts run under
# qemu-user while the image is built); vm-tests/arm64-vm/run does that. Idempotent: built in a temp dir, renamed
# into place when complete.
set -euo pipefail
cache=${FLEET_CACHE:?FLEET_CACHE must be set (set by scripts/setup)}
# Only vm-tests/arm64-vm/run needs this (minutes under emulation, ~1.5 GB): it sets FLEET_SETUP_QEMU_ARM64=1.
if [ "${FLEET_SETUP_QEMU_ARM64:-0}" != 1 ]; then
  echo "skipped: the arm64 VM is set up by vm-tests/arm64-vm/run (or FLEET_SETUP_QEMU_ARM64=1 scripts/setup qemu-arm64)"
  exit 0
fi

host_pkgs=()
for p in fdisk dosfstools mtools e2fsprogs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || host_pkgs+=("$p")
done
if [ ${#host_pkgs[@]} -gt 0 ]; then
  echo "installing: ${host_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${host_pkgs[@]}" >/dev/null
fi

# ipxe-qemu: QEMU loads the virtio-net device's option ROM (efi-virtio.rom) from it at start-up, even for a
# -kernel boot, and fails without it. qemu-system-arm only recommends it (not installed with
# --no-install-recommends); 65-qemu.sh's qemu-system-x86 depends on it, so a machine where vm-tests/qemu/run ran
# first has it by chance.
missing=0
for p in qemu-system-arm qemu-utils ipxe-qemu; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing=1
done
if [ "$missing" = 1 ] || ! command -v qemu-system-aarch64 >/dev/null || ! command -v qemu-img >/dev/null; then
  apt_dir=$cache/qemu-arm64/apt
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
  echo "installing qemu-system-arm from bookworm-backports (private apt config in $apt_dir)"
  apt-get "${apt_opts[@]}" update -qq
  # Backports versions named per package (not -t bookworm-backports, which would also upgrade qemu-user-static,
  # which the qemu-user arm64 tests use). -kernel/-initrd boots need no UEFI firmware (qemu-efi-aarch64).
  DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends \
    qemu-system-arm/bookworm-backports qemu-system-common/bookworm-backports \
    qemu-system-data/bookworm-backports qemu-utils/bookworm-backports ipxe-qemu >/dev/null
fi
qemu-system-aarch64 --version | head -1

# The image starts from the arm64 nspawn tree (debootstrap under qemu-user; built by vm-tests/arm64/build-tree).
base_recipe=bookworm-arm64-v1
base=$cache/nspawn-arm64/$base_recipe
[ "$(cat "$base/etc/fleet-test-tree" 2>/dev/null)" = "$base_recipe" ] || {
  echo "66-qemu-arm64: no arm64 tree at $base: run vm-tests/arm64/build-tree (vm-tests/arm64-vm/run does)" >&2; exit 1; }
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || {
  echo "66-qemu-arm64: qemu-aarch64 is not registered with binfmt_misc (vm-tests/arm64-vm/run registers it)" >&2; exit 1; }
recipe=qemu-arm64-v1-$base_recipe
out=$cache/qemu-arm64/$recipe
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$recipe" ]; then
  echo "arm64 VM image present: $out"; exit 0
fi
t0=$(date +%s)
mkdir -p "$cache/qemu-arm64"
work=$(mktemp -d "$cache/qemu-arm64/.build-XXXXXX")
tree=$work/tree
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
cp -a "$base" "$tree"

# Raspberry Pi OS's disk: MBR, identifier below, p1 FAT32 at sector 8192 (512 MiB) on /boot/firmware, p2 ext4 on /,
# both mounted by PARTUUID (<disk id>-01, -02) as Raspberry Pi OS's fstab and cmdline.txt do.
disk_id=5eedf1ee
fw_sectors=1048576
root_mib=3072
cat >"$tree/etc/fstab" <<FSTAB
proc                  /proc           proc    defaults          0       0
PARTUUID=$disk_id-01  /boot/firmware  vfat    defaults          0       2
PARTUUID=$disk_id-02  /               ext4    defaults,noatime  0       1
FSTAB
mkdir -p "$tree/boot/firmware"
# raspi-firmware's kernel hooks write cmdline.txt from this (Debian's default names /dev/mmcblk0p2).
cat >"$tree/etc/default/raspi-firmware" <<CFG
ROOTPART=PARTUUID=$disk_id-02
CONSOLES="ttyAMA0,115200 tty1"
CFG

# The initramfs holds only what mounts the root file system on QEMU's virt machine (virtio PCI disks, ext4):
# initramfs-tools' default MODULES=most (what Debian's Raspberry Pi images use) copies over a thousand modules, one
# modprobe process each, which took over 15 minutes under qemu-user without finishing.
mkdir -p "$tree/etc/initramfs-tools/conf.d"
echo MODULES=list >"$tree/etc/initramfs-tools/conf.d/fleet-qemu-arm64"
printf '%s\n' virtio_pci virtio_mmio virtio_blk ext4 crc32c_generic >>"$tree/etc/initramfs-tools/modules"
for d in proc sys dev; do mount --rbind "/$d" "$tree/$d"; mounted+=("$tree/$d"); done
cp /etc/resolv.conf "$tree/etc/resolv.conf"
# raspi-firmware is in non-free-firmware (Raspberry Pi OS's own sources carry it too).
mirror=${FLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cat >"$tree/etc/apt/sources.list" <<SRC
deb $mirror bookworm main non-free-firmware
deb $mirror bookworm-updates main non-free-firmware
deb http://deb.debian.org/debian-security bookworm-security main non-free-firmware
SRC
echo "installing Debian's arm64 kernel, initramfs-tools, raspi-firmware, dosfstools, busybox-static, socat and sudo (minutes under qemu-user)"
chroot "$tree" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
# raspi-firmware first: its kernel and initramfs hooks must be in place when the kernel package is configured.
# --force-confold keeps the /etc/default/raspi-firmware written above. dosfstools: fsck of /boot/firmware at boot.
for pkgs in "raspi-firmware dosfstools busybox-static socat sudo" "linux-image-arm64 initramfs-tools"; do
  # shellcheck disable=SC2086 # two word lists
  chroot "$tree" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confold -o Dpkg::Options::=--force-confdef $pkgs \
    >>"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }
done
ls "$tree"/boot/firmware/vmlinuz* "$tree"/boot/firmware/cmdline.txt >/dev/null || {
  echo "66-qemu-arm64: raspi-firmware's hooks did not fill /boot/firmware:" >&2; ls -la "$tree/boot/firmware" >&2
  tail -30 "$work/apt.log" >&2; exit 1; }
chroot "$tree" apt-get clean

# The first user, as Raspberry Pi OS's first-boot wizard makes it: uid 1000, its groups (spi, i2c and gpio come
# from Raspberry Pi's own packages and do not exist here), passwordless sudo; the password is locked (nothing
# logs in: the test host drives the guest over virtio-serial).
groups=$(for g in adm dialout cdrom sudo audio video plugdev games users input render netdev; do
  chroot "$tree" getent group "$g" >/dev/null && printf '%s,' "$g"; done)
chroot "$tree" useradd -m -u 1000 -s /bin/bash -G "${groups%,}" pi
chroot "$tree" passwd -l pi >/dev/null
echo 'pi ALL=(ALL) NOPASSWD: ALL' >"$tree/etc/sudoers.d/010_pi-nopasswd"
chmod 0440 "$tree/etc/sudoers.d/010_pi-nopasswd"
for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}"; done
mounted=()
: >"$tree/etc/resolv.conf"
echo raspberrypi >"$tree/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\traspberrypi\n' >"$tree/etc/hosts"

# What build-tree set for systemd-nspawn under qemu-user and a real kernel does not need: the containers.conf
# work-arounds (no cgroup controllers, no CAP_SYS_RESOURCE) and the masked systemd-sysctl. Debian's defaults
# again, as on a device. Kept: the test-only masks (gettys, apt and fstrim timers, time sync: no NTP here) and
# DefaultTimeoutStopSec=10s (a power-off with running containers would otherwise wait 90 s).
rm -f "$tree/etc/containers/containers.conf" "$tree/etc/systemd/system/systemd-sysctl.service"
# A busybox image tarball for `podman import` in the guest (no registry is reachable): aarch64 busybox.
img=$(mktemp -d)
mkdir -p "$img/bin"
cp "$tree/bin/busybox" "$img/bin/busybox"
for a in sh sleep cat echo ls true; do ln -s busybox "$img/bin/$a"; done
mkdir -p "$tree/usr/share/fleet-test"
tar -C "$img" -cf "$tree/usr/share/fleet-test/busybox-rootfs.tar" .
rm -rf "$img"

# QEMU user-mode network: the guest is 10.0.2.15, the host's loopback is 10.0.2.2 (net.ifnames=0: eth0).
# Raspberry Pi OS uses NetworkManager; a static oneshot is enough here.
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
# The command channel of vm-tests/src/qemu_arm64.rs, the same protocol as 65-qemu.sh's: one request per line
# "<id> <base64 command>", one answer per line "<id> <exit code> <base64 output>".
cat >"$tree/usr/local/sbin/fleet-qemu-shell" <<'SH'
#!/bin/bash
# Runs commands the test host sends over the virtio-serial port fleet.shell (vm-tests/arm64-vm).
port=/dev/virtio-ports/fleet.shell
for _ in $(seq 600); do [ -e "$port" ] && break; sleep 0.1; done
exec 3<>"$port"
while IFS= read -r line <&3; do
  id=${line%% *}
  cmd=$(printf '%s' "${line#* }" | base64 -d 2>/dev/null) || continue
  out=$(timeout 600 bash -c "$cmd" 2>&1 </dev/null); rc=$?
  printf '%s %s %s\n' "$id" "$rc" "$(printf '%s' "$out" | base64 -w0)" >&3
done
SH
chmod 0755 "$tree/usr/local/sbin/fleet-qemu-shell"
cat >"$tree/etc/systemd/system/fleet-qemu-shell.service" <<'UNIT'
[Unit]
Description=Command channel for the vm-tests/arm64-vm host (virtio-serial port fleet.shell)
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
# QEMU loads the kernel and initrd itself (-kernel/-initrd): the Raspberry Pi's boot firmware, which would read
# config.txt and load the copies raspi-firmware put in /boot/firmware, has no QEMU machine to run on.
cp -L "$tree/vmlinuz" "$work/out/vmlinuz"
cp -L "$tree/initrd.img" "$work/out/initrd.img"
ls "$tree/boot/firmware" >"$work/out/firmware-files.txt"
echo "making the disk image (MBR: bootfs FAT32 + rootfs ext4)"
mkfs.vfat -F 32 -n bootfs -C "$work/fw.img" $((fw_sectors / 2)) >/dev/null
mcopy -s -i "$work/fw.img" "$tree"/boot/firmware/* ::/
rm -rf "$tree"/boot/firmware/*
mkfs.ext4 -q -L rootfs -d "$tree" "$work/root.img" "${root_mib}M"
disk=$work/out/disk.raw
truncate -s $(( (8192 + fw_sectors) * 512 + root_mib * 1024 * 1024 )) "$disk"
sfdisk -q "$disk" <<PT
label: dos
label-id: 0x$disk_id
unit: sectors

start=8192, size=$fw_sectors, type=c
start=$((8192 + fw_sectors)), type=83
PT
dd if="$work/fw.img" of="$disk" bs=512 seek=8192 conv=notrunc,sparse status=none
dd if="$work/root.img" of="$disk" bs=1M seek=$(( (8192 + fw_sectors) / 2048 )) conv=notrunc,sparse status=none
echo "root=PARTUUID=$disk_id-02 rootfstype=ext4 fsck.repair=yes rootwait console=ttyAMA0 net.ifnames=0 panic=5" \
  >"$work/out/cmdline"
echo "$recipe" >"$work/out/stamp"
rm -rf --one-file-system "$out"
mv "$work/out" "$out"
for old in "$cache"/qemu-arm64/qemu-arm64-v*; do [ "$old" = "$out" ] || rm -rf --one-file-system "$old"; done
du -sh "$out"/*
echo "arm64 VM image built in $(( $(date +%s) - t0 )) s"
