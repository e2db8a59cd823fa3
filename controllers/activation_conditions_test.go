package controllers

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
)

// The activation's conditions, one table per condition function, in the
// manner of Cluster API's machine_controller_status_test.go: no API server,
// no coordinator. Every case starts from the same world — a reconcile of
// spec generation 2 of activation "stack", whose prompt_system was just hot
// swapped from g1 to g2 and whose context_assembly (its consumer) still
// serves g1 — and changes one or two things about it. The summary is made
// the way a reconcile makes it (summarize, then summarizeActivation), so a
// case reads as a situation, not as a hand-built summary.

const (
	sysG1 = "stack-prompt-system-g1-1"
	sysG2 = "stack-prompt-system-g2-1"
	sysG3 = "stack-prompt-system-g3-1"
	ctxG1 = "stack-context-assembly-g1-1"
	ctxG2 = "stack-context-assembly-g2-1"
)

// readyWorld is the scope of a reconcile after its phases ran, at a moment
// where everything is done: both modules serve their targets and every
// Generation object shows what the coordinator did.
func readyWorld() *activationScope {
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: "stack", Namespace: "default", UID: "uid-stack", Generation: 2},
		Spec:       iteronv1.ImplementationActivationSpec{NodeName: "worker-1"},
		Status:     iteronv1.ImplementationActivationStatus{ObservedGeneration: 1},
	}
	s := &activationScope{act: act, base: act.DeepCopy(), key: keyOf(act), resolved: true, haveStatus: true}
	s.res = Resolution{
		Modules: []ResolvedModule{
			{Module: "prompt_system", Epoch: "sha256:epoch-sys-2"},
			{Module: "context_assembly", Epoch: "sha256:epoch-ctx-1", DependsOn: []string{"prompt_system"}},
		},
		ActivateOrder: []string{"prompt_system", "context_assembly"},
		DrainOrder:    []string{"context_assembly", "prompt_system"},
	}
	s.targets = map[string]hotswap.ModuleTarget{
		"prompt_system":    {Module: "prompt_system", GenerationName: sysG2, Lineage: 2, Attempt: 1},
		"context_assembly": {Module: "context_assembly", GenerationName: ctxG1, Lineage: 1, Attempt: 1, DependsOn: []string{"prompt_system"}},
	}
	s.stalled = map[string]hotswap.Failure{}
	s.status = hotswap.ActivationStatus{
		Key: s.key, AppliedSpecGeneration: 2,
		Modules: map[string]hotswap.ModuleStatus{
			"prompt_system": {Module: "prompt_system", Active: sysG2, ImplementationID: "counter-v2", Lineage: 2, Attempt: 1,
				Epoch: "sha256:epoch-sys-2", Phase: iteronv1.PhaseActive, Serving: true, Pid: 4102},
			"context_assembly": {Module: "context_assembly", Active: ctxG1, ImplementationID: "counter-v1", Lineage: 1, Attempt: 1,
				Epoch: "sha256:epoch-ctx-1", Phase: iteronv1.PhaseActive, Serving: true, Pid: 4001},
		},
		Generations: map[string]hotswap.GenerationStatus{
			sysG1: {Name: sysG1, Module: "prompt_system", Lineage: 1, Attempt: 1, Phase: iteronv1.PhaseInactive, Step: iteronv1.StepDrain},
			sysG2: {Name: sysG2, Module: "prompt_system", Lineage: 2, Attempt: 1, Phase: iteronv1.PhaseActive, Step: iteronv1.StepCommitted, Pid: 4102},
			ctxG1: {Name: ctxG1, Module: "context_assembly", Lineage: 1, Attempt: 1, Phase: iteronv1.PhaseActive, Step: iteronv1.StepCommitted, Pid: 4001},
		},
	}
	for _, name := range []string{sysG1, sysG2, ctxG1} {
		gs := s.status.Generations[name]
		s.gens = append(s.gens, generationObject(gs.Name, gs.Module, gs.Lineage, gs.Phase, gs.Step))
	}
	return s
}

func generationObject(name, module string, lineage int64, phase iteronv1.ModulePhase, step iteronv1.GenerationStep) iteronv1.Generation {
	return iteronv1.Generation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Generation: 1},
		Spec:       iteronv1.GenerationSpec{ActivationName: "stack", Module: module, Generation: lineage, Attempt: 1},
		Status:     iteronv1.GenerationStatus{Phase: phase, Step: step},
	}
}

// world is readyWorld changed by each edit, in order.
func world(edits ...func(*activationScope)) func() *activationScope {
	return func() *activationScope {
		s := readyWorld()
		for _, e := range edits {
			e(s)
		}
		return s
	}
}

// The edits: one situation each.

// corruptLedger: replay failed a rule; the coordinator serves nothing more
// for context_assembly (its process was not relaunched).
func corruptLedger(s *activationScope) {
	s.status.LedgerError = "record 12 does not chain: previous_sha256 differs from record 11's record_sha256"
	ms := s.status.Modules["context_assembly"]
	ms.Active, ms.Serving, ms.Phase = "", false, iteronv1.PhaseInactive
	s.status.Modules["context_assembly"] = ms
}

// ledgerUnwritable: an append failed; serving modules keep serving.
func ledgerUnwritable(s *activationScope) {
	s.status.LedgerUnwritable = "append record 31: write /var/lib/iteron/ledgers/uid-stack/ledger-000001.jsonl: no space left on device"
}

