#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kubectl v1.37.2 from the Go module proxy into
# bin/k8s/, once: a binary that already reports the right version is kept.
# No Docker, no setup-envtest, nothing from outside the module registries.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=3.7.0
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${K8S_BIN_DIR:-$root/bin/k8s}
mkdir -p "$out"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# current reports whether bin/k8s/$1 reports the pinned version. The output is
# captured first: `grep -q` on a pipe would end early and, under pipefail,
# make a current binary look stale.
current() {
  local v
  case "$1" in
    kube-apiserver) v=$("$out/$1" --version 2>/dev/null) && [[ "$v" == *"Kubernetes $K8S_VERSION"* ]] ;;
    kubectl) v=$("$out/$1" version --client 2>/dev/null) && [[ "$v" == *"Client Version: $K8S_VERSION"* ]] ;;
    etcd) v=$("$out/$1" --version 2>/dev/null) && [[ "$v" == *"etcd Version: $ETCD_VERSION"* ]] ;;
  esac
}

cd "$here/k8s"
for bin in etcd kubectl kube-apiserver; do
  if [ -x "$out/$bin" ] && current "$bin"; then
    echo "controlplane: $bin is current ($out/$bin)"
    continue
  fi
  echo "controlplane: building $bin from the Go module proxy (first run: a few minutes; kube-apiserver is the longest)..."
  start=$(date +%s)
  go build -trimpath -ldflags "$ldflags" -o "$out/$bin.tmp" "./cmd/$bin"
  mv "$out/$bin.tmp" "$out/$bin"
  if ! current "$bin"; then
    echo "controlplane: $bin built but does not report the expected version" >&2
    exit 1
  fi
  echo "controlplane: built $bin in $(( $(date +%s) - start ))s"
done
