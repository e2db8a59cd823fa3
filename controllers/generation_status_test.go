package controllers

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
)

// The Generation controller's two status writers, table-tested without an
// API server: mirrorGeneration (the coordinator's view of a generation) and
// markSuperseded (a generation a previous manager left live).

var (
	t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	t1 = t0.Add(2 * time.Second)
	t2 = t0.Add(9 * time.Second)
)

// liveGeneration is a Generation object whose status a previous mirror
// wrote: Active, serving, with pid 4102.
func liveGeneration() *iteronv1.Generation {
	g := generationObject(sysG2, "prompt_system", 2, iteronv1.PhaseActive, iteronv1.StepCommitted)
	g.Generation = 3 // its metadata.generation (the spec is immutable, but labels and annotations count)
	g.Status.Pid = 4102
	g.Status.ProcessStartedAt = &metav1.Time{Time: t0}
	g.Status.StartedAt, g.Status.ActivatedAt = &metav1.Time{Time: t0}, &metav1.Time{Time: t1}
	g.Status.Ledger = &iteronv1.LedgerPosition{TransactionID: "tx-2", LastSequence: 9, LastRecordSHA256: "sha256:r9"}
	for _, c := range []metav1.Condition{
		{Type: iteronv1.ConditionReady, Status: metav1.ConditionTrue, Reason: iteronv1.ReasonSucceeded, Message: "serving", ObservedGeneration: 3},
		{Type: iteronv1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "Active", ObservedGeneration: 3},
		{Type: iteronv1.ConditionStalled, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "not stalled", ObservedGeneration: 3},
	} {
		meta.SetStatusCondition(&g.Status.Conditions, c)
	}
	return &g
}

// freshGeneration is a Generation object the coordinator has just taken
// up: no status yet.
func freshGeneration() *iteronv1.Generation {
	g := generationObject(sysG3, "prompt_system", 3, "", "")
	g.Generation = 1
	return &g
}

// coordinatorSays is a coordinator generation status at a phase and step.
func coordinatorSays(phase iteronv1.ModulePhase, step iteronv1.GenerationStep, edits ...func(*hotswap.GenerationStatus)) hotswap.GenerationStatus {
	gs := hotswap.GenerationStatus{Name: sysG3, Module: "prompt_system", Lineage: 3, Attempt: 1, Phase: phase, Step: step,
		StartedAt: t0, TransactionID: "tx-3", LastSequence: 14, LastRecordSHA256: "sha256:r14"}
	for _, e := range edits {
		e(&gs)
	}
	return gs
}

type generationConditions struct {
	ready, reconciling, stalled wantCondition
}

func checkGenerationConditions(t *testing.T, g *iteronv1.Generation, want generationConditions) {
	t.Helper()
	for typ, w := range map[string]wantCondition{
		iteronv1.ConditionReady: want.ready, iteronv1.ConditionReconciling: want.reconciling, iteronv1.ConditionStalled: want.stalled,
	} {
		c := meta.FindStatusCondition(g.Status.Conditions, typ)
		if c == nil {
			t.Errorf("no %s condition in %+v", typ, g.Status.Conditions)
			continue
		}
		checkCondition(t, *c, w)
		if c.ObservedGeneration != g.Generation {
			t.Errorf("%s has observedGeneration %d; want the object's generation %d", typ, c.ObservedGeneration, g.Generation)
		}
	}
	if g.Status.ObservedGeneration != g.Generation {
		t.Errorf("status.observedGeneration %d; want %d", g.Status.ObservedGeneration, g.Generation)
	}
	if n := len(g.Status.Conditions); n != 3 {
		t.Errorf("%d conditions; want Ready, Reconciling and Stalled only: %+v", n, g.Status.Conditions)
	}
}

var (
	notStalledGen     = wantCondition{metav1.ConditionFalse, iteronv1.ReasonSucceeded, []string{"not stalled"}}
	notReconcilingGen = func(phase string) wantCondition {
		return wantCondition{metav1.ConditionFalse, iteronv1.ReasonSucceeded, []string{phase}}
	}
)

