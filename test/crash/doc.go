// Package crash runs the real manager binary as a process against the real
// API server and real providers, and kills it: SIGKILL at each phase of a
// hot swap, SIGTERM under calls, a provider killed from outside, a ledger
// corrupted while no manager ran. After each, a restarted manager must hold
// exactly one Active generation per module, a verifying ledger, the state of
// the last durable snapshot, and no process left behind.
package crash