// servesNothing: the module's relaunch was refused for a stalling reason:
// its active generation is Failed and no process serves.
func servesNothing(module, code string) func(*activationScope) {
	return func(s *activationScope) {
		ms := s.status.Modules[module]
		ms.Serving, ms.Phase, ms.Pid = false, iteronv1.PhaseFailed, 0
		ms.Reason, ms.Message = code, "relaunch of "+ms.Active+" refused: the artifact on disk no longer matches its digest"
		s.status.Modules[module] = ms
		gs := s.status.Generations[ms.Active]
		gs.Phase, gs.Pid, gs.Reason, gs.Message = iteronv1.PhaseFailed, 0, code, ms.Message
		s.status.Generations[ms.Active] = gs
		for i := range s.gens {
			if s.gens[i].Name == ms.Active {
				s.gens[i].Status.Phase, s.gens[i].Status.Reason = iteronv1.PhaseFailed, code
			}
		}
	}
}

// replacedByANewTarget: prompt_system's active generation (g2) is given up
// (its relaunch refused) and the spec changed to a new target (g3), which
// the coordinator will cold-replace it with: progress, not a stall.
func replacedByANewTarget(s *activationScope) {
	servesNothing("prompt_system", reasons.VerificationFailed)(s)
	s.targets["prompt_system"] = hotswap.ModuleTarget{Module: "prompt_system", GenerationName: sysG3, Lineage: 3, Attempt: 1}
}

// endedWhileUnwritable: the module's process reached its lifetime bound
// while no renewal could be recorded: it serves nothing until the ledger
// heals (its generation is not Failed).
func endedWhileUnwritable(module string) func(*activationScope) {
	return func(s *activationScope) {
		ledgerUnwritable(s)
		ms := s.status.Modules[module]
		ms.Serving, ms.Pid = false, 0
		ms.Reason, ms.Message = reasons.LedgerUnwritable, "its process ended and no relaunch can be recorded until the ledger accepts appends"
		s.status.Modules[module] = ms
	}
}

// swapFailed: the coordinator's attempt at prompt_system g3 failed; g2
// still serves. The target of this reconcile is still g3 (the failure has
// just happened).
func swapFailed(code string, retryable bool) func(*activationScope) {
	return func(s *activationScope) {
		f := hotswap.Failure{Module: "prompt_system", GenerationName: sysG3, Code: code,
			Message: "generation 3 failed at migrate: the provider exited with status 2", Retryable: retryable}
		s.status.Failures = append(s.status.Failures, f)
		s.status.Generations[sysG3] = hotswap.GenerationStatus{Name: sysG3, Module: "prompt_system", Lineage: 3, Attempt: 1,
			Phase: iteronv1.PhaseFailed, Step: iteronv1.StepRolledBack, Reason: code, Message: f.Message}
		s.gens = append(s.gens, generationObject(sysG3, "prompt_system", 3, iteronv1.PhaseFailed, iteronv1.StepRolledBack))
		s.gens[len(s.gens)-1].Status.Reason = code
	}
}

// failedSwapKept: a later reconcile of the same spec: the failed target is
// not retried, the module keeps g2.
func failedSwapKept(s *activationScope) {
	swapFailed(reasons.ProviderFailed, false)(s)
	s.status.Failures = nil
	s.stalled["prompt_system"] = hotswap.Failure{Module: "prompt_system", GenerationName: sysG3, Code: reasons.ProviderFailed,
		Message: "generation 3 failed at migrate: the provider exited with status 2"}
	s.targets["prompt_system"] = hotswap.ModuleTarget{Module: "prompt_system", Keep: true}
}

// waitsForDependency: context_assembly's new generation waits for
// prompt_system (its dependency) to serve.
func waitsForDependency(s *activationScope) {
	ms := s.status.Modules["context_assembly"]
	ms.Active, ms.Serving, ms.Phase, ms.Pid = "", false, iteronv1.PhaseInactive, 0
	ms.Reason, ms.Message = reasons.DependencyUnsatisfied, "waits for prompt_system to serve"
	s.status.Modules["context_assembly"] = ms
	delete(s.status.Generations, ctxG1)
	s.gens = s.gens[:2]
}

// verificationFails: a source of the spec does not verify; what ran keeps
// running (its target is Keep).
func verificationFails(module, code string) func(*activationScope) {
	return resolutionRefuses(module, code, "artifact digest sha256:1f… does not match the manifest's sha256:9c…")
}

// resolutionRefuses: the resolution cannot run the module (a verification
// failure, a missing dependency, a cycle); what ran keeps running.
func resolutionRefuses(module, code, message string) func(*activationScope) {
	return func(s *activationScope) {
		for i := range s.res.Modules {
			if s.res.Modules[i].Module == module {
				s.res.Modules[i].Code, s.res.Modules[i].Message = code, message
			}
		}
		s.targets[module] = hotswap.ModuleTarget{Module: module, Keep: true}
	}
}

// documentRefused: the whole spec is refused; nothing is applied.
func documentRefused(s *activationScope) {
	s.res.DocumentError = errors.New("module prompt_system appears twice in spec.sources")
	s.res.DocumentCode = reasons.SchemaMismatch
}

// paused: spec.paused; the spec is not resolved.
func paused(s *activationScope) {
	s.act.Spec.Paused = true
	s.resolved = false
	s.res = Resolution{}
	s.act.Status.Modules = []iteronv1.ModuleStatus{
		{Module: "prompt_system", Phase: iteronv1.PhaseActive, GenerationName: sysG2, Generation: 2},
		{Module: "context_assembly", Phase: iteronv1.PhaseActive, GenerationName: ctxG1, Generation: 1},
	}
}

// busy: a transaction of the applied plan runs.
func busy(s *activationScope) { s.status.Busy = true }

// notApplied: the coordinator has not been handed this spec generation.
func notApplied(s *activationScope) { s.status.AppliedSpecGeneration = 1 }

