// Package analysis judges what a rollout measures: the CEL conditions of an
// ActivationSet's analysis metrics and of an activation's probes, the query
// a wave's measurement sends (with the wave's nodes and revision filled
// in), and the bounded HTTP calls to the cluster's AnalysisProviders. The
// decisions built on a measurement (when the next one is due, when a run
// has failed, what a failed wave does) are internal/fleet's.
//
// What holds for any answer a provider gives:
//
//   - A request never outlives the provider's timeoutSeconds, connection
//     included, and never reads more than its maxResponseBytes of body: a
//     slower or larger answer is a measurement that could not be made
//     (Error), with the reason in its message. Redirects are not followed
//     (a provider is reached at the address an administrator wrote, and
//     nowhere else).
//   - A condition is type-checked to a bool when it is compiled (a spec
//     with a condition that does not compile is refused before a node
//     moves) and evaluated within a fixed CEL cost budget, whatever the
//     size of the answer: an expression that would exceed it is an Error,
//     not a hang.
//   - What a measurement records is bounded (value and message at most 256
//     bytes each, cut at a UTF-8 boundary), so status stays small whatever
//     a provider sends.
package analysis
