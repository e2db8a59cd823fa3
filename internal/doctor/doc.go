// Package doctor explains why an ImplementationActivation is not serving: the
// diagnosis behind `kubectl iteron doctor <activation>`
// (docs/troubleshooting.md says what each finding means and what to do).
//
// It is split so that the judgement is testable without a cluster:
//   - Gather reads the objects (the activation, its Generations, the Node
//     its spec names, its events; with a state dir, every activation and
//     Generation of that node) through any client.Reader;
//   - ReadLocal reads what only the node has: the activation's ledger
//     (verified read-only, the last blocked record of each module) and the
//     executor's durable process records checked against /proc;
//   - Diagnose is a pure function from those two to a Report: one entry per
//     module that does not serve its desired implementation, the conditions,
//     the Node, the ledger, the processes, and Findings, each with a stable
//     code, a severity and, where there is one, the exact command that
//     clears it.
//
// Nothing here changes anything: the doctor prints commands, a person runs
// them. It sits at the top of the internal packages
// (docs/reference/layering.md): it reads the ledger (internal/ledger), the
// process records (internal/procexec's Record) and the seam graph
// (internal/catalog), and nothing imports it but the CLI.
package doctor