// notYetActive: prompt_system's target is g3, which is not active yet (the
// coordinator still serves g2).
func notYetActive(s *activationScope) {
	s.targets["prompt_system"] = hotswap.ModuleTarget{Module: "prompt_system", GenerationName: sysG3, Lineage: 3, Attempt: 1}
}

// generationShows: the named Generation object's mirrored status lags.
func generationShows(name string, phase iteronv1.ModulePhase, step iteronv1.GenerationStep) func(*activationScope) {
	return func(s *activationScope) {
		for i := range s.gens {
			if s.gens[i].Name == name {
				s.gens[i].Status.Phase, s.gens[i].Status.Step = phase, step
			}
		}
	}
}

// The reconcile errors.

var (
	generationsGR = schema.GroupResource{Group: "iteron.dev", Resource: "generations"}
	// errDenied is what a ValidatingAdmissionPolicy's denial looks like.
	errDenied = apiRefusal("create Generation "+sysG3, apierrors.NewForbidden(generationsGR, sysG3,
		errors.New("ValidatingAdmissionPolicy 'no-generations' with binding 'no-generations' denied request: Generations of stack are refused here")))
	errRBAC = apiRefusal("create Generation "+sysG3, apierrors.NewForbidden(generationsGR, sysG3,
		errors.New(`User "system:serviceaccount:iteron-system:iteron-manager" cannot create resource "generations"`)))
	errInvalid = apiRefusal("create Generation "+sysG3, apierrors.NewInvalid(schema.GroupKind{Group: "iteron.dev", Kind: "Generation"}, sysG3,
		field.ErrorList{field.Invalid(field.NewPath("spec", "previous"), "x", "too long")}))
	errConflict = apiRefusal("create Generation "+sysG3, apierrors.NewConflict(generationsGR, sysG3, errors.New("the object has been modified")))
	errTimeout  = apiRefusal("delete Generation "+sysG1+" beyond the history limit", apierrors.NewServerTimeout(generationsGR, "delete", 2))
	errUnknown  = apiRefusal("list Generations", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"))
	errPlain    = fmt.Errorf("forget activation uid-stack: %w", errors.New("rename: permission denied"))
	errApply    = &phaseError{reason: "CoordinatorError", err: errors.New("hand the plan to the node's coordinator: the coordinator is stopping")}
)

// summaryOf is the summary of a reconcile of s that ends with err, made the
// way summarize makes it (module statuses first, then the Generations' lag).
func summaryOf(s *activationScope, err error) summary {
	r := &ActivationReconciler{Recorder: events.NewFakeRecorder(100)}
	r.summarize(s, err)
	return summarizeActivation(s, err)
}

// wantCondition is a condition's status and reason, and words its message
// must contain.
type wantCondition struct {
	status  metav1.ConditionStatus
	reason  string
	message []string
}

func checkCondition(t *testing.T, got metav1.Condition, want wantCondition) {
	t.Helper()
	if got.Status != want.status || got.Reason != want.reason {
		t.Errorf("%s = %s (%s); want %s (%s)\nmessage: %s", got.Type, got.Status, got.Reason, want.status, want.reason, got.Message)
	}
	for _, m := range want.message {
		if !strings.Contains(got.Message, m) {
			t.Errorf("%s's message %q does not say %q", got.Type, got.Message, m)
		}
	}
	if len(got.Message) > iteronv1.MaxMessageBytes {
		t.Errorf("%s's message is %d bytes; the bound is %d", got.Type, len(got.Message), iteronv1.MaxMessageBytes)
	}
}

type conditionCase struct {
	name  string
	scope func() *activationScope
	err   error
	want  wantCondition
}

func runConditionTable(t *testing.T, cases []conditionCase, cond func(summary) metav1.Condition) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkCondition(t, cond(summaryOf(tc.scope(), tc.err)), tc.want)
		})
	}
}

