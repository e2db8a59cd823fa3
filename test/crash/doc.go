// Package crash runs the real manager binary as a process against the real
// API server and real providers, and kills it: SIGKILL at each phase of a
// hot swap, SIGTERM under calls, a provider killed from outside, a ledger
// corrupted while no manager ran. After each, a restarted manager must hold
// exactly one Active generation per module, a verifying ledger, the state of
// the last durable snapshot, and no process left behind.
//
// It also fails the manager's disk under it: with <state-dir>/ledgers (and
// only it) on a FUSE file system (test/faultfs), the ledger append of a
// chosen phase of each transaction kind fails with ENOSPC or EIO
// (faults_ledger_test.go; every phase of every kind with ITERON_FAULTS=all,
// make faults), and a provider whose lifetime ends before its renewal can
// be recorded stops serving then and not before, and says so
// (faults_lifetime_test.go). Process groups are followed whole, from the
// manager's process records (watched with inotify) and /proc. Without root
// or /dev/fuse those tests skip; ITERON_REQUIRE_FUSE=1 (.ci/run) makes that a
// failure.
package crash
