#!/usr/bin/env bash
# Runs `go test -v` over the given packages (default ./...), keeps the whole
# log in bin/test.log and prints as it goes only what a reader needs: each
# package's result, each failing test, and the API server version each
# envtest suite ran against. On failure it prints the log without the noise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log="$root/bin/test.log"
mkdir -p "$root/bin"
[ "$#" -gt 0 ] || set -- ./...
go test -v ${GO_TEST_FLAGS:-} "$@" 2>&1 | tee "$log" |
  awk '/^(ok|FAIL|panic:)|^--- FAIL|^    --- FAIL|run against kube-apiserver/ { print; fflush() }'
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo
  echo "go test failed (exit $status); the log without passing-test noise follows (whole log: $log):"
  grep -v -E '^\s*(=== (RUN|PAUSE|CONT|NAME)|--- (PASS|SKIP)|PASS$)' "$log" | tail -400
fi
exit "$status"