func TestTheFirstProblemIsTheMostSevereOne(t *testing.T) {
	type want struct {
		severity severity
		reason   string
		stalled  bool
		message  string
	}
	cases := []struct {
		name  string
		scope func() *activationScope
		err   error
		want  *want
	}{
		{"an activation serving its desired state has no problem", world(), nil, nil},
		{"a corrupt ledger comes before a module that serves nothing",
			world(servesNothing("prompt_system", reasons.VerificationFailed), corruptLedger), nil,
			&want{severityLedgerCorrupt, iteronv1.ReasonLedgerCorrupt, true, "until an operator resolves it: record 12 does not chain"}},
		{"a module serving nothing outranks a failed swap whose old generation serves",
			world(swapFailed(reasons.ProviderFailed, false), servesNothing("context_assembly", reasons.VerificationFailed)), nil,
			&want{severityNotServing, iteronv1.ReasonVerificationFailed, true, "module context_assembly serves nothing: relaunch of " + ctxG1 + " refused"}},
		{"a module serving nothing outranks an unwritable ledger",
			world(ledgerUnwritable, servesNothing("context_assembly", reasons.AuthorityChanged)), nil,
			&want{severityNotServing, iteronv1.ReasonAuthorityChanged, true, "module context_assembly serves nothing"}},
		{"a module whose process ended while the ledger is unwritable serves nothing, for that reason",
			world(endedWhileUnwritable("prompt_system")), nil,
			&want{severityNotServing, iteronv1.ReasonLedgerUnwritable, true, "module prompt_system serves nothing: its process ended"}},
		{"a module serving nothing until a new target replaces it is not stalled",
			world(replacedByANewTarget, notApplied), nil,
			&want{severityNotServing, iteronv1.ReasonVerificationFailed, false, "module prompt_system serves nothing until " + sysG3 + " replaces it"}},
		{"a module serving nothing whose replacement failed too stalls",
			world(replacedByANewTarget, swapFailed(reasons.ProviderFailed, false)), nil,
			&want{severityNotServing, iteronv1.ReasonVerificationFailed, true, "module prompt_system serves nothing: relaunch"}},
		{"a module serving nothing outranks a reconcile error",
			world(servesNothing("prompt_system", reasons.UnsupportedVersion)), errDenied,
			&want{severityNotServing, iteronv1.ReasonUnsupportedVersion, true, "module prompt_system serves nothing"}},
		{"an unwritable ledger outranks a reconcile error",
			world(ledgerUnwritable), errConflict,
			&want{severityLedgerUnwritable, iteronv1.ReasonLedgerUnwritable, true, "no space left on device"}},
		{"an unwritable ledger outranks a failed swap whose old generation serves",
			world(swapFailed(reasons.LedgerUnwritable, true), ledgerUnwritable), nil,
			&want{severityLedgerUnwritable, iteronv1.ReasonLedgerUnwritable, true, "no space left on device"}},
		{"a refusal the API server will repeat (an admission policy) stalls with the API's reason",
			world(), errDenied,
			&want{severityReconcile, "Forbidden", true, "create Generation " + sysG3 + ": generations.iteron.dev \"" + sysG3 + "\" is forbidden: ValidatingAdmissionPolicy 'no-generations'"}},
		{"a refusal by RBAC stalls with Forbidden", world(), errRBAC,
			&want{severityReconcile, "Forbidden", true, "cannot create resource \"generations\""}},
		{"an invalid object stalls with Invalid", world(), errInvalid,
			&want{severityReconcile, "Invalid", true, "spec.previous"}},
		{"a conflict is retried, not stalled", world(), errConflict,
			&want{severityReconcile, "Conflict", false, "the object has been modified"}},
		{"a server timeout is retried, not stalled", world(), errTimeout,
			&want{severityReconcile, "ServerTimeout", false, "delete Generation " + sysG1 + " beyond the history limit"}},
		{"an API error without a status is retried as APIError", world(), errUnknown,
			&want{severityReconcile, "APIError", false, "list Generations: dial tcp"}},
		{"an error of no phase is retried as ReconcileError", world(), errPlain,
			&want{severityReconcile, "ReconcileError", false, "forget activation uid-stack"}},
		{"the coordinator refusing the plan is retried as CoordinatorError", world(), errApply,
			&want{severityReconcile, "CoordinatorError", false, "the coordinator is stopping"}},
		{"a reconcile error outranks a source that does not verify",
			world(verificationFails("context_assembly", reasons.VerificationFailed)), errConflict,
			&want{severityReconcile, "Conflict", false, ""}},
		{"a source that does not verify outranks a failed swap whose old generation serves",
			world(failedSwapKept, verificationFails("context_assembly", reasons.VerificationFailed)), nil,
			&want{severityVerification, iteronv1.ReasonVerificationFailed, true, "module context_assembly: artifact digest"}},
		{"a refused document is a verification problem with its code",
			world(documentRefused), nil,
			&want{severityVerification, iteronv1.ReasonSchemaMismatch, true, "appears twice"}},
		{"a swap that just failed stalls with its reason while the old generation serves",
			world(swapFailed(reasons.ProviderFailed, false)), nil,
			&want{severityFailedTarget, iteronv1.ReasonProviderFailed, true, "module prompt_system: generation 3 failed at migrate"}},
		{"a failed swap kept for the same spec stalls and says how to retry",
			world(failedSwapKept), nil,
			&want{severityFailedTarget, iteronv1.ReasonProviderFailed, true, iteronv1.AnnotationRetry}},
		{"an attempt cut short by an unwritable ledger that has healed is retried, not stalled",
			world(swapFailed(reasons.LedgerUnwritable, true)), nil,
			&want{severityFailedTarget, iteronv1.ReasonLedgerUnwritable, false, "module prompt_system"}},
		{"a failed swap outranks a module waiting for its dependency",
			world(waitsForDependency, swapFailed(reasons.DeadlineExceeded, false)), nil,
			&want{severityFailedTarget, iteronv1.ReasonDeadlineExceeded, true, "module prompt_system"}},
		{"a module waiting for its dependency is a problem that does not stall",
			world(waitsForDependency), nil,
			&want{severityModule, iteronv1.ReasonDependencyUnsatisfied, false, "module context_assembly: waits for prompt_system"}},
		{"a dependency cycle in the spec stalls at module severity",
			world(resolutionRefuses("context_assembly", reasons.DependencyCycle, "context_assembly → prompt_system → context_assembly")), nil,
			&want{severityModule, iteronv1.ReasonDependencyCycle, true, "module context_assembly: context_assembly → prompt_system"}},
		{"transactions in progress are no problem", world(busy), nil, nil},
		{"Generations lagging are no problem", world(generationShows(sysG2, iteronv1.PhasePreparing, iteronv1.StepReadiness)), nil, nil},
		{"a paused activation has no problem", world(paused), nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sum := summaryOf(tc.scope(), tc.err)
			p := sum.first
			switch {
			case tc.want == nil && p != nil:
				t.Fatalf("first problem %+v; want none", *p)
			case tc.want == nil:
				return
			case p == nil:
				t.Fatalf("no first problem; want %s (%s)", tc.want.reason, severityName(tc.want.severity))
			}
			if p.severity != tc.want.severity || p.conditionReason() != tc.want.reason || p.stalled != tc.want.stalled {
				t.Errorf("first problem: %s, reason %s, stalled %v; want %s, reason %s, stalled %v\nmessage: %s",
					severityName(p.severity), p.conditionReason(), p.stalled, severityName(tc.want.severity), tc.want.reason, tc.want.stalled, p.message)
			}
			if !strings.Contains(p.message, tc.want.message) {
				t.Errorf("first problem's message %q does not say %q", p.message, tc.want.message)
			}
		})
	}
}

