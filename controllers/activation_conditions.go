package controllers

import (
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
)

// problem is the first thing standing between an activation and Ready.
type problem struct {
	code, message string
	stalled       bool // no progress without a change
}

func reasonOf(code string) string {
	if r := reasons.ConditionReason(code); r != "" {
		return r
	}
	return iteronv1.ReasonProgressing
}

// conditionsFor summarizes an activation into its five conditions: Ready
// says whether every module serves its desired generation; Reconciling and
// Stalled are the kstatus pair; Degraded says part of the activation does not
// serve; Verified says every source passed verification.
func conditionsFor(s *activationScope) []metav1.Condition {
	act, st := s.act, s.status
	cond := func(t string, ok bool, reason, msg string) metav1.Condition {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: status, Reason: reason, Message: truncate(msg, iteronv1.MaxMessageBytes)}
	}
	var out []metav1.Condition

	// Verified (only when the spec was resolved: a paused spec is not).
	var verifyProblem *problem
	if s.resolved {
		switch {
		case s.res.DocumentError != nil:
			verifyProblem = &problem{s.res.DocumentCode, s.res.DocumentError.Error(), true}
		default:
			for _, rm := range s.res.Modules {
				if reasons.Verification(rm.Code) {
					verifyProblem = &problem{rm.Code, rm.Message, true}
					break
				}
			}
		}
		if verifyProblem != nil {
			out = append(out, cond(iteronv1.ConditionVerified, false, reasonOf(verifyProblem.code), verifyProblem.message))
		} else {
			out = append(out, cond(iteronv1.ConditionVerified, true, iteronv1.ReasonSucceeded, fmt.Sprintf("all %d sources verified", len(s.res.Modules))))
		}
	}

	// The first problem, stalling ones first.
	var first *problem
	note := func(p problem) {
		if first == nil || p.stalled && !first.stalled {
			first = &p
		}
	}
	if verifyProblem != nil {
		note(*verifyProblem)
	}
	if st.LedgerError != "" {
		note(problem{reasons.LedgerCorrupt, "the ledger is unusable; the manager does not act on this activation until an operator resolves it: " + st.LedgerError, true})
	}
	for _, m := range sortedKeys(s.stalled) {
		f := s.stalled[m]
		note(problem{f.Code, fmt.Sprintf("module %s: %s (a failed swap is not retried for the same target; change the spec or set %s)", m, f.Message, iteronv1.AnnotationRetry), true})
	}
	for _, f := range st.Failures {
		note(problem{f.Code, fmt.Sprintf("module %s: %s", f.Module, f.Message), !f.Retryable})
	}
	degraded := false
	notReady := ""
	for _, ms := range act.Status.Modules {
		if ms.Reason != "" {
			degraded = true
			note(problem{ms.Reason, fmt.Sprintf("module %s: %s", ms.Module, ms.Message), reasons.Stalls(ms.Reason)})
		}
		if ms.Phase != iteronv1.PhaseActive && notReady == "" {
			notReady = ms.Module
		}
		if t, ok := s.targets[ms.Module]; ok && ms.GenerationName != t.GenerationName && notReady == "" {
			notReady = ms.Module
		}
	}
	// A paused spec is not applied, so the applied generation lagging is
	// not work in progress.
	busy := s.haveStatus && (st.Busy || st.AppliedSpecGeneration < act.Generation && !act.Spec.Paused)
	stalled := first != nil && first.stalled

	switch {
	case stalled:
		out = append(out, cond(iteronv1.ConditionStalled, true, reasonOf(first.code), first.message))
	default:
		out = append(out, cond(iteronv1.ConditionStalled, false, iteronv1.ReasonSucceeded, "not stalled"))
	}
	switch {
	case act.Spec.Paused:
		out = append(out, cond(iteronv1.ConditionReconciling, false, iteronv1.ReasonPaused, "spec.paused is true: spec changes are not acted on; running providers keep serving"))
	case stalled:
		out = append(out, cond(iteronv1.ConditionReconciling, false, reasonOf(first.code), "stalled: "+first.message))
	case busy || notReady != "" && first == nil:
		msg := "transactions in progress"
		if notReady != "" {
			msg = fmt.Sprintf("module %s is not serving its desired generation yet", notReady)
		}
		out = append(out, cond(iteronv1.ConditionReconciling, true, iteronv1.ReasonProgressing, msg))
	default:
		out = append(out, cond(iteronv1.ConditionReconciling, false, iteronv1.ReasonSucceeded, "the desired state holds"))
	}
	if degraded || len(st.Failures) > 0 || len(s.stalled) > 0 {
		msg := "part of the activation does not serve"
		if first != nil {
			msg = first.message
		}
		code := reasons.ActivationFailed
		if first != nil {
			code = first.code
		}
		out = append(out, cond(iteronv1.ConditionDegraded, true, reasonOf(code), msg))
	} else {
		out = append(out, cond(iteronv1.ConditionDegraded, false, iteronv1.ReasonSucceeded, "every module serves"))
	}
	switch {
	case first != nil:
		out = append(out, cond(iteronv1.ConditionReady, false, reasonOf(first.code), first.message))
	case notReady != "" || busy:
		msg := "transactions in progress"
		if notReady != "" {
			msg = fmt.Sprintf("module %s is not serving its desired generation yet", notReady)
		}
		out = append(out, cond(iteronv1.ConditionReady, false, iteronv1.ReasonProgressing, msg))
	default:
		out = append(out, cond(iteronv1.ConditionReady, true, iteronv1.ReasonSucceeded, fmt.Sprintf("all %d modules Active", len(act.Status.Modules))))
	}
	return out
}

func sortedKeys(m map[string]hotswap.Failure) []string {
	return slices.Sorted(maps.Keys(m))
}
