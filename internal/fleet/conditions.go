package fleet

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// phaseReason is the condition reason of each phase.
var phaseReason = map[iteronv1.RolloutPhase]string{
	iteronv1.RolloutProgressing:  iteronv1.ReasonProgressing,
	iteronv1.RolloutSoaking:      iteronv1.ReasonSoaking,
	iteronv1.RolloutPaused:       iteronv1.ReasonPaused,
	iteronv1.RolloutPausedAtStep: iteronv1.ReasonPausedAtStep,
	iteronv1.RolloutCompleted:    iteronv1.ReasonSucceeded,
	iteronv1.RolloutHalted:       iteronv1.ReasonRolloutHalted,
	iteronv1.RolloutReverting:    iteronv1.ReasonRolloutReverting,
	iteronv1.RolloutReverted:     iteronv1.ReasonRolloutReverted,
	iteronv1.RolloutRevertFailed: iteronv1.ReasonRevertFailed,
	iteronv1.RolloutDeleting:     iteronv1.ReasonDeleting,
}

// AtRest reports whether a phase lasts without a change: only then does
// status.observedGeneration advance (kstatus reads InProgress until then).
// No phase is a spec that cannot be acted on (Stalled).
func AtRest(phase iteronv1.RolloutPhase) bool {
	switch phase {
	case "", iteronv1.RolloutCompleted, iteronv1.RolloutHalted, iteronv1.RolloutReverted, iteronv1.RolloutRevertFailed, iteronv1.RolloutPaused, iteronv1.RolloutPausedAtStep:
		return true
	}
	return false
}

// Conditions are the set's Ready, Reconciling and Stalled conditions for a
// phase, its message and the conflicts (kstatus reads Reconciling and
// Stalled; Argo CD's health script all three). Reconciling is True while
// nodes move (Progressing, Soaking, Reverting, Deleting); Stalled is True
// when nothing moves without a person (Halted, Reverted, RevertFailed, a
// spec that cannot be acted on, or a finished rollout with nodes it could
// not stamp); Ready is True only when every selected node is Ready on the
// update revision.
func Conditions(phase iteronv1.RolloutPhase, message string, conflicts []iteronv1.NodeConflict, generation int64) []metav1.Condition {
	reason := phaseReason[phase]
	if reason == "" {
		reason = iteronv1.ReasonInvalidSpec
	}
	cond := func(t string, ok bool, reason, msg string) metav1.Condition {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: truncate(msg, iteronv1.MaxMessageBytes), ObservedGeneration: generation}
	}
	if len(conflicts) > 0 {
		c := conflicts[0]
		more := ""
		if len(conflicts) > 1 {
			more = fmt.Sprintf(" (and %d more nodes: status.conflicts)", len(conflicts)-1)
		}
		note := fmt.Sprintf("node %s has no activation: %s%s", c.Node, c.Message, more)
		if phase == iteronv1.RolloutCompleted {
			reason, message = iteronv1.ReasonNodeConflict, note
		} else {
			message += "; " + note
		}
	}
	var moving, stalled bool
	switch phase {
	case iteronv1.RolloutProgressing, iteronv1.RolloutSoaking, iteronv1.RolloutReverting, iteronv1.RolloutDeleting:
		moving = true
	case iteronv1.RolloutHalted, iteronv1.RolloutReverted, iteronv1.RolloutRevertFailed:
		stalled = true
	case iteronv1.RolloutCompleted, iteronv1.RolloutPaused, iteronv1.RolloutPausedAtStep:
		stalled = reason == iteronv1.ReasonNodeConflict
	default:
		stalled = true
	}
	ready := phase == iteronv1.RolloutCompleted && reason == iteronv1.ReasonSucceeded
	out := []metav1.Condition{
		cond(iteronv1.ConditionReady, ready, reason, message),
		cond(iteronv1.ConditionReconciling, moving, reason, message),
		cond(iteronv1.ConditionStalled, stalled, reason, message),
	}
	if !moving {
		out[1].Message = truncate("no node is moving: "+message, iteronv1.MaxMessageBytes)
	}
	if !stalled {
		out[2].Reason, out[2].Message = iteronv1.ReasonSucceeded, "not stalled"
	}
	return out
}
