#!/usr/bin/env bash
# Runs `go test -v` over the given packages (default ./...) with an explicit
# -timeout for every package, keeps the whole log in bin/test.log and prints as
# it goes only what a reader needs: which packages run with which timeout, each
# package's result, each failing test, and the API server version each envtest
# suite ran against. On failure it prints the log without the noise.
#
# Light packages run first, in parallel as `go test` runs them (one `go test`
# per timeout value, and one more for those that always run: see rerun
# below). The heavy end-to-end packages (those that start a
# control plane or the real manager) then run one at a time, while the light
# packages with a longer timeout of their own may still be finishing. A package whose
# test binary links controller-runtime's envtest starts a control plane, so it
# runs one at a time even when the table below does not name it.
#
# Extra `go test` flags come from GO_TEST_FLAGS (after ours, so a -timeout
# there wins). Arguments are packages.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log="$root/bin/test.log"
mkdir -p "$root/bin"
[ "$#" -gt 0 ] || set -- ./...
module=iteron.dev/operator

# Timeouts, first match wins. A package is its path in the module; `x/...`
# matches x and every package below it. `serial` packages run one at a time
# after the others. A package no row matches gets default_timeout and runs
# with the light ones. Each timeout is three times the longest run measured
# (passing or not), rounded up to a whole minute, and at least 3m for a
# package that starts a control plane (etcd and kube-apiserver start in
# seconds on an idle machine, far slower on a busy one). The comments give
# the test binary's times as `go test` reported them in four runs (1 Dec
# 2026, 2 cores shared with other agents' builds and tests, 1-minute load
# average 1 to 14).
default_timeout=3m # the longest light package outside the table: internal/procexec 19-30s
table=(
  # package          timeout  mode        measured
  "internal/hotswap  7m       parallel" # 121-126s
  "api/v1alpha1      3m       serial"   # 6.8-9.5s
  "cmd/manager       3m       serial"   # 11.6-17.0s
  "controllers       6m       serial"   # 30-35s passing; 87s and 109s when one test failed after a 60s wait; 150-164s in CI on 5-7 Dec 2026, a minute of it the lost-echo retry test waiting for a renewal; 98s on 7 Dec without that wait
  "test/crash        9m       serial"   # 159-170s (6 runs, load 14-17: the ledger-fault subset 72-81s, SIGKILL at 11 points 56-66s); 182s on 5 Dec with the lifetime case (20s) and the renewal cell's call
  "test/docs         6m       serial"   # 13-44s before docs/fleet.md, 65.6s with it (the fleet guide 19-30s); 102.8s on 5 Dec 2026 with the fleet guide's steps, pause and probe (the fleet guide 30-36s) (runs the guides: its own local control plane, managers and providers)
  "test/doctor       3m       serial"   # 11.5-16.7s
  "test/e2e          3m       serial"   # 16.7-32.1s
  "test/fleet        5m       serial"   # 47-97s, load 4-13 (9 runs; 69-82s with all nine tests) (six managers, two fleet controllers, a control plane; builds the manager and the plugin)
  "test/applyscale   3m       serial"   # 0.02s: only a benchmark (make bench-apply); without -test.bench it starts nothing
  "test/fleetscale   4m       serial"   # 13.3s with 100 nodes; 72-80s (2 runs, 5 Dec 2026) with the 1 000-node rollout judged by analyses (a control plane; 100 and 1 000 Node objects, the controller in process, a loopback analysis server)
  "test/fleetanalysis 5m      serial"   # 64-86s (5 runs, 5 Dec 2026, load 2-8) (a control plane, three managers, a fleet controller, bin/prometheus scraping them, traffic and webhooks on loopback; builds the manager and the plugin)
  "test/gitops       3m       serial"   # 8.1-8.5s
  "test/kubeapi      3m       serial"   # 3.0-3.5s (a control plane started in a child test binary that panics: nothing of it may outlive the child); 10.0s on 6 Dec 2026 with a control plane stopped normally (its watchdog and the watchdog's sleep must not outlive Stop)
  "test/localnode    5m       serial"   # 10.5-18.1s (a real node started, killed, cleaned up)
  "test/node         15m      serial"   # 157s on 5 Dec after a change to cmd/manager (the image rebuilt); 226s passing and 272-283s in two failing runs later that day (load 12-20, with the sandbox's hostile subset and the restart table); 34-55s warm, 132s on a cold build cache (a real node: kubelet, containerd, the DaemonSet scenario; it builds the image of the code under test); with the survivor DaemonSet and the three manager restarts under a caller loop (the survivor): 47-128s over 8 runs (2 Dec 2026, load from other real-node runs)
  "test/survivor     4m       serial"   # 69-74s (6 Dec 2026, two make test runs, one beside a CPU hog); 136s in a failing CI run whose lost survivor outcome made two calls wait out their 25 s deadline; 33-74s (9 runs, 2 Dec 2026) (a control plane, the manager and survivor binaries killed and restarted under calls)
  "test/oci          5m       serial"   # 32.0-51.0s (12 runs, 2 Dec 2026; two registries, the control plane, the manager in-process and the manager binary built and SIGKILLed mid-pull: a cold build cache adds the manager's build)
  "test/lifecycle    3m       serial"   # 21.9-36.0s (3 runs, 2 Dec 2026; a control plane, the manager in-process with a custom seam graph, nine requirement activations and one hot swap held at two phases)
  "internal/gateway  5m       parallel" # 88-100s in make test (6 Dec 2026 and CI on 5 Dec: beside the other parallel packages); 35-47s alone (2 Dec 2026, idle and beside two CPU hogs; with the package-runtime fault table, which links the seed runtime once per fault: a cold build cache adds those links)
  "internal/artifacts 3m      parallel" # 4.1-7.4s (a registry of its own; a puller re-executed and SIGKILLed)
  "internal/sandbox/... 3m    parallel" # 6.6-15.1s (5 Dec 2026, load 0.5-9); 14.0-16.1s (internal/sandbox; cgroups 1.2-1.4s) in 4 runs later that day, load 6-13, with the v2 pod layout (a child in a cgroup namespace) and the audit count under a SIGURG storm (real launchers and providers as uid 65534 below a guard cgroup; builds the launcher and the hostile provider)
  "test/sandbox      4m       serial"   # 17-29s (5 Dec 2026, load 0.5-9); 52-62s in 3 runs later that day, load 7-14, once the audited node also waits for status.sandbox.violations and refuses a swap to a source requiring Isolated (the subset: a control plane, the manager in-process with the sandbox enforced, the manager binary in audit mode; make test-sandbox runs the whole table)
)