func severityName(s severity) string {
	return [...]string{"ledger corrupt", "not serving", "ledger unwritable", "reconcile error", "verification", "failed target", "module"}[s]
}

func TestVerifiedSaysWhetherEverySourcePassedVerification(t *testing.T) {
	cases := []struct {
		name    string
		scope   func() *activationScope
		absent  bool
		want    wantCondition
		subject string
	}{
		{name: "every source verified is Verified", scope: world(),
			want: wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, []string{"all 2 sources verified"}}},
		{name: "a source whose artifact does not match its digest is not Verified", scope: world(verificationFails("context_assembly", reasons.VerificationFailed)),
			want: wantCondition{metav1.ConditionFalse, iteronv1.ReasonVerificationFailed, []string{"module context_assembly", "does not match"}}},
		{name: "a source of an unsupported version is not Verified", scope: world(verificationFails("prompt_system", reasons.UnsupportedVersion)),
			want: wantCondition{metav1.ConditionFalse, iteronv1.ReasonUnsupportedVersion, []string{"module prompt_system"}}},
		{name: "the first source that fails is named", scope: world(verificationFails("prompt_system", reasons.SchemaMismatch), verificationFails("context_assembly", reasons.VerificationFailed)),
			want: wantCondition{metav1.ConditionFalse, iteronv1.ReasonSchemaMismatch, []string{"module prompt_system"}}},
		{name: "a refused document is not Verified, with its code", scope: world(documentRefused),
			want: wantCondition{metav1.ConditionFalse, iteronv1.ReasonSchemaMismatch, []string{"appears twice"}}},
		{name: "a module waiting for its dependency is still Verified", scope: world(waitsForDependency),
			want: wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, nil}},
		{name: "a module whose dependency is missing from the spec is still Verified (its bytes verified)",
			scope: world(resolutionRefuses("context_assembly", reasons.DependencyUnsatisfied, "needs prompt_tool_description, which no source fills")),
			want:  wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, []string{"all 2 sources verified"}}},
		{name: "modules in a dependency cycle are still Verified",
			scope: world(resolutionRefuses("context_assembly", reasons.DependencyCycle, "context_assembly → prompt_system → context_assembly")),
			want:  wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, nil}},
		{name: "a failed swap is still Verified (the bytes verified; the provider failed)", scope: world(failedSwapKept),
			want: wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, nil}},
		{name: "a paused activation has no Verified condition (the spec was not resolved)", scope: world(paused), absent: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := verifiedCondition(summaryOf(tc.scope(), nil))
			if ok == tc.absent {
				t.Fatalf("Verified present = %v (%+v); want present = %v", ok, c, !tc.absent)
			}
			if ok {
				checkCondition(t, c, tc.want)
			}
		})
	}
}

func TestStalledIsTrueOnlyWhenNothingProgressesWithoutAChange(t *testing.T) {
	notStalled := wantCondition{metav1.ConditionFalse, iteronv1.ReasonSucceeded, []string{"not stalled"}}
	runConditionTable(t, []conditionCase{
		{"an activation serving its desired state is not Stalled", world(), nil, notStalled},
		{"a corrupt ledger is Stalled with LedgerCorrupt", world(corruptLedger), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonLedgerCorrupt, []string{"until an operator resolves it"}}},
		{"a module serving nothing is Stalled with its reason", world(servesNothing("prompt_system", reasons.VerificationFailed)), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonVerificationFailed, []string{"module prompt_system serves nothing"}}},
		{"a module serving nothing that a new target replaces is not Stalled (the spec change is the progress)",
			world(replacedByANewTarget, notApplied), nil, notStalled},
		{"an unwritable ledger is Stalled with LedgerUnwritable", world(ledgerUnwritable), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonLedgerUnwritable, []string{"no space left on device"}}},
		{"a denial by an admission policy is Stalled with Forbidden", world(), errDenied,
			wantCondition{metav1.ConditionTrue, "Forbidden", []string{"create Generation " + sysG3, "denied request"}}},
		{"a conflict is not Stalled (it is retried)", world(), errConflict, notStalled},
		{"a server timeout is not Stalled", world(), errTimeout, notStalled},
		{"a source that does not verify is Stalled", world(verificationFails("prompt_system", reasons.VerificationFailed)), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonVerificationFailed, []string{"module prompt_system"}}},
		{"a failed swap kept for the same spec is Stalled", world(failedSwapKept), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProviderFailed, []string{"not retried for the same target"}}},
		{"a retryable attempt is not Stalled", world(swapFailed(reasons.LedgerUnwritable, true)), nil, notStalled},
		{"a module waiting for its dependency is not Stalled", world(waitsForDependency), nil, notStalled},
		{"a paused activation is not Stalled", world(paused), nil, notStalled},
		{"transactions in progress are not Stalled", world(busy), nil, notStalled},
	}, stalledCondition)
}