func TestMirrorGenerationWritesWhatTheCoordinatorKnows(t *testing.T) {
	long := strings.Repeat("é", 700) // 1400 bytes, two per rune
	stderr := "x" + strings.Repeat("ü", 1500) + "the provider's last words\n"
	cases := []struct {
		name  string
		start func() *iteronv1.Generation
		gs    hotswap.GenerationStatus
		phase iteronv1.ModulePhase
		step  iteronv1.GenerationStep
		conds generationConditions
		check func(t *testing.T, g *iteronv1.Generation)
	}{
		{name: "an Active generation at committed is Ready, neither Reconciling nor Stalled", start: freshGeneration,
			gs: coordinatorSays(iteronv1.PhaseActive, iteronv1.StepCommitted, func(gs *hotswap.GenerationStatus) {
				gs.Pid, gs.ProcessStartedAt, gs.ActivatedAt, gs.StateSHA256 = 4203, t1, t1, "sha256:s3"
			}),
			phase: iteronv1.PhaseActive, step: iteronv1.StepCommitted,
			conds: generationConditions{wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, []string{"serving"}}, notReconcilingGen("Active"), notStalledGen},
			check: func(t *testing.T, g *iteronv1.Generation) {
				s := g.Status
				if s.Pid != 4203 || s.ProcessStartedAt == nil || !s.ProcessStartedAt.Time.Equal(t1) || s.StateSHA256 != "sha256:s3" {
					t.Errorf("process: pid %d started %v state %q", s.Pid, s.ProcessStartedAt, s.StateSHA256)
				}
				if s.StartedAt == nil || !s.StartedAt.Time.Equal(t0) || s.ActivatedAt == nil || !s.ActivatedAt.Time.Equal(t1) || s.DrainedAt != nil {
					t.Errorf("timestamps: started %v activated %v drained %v; want %v, %v and none", s.StartedAt, s.ActivatedAt, s.DrainedAt, t0, t1)
				}
				if s.Ledger == nil || *s.Ledger != (iteronv1.LedgerPosition{TransactionID: "tx-3", LastSequence: 14, LastRecordSHA256: "sha256:r14"}) {
					t.Errorf("ledger position %+v", s.Ledger)
				}
			}},
		{name: "an Active generation whose manifest asks for host fallback says it is treated as fail_closed",
			start: func() *iteronv1.Generation {
				g := freshGeneration()
				g.Spec.FailurePolicy = "request_host_fallback"
				return g
			},
			gs:    coordinatorSays(iteronv1.PhaseActive, iteronv1.StepCommitted, func(gs *hotswap.GenerationStatus) { gs.Pid = 4203 }),
			phase: iteronv1.PhaseActive, step: iteronv1.StepCommitted,
			conds: generationConditions{wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, []string{"failure_policy request_host_fallback is treated as fail_closed"}},
				notReconcilingGen("Active"), notStalledGen}},
		{name: "a generation Preparing at migrate is Reconciling at that step and not Ready", start: freshGeneration,
			gs:    coordinatorSays(iteronv1.PhasePreparing, iteronv1.StepMigrate, func(gs *hotswap.GenerationStatus) { gs.Pid = 4203 }),
			phase: iteronv1.PhasePreparing, step: iteronv1.StepMigrate,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonProgressing, []string{"Preparing at migrate"}},
				wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"Preparing at migrate"}}, notStalledGen}},
		{name: "a generation Preparing that waits for the ledger says why in Ready", start: freshGeneration,
			gs: coordinatorSays(iteronv1.PhasePreparing, iteronv1.StepVerify, func(gs *hotswap.GenerationStatus) {
				gs.Reason, gs.Message = reasons.LedgerUnwritable, "waits for the ledger to accept appends"
			}),
			phase: iteronv1.PhasePreparing, step: iteronv1.StepVerify,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonLedgerUnwritable, []string{"waits for the ledger"}},
				wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"Preparing at verify"}}, notStalledGen}},
		{name: "a generation Draining is Reconciling at drain", start: liveGeneration,
			gs:    coordinatorSays(iteronv1.PhaseDraining, iteronv1.StepDrain, func(gs *hotswap.GenerationStatus) { gs.Pid = 4102 }),
			phase: iteronv1.PhaseDraining, step: iteronv1.StepDrain,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonProgressing, []string{"Draining at drain"}},
				wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, []string{"Draining at drain"}}, notStalledGen}},
		{name: "an Active generation that failed is Stalled with its reason, and no longer Ready", start: liveGeneration,
			gs: coordinatorSays(iteronv1.PhaseFailed, iteronv1.StepRolledBack, func(gs *hotswap.GenerationStatus) {
				gs.Reason, gs.Message, gs.LastPid = reasons.ProviderFailed, "generation 3 failed at migrate: the provider exited with status 2", 4203
			}),
			phase: iteronv1.PhaseFailed, step: iteronv1.StepRolledBack,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonProviderFailed, []string{"failed at migrate"}},
				notReconcilingGen("Failed"), wantCondition{metav1.ConditionTrue, iteronv1.ReasonProviderFailed, []string{"failed at migrate"}}},
			check: func(t *testing.T, g *iteronv1.Generation) {
				if g.Status.Pid != 0 || g.Status.Reason != reasons.ProviderFailed {
					t.Errorf("pid %d reason %q; want no pid and provider_failed", g.Status.Pid, g.Status.Reason)
				}
			}},
		{name: "a reason outside the table never leaves a condition without a reason", start: freshGeneration,
			gs: coordinatorSays(iteronv1.PhaseFailed, iteronv1.StepShadowLoad, func(gs *hotswap.GenerationStatus) {
				gs.Reason, gs.Message = "something_new", "a reason this manager does not know"
			}),
			phase: iteronv1.PhaseFailed, step: iteronv1.StepShadowLoad,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonProgressing, []string{"does not know"}},
				notReconcilingGen("Failed"), wantCondition{metav1.ConditionTrue, iteronv1.ReasonProgressing, nil}}},
		{name: "an Inactive generation after its drain has no pid and keeps its timestamps", start: liveGeneration,
			gs: coordinatorSays(iteronv1.PhaseInactive, iteronv1.StepDrain, func(gs *hotswap.GenerationStatus) {
				gs.ActivatedAt, gs.DrainedAt, gs.LastPid = t1, t2, 4102
			}),
			phase: iteronv1.PhaseInactive, step: iteronv1.StepDrain,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonProgressing, []string{"Inactive at drain"}},
				notReconcilingGen("Inactive"), notStalledGen},
			check: func(t *testing.T, g *iteronv1.Generation) {
				s := g.Status
				if s.Pid != 0 || s.DrainedAt == nil || !s.DrainedAt.Time.Equal(t2) || s.ActivatedAt == nil || !s.ActivatedAt.Time.Equal(t1) {
					t.Errorf("pid %d activated %v drained %v; want no pid, %v, %v", s.Pid, s.ActivatedAt, s.DrainedAt, t1, t2)
				}
				if s.ProcessStartedAt == nil || !s.ProcessStartedAt.Time.Equal(t0) {
					t.Errorf("processStartedAt %v; want the last process's start %v kept", s.ProcessStartedAt, t0)
				}
			}},
		{name: "an Inactive generation with a reason says it in Ready without stalling", start: liveGeneration,
			gs: coordinatorSays(iteronv1.PhaseInactive, iteronv1.StepDrain, func(gs *hotswap.GenerationStatus) {
				gs.Reason, gs.Message = reasons.CleanupFailed, "the old process did not stop within 5s and was killed"
			}),
			phase: iteronv1.PhaseInactive, step: iteronv1.StepDrain,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonCleanupFailed, []string{"was killed"}},
				notReconcilingGen("Inactive"), notStalledGen}},
		{name: "a generation relaunched after a restart reports its receipts incomplete, and its checkpoint", start: liveGeneration,
			gs: coordinatorSays(iteronv1.PhaseActive, iteronv1.StepCommitted, func(gs *hotswap.GenerationStatus) {
				gs.Pid, gs.Renewals = 4300, 2
				gs.Receipts = hotswap.ReceiptCounts{Total: 3, Irreversible: 1, Truncated: true, IncompleteReason: "the manager restarted at 2026-12-01T10:00:09Z"}
				gs.LastCheckpoint = &hotswap.CheckpointInfo{StateSHA256: "sha256:c1", At: t2}
			}),
			phase: iteronv1.PhaseActive, step: iteronv1.StepCommitted,
			conds: generationConditions{wantCondition{metav1.ConditionTrue, iteronv1.ReasonSucceeded, nil}, notReconcilingGen("Active"), notStalledGen},
			check: func(t *testing.T, g *iteronv1.Generation) {
				s := g.Status
				if s.Receipts == nil || *s.Receipts != (iteronv1.ReceiptSummary{Total: 3, Irreversible: 1, Truncated: true, IncompleteReason: "the manager restarted at 2026-12-01T10:00:09Z"}) {
					t.Errorf("receipts %+v", s.Receipts)
				}
				if s.LastCheckpoint == nil || s.LastCheckpoint.StateSHA256 != "sha256:c1" || !s.LastCheckpoint.At.Time.Equal(t2) || s.Renewals != 2 || s.Pid != 4300 {
					t.Errorf("checkpoint %+v renewals %d pid %d", s.LastCheckpoint, s.Renewals, s.Pid)
				}
			}},
		{name: "a long message is cut to 1 KiB at a rune boundary", start: freshGeneration,
			gs: coordinatorSays(iteronv1.PhaseFailed, iteronv1.StepReadiness, func(gs *hotswap.GenerationStatus) {
				gs.Reason, gs.Message = reasons.ProviderFailed, long
			}),
			phase: iteronv1.PhaseFailed, step: iteronv1.StepReadiness,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonProviderFailed, []string{"é…"}},
				notReconcilingGen("Failed"), wantCondition{metav1.ConditionTrue, iteronv1.ReasonProviderFailed, nil}},
			check: func(t *testing.T, g *iteronv1.Generation) {
				if m := g.Status.Message; len(m) > iteronv1.MaxMessageBytes || !utf8.ValidString(m) || !strings.HasSuffix(m, "…") {
					t.Errorf("message of %d bytes (valid UTF-8 %v) ends %q", len(m), utf8.ValidString(m), m[max(0, len(m)-8):])
				}
			}},
		{name: "a long stderr keeps its last 2 KiB from a rune boundary", start: freshGeneration,
			gs: coordinatorSays(iteronv1.PhaseFailed, iteronv1.StepShadowLoad, func(gs *hotswap.GenerationStatus) {
				gs.Reason, gs.Message, gs.StderrTail, gs.StderrDropped = reasons.ActivationFailed, "load failed", stderr, 70000
			}),
			phase: iteronv1.PhaseFailed, step: iteronv1.StepShadowLoad,
			conds: generationConditions{wantCondition{metav1.ConditionFalse, iteronv1.ReasonActivationFailed, nil},
				notReconcilingGen("Failed"), wantCondition{metav1.ConditionTrue, iteronv1.ReasonActivationFailed, nil}},
			check: func(t *testing.T, g *iteronv1.Generation) {
				s := g.Status
				if len(s.StderrTail) > 2048 || len(s.StderrTail) < 2046 || !utf8.ValidString(s.StderrTail) || !strings.HasSuffix(s.StderrTail, "the provider's last words\n") || s.StderrDroppedBytes != 70000 {
					t.Errorf("stderr tail of %d bytes (valid UTF-8 %v), dropped %d", len(s.StderrTail), utf8.ValidString(s.StderrTail), s.StderrDroppedBytes)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.start()
			mirrorGeneration(g, tc.gs)
			if g.Status.Phase != tc.phase || g.Status.Step != tc.step {
				t.Errorf("phase %s step %s; want %s %s", g.Status.Phase, g.Status.Step, tc.phase, tc.step)
			}
			checkGenerationConditions(t, g, tc.conds)
			if tc.check != nil {
				tc.check(t, g)
			}
		})
	}
}

