#!/usr/bin/env bash
# Fails when a go.mod of the repository (the root module and each wrapper
# module under hack/) is not tidy: `go mod tidy -diff` in each, which prints
# what `go mod tidy` would change and changes nothing. It builds nothing; it
# may download the go.mod files of modules not yet in the module cache.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
status=0
n=0
while IFS= read -r mod; do
  dir=$(dirname "$mod")
  n=$((n + 1))
  if ! out=$(cd "$dir" && go mod tidy -diff 2>&1); then
    echo "$dir/go.mod is not tidy: run 'go mod tidy' in $dir and commit the result" >&2
    grep -v '^go: downloading' <<<"$out" | head -60 >&2
    status=1
  fi
done < <(git ls-files --cached --others --exclude-standard -- 'go.mod' '*/go.mod')
if [ "$n" -eq 0 ]; then
  echo "verify-tidy: git ls-files found no go.mod" >&2
  exit 1
fi
[ "$status" -eq 0 ] && echo "every go.mod is tidy ($n modules)"
exit "$status"
