#!/usr/bin/env bash
# bench/sidebyside.sh OLD NEW [RUNS] [REGEX]
#
# Measures the benchmarks of bench/README at two commits on this machine, side
# by side: one test binary per commit and package (built from a worktree of
# each commit), RUNS runs of each benchmark per commit (default 5), the two
# commits alternating, old first in the first half of the pairs and new first
# in the rest (the second run of a pair tends to be the slower one). REGEX
# (an extended regular expression) keeps only the benchmarks whose name
# matches it. At the end it prints, per benchmark, each metric's median at
# both commits, new ÷ old, and the p-value of a rank test over the runs
# (bench/benchmed -old -new: above 0.05, not told apart from noise).
#
#   bench/sidebyside.sh 8680f4f HEAD 5
#   bench/sidebyside.sh 8680f4f HEAD 5 'SwapPause|CallRoundTrip'
#
# The runs' output stays in $SIDEBYSIDE_DIR (default bin/sidebyside): <side>-
# <benchmark>.txt, with each run's stderr in .err beside it. The two
# worktrees share this checkout's bin/ (the control plane that
# test/applyscale and test/sandbox start) and are removed at the end. The
# sandbox benchmarks and ApplyScale need root.
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
old=$(git rev-parse --short "$1^{commit}")
new=$(git rev-parse --short "$2^{commit}")
runs=${3:-5}
filter=${4:-.}
root=$(git rev-parse --show-toplevel)
out=${SIDEBYSIDE_DIR:-$root/bin/sidebyside}
mkdir -p "$out"

# name benchtime: every benchmark bench/README reports, with its -benchtime.
benchmarks=(
  "ArtifactVerification 10x"
  "SpawnVerifyLoad 40x"
  "FaultToGroupReaped 200x"
  "StartToTerminal 3000x"
  "StartToTerminalSurvivor 1000x"
  "SurvivorHop 5000x"
  "DurableAppend 40x"
  "ReplayVerify 40x"
  "CallRoundTrip 2000x"
  "SwapPause 1x"
  "OCIPullVerify64MiB 3x"
  "FamilyApply 3x"
  "Plan 2000x"
  "PackageInvoke 2000x"
  "PackageWatchEvents 3x"
  "SandboxedLaunch 30x"
  "SandboxedStartToTerminal 2000x"
  "NeighbourLatencyBesideACPUSpinner 300x"
  "ApplyScale 1x"
)

# The worktrees are this run's: removed (and unregistered) however it ends.
remove_worktrees() {
  local side
  for side in old new; do
    [ ! -d "$out/wt-$side" ] || git worktree remove --force "$out/wt-$side" || true
  done
}
trap remove_worktrees EXIT

worktree() { # side commit
  local wt=$out/wt-$1
  [ ! -d "$wt" ] || git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
  git worktree prune
  git worktree add --detach "$wt" "$2" >/dev/null
  ln -s "$root/bin" "$wt/bin"
}

# pkgdir side name: the package directory that declares Benchmark<name>.
pkgdir() {
  local dir
  dir=$(git -C "$out/wt-$1" grep -l "^func Benchmark$2(" -- '*_test.go' | head -1)
  [ -n "$dir" ] || { echo "sidebyside: no Benchmark$2 at the $1 commit" >&2; return 1; }
  dirname "$dir"
}

# binary side dir: the package's test binary, built once per side.
binary() {
  local bin=$out/$1-${2//\//_}.test
  if [ ! -x "$bin" ]; then
    (cd "$out/wt-$1" && go test -c -o "$bin" "./$2") >&2
  fi
  echo "$bin"
}

declare -A dirs bins # by "<side> <name>": the package directory and its test binary

run() { # side name benchtime
  local dir=${dirs[$1 $2]} bin=${bins[$1 $2]}
  echo "$(date -u +%T) $1 $2" >&2
  (cd "$out/wt-$1/$dir" && "$bin" -test.run='^$' -test.bench="^Benchmark$2\$" -test.benchtime="$3" \
    -test.benchmem -test.count=1 -test.timeout=15m) >>"$out/$1-$2.txt" 2>>"$out/$1-$2.err" || {
    echo "sidebyside: Benchmark$2 failed at the $1 commit; its output: $out/$1-$2.txt and .err" >&2
    tail -20 "$out/$1-$2.txt" >&2
    return 1
  }
}

worktree old "$old"
worktree new "$new"
rm -f "$out"/old-*.test "$out"/new-*.test
echo "old $old, new $new, $runs runs each, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/summary.txt"

selected=()
for b in "${benchmarks[@]}"; do
  name=${b%% *}
  if [[ $name =~ $filter ]]; then
    selected+=("$b")
    rm -f "$out"/{old,new}-"$name".{txt,err}
    for side in old new; do
      dirs[$side $name]=$(pkgdir "$side" "$name")
      bins[$side $name]=$(binary "$side" "${dirs[$side $name]}")
    done
  fi
done
[ ${#selected[@]} -gt 0 ] || { echo "sidebyside: no benchmark matches $filter" >&2; exit 2; }

for b in "${selected[@]}"; do
  name=${b%% *} benchtime=${b#* }
  for i in $(seq "$runs"); do
    if [ "$i" -le $(((runs + 1) / 2)) ]; then
      run old "$name" "$benchtime"; run new "$name" "$benchtime"
    else
      run new "$name" "$benchtime"; run old "$name" "$benchtime"
    fi
  done
done

echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/summary.txt"
for b in "${selected[@]}"; do
  name=${b%% *}
  (cd "$root" && go run ./bench/benchmed -old "$out/old-$name.txt" -new "$out/new-$name.txt") | tee -a "$out/summary.txt"
done
