#!/usr/bin/env bash
# Builds a Kubernetes node from the Go module proxy into bin/node/, once: a
# binary already built from the pinned module version is kept.
#
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy  v1.37.2
#       (hack/k8s, the wrapper module that also builds kube-apiserver)
#   containerd, ctr, containerd-shim-runc-v2                       v2.4.2
#   runc (cgo: seccomp, static; Debian's gcc and libseccomp-dev)   v1.5.3
#   CNI bridge, host-local, loopback                               v1.10.0
#
# and installs, non-interactively and only when missing, the Debian packages
# the node needs to build or run: gcc, pkg-config and libseccomp-dev (runc),
# nftables (kube-proxy's nftables mode), iproute2 and util-linux (the node's
# network namespace), busybox-static (the /bin/sh of the manager's image).
# No Docker, no container registry: nothing is downloaded from anywhere but the
# Go module proxy and Debian's archive. hack/localnode and test/node use the
# result; `make node` runs this, and `make test` depends on it.
set -euo pipefail

K8S_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
CNI_VERSION=v1.10.0
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${NODE_BIN_DIR:-$root/bin/node}
mkdir -p "$out"

# Debian packages: installed when dpkg does not know them as installed.
need=()
for pkg in gcc libc6-dev pkg-config libseccomp-dev nftables iproute2 util-linux busybox-static; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "node: installing Debian packages: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo_cmd apt-get install -y -q --no-install-recommends "${need[@]}"; then
    $sudo_cmd apt-get update -q
    $sudo_cmd apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
fi

k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# built_from <binary> <module> <version>: the binary's build information
# (go version -m) names that module at that version, as the main module or a
# dependency. Captured first: `grep -q` on a pipe could end it early and,
# under pipefail, make a current binary look stale.
built_from() {
  local info
  info=$(go version -m "$1" 2>/dev/null) || return 1
  grep -qE "^[[:space:]]+(mod|dep)[[:space:]]+$2[[:space:]]+$3([[:space:]]|$)" <<<"$info"
}

# reports <binary> <text>: the binary's own version output contains text.
reports() {
  local v
  case "$(basename "$1")" in
    containerd-shim-runc-v2) v=$("$1" -v 2>&1) ;;
    bridge | host-local | loopback) v=$("$1" 2>&1 || true) ;;
    *) v=$("$1" --version 2>&1) ;;
  esac
  [[ "$v" == *"$2"* ]]
}

# build <name> <module> <version> <expected version text> <command...>: runs
# the command (which writes $out/<name>.tmp) unless $out/<name> is current.
build() {
  local name=$1 module=$2 version=$3 text=$4 start
  shift 4
  if [ -x "$out/$name" ] && built_from "$out/$name" "$module" "$version" && reports "$out/$name" "$text"; then
    echo "node: $name is current ($module $version)"
    return
  fi
  echo "node: building $name ($module $version) from the Go module proxy..."
  start=$(date +%s)
  rm -f "$out/$name.tmp"
  "$@"
  mv "$out/$name.tmp" "$out/$name"
  if ! built_from "$out/$name" "$module" "$version" || ! reports "$out/$name" "$text"; then
    echo "node: $name built but does not report $module $version ($text)" >&2
    exit 1
  fi
  echo "node: built $name in $(($(date +%s) - start))s"
}

# k8s_build <name>: a main of hack/k8s.
k8s_build() {
  (cd "$here/k8s" && CGO_ENABLED=0 go build -trimpath -ldflags "$k8s_ldflags" -o "$out/$1.tmp" "./cmd/$1")
}

# install_build <name> <package@version> <env and flags...>: `go install` of a
# package at a pinned version, in its own module (its go.mod and go.sum, checked
# against the checksum database), into a scratch GOBIN.
install_build() {
  local name=$1 pkg=$2 gobin
  shift 2
  gobin=$(mktemp -d "$out/.gobin.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$gobin'" RETURN
  env GOBIN="$gobin" "$@" "$pkg"
  mv "$gobin/$(basename "${pkg%@*}")" "$out/$name.tmp"
}

ctrd=github.com/containerd/containerd/v2
ctrd_ldflags="-s -w -X $ctrd/version.Version=$CONTAINERD_VERSION -X $ctrd/version.Revision=module-proxy -X $ctrd/version.Package=$ctrd"
cni=github.com/containernetworking/plugins
cni_ldflags="-s -w -X $cni/pkg/utils/buildversion.BuildVersion=$CNI_VERSION"

for bin in kubelet kube-controller-manager kube-scheduler kube-proxy; do
  build "$bin" k8s.io/kubernetes "$K8S_VERSION" "Kubernetes $K8S_VERSION" k8s_build "$bin"
done
for bin in containerd ctr; do
  build "$bin" "$ctrd" "$CONTAINERD_VERSION" "$CONTAINERD_VERSION" install_build "$bin" "$ctrd/cmd/$bin@$CONTAINERD_VERSION" \
    CGO_ENABLED=0 go install -trimpath -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" -ldflags "$ctrd_ldflags"
done
build containerd-shim-runc-v2 "$ctrd" "$CONTAINERD_VERSION" "$CONTAINERD_VERSION" \
  install_build containerd-shim-runc-v2 "$ctrd/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  CGO_ENABLED=0 go install -trimpath -tags "no_grpc urfave_cli_no_docs" -ldflags "$ctrd_ldflags"
build runc github.com/opencontainers/runc "$RUNC_VERSION" "runc version ${RUNC_VERSION#v}" \
  install_build runc "github.com/opencontainers/runc@$RUNC_VERSION" \
  CGO_ENABLED=1 go install -trimpath -tags "seccomp netgo osusergo urfave_cli_no_docs" \
  -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=module-proxy -extldflags -static"
for bin in bridge host-local loopback; do
  dir=main/$bin
  [ "$bin" = host-local ] && dir=ipam/host-local
  build "$bin" "$cni" "$CNI_VERSION" "$CNI_VERSION" install_build "$bin" "$cni/plugins/$dir@$CNI_VERSION" \
    CGO_ENABLED=0 go install -trimpath -ldflags "$cni_ldflags"
done
if ! reports "$out/runc" "libseccomp:"; then
  echo "node: runc was built without seccomp (runc --version names no libseccomp)" >&2
  exit 1
fi
# busybox-static's .deb for the manager's image (hack/image; test/node builds
# the image of the code under test and fetches nothing itself).
debs=${IMAGE_DEBS_DIR:-$root/bin/image/debs}
if ! compgen -G "$debs/busybox-static_*.deb" >/dev/null; then
  echo "node: fetching Debian's busybox-static package into $debs (for the manager's image)"
  mkdir -p "$debs"
  (cd "$debs" && apt-get download busybox-static) ||
    { apt-get update -q && (cd "$debs" && apt-get download busybox-static); }
fi
echo "node: bin/node is complete: kubelet $K8S_VERSION, containerd $CONTAINERD_VERSION, runc $RUNC_VERSION, CNI $CNI_VERSION"