func TestReconcilingIsTrueWhileSomethingIsLeftToDo(t *testing.T) {
	runConditionTable(t, []conditionCase{
		{"an activation serving its desired state is not Reconciling", world(), nil,
			wantCondition{metav1.ConditionFalse, iteronv1.ReasonSucceeded, []string{"the desired state holds"}}},
		{"a paused activation is not Reconciling, even with a transaction running", world(paused, busy), nil,
			wantCondition{metav1.ConditionFalse, iteronv1.ReasonPaused, []string{"spec.paused is true"}}},
		{"a stalled activation is not Reconciling (kstatus: Failed, not InProgress)", world(failedSwapKept, busy), nil,
			wantCondition{metav1.ConditionFalse, iteronv1.ReasonProviderFailed, []string{"stalled: module prompt_system"}}},
		{"a denial by an admission policy is not Reconciling", world(notApplied), errDenied,
			wantCondition{metav1.ConditionFalse, "Forbidden", []string{"stalled: create Generation"}}},
		{"a retried API error is Reconciling with the API's reason", world(), errConflict,
			wantCondition{metav1.ConditionTrue, "Conflict", []string{"retrying: create Generation " + sysG3}}},
		{"a retried API error is Reconciling with its reason even while transactions run", world(busy), errTimeout,
			wantCondition{metav1.ConditionTrue, "ServerTimeout", []string{"retrying: delete Generation"}}},
		{"a running transaction is Reconciling", world(busy), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"transactions in progress"}}},
		{"a spec not yet handed to the coordinator is Reconciling", world(notApplied), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, nil}},
		{"a module not serving its target yet is Reconciling and names it", world(notYetActive), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"module prompt_system is not serving its desired generation yet"}}},
		{"a module serving nothing that a new target replaces is Reconciling", world(replacedByANewTarget, notApplied), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"module prompt_system is not serving its desired generation yet"}}},
		{"a module waiting for its dependency is Reconciling", world(waitsForDependency), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"module context_assembly is not serving"}}},
		{"a Generation that does not show Active at a final step yet is Reconciling and names it",
			world(generationShows(sysG2, iteronv1.PhaseActive, iteronv1.StepAtomicSwitch)), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"Generation " + sysG2 + " does not show Active at a final step yet (it shows Active atomic_switch)"}}},
		{"a retryable attempt with nothing else to do is Reconciling with its reason", world(swapFailed(reasons.LedgerUnwritable, true)), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonLedgerUnwritable, []string{"module prompt_system"}}},
	}, reconcilingCondition)
}

func TestDegradedSaysPartOfTheActivationDoesNotServeAsDesired(t *testing.T) {
	healthy := wantCondition{metav1.ConditionFalse, iteronv1.ReasonSucceeded, []string{"every module serves its desired generation"}}
	progressing := func(msg string) wantCondition {
		return wantCondition{metav1.ConditionFalse, iteronv1.ReasonProgressing, []string{"no module has a problem; " + msg}}
	}
	runConditionTable(t, []conditionCase{
		{"an activation serving its desired state is not Degraded", world(), nil, healthy},
		{"a corrupt ledger is Degraded", world(corruptLedger), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonLedgerCorrupt, nil}},
		{"a module serving nothing is Degraded with its reason", world(swapFailed(reasons.ProviderFailed, false), servesNothing("context_assembly", reasons.VerificationFailed)), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonVerificationFailed, []string{"module context_assembly serves nothing"}}},
		{"an unwritable ledger is Degraded", world(ledgerUnwritable), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonLedgerUnwritable, nil}},
		{"a failed swap whose old generation serves is Degraded", world(failedSwapKept), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonProviderFailed, []string{"module prompt_system"}}},
		{"a module waiting for its dependency is Degraded with that reason", world(waitsForDependency), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonDependencyUnsatisfied, nil}},
		{"an API refusal alone does not make the activation Degraded (what serves, serves)", world(), errDenied, healthy},
		{"an API refusal while a module is not serving its target yet is not Degraded, and names the module (not transactions that do not run)",
			world(notYetActive), errDenied, progressing("module prompt_system is not serving its desired generation yet")},
		{"a running transaction is not Degraded", world(busy), nil, progressing("transactions in progress")},
		{"a Generation lagging is not Degraded", world(generationShows(sysG1, iteronv1.PhaseDraining, iteronv1.StepDrain)), nil, healthy},
	}, degradedCondition)
}

