// Package graph orders verified sources and plans the change between two
// activations (docs/concepts.md, identity, epoch and plan). It is pure
// computation over plain data: its input is what verification produced, its
// output (module statuses, orders, identities, epochs, a RuntimePlan) holds no
// live handle, so the hot-swap coordinator and the activation controller can
// keep, compare and print it.
//
// Dependencies. A module's direct dependencies are
//   - its seam-graph dependencies that have a source in the activation, and
//   - the modules whose sources provide its manifest's implementation
//     dependencies (dependencies[{implementation_id, minimum_version}]).
//
// Admission. A verified module is admitted unless
//   - an implementation dependency is not satisfied by a source in the same
//     activation (absent, or its version below minimum_version): the module is
//     Inactive with dependency_unsatisfied;
//   - a direct dependency is present but not admitted (it failed verification
//     or is itself Inactive): Inactive with dependency_unsatisfied, the
//     message naming the whole chain ("memory_recall needs context_assembly
//     needs prompt_system (not admitted: verification_failed: …)");
//   - it lies on a dependency cycle (possible only through implementation
//     dependencies; the seam graph itself is acyclic): Inactive with
//     dependency_cycle, the message naming the full cycle path.
//
// A seam-graph dependency that has no source in the activation does not gate:
// the built-in graph has 28 modules and an activation may fill two of them,
// so only present-but-failed dependencies and implementation dependencies
// gate. Such an absent module is not part of the epoch either.
//
// Identity and epoch. A module's identity is
// "module|implementation_id|major.minor.patch|sha256:<artifact hex>". Its
// epoch is "sha256:" and the hex SHA-256 of the compact JSON array of strings
// [identity, identities of its direct dependencies in ModuleId order]:
// identities, not epochs, so a change reloads the changed module and its
// direct consumers only.
//
// Orders. The activation order is topological (dependencies first) with ties
// broken by ModuleId order; the drain order is its reverse. A RuntimePlan's
// ActivateOrder holds the Added and Reloaded modules in the new activation
// order; its DrainOrder holds the Removed modules in the old drain order.
package graph
