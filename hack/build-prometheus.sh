#!/usr/bin/env bash
# Builds Prometheus (cmd/prometheus of github.com/prometheus/prometheus, the
# version pinned in hack/prometheus/go.mod) from the Go module proxy into
# bin/prometheus, once: a binary that reports the pinned version is kept.
# Built with -tags remove_all_sd: only the static and file service discovery
# (the tests scrape fixed loopback targets), no cloud SDKs; without the
# builtinassets tag the web UI is left out (the HTTP API is all the tests
# use). Tests run it on loopback only.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${PROMETHEUS_BIN:-$root/bin/prometheus}
module=$(cd "$here/prometheus" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
# Module v0.X.Y is Prometheus 3.(X-300).Y (the module's VERSION file).
minor=${module#v0.}; patch=${minor#*.}; minor=${minor%%.*}
version="3.$((minor - 300)).$patch"

if [ -x "$out" ] && [[ "$("$out" --version 2>/dev/null)" == *"version $version "* ]]; then
  echo "prometheus: $out is current ($version)"
  exit 0
fi
echo "prometheus: building Prometheus $version ($module) from the Go module proxy..."
start=$(date +%s)
mkdir -p "$(dirname "$out")"
cd "$here/prometheus"
v=github.com/prometheus/common/version
go build -trimpath -tags remove_all_sd \
  -ldflags "-s -w -X $v.Version=$version -X $v.Revision=$module -X $v.Branch=module-proxy -X $v.BuildUser=iteron -X $v.BuildDate=00000000-00:00:00" \
  -o "$out.tmp" github.com/prometheus/prometheus/cmd/prometheus
mv "$out.tmp" "$out"
echo "prometheus: built $out in $(( $(date +%s) - start ))s: $("$out" --version | head -1)"