# Packages whose tests build a binary of this repository with `go build` or
# `go run` at run time and run it (the manager, the survivor, the plugin, the
# node's image, hack/catalog, the guides' commands) run every time
# (-count=1): the build is a child process, so go test's cache does not know
# those sources, and a cached result would stand for code that has changed
# since. (A test that builds a provider through examples/providers/artifacts,
# or the plugin through test/operatortest, needs no row: they stat the
# sources, which makes them part of the cache key.)
rerun=(
  cmd/manager    # the sandbox launcher beside the manager it builds
  test/crash     # the manager and survivor binaries, SIGKILLed
  test/docs      # the guides build and run the manager, the plugin and the providers
  test/e2e       # the manager and the plugin, hack/catalog
  test/fleet     # the manager and the plugin
  test/fleetanalysis # the manager, the plugin and the sandbox launcher
  test/localnode # the pause image from hack/image
  test/node      # the image of the manager and the survivor, the plugin, hack/catalog
  test/oci       # the manager binary, SIGKILLed mid-pull
  test/sandbox   # the manager and the sandbox launcher
  test/survivor  # the manager and survivor binaries
)
reruns() { local p; for p in "${rerun[@]}"; do [ "$1" = "$p" ] && return 0; done; return 1; }

# rule <relative package> prints "<timeout> <mode> <row>" for the first row
# that matches, or the default.
rule() {
  local row pattern timeout mode
  for row in "${table[@]}"; do
    read -r pattern timeout mode <<<"$row"
    if [ "$1" = "$pattern" ] || { [ "${pattern%/...}" != "$pattern" ] &&
      { [ "$1" = "${pattern%/...}" ] || [ "${1#"${pattern%/...}"/}" != "$1" ]; }; }; then
      echo "$timeout $mode $pattern"
      return
    fi
  done
  echo "$default_timeout parallel default"
}

