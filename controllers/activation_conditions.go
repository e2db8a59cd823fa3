package controllers

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
)

// The activation's five conditions are summarized from one "first
// problem": the most severe thing that stands between the activation and
// Ready now. Each condition is its own function of that summary, so each
// can be table-tested alone.

// severity orders problems: a lower one is reported first.
type severity int

const (
	// severityLedgerCorrupt: nothing is done until an operator acts.
	severityLedgerCorrupt severity = iota
	// severityNotServing: a module has no generation that can serve (a
	// refused relaunch, a failed rollback, the crash budget spent).
	severityNotServing
	// severityLedgerUnwritable: transactions wait for the ledger.
	severityLedgerUnwritable
	// severityReconcile: the reconcile itself failed (the API refused).
	severityReconcile
	// severityVerification: a source of the spec did not verify.
	severityVerification
	// severityFailedTarget: a swap failed; the old generation serves.
	severityFailedTarget
	// severityModule: a module waits (a dependency, a relaunch).
	severityModule
)

// problem is something standing between an activation and Ready.
type problem struct {
	severity severity
	// code is the reason (snake_case), or reason the condition reason
	// itself when the problem is not one of the operator's reasons (an API
	// refusal).
	code, reason string
	message      string
	// stalled: no progress without a change.
	stalled bool
}

// conditionReason is the CamelCase condition reason of the problem.
func (p *problem) conditionReason() string {
	if p.reason != "" {
		return p.reason
	}
	return reasonOf(p.code)
}

func reasonOf(code string) string {
	if r := reasons.ConditionReason(code); r != "" {
		return r
	}
	return iteronv1.ReasonProgressing
}

// phaseError is a reconcile phase that failed, with the condition reason
// it shows and whether retrying alone can fix it.
type phaseError struct {
	reason  string
	stalled bool
	err     error
}

func (e *phaseError) Error() string { return e.err.Error() }
func (e *phaseError) Unwrap() error { return e.err }

// apiRefusal classifies an API error of a phase: a refusal the API server
// will repeat (forbidden by RBAC, denied by an admission policy, invalid)
// stalls until something changes; anything else is retried.
func apiRefusal(what string, err error) error {
	reason := string(apierrors.ReasonForError(err))
	if reason == "" || reason == string(metav1.StatusReasonUnknown) {
		reason = "APIError"
	}
	stalled := apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
	return &phaseError{reason: reason, stalled: stalled, err: fmt.Errorf("%s: %w", what, err)}
}

// summary is what the conditions are made of.
type summary struct {
	// first is the most severe current problem (nil: none).
	first *problem
	// verification is the spec's verification problem (nil: verified, or
	// not resolved).
	verification *problem
	// resolved: the spec was verified this reconcile (not paused).
	resolved bool
	sources  int
	// notReady explains the first module not serving its desired
	// generation ("" when every module does).
	notReady string
	// lagging explains a Generation whose status does not show what the
	// coordinator did yet ("" when they agree).
	lagging string
	// busy: transactions of the applied plan are in progress, or the spec
	// is not applied yet.
	busy bool
	// transacting: the coordinator is running a transaction now.
	transacting bool
	paused      bool
	active      int
	// probePending explains a probe that has not run against the
	// generations serving now ("" when none).
	probePending string
}

