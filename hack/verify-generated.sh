#!/usr/bin/env bash
# Regenerates deepcopy, CRDs, RBAC, the API reference and the gateway's gRPC
# code (api/gateway/v1, from gateway.proto) in a scratch copy of the tree and
# fails when they differ from what is committed here. It never touches the working
# tree, so it is safe with uncommitted work.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$root"
# Copy the tracked and untracked-but-not-ignored files: what the generators read.
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] || continue
  mkdir -p "$scratch/$(dirname "$f")"
  cp -p "$f" "$scratch/$f"
done
(cd "$scratch" && make --no-print-directory generate >/dev/null)
status=0
for path in api/v1alpha1 api/gateway/v1 api/quixos config/crd/bases config/rbac/role.yaml config/fleet/role.yaml docs/reference/api.md docs/reference/reasons.md; do
  if ! diff -ru "$root/$path" "$scratch/$path" >/dev/null; then
    echo "stale generated files under $path: run 'make generate' and commit the result" >&2
    diff -ru "$root/$path" "$scratch/$path" | head -40 >&2 || true
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "generated files are up to date"
exit "$status"