func TestReadyWaitsForEveryModuleAndEveryGeneration(t *testing.T) {
	notReady := func(reason string, msg ...string) wantCondition {
		return wantCondition{metav1.ConditionFalse, reason, msg}
	}
	runConditionTable(t, []conditionCase{
		{"every module serving its target, every Generation showing it, is Ready", world(), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, []string{"all 2 modules Active"}}},
		{"a corrupt ledger is not Ready", world(corruptLedger), nil, notReady(iteronv1.ReasonLedgerCorrupt, "record 12")},
		{"a module serving nothing is not Ready, with its reason, even when another module's swap failed",
			world(swapFailed(reasons.ProviderFailed, false), servesNothing("context_assembly", reasons.VerificationFailed)), nil,
			notReady(iteronv1.ReasonVerificationFailed, "module context_assembly serves nothing")},
		{"an unwritable ledger is not Ready", world(ledgerUnwritable), nil, notReady(iteronv1.ReasonLedgerUnwritable, "no space left on device")},
		{"a Generation refused by an admission policy is not Ready, with the API's reason and the denial", world(notApplied), errDenied,
			notReady("Forbidden", "create Generation "+sysG3, "denied request: Generations of stack are refused here")},
		{"a retried API error is not Ready, with its reason", world(), errConflict, notReady("Conflict", "the object has been modified")},
		{"a source that does not verify is not Ready", world(verificationFails("prompt_system", reasons.VerificationFailed)), nil,
			notReady(iteronv1.ReasonVerificationFailed, "module prompt_system")},
		{"a failed swap whose old generation serves is not Ready", world(failedSwapKept), nil,
			notReady(iteronv1.ReasonProviderFailed, "generation 3 failed at migrate")},
		{"a module waiting for its dependency is not Ready", world(waitsForDependency), nil,
			notReady(iteronv1.ReasonDependencyUnsatisfied, "waits for prompt_system")},
		{"a running transaction is not Ready", world(busy), nil, notReady(iteronv1.ReasonProgressing, "transactions in progress")},
		{"a spec not yet handed to the coordinator is not Ready", world(notApplied), nil, notReady(iteronv1.ReasonProgressing)},
		{"a module not serving its target yet is not Ready", world(notYetActive), nil,
			notReady(iteronv1.ReasonProgressing, "module prompt_system is not serving its desired generation yet")},
		{"the new Generation not yet showing Active is not Ready", world(generationShows(sysG2, iteronv1.PhasePreparing, iteronv1.StepReadiness)), nil,
			notReady(iteronv1.ReasonProgressing, "Generation "+sysG2+" does not show Active at a final step yet (it shows Preparing readiness)")},
		{"the new Generation Active but not yet at a final step is not Ready", world(generationShows(sysG2, iteronv1.PhaseActive, iteronv1.StepDrain)), nil,
			notReady(iteronv1.ReasonProgressing, "Generation "+sysG2)},
		{"the old Generation not yet showing Inactive is not Ready", world(generationShows(sysG1, iteronv1.PhaseDraining, iteronv1.StepDrain)), nil,
			notReady(iteronv1.ReasonProgressing, "Generation "+sysG1+" does not show Inactive yet (it shows Draining drain)")},
		{"a failed swap is not Ready, for its reason, before its Generation shows Failed", world(failedSwapKept, generationShows(sysG3, iteronv1.PhasePreparing, iteronv1.StepMigrate)), nil,
			notReady(iteronv1.ReasonProviderFailed)},
		{"an active Generation rolled back to is a final step: Ready", world(generationShows(sysG2, iteronv1.PhaseActive, iteronv1.StepRolledBack)), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, nil}},
		{"a paused activation whose modules serve stays Ready", world(paused), nil,
			wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, []string{"all 2 modules Active"}}},
		{"a paused activation whose swap finished after the pause is not Ready until its Generations show it",
			world(paused, generationShows(sysG2, iteronv1.PhasePreparing, iteronv1.StepReadiness)), nil,
			notReady(iteronv1.ReasonProgressing, "Generation "+sysG2)},
	}, readyCondition)
}

func TestGenerationsLagNamesTheFirstGenerationThatDoesNotShowWhatTheCoordinatorDid(t *testing.T) {
	cases := []struct {
		name  string
		scope func() *activationScope
		want  string // "" or a part of the explanation
	}{
		{"Generations showing what the coordinator did do not lag", world(), ""},
		{"an active Generation still Preparing lags", world(generationShows(sysG2, iteronv1.PhasePreparing, iteronv1.StepRestore)),
			"Generation " + sysG2 + " does not show Active at a final step yet (it shows Preparing restore)"},
		{"an active Generation at atomic_switch lags", world(generationShows(ctxG1, iteronv1.PhaseActive, iteronv1.StepAtomicSwitch)),
			"Generation " + ctxG1 + " does not show Active at a final step yet (it shows Active atomic_switch)"},
		{"an active Generation whose status was never written lags", world(generationShows(sysG2, "", "")),
			"(it shows nothing nothing)"},
		{"an active Generation at rolled_back does not lag", world(generationShows(sysG2, iteronv1.PhaseActive, iteronv1.StepRolledBack)), ""},
		{"an active Generation in the middle of a renewal does not lag (it serves throughout)",
			world(generationShows(sysG2, iteronv1.PhaseActive, iteronv1.StepQuiesce), func(s *activationScope) {
				gs := s.status.Generations[sysG2]
				gs.Step = iteronv1.StepQuiesce
				s.status.Generations[sysG2] = gs
			}), ""},
		{"a drained Generation still Active lags", world(generationShows(sysG1, iteronv1.PhaseActive, iteronv1.StepCommitted)),
			"Generation " + sysG1 + " does not show Inactive yet (it shows Active committed)"},
		{"a failed Generation still Preparing lags", world(swapFailed(reasons.ProviderFailed, false), generationShows(sysG3, iteronv1.PhasePreparing, iteronv1.StepMigrate)),
			"Generation " + sysG3 + " does not show Failed yet (it shows Preparing migrate)"},
		{"a Generation the coordinator does not know (history of an earlier manager) does not lag",
			world(func(s *activationScope) {
				s.gens = append(s.gens, generationObject("stack-prompt-system-g0-1", "prompt_system", 0, iteronv1.PhaseDraining, iteronv1.StepDrain))
			}), ""},
		{"without the coordinator's view nothing lags",
			world(generationShows(sysG2, iteronv1.PhasePreparing, iteronv1.StepRestore), func(s *activationScope) { s.haveStatus = false }), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := generationsLag(tc.scope())
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("lag %q; want %q", got, tc.want)
			}
		})
	}
}