// summarize computes the summary of a reconcile; reconcileErr is the error
// the reconcile ends with, if any.
func summarizeActivation(s *activationScope, reconcileErr error) summary {
	act, st := s.act, s.status
	sum := summary{resolved: s.resolved, sources: len(s.res.Modules), paused: act.Spec.Paused}
	var problems []problem
	add := func(p problem) { problems = append(problems, p) }

	if st.LedgerError != "" {
		add(problem{severity: severityLedgerCorrupt, code: reasons.LedgerCorrupt, stalled: true,
			message: "the ledger is unusable; the manager does not act on this activation until an operator resolves it: " + st.LedgerError})
	}
	if st.LedgerUnwritable != "" {
		add(problem{severity: severityLedgerUnwritable, code: reasons.LedgerUnwritable, stalled: true, message: st.LedgerUnwritable})
	}
	if reconcileErr != nil {
		p := problem{severity: severityReconcile, reason: "ReconcileError", message: reconcileErr.Error()}
		var pe *phaseError
		if errors.As(reconcileErr, &pe) {
			p.reason, p.stalled = pe.reason, pe.stalled
		}
		add(p)
	}
	if s.resolved {
		switch {
		case s.res.DocumentError != nil:
			sum.verification = &problem{severity: severityVerification, code: s.res.DocumentCode, message: s.res.DocumentError.Error(), stalled: true}
		default:
			for _, rm := range s.res.Modules {
				if reasons.Verification(rm.Code) {
					sum.verification = &problem{severity: severityVerification, code: rm.Code, message: fmt.Sprintf("module %s: %s", rm.Module, rm.Message), stalled: true}
					break
				}
			}
		}
		if sum.verification != nil {
			add(*sum.verification)
		}
	}
	for _, m := range slices.Sorted(maps.Keys(s.stalled)) {
		f := s.stalled[m]
		add(problem{severity: severityFailedTarget, code: f.Code, stalled: true,
			message: fmt.Sprintf("module %s: %s (a failed swap is not retried for the same target; change the spec or set %s)", m, f.Message, iteronv1.AnnotationRetry)})
	}
	for _, f := range st.Failures {
		add(problem{severity: severityFailedTarget, code: f.Code, message: fmt.Sprintf("module %s: %s", f.Module, f.Message), stalled: !f.Retryable})
	}
	sourced := map[string]bool{}
	for _, rm := range s.res.Modules {
		sourced[rm.Module] = true
	}
	for _, ms := range act.Status.Modules {
		rt, known := st.Modules[ms.Module]
		if s.resolved && !sourced[ms.Module] {
			// Being retired (its source left the spec): it is not part of
			// what the spec asks to serve; the retirement keeps the
			// activation Reconciling.
			continue
		}
		if ms.Phase != iteronv1.PhaseActive && sum.notReady == "" {
			sum.notReady = fmt.Sprintf("module %s is not serving its desired generation yet", ms.Module)
		}
		if t, ok := s.targets[ms.Module]; ok && !t.Keep && ms.GenerationName != t.GenerationName && sum.notReady == "" {
			sum.notReady = fmt.Sprintf("module %s is not serving its desired generation yet", ms.Module)
		}
		if ms.Phase == iteronv1.PhaseActive {
			sum.active++
		}
		if ms.Reason == "" {
			continue
		}
		p := problem{severity: severityModule, code: ms.Reason, message: fmt.Sprintf("module %s: %s", ms.Module, ms.Message), stalled: reasons.Stalls(ms.Reason)}
		if known && rt.Active != "" && !rt.Serving && (rt.Phase == iteronv1.PhaseFailed || ms.Reason == reasons.LedgerUnwritable) {
			p.severity, p.stalled = severityNotServing, true
			p.message = fmt.Sprintf("module %s serves nothing: %s", ms.Module, ms.Message)
			if t := s.targets[ms.Module]; rt.Phase == iteronv1.PhaseFailed && replacesGivenUp(s, ms.Module, t, rt.Active) {
				// A new target replaces a given-up generation (a cold
				// replace): the spec change is the progress a stall waits
				// for, so this is Reconciling until the target ends.
				p.stalled = false
				p.message = fmt.Sprintf("module %s serves nothing until %s replaces it: %s", ms.Module, t.GenerationName, ms.Message)
			}
		}
		if ms.Reason == reasons.LedgerCorrupt {
			continue // reported once, for the activation
		}
		add(p)
	}
	if s.resolved && s.res.DocumentError == nil {
		probes, pending := probeProblems(s)
		for _, p := range probes {
			add(p)
		}
		sum.probePending = pending
	}
	sum.busy = s.haveStatus && (st.Busy || st.AppliedSpecGeneration < act.Generation && !act.Spec.Paused)
	sum.transacting = s.haveStatus && st.Busy
	sum.lagging = s.lagging
	for i := range problems {
		if sum.first == nil || problems[i].severity < sum.first.severity {
			sum.first = &problems[i]
		}
	}
	return sum
}

// replacesGivenUp reports whether target t of module is a new generation
// that will replace the given-up active one: not kept, not the active
// generation, and not a target that has already failed. A module without a
// target has the zero target, which replaces nothing.
func replacesGivenUp(s *activationScope, module string, t hotswap.ModuleTarget, active string) bool {
	if t.Keep || t.GenerationName == "" || t.GenerationName == active {
		return false
	}
	if f := failureFor(s.status, module); f != nil && f.GenerationName == t.GenerationName {
		return false
	}
	_, kept := s.stalled[module]
	return !kept
}

// restingState reports whether the spec generation has been handled to a
// state that lasts without a change: Ready, Stalled or paused. Only then
// does observedGeneration advance (kstatus reads InProgress until then).
func (sum summary) restingState() bool {
	// Stalled while a transaction still runs (a rollback in progress) is
	// not at rest: what it ends with may not stall.
	return sum.paused || sum.stalled() && !sum.transacting || sum.ready()
}

