#!/usr/bin/env bash
# Builds the CNCF distribution registry (cmd/registry of
# github.com/distribution/distribution/v3, pinned in hack/registry/go.mod)
# from the Go module proxy into bin/registry, once: a binary that reports the
# pinned version is kept. Tests and the demo run it on loopback only.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${REGISTRY_BIN:-$root/bin/registry}
version=$(cd "$here/registry" && go list -m -f '{{.Version}}' github.com/distribution/distribution/v3)

if [ -x "$out" ] && [[ "$("$out" --version 2>/dev/null)" == *"distribution/v3 $version"* ]]; then
  echo "registry: $out is current ($version)"
  exit 0
fi
echo "registry: building distribution $version from the Go module proxy..."
start=$(date +%s)
mkdir -p "$(dirname "$out")"
cd "$here/registry"
go build -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$version" -o "$out.tmp" ./cmd/registry
mv "$out.tmp" "$out"
echo "registry: built $out in $(( $(date +%s) - start ))s: $("$out" --version)"
