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
// make faults). Process groups are followed whole, from the manager's
// process records (watched with inotify) and /proc.
package crash