func (sum summary) stalled() bool { return sum.first != nil && sum.first.stalled }

func (sum summary) ready() bool {
	return sum.first == nil && sum.notReady == "" && !sum.busy && sum.lagging == "" && sum.probePending == ""
}

func condition(t string, ok bool, reason, msg string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: t, Status: status, Reason: reason, Message: truncate(msg, iteronv1.MaxMessageBytes)}
}

// verifiedCondition says whether every source passed verification; absent
// when the spec was not resolved (paused).
func verifiedCondition(sum summary) (metav1.Condition, bool) {
	switch {
	case !sum.resolved:
		return metav1.Condition{}, false
	case sum.verification != nil:
		return condition(iteronv1.ConditionVerified, false, sum.verification.conditionReason(), sum.verification.message), true
	}
	return condition(iteronv1.ConditionVerified, true, iteronv1.ReasonSucceeded, fmt.Sprintf("all %d sources verified", sum.sources)), true
}

// stalledCondition is kstatus's Failed: no progress without a change.
func stalledCondition(sum summary) metav1.Condition {
	if sum.stalled() {
		return condition(iteronv1.ConditionStalled, true, sum.first.conditionReason(), sum.first.message)
	}
	return condition(iteronv1.ConditionStalled, false, iteronv1.ReasonSucceeded, "not stalled")
}

// reconcilingCondition is kstatus's InProgress.
func reconcilingCondition(sum summary) metav1.Condition {
	switch {
	case sum.paused:
		return condition(iteronv1.ConditionReconciling, false, iteronv1.ReasonPaused, "spec.paused is true: spec changes are not acted on; running providers keep serving")
	case sum.stalled():
		return condition(iteronv1.ConditionReconciling, false, sum.first.conditionReason(), "stalled: "+sum.first.message)
	case sum.first != nil && sum.first.severity == severityReconcile:
		return condition(iteronv1.ConditionReconciling, true, sum.first.conditionReason(), "retrying: "+sum.first.message)
	case sum.busy || sum.notReady != "" || sum.lagging != "" || sum.probePending != "":
		return condition(iteronv1.ConditionReconciling, true, iteronv1.ReasonProgressing, progressMessage(sum))
	case sum.first != nil:
		return condition(iteronv1.ConditionReconciling, true, sum.first.conditionReason(), sum.first.message)
	}
	return condition(iteronv1.ConditionReconciling, false, iteronv1.ReasonSucceeded, "the desired state holds")
}

// degradedCondition says part of the activation does not serve as desired.
func degradedCondition(sum summary) metav1.Condition {
	if p := sum.first; p != nil && p.severity != severityReconcile {
		return condition(iteronv1.ConditionDegraded, true, p.conditionReason(), p.message)
	}
	if sum.notReady != "" || sum.busy {
		return condition(iteronv1.ConditionDegraded, false, iteronv1.ReasonProgressing, "no module has a problem; "+progressMessage(sum))
	}
	return condition(iteronv1.ConditionDegraded, false, iteronv1.ReasonSucceeded, "every module serves its desired generation")
}

// readyCondition summarizes the others: True only once every module serves
// its desired generation and every Generation's status shows it.
func readyCondition(sum summary) metav1.Condition {
	switch {
	case sum.first != nil:
		return condition(iteronv1.ConditionReady, false, sum.first.conditionReason(), sum.first.message)
	case !sum.ready():
		return condition(iteronv1.ConditionReady, false, iteronv1.ReasonProgressing, progressMessage(sum))
	}
	return condition(iteronv1.ConditionReady, true, iteronv1.ReasonSucceeded, fmt.Sprintf("all %d modules Active", sum.active))
}

func progressMessage(sum summary) string {
	switch {
	case sum.notReady != "":
		return sum.notReady
	case sum.lagging != "":
		return sum.lagging
	case sum.probePending != "":
		return sum.probePending
	}
	return "transactions in progress"
}

// conditionsFor is every condition of the activation, in a stable order.
func conditionsFor(sum summary) []metav1.Condition {
	var out []metav1.Condition
	if c, ok := verifiedCondition(sum); ok {
		out = append(out, c)
	}
	return append(out, stalledCondition(sum), reconcilingCondition(sum), degradedCondition(sum), readyCondition(sum))
}

func sortedKeys(m map[string]hotswap.Failure) []string {
	return slices.Sorted(maps.Keys(m))
}