func TestObservedGenerationAdvancesOnlyAtARestingState(t *testing.T) {
	cases := []struct {
		name    string
		scope   func() *activationScope
		err     error
		resting bool
		requeue time.Duration
	}{
		{"Ready is resting", world(), nil, true, 0},
		{"Stalled by a failed swap is resting", world(failedSwapKept), nil, true, 0},
		{"Stalled by a denial of the API is resting (kstatus sees Failed, not InProgress forever)", world(notApplied), errDenied, true, 10 * time.Second},
		{"Stalled by a corrupt ledger is resting", world(corruptLedger), nil, true, 0},
		{"Stalled by an unwritable ledger is resting", world(ledgerUnwritable), nil, true, 0},
		{"a module serving nothing is resting", world(servesNothing("prompt_system", reasons.VerificationFailed)), nil, true, 0},
		{"a module serving nothing that a new target replaces is not resting", world(replacedByANewTarget, notApplied), nil, false, 10 * time.Second},
		{"a module serving nothing that a new target replaces is not resting once the coordinator has the plan either", world(replacedByANewTarget), nil, false, 0},
		{"a paused activation is resting", world(paused, notApplied), nil, true, 0},
		{"a retried API error is not resting", world(), errConflict, false, 0},
		{"a retried error of no phase is not resting", world(), errPlain, false, 0},
		{"a running transaction is not resting and looks again", world(busy), nil, false, 10 * time.Second},
		{"Stalled while a transaction still runs (a rollback in progress) is not resting", world(ledgerUnwritable, busy), nil, false, 10 * time.Second},
		{"a spec not yet handed to the coordinator is not resting", world(notApplied), nil, false, 10 * time.Second},
		{"a module waiting for its dependency is not resting", world(waitsForDependency), nil, false, 0},
		{"a module not serving its target yet is not resting", world(notYetActive), nil, false, 0},
		{"a Generation lagging is not resting and looks again soon", world(generationShows(sysG1, iteronv1.PhaseDraining, iteronv1.StepDrain)), nil, false, 2 * time.Second},
		{"a retryable attempt is not resting", world(swapFailed(reasons.LedgerUnwritable, true)), nil, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.scope()
			r := &ActivationReconciler{Recorder: events.NewFakeRecorder(100)}
			r.summarize(s, tc.err)
			if got := summarizeActivation(s, tc.err).restingState(); got != tc.resting {
				t.Errorf("restingState() = %v; want %v", got, tc.resting)
			}
			want := int64(1)
			if tc.resting {
				want = 2
			}
			if got := s.act.Status.ObservedGeneration; got != want {
				t.Errorf("status.observedGeneration = %d; want %d (spec generation 2, resting %v)\nconditions: %+v", got, want, tc.resting, s.act.Status.Conditions)
			}
			for _, c := range s.act.Status.Conditions {
				if c.ObservedGeneration != 2 {
					t.Errorf("condition %s has observedGeneration %d; want 2 (the conditions always speak of the spec just reconciled)", c.Type, c.ObservedGeneration)
				}
			}
			if s.requeueAfter != tc.requeue {
				t.Errorf("requeueAfter = %v; want %v", s.requeueAfter, tc.requeue)
			}
		})
	}
}

func TestModuleStatusesPutWhatKeepsAModuleFromServingFirst(t *testing.T) {
	cases := []struct {
		name   string
		scope  func() *activationScope
		module string
		phase  iteronv1.ModulePhase
		reason string
		gen    string
	}{
		{"a serving module has no reason", world(), "prompt_system", iteronv1.PhaseActive, "", sysG2},
		{"a module serving nothing keeps that reason over its failed swap",
			world(swapFailed(reasons.ProviderFailed, false), servesNothing("prompt_system", reasons.VerificationFailed)),
			"prompt_system", iteronv1.PhaseFailed, reasons.VerificationFailed, sysG2},
		{"a module serving nothing keeps that reason over a source of the new spec that does not verify",
			world(servesNothing("prompt_system", reasons.AuthorityChanged), verificationFails("prompt_system", reasons.VerificationFailed)),
			"prompt_system", iteronv1.PhaseFailed, reasons.AuthorityChanged, sysG2},
		{"a module serving nothing keeps that reason over a failed swap kept for the same spec",
			world(failedSwapKept, servesNothing("prompt_system", reasons.RollbackFailed)),
			"prompt_system", iteronv1.PhaseFailed, reasons.RollbackFailed, sysG2},
		{"a module that does not serve under a corrupt ledger says ledger_corrupt", world(corruptLedger),
			"context_assembly", iteronv1.PhaseInactive, reasons.LedgerCorrupt, ""},
		{"a module still serving under a corrupt ledger keeps serving without a reason", world(corruptLedger),
			"prompt_system", iteronv1.PhaseActive, "", sysG2},
		{"a failed swap whose old generation serves: Active with the failure's reason", world(swapFailed(reasons.ProviderFailed, false)),
			"prompt_system", iteronv1.PhaseActive, reasons.ProviderFailed, sysG2},
		{"a failed swap kept for the same spec: Active with the failure's reason", world(failedSwapKept),
			"prompt_system", iteronv1.PhaseActive, reasons.ProviderFailed, sysG2},
		{"a source that does not verify says so while its old generation serves", world(verificationFails("prompt_system", reasons.VerificationFailed)),
			"prompt_system", iteronv1.PhaseActive, reasons.VerificationFailed, sysG2},
		{"a first activation that failed: Failed", world(waitsForDependency, func(s *activationScope) {
			ms := s.status.Modules["context_assembly"]
			ms.Reason, ms.Message = "", ""
			s.status.Modules["context_assembly"] = ms
			s.status.Failures = []hotswap.Failure{{Module: "context_assembly", GenerationName: ctxG1, Code: reasons.ActivationFailed, Message: "load failed"}}
		}), "context_assembly", iteronv1.PhaseFailed, reasons.ActivationFailed, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got *iteronv1.ModuleStatus
			all := moduleStatuses(tc.scope())
			for i := range all {
				if all[i].Module == tc.module {
					got = &all[i]
				}
			}
			if got == nil {
				t.Fatalf("no status for %s in %+v", tc.module, all)
			}
			if got.Phase != tc.phase || got.Reason != tc.reason || got.GenerationName != tc.gen {
				t.Fatalf("%s: phase %s reason %q generation %q; want %s %q %q (message %q)", tc.module, got.Phase, got.Reason, got.GenerationName, tc.phase, tc.reason, tc.gen, got.Message)
			}
		})
	}
}
