// Package controllers holds the node's reconcilers, one per concern. They
// are thin: load the object, ensure the finalizer, call phase functions from
// internal/, patch status once with observedGeneration.
//
//   - ActivationReconciler acts on an activation's spec: verify, plan, create
//     the Generations of new targets, hand the plan to the coordinator, and
//     summarize what runs into status. It runs when the spec (or an
//     annotation, a label, the deletion) changes and when the coordinator
//     reports the activation's work changed; a phase of a transaction does
//     not requeue it.
//   - GenerationReconciler mirrors the coordinator's state of each
//     generation into its Generation's status.
//   - GenerationHistoryReconciler deletes the ended Generations beyond
//     spec.generationHistoryLimit.
//   - Notifier turns the coordinator's notifications into requeues of the
//     first two, an activation's held until the Generations it changed were
//     mirrored.
package controllers
