// Package fleet is the logic of the ActivationSet controller, with no API
// calls: which node gets which activation name, which template revision a
// node is on, and what one reconcile changes. The reconciler in
// controllers/fleet reads the cluster, calls Compute and carries out the
// actions it returns; everything here is a function of its input, so every
// decision is table-tested without a cluster.
//
// What holds after any sequence of reconciles, by any number of controller
// processes one after another (a leader killed mid-rollout included):
//
//   - Every decision is derived from the objects in the API: the revision a
//     node is on is its activation's iteron.dev/revision label, written in
//     the same update as the spec stamped from that revision; the wave that
//     moved it is its iteron.dev/wave annotation; what cannot be read back
//     from the nodes (the stable revision, a halt, a soak that began) is in
//     the set's status. A new leader therefore neither moves a node twice
//     nor skips one.
//   - A rollout moves a node only when every node it moved before is Ready
//     (waves), and never more nodes than maxUnavailable less the nodes not
//     Ready already: the nodes not Ready never exceed maxUnavailable because
//     of the rollout.
//   - A node the rollout moved that goes Stalled halts the rollout
//     (status.halt, kept until the template changes or the rollout is
//     resumed); with onFailure Revert every node that left the stable
//     revision goes back to it, Stalled ones first, the others within the
//     same budget.
//   - An activation the set did not stamp (no controller owner reference to
//     it) is never changed, adopted or deleted, and a node whose stamped
//     name it holds is reported as a conflict; two selected nodes whose
//     names collide never share one (the first by node name keeps it).
//   - A stamped activation is changed only to the spec of a revision: a
//     hand edit is set back to its revision's spec; the set's template is
//     never written.
//   - Names are deterministic: a readable prefix of the set and node names
//     and a hash of both, at most 40 characters for any node name.
package fleet
