package procexec

import "iteron.dev/operator/internal/spawn"

// The process layer below the executor (internal/spawn) is shared with the
// package-runtime host; these names keep the executor's API as it was.

// Exit describes how a provider process ended (spawn.Exit).
type Exit = spawn.Exit

// Record is the durable trace of one live provider group (spawn.Record).
type Record = spawn.Record

// SweepReport says what Sweep found (spawn.SweepReport).
type SweepReport = spawn.SweepReport

// ReapOrphans scans /proc at once, as the reaper does on SIGCHLD: it reaps
// zombie members of recorded provider groups re-parented to the manager and
// kills (and reaps) descendants that left their provider's group. It returns
// the pids of the escaped descendants killed since the last call, which the
// conformance check reports as processes left behind (spawn.ReapOrphans).
func ReapOrphans() []int { return spawn.ReapOrphans() }
