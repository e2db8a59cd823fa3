// Package survivor runs the real manager and the real survivor binaries as
// processes against the real API server (the local control plane) and real
// providers, and restarts and kills them under calls (docs/survivor.md):
//
//   - the manager restarted (SIGTERM, then a new manager; and a new binary:
//     an upgrade) while a caller calls: no call fails, the count goes on
//     without a gap, the provider keeps its pid and start time, the ledger
//     verifies and records no relaunch;
//   - the manager SIGKILLed under load: only the calls in flight fail, and
//     their retries under the same invocation ID are answered from the
//     survivor's outcome (replayed): nothing counted twice, nothing lost;
//   - the survivor SIGKILLed: the manager relaunches the provider from its
//     newest checkpoint; what it did after that checkpoint is lost (bounded
//     by the checkpoint interval) and the Generation's status says so;
//   - the survivor stopped (SIGTERM, its upgrade): the manager checkpoints
//     first: nothing is lost;
//   - a provider that exits while no manager runs is noticed and relaunched
//     when the next manager re-attaches.
//
// Each test prints its numbers (calls made and failed, the counts, pids
// before and after); after the tests, TestMain prints the table of docs/survivor.md.
package survivor
