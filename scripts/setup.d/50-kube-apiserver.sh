#!/usr/bin/env bash
# kube-apiserver (the operator's integration tests, the demo), kubectl (the end-to-end test, the demo) and
# kube-controller-manager (the demo's cluster: it collects owner references, as in a real cluster), all built from
# Debian bookworm's `kubernetes` source package (1.20.2) with Debian's golang-1.19; every download goes through apt.
# Cached as $FLEET_CACHE/kube-apiserver/{kube-apiserver,kubectl,kube-controller-manager}; a no-op when all three
# are present and run, and only the missing ones are built otherwise (in one Go build cache).
# Cold: about 115 MB of downloads and 6-10 minutes of build on 2 cores (kubectl alone: about 4 minutes).
# kube-controller-manager alone with an empty Go cache: 11.6 CPU-minutes (measured; 22 min wall on 2 cores shared
# with other builds); built after kube-apiserver in the same cache, 91% of its Go source is compiled already
# (254 of its 1,616 packages are its own), so it adds about a minute (measured on a fresh clone: 55 s after kube-apiserver and kubectl).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cache=${FLEET_CACHE:-$root/.cache}
out=$cache/kube-apiserver
bin=$out/kube-apiserver
kubectl=$out/kubectl
kcm=$out/kube-controller-manager
targets=()
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q '^Kubernetes v'; then
  echo "kube-apiserver already built: $bin ($("$bin" --version))"
else
  targets+=(kube-apiserver)
fi
if [ -x "$kubectl" ] && "$kubectl" version --client --short 2>/dev/null | grep -q '^Client Version: v'; then
  echo "kubectl already built: $kubectl ($("$kubectl" version --client --short))"
else
  targets+=(kubectl)
fi
if [ -x "$kcm" ] && "$kcm" --version 2>/dev/null | grep -q '^Kubernetes v'; then
  echo "kube-controller-manager already built: $kcm ($("$kcm" --version))"
else
  targets+=(kube-controller-manager)
fi
[ ${#targets[@]} -gt 0 ] || exit 0
export DEBIAN_FRONTEND=noninteractive
# Go toolchain and build tools (installed system-wide, like the other apt parts).
if ! [ -x /usr/lib/go-1.19/bin/go ] || ! command -v make >/dev/null || ! command -v dpkg-source >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends golang-1.19-go make dpkg-dev ca-certificates >/dev/null
fi
work=$cache/kube-apiserver-build
rm -rf "$work"
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src" "$work/debs" "$work/bin"
# A private apt configuration with a deb-src line: /etc/apt stays untouched.
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
  >"$work/apt/sources.list"
aptopts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache")
apt-get "${aptopts[@]}" update -qq
(cd "$work/src" && apt-get "${aptopts[@]}" source --download-only -qq kubernetes >/dev/null)
tarball=$(ls "$work"/src/kubernetes_*.orig.tar.gz | head -n1)
mkdir -p "$work/tree"
tar -xzf "$tarball" -C "$work/tree" --strip-components=1
# The vendored reflect2 1.0.1 crashes under Go 1.18+ on the first custom-resource create: use Debian's fixed copies.
(cd "$work/debs" && apt-get download -qq golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev)
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/debs/x"; done
gocode=$work/debs/x/usr/share/gocode/src/github.com
for pkg in modern-go/reflect2 json-iterator/go; do
  rm -rf "$work/tree/vendor/github.com/$pkg"
  cp -a "$gocode/$pkg" "$work/tree/vendor/github.com/$pkg"
done
# The build scripts call rsync only to copy one file.
printf '#!/bin/sh\n# rsync stand-in: copy the last-but-one argument to the last\nfor a; do src=$dst; dst=$a; done\nexec cp -f "$src" "$dst"\n' \
  >"$work/bin/rsync"
chmod +x "$work/bin/rsync"
mkdir -p "$work/gopath/src/k8s.io"
ln -s "$work/tree" "$work/gopath/src/k8s.io/kubernetes"
export GOPATH=$work/gopath GO111MODULE=off CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOCACHE=$work/gocache
export PATH=$work/bin:/usr/lib/go-1.19/bin:$PATH
cd "$work/gopath/src/k8s.io/kubernetes"
# The generated OpenAPI definitions are not in the tarball (only kube-apiserver needs them).
case " ${targets[*]} " in *" kube-apiserver "*) make gen_openapi ;; esac
# GOPATH mode: the version variables live under the vendor path.
v=k8s.io/kubernetes/vendor/k8s.io
mkdir -p "$out"
for t in "${targets[@]}"; do
  echo "building $t"
  go build -ldflags "-X $v/component-base/version.gitVersion=v1.20.2 -X $v/client-go/pkg/version.gitVersion=v1.20.2" \
    -o "$work/$t" "k8s.io/kubernetes/cmd/$t"
  mv "$work/$t" "$out/$t"
  echo "built $t at $(date -u +%T)"
done
cd /
rm -rf "$work"
"$bin" --version
"$kubectl" version --client --short
"$kcm" --version