: >"$log"
say() { echo "$@" | tee -a "$log"; }

# The packages, and which of them link envtest into their test binary.
if ! pkgs=$(go list -e "$@"); then
  say "go list $* failed"
  exit 1
fi
envtest=$(go list -e -test -f '{{if eq .Name "main"}}{{.ImportPath}}{{range .Deps}} {{.}}{{end}}{{end}}' "$@" |
  awk '$1 ~ /\.test$/ { for (i = 2; i <= NF; i++) if ($i == "sigs.k8s.io/controller-runtime/pkg/envtest") { sub(/\.test$/, "", $1); print $1; break } }')

declare -A light=()  # "timeout count" -> packages (space-separated)
serial=()            # "timeout count package"
declare -A matched=() # table row -> 1
n=0
say "== packages and their -timeout (a row of hack/test.sh, else the default $default_timeout):"
for pkg in $pkgs; do
  rel=${pkg#"$module"/}
  [ "$pkg" = "$module" ] && rel=.
  read -r timeout mode row <<<"$(rule "$rel")"
  matched[$row]=1
  note=""
  if [ "$mode" = parallel ] && grep -qxF "$pkg" <<<"$envtest"; then
    mode=serial
    note=" (links envtest: one at a time; give it a row in hack/test.sh)"
  fi
  count=cache
  if reruns "$rel"; then
    count=1
    note+=" (runs every time: -count=1)"
    matched[rerun:$rel]=1
  fi
  if [ "$mode" = serial ]; then
    serial+=("$timeout $count $pkg")
  else
    light["$timeout $count"]+=" $pkg"
  fi
  say "   $(printf '%-6s %-8s %s' "$timeout" "$mode" "$rel")$note"
  n=$((n + 1))
done
[ -z "${GO_TEST_FLAGS:-}" ] || say "   GO_TEST_FLAGS, after the -timeout (so a -timeout there wins): $GO_TEST_FLAGS"
if [ "$*" = ./... ]; then
  for row in "${table[@]}"; do
    read -r pattern _ <<<"$row"
    [ -n "${matched[$pattern]:-}" ] || say "   warning: the table row for $pattern matches no package (renamed? removed?)"
  done
  for pattern in "${rerun[@]}"; do
    [ -n "${matched[rerun:$pattern]:-}" ] || say "   warning: the rerun entry $pattern matches no package (renamed? removed?)"
  done
fi

# run <log> <description> <go test args...>: one `go test -v`; its whole output
# is appended to <log>, the lines a reader needs go to the terminal as they
# come, and its exit status and duration to <log>.rc.
run() {
  local out=$1 what=$2 start=$SECONDS rc
  shift 2
  echo "== go test $what" | tee -a "$out"
  go test -v "$@" 2>&1 | tee -a "$out" |
    awk '
      # A failing test'"'"'s own lines come before its "--- FAIL": keep the
      # newest 200 of the running test and print them with it.
      /^=== RUN/ { n = 0; next }
      /^(ok|FAIL|panic:)|^--- FAIL|^    --- FAIL|run against kube-apiserver/ {
        if ($0 ~ /^--- FAIL/) { for (i = (n > 200 ? n - 200 : 0); i < n; i++) print kept[i % 200] }
        print; fflush(); n = 0; next
      }
      { kept[n % 200] = $0; n++ }'
  rc=${PIPESTATUS[0]}
  echo "$rc $((SECONDS - start)) $what" >"$out.rc"
}
packages() { if [ "$1" -eq 1 ]; then echo "1 package"; else echo "$1 packages"; fi; }

# The light packages: one `go test` per timeout, all at the same time (a
# package with a long timeout mostly waits: run alone, it would add its whole
# duration). Each writes its own part of the log; the parts are appended in
# order once they are done. The heavy packages start once the light
# packages of the default timeout are done: those with a row of their own
# (internal/hotswap, internal/gateway) spend their last minute or so on
# soaks and deadlines that mostly wait, so they finish beside the first
# heavy packages instead of holding them back.
parts=$(mktemp -d)
trap 'rm -rf "$parts"' EXIT
i=0
first=() later=() # the light groups' pids: waited for before the heavy ones, and at the end
while read -r timeout count; do
  [ -n "$timeout" ] || continue
  i=$((i + 1))
  # shellcheck disable=SC2086 # lists of packages and of flags
  set -- ${light["$timeout $count"]}
  what="$(packages $#), in parallel"
  [ "$#" -gt 1 ] || what=${1#"$module"/}
  flags=(-timeout "$timeout")
  if [ "$count" = 1 ]; then
    flags+=(-count=1)
    what+=", -count=1"
  fi
  # shellcheck disable=SC2086
  run "$parts/$(printf 'light%03d' $i)" "-timeout $timeout: $what" \
    "${flags[@]}" ${GO_TEST_FLAGS:-} "$@" &
  if [ "$timeout" = "$default_timeout" ]; then first+=($!); else later+=($!); fi
done < <(printf '%s\n' "${!light[@]}" | sort -V)
[ "${#first[@]}" -eq 0 ] || wait "${first[@]}"
# append_light appends each light part that is done and not yet appended.
declare -A appended=()
append_light() {
  local part
  for part in "$parts"/light*.rc; do
    [ -e "$part" ] && [ -z "${appended[$part]:-}" ] || continue
    cat "${part%.rc}" >>"$log"
    appended[$part]=1
  done
}
append_light
# The heavy packages, one at a time, straight into the log.
for entry in "${serial[@]}"; do
  i=$((i + 1))
  read -r timeout count pkg <<<"$entry"
  flags=(-timeout "$timeout")
  what="${pkg#"$module"/}, alone"
  if [ "$count" = 1 ]; then
    flags+=(-count=1)
    what+=", -count=1"
  fi
  # shellcheck disable=SC2086
  run "$log" "-timeout $timeout: $what" "${flags[@]}" ${GO_TEST_FLAGS:-} "$pkg"
  mv "$log.rc" "$parts/$(printf 'serial%03d' $i).rc"
done
[ "${#later[@]}" -eq 0 ] || wait "${later[@]}"
append_light

status=0
results=()
for part in "$parts"/light*.rc "$parts"/serial*.rc; do
  [ -e "$part" ] || continue
  read -r rc secs what <"$part"
  results+=("$(printf '%-4s %5ss  %s' "$([ "$rc" -eq 0 ] && echo ok || echo FAIL)" "$secs" "$what")")
  [ "$rc" -eq 0 ] || status=$rc
done

# Every package must have reported a result: none is skipped in silence.
missing=()
for pkg in $pkgs; do
  grep -qE "^(ok|FAIL|\?)[[:space:]]+${pkg//./\\.}([[:space:]]|$)" "$log" || missing+=("$pkg")
done

[ "${#missing[@]}" -eq 0 ] || [ "$status" -ne 0 ] || status=1
if [ "$status" -ne 0 ]; then
  echo
  echo "go test failed (exit $status)."
  # First what each failing test printed itself (its last 150 lines: a
  # timed-out wait prints the status it saw), so that a reader of only the
  # head of this output sees why.
  awk '
    /^=== (RUN|CONT|NAME) / { cur = $3; next }
    /^ *--- FAIL: / {
      name = $3
      if (name in n && n[name] > 0 && shown < 8) {
        shown++
        print "== what " name " printed (its last " (n[name] < 150 ? n[name] : 150) " lines):"
        for (i = (n[name] > 150 ? n[name] - 150 : 0); i < n[name]; i++) print lines[name, i % 150]
      }
      next
    }
    cur != "" { lines[cur, n[cur] % 150] = $0; n[cur]++ }
  ' "$log"
  echo
  echo "the log without passing-test noise follows (whole log: $log):"
  grep -v -E '^\s*(=== (RUN|PAUSE|CONT|NAME)|--- (PASS|SKIP)|PASS$)' "$log" | tail -400
fi
echo
say "== summary ($n packages, $((SECONDS / 60))m$((SECONDS % 60))s):"
for r in "${results[@]}"; do say "   $r"; done
if [ "${#missing[@]}" -gt 0 ]; then
  say "   FAIL: no result for ${missing[*]}"
fi
exit "$status"