func TestMarkSupersededEndsAGenerationAPreviousManagerLeftLive(t *testing.T) {
	inactive := generationConditions{
		ready:       wantCondition{metav1.ConditionFalse, iteronv1.ReasonSucceeded, []string{"its process ended with the manager that ran it"}},
		reconciling: notReconcilingGen("Inactive"),
		stalled:     notStalledGen,
	}
	cases := []struct {
		name      string
		start     func() *iteronv1.Generation
		successor string
		message   string
		drainedAt *time.Time // nil: now
		step      iteronv1.GenerationStep
	}{
		{name: "an Active generation the ledger has replaced is Inactive and names the successor", start: liveGeneration,
			successor: sysG3, message: "the ledger's last committed generation of the module is " + sysG3, step: iteronv1.StepCommitted},
		{name: "without a successor it says the module no longer runs", start: liveGeneration,
			message: "the module no longer runs", step: iteronv1.StepCommitted},
		{name: "a generation left mid-swap keeps the step it stopped at",
			start: func() *iteronv1.Generation {
				g := liveGeneration()
				g.Status.Phase, g.Status.Step = iteronv1.PhasePreparing, iteronv1.StepMigrate
				return g
			},
			successor: sysG2, message: "is " + sysG2, step: iteronv1.StepMigrate},
		{name: "a drain time already recorded is kept",
			start: func() *iteronv1.Generation {
				g := liveGeneration()
				g.Status.Phase, g.Status.Step, g.Status.DrainedAt = iteronv1.PhaseDraining, iteronv1.StepDrain, &metav1.Time{Time: t2}
				return g
			},
			successor: sysG3, message: sysG3, drainedAt: &t2, step: iteronv1.StepDrain},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.start()
			before := time.Now().Add(-time.Second)
			markSuperseded(g, tc.successor)
			s := g.Status
			if s.Phase != iteronv1.PhaseInactive || s.Pid != 0 || s.Step != tc.step {
				t.Errorf("phase %s pid %d step %s; want Inactive, no pid, step %s", s.Phase, s.Pid, s.Step, tc.step)
			}
			if !strings.Contains(s.Message, tc.message) {
				t.Errorf("message %q does not say %q", s.Message, tc.message)
			}
			switch {
			case s.DrainedAt == nil:
				t.Error("no drainedAt")
			case tc.drainedAt != nil && !s.DrainedAt.Time.Equal(*tc.drainedAt):
				t.Errorf("drainedAt %v; want the recorded %v kept", s.DrainedAt, *tc.drainedAt)
			case tc.drainedAt == nil && s.DrainedAt.Time.Before(before):
				t.Errorf("drainedAt %v; want now", s.DrainedAt)
			}
			checkGenerationConditions(t, g, inactive)
		})
	}
}
