package v1alpha1

// Labels, annotations, finalizer and condition reasons of ActivationSets and
// the activations they stamp.
const (
	// LabelActivationSet, on a stamped ImplementationActivation and on a
	// template revision (ControllerRevision), names the set. Ownership is
	// the controller owner reference; the label only narrows what is read.
	LabelActivationSet = "iteron.dev/activation-set"
	// LabelNode, on a stamped activation, is its node's name (when the name
	// fits a label value; spec.nodeName always holds it).
	LabelNode = "iteron.dev/node"
	// LabelRevision, on a stamped activation and a template revision, is
	// the revision's hash: the revision the activation's spec is stamped
	// from (apps/v1's controller-revision-hash).
	LabelRevision = "iteron.dev/revision"
	// AnnotationWave, on a stamped activation, is the wave of the rollout
	// that moved it to its revision ("0": created there).
	AnnotationWave = "iteron.dev/wave"
	// AnnotationRevertedFrom, on a stamped activation, is the revision hash
	// a revert moved it back from: its swaps back use the set's
	// revertStateDisposition.
	AnnotationRevertedFrom = "iteron.dev/reverted-from"
	// AnnotationTraceparent, on a stamped activation, is the W3C
	// traceparent of the node's span in the set's rollout trace, written in
	// the same update as the stamp (so it costs no write of its own) by a
	// fleet controller that traces: the node's transactions link to it,
	// which ties a node's swap to the wave that moved it. Absent when the
	// fleet controller does not trace; a value that does not parse is
	// ignored.
	AnnotationTraceparent = "iteron.dev/traceparent"
	// AnnotationResume, set on an ActivationSet to a timestamp (kubectl
	// iteron rollout resume), resumes a halted or reverted rollout: the
	// failed nodes are retried (iteron.dev/retry) and the rollout goes on.
	// The handled value is echoed in status.lastHandledResumeAt.
	AnnotationResume = "iteron.dev/resume"
	// AnnotationPromote, set on an ActivationSet to a timestamp (kubectl
	// iteron rollout promote), releases the pause step the rollout waits
	// at. The handled value is echoed in status.lastHandledPromoteAt; a
	// value seen while the rollout is not at a pause step releases nothing.
	AnnotationPromote = "iteron.dev/promote"
	// AnnotationAbort, set on an ActivationSet to a timestamp (kubectl
	// iteron rollout abort), stops the rollout under way and moves every
	// node that left the stable revision back to it, whatever onFailure
	// says. The handled value is echoed in status.lastHandledAbortAt.
	AnnotationAbort = "iteron.dev/abort"
	// FinalizerActivationSet holds a set until every activation it stamped
	// is gone (each one's own finalizer retires its providers).
	FinalizerActivationSet = "iteron.dev/delete-activations"
)

// Condition reasons of an ActivationSet (besides Succeeded, Progressing and
// Paused).
const (
	// ReasonRolloutHalted: a moved node went Stalled and onFailure is Halt.
	ReasonRolloutHalted = "RolloutHalted"
	// ReasonRolloutReverting: a moved node went Stalled; nodes go back.
	ReasonRolloutReverting = "RolloutReverting"
	// ReasonRolloutReverted: every node is back on the stable revision.
	ReasonRolloutReverted = "RolloutReverted"
	// ReasonRevertFailed: a node could not go back to the stable revision.
	ReasonRevertFailed = "RevertFailed"
	// ReasonSoaking: the canaries must stay Ready for the soak time.
	ReasonSoaking = "Soaking"
	// ReasonInvalidSpec: the spec cannot be acted on (an invalid selector).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonDeleting: the set is being deleted.
	ReasonDeleting = "Deleting"
	// ReasonNodeConflict: a selected node has no stamped activation (a name
	// held by an activation the set did not stamp, or a name collision).
	ReasonNodeConflict = "NodeConflict"
	// ReasonPausedAtStep: the rollout waits at a pause step for a
	// promotion.
	ReasonPausedAtStep = "PausedAtStep"
	// ReasonAnalysisFailed: a wave's analysis failed.
	ReasonAnalysisFailed = "AnalysisFailed"
	// ReasonProbeFailed: a probe failed (on an activation: its module's
	// answer; on a set: on a node the rollout moved).
	ReasonProbeFailed = "ProbeFailed"
	// ReasonAborted: kubectl iteron rollout abort.
	ReasonAborted = "Aborted"
	// ReasonAnalysisRunning: a wave's analysis is being measured.
	ReasonAnalysisRunning = "AnalysisRunning"
)

// ConditionAnalysisFailed, on an ActivationSet whose strategy has an
// analysis or whose template has probes, is True when the rollout stopped
// because a wave's analysis or a node's probe failed (reason AnalysisFailed
// or ProbeFailed, the values in the message): the condition an alert
// watches. False otherwise.
const ConditionAnalysisFailed = "AnalysisFailed"
