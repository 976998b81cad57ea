#!/usr/bin/env bash
# Debian packages the tests use: Podman (agent), docker-registry (OCI artifacts; apache2-utils: htpasswd for its
# basic-auth mode), etcd (kube-apiserver),
# debootstrap + systemd-container (whole-device tests), dpkg-dev (the local apt repository).
set -euo pipefail
pkgs=(podman runc busybox-static uidmap slirp4netns fuse-overlayfs docker-registry etcd-server
      debootstrap systemd-container skopeo curl iproute2 dpkg-dev openssl apache2-utils)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "apt packages present"; exit 0; fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian packages start services we do not want running: tests start their own instances.
systemctl disable --now docker-registry etcd 2>/dev/null || true
