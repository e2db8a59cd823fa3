package hotswap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// disposeLog records the disposes of the resources a test adds to a scope.
type disposeLog struct {
	mu    sync.Mutex
	order []string
}

func (l *disposeLog) dispose(id string, err error) effects.DisposeFunc {
	return func(context.Context) error {
		l.mu.Lock()
		l.order = append(l.order, id)
		l.mu.Unlock()
		return err
	}
}

func (l *disposeLog) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// scopeOf is the EffectScope of the generation the module routes to.
func (h *harness) scopeOf(module string) *effects.EffectScope {
	h.t.Helper()
	d, ok := h.c.Dispatcher(h.key.Namespace, h.key.Name, module)
	if !ok {
		h.t.Fatalf("no dispatcher for %s", module)
	}
	r := d.Route()
	if r == nil || r.Scope == nil {
		h.t.Fatalf("module %s routes to no scope: %+v", module, r)
	}
	return r.Scope
}

// resourceIDs are the IDs of a generation's resources, in registration order.
func resourceIDs(rs []effects.Resource) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// drainRecordReason is the reason of the module's last drain record.
func (h *harness) drainRecordReason(module string) string {
	h.t.Helper()
	dir, err := ledger.ActivationDir(h.stateDir, h.key.UID)
	if err != nil {
		h.t.Fatal(err)
	}
	reason := ""
	if _, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		if r.Module == module && r.Phase == ledger.PhaseDrain {
			reason = ""
			if r.Reason != nil {
				reason = *r.Reason
			}
		}
		return nil
	}); err != nil {
		h.t.Fatal(err)
	}
	return reason
}

func TestARunningGenerationsScopeListsEveryResourceAndItsStream(t *testing.T) {
	h := newHarness(t)
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	h.apply(SwapPolicy{}, v1)
	st := h.settle()
	gs := st.Generations[v1.GenerationName]
	if got, want := resourceIDs(gs.Resources), []string{"process", "route", "crash-watch"}; !slices.Equal(got, want) {
		t.Fatalf("resources of the active generation: %v, want %v", got, want)
	}

	// A call's stream binds to the generation that runs it (the gateway
	// does this through Route.Scope when the run starts); while it is open
	// the scope lists it, once it ends it is released.
	d, _ := h.c.Dispatcher(h.key.Namespace, h.key.Name, "prompt_system")
	streamDone := make(chan struct{})
	var bound *effects.EffectScope
	res, err := d.Invoke(context.Background(), dispatch.Call{ID: "watch-1", Input: protocol.MustPayload(`{"key":"a","add":1}`), Deadline: time.Now().Add(10 * time.Second),
		OnStart: func(r dispatch.Route) {
			bound = r.Scope
			if err := r.Scope.TrackWork(context.Background(), "stream watch-1", func() {}, streamDone); err != nil {
				t.Errorf("bind the stream: %v", err)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	st = h.settle()
	gs = st.Generations[v1.GenerationName]
	fmt.Printf("scope of %s (served %s, pid %d), in registration order:\n", gs.Name, res.Name, gs.Pid)
	for i, r := range gs.Resources {
		fmt.Printf("  %d. %s\n", i+1, r)
	}
	if got, want := resourceIDs(gs.Resources), []string{"process", "route", "crash-watch", "stream watch-1"}; !slices.Equal(got, want) {
		t.Fatalf("resources with a stream open: %v, want %v", got, want)
	}
	// The counter's runs are reversible: counted, no receipt each.
	if r := gs.Receipts; r.ReversibleRuns != 1 || r.Total != 0 {
		t.Fatalf("receipts after one reversible run: %+v; want it counted, not recorded", r)
	}
	close(streamDone)
	if !bound.Release("stream watch-1") {
		t.Fatal("the ended stream was no longer tracked")
	}
	if got := resourceIDs(h.c.mustStatus(t, h.key.UID).Generations[v1.GenerationName].Resources); slices.Contains(got, "stream watch-1") {
		t.Fatalf("the ended stream is still listed: %v", got)
	}

	// After a swap the old generation holds nothing, the new one the same
	// kinds of resources.
	pid := gs.Pid
	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, v2)
	st = h.settle()
	if old := st.Generations[v1.GenerationName]; len(old.Resources) != 0 || old.Phase != iteronv1.PhaseInactive {
		t.Fatalf("old generation after the swap: phase %s, resources %v; want Inactive holding nothing", old.Phase, old.Resources)
	}
	if got, want := resourceIDs(st.Generations[v2.GenerationName].Resources), []string{"process", "route", "crash-watch"}; !slices.Equal(got, want) {
		t.Fatalf("resources of the new generation: %v, want %v", got, want)
	}
	if !processGone(pid) {
		t.Fatalf("the old process (pid %d) outlived its scope", pid)
	}
}

func (c *Coordinator) mustStatus(t *testing.T, uid string) ActivationStatus {
	t.Helper()
	st, ok := c.Status(uid)
	if !ok {
		t.Fatalf("no status for %s", uid)
	}
	return st
}

func TestACleanupFailingInTheMiddleStillDisposesTheRestAndFailsTheGeneration(t *testing.T) {
	h := newHarness(t)
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	h.apply(SwapPolicy{}, v1)
	st := h.settle()
	oldPid := st.Modules["prompt_system"].Pid
	h.count("prompt_system", "a", 2)

	scope := h.scopeOf("prompt_system")
	var log disposeLog
	for _, r := range []struct {
		id  string
		err error
	}{
		{"stream first", nil},
		{"socket /run/iteron/probe.sock", errors.New("close unix socket: input/output error")},
		{"stream last", nil},
	} {
		if err := scope.Track(context.Background(), r.id, effects.Reversible, log.dispose(r.id, r.err)); err != nil {
			t.Fatal(err)
		}
	}

	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, v2)
	st = h.settle()

	if got, want := log.got(), []string{"stream last", "socket /run/iteron/probe.sock", "stream first"}; !slices.Equal(got, want) {
		t.Fatalf("disposed %v, want %v (reverse order, none skipped)", got, want)
	}
	if !processGone(oldPid) {
		t.Fatalf("the process (pid %d), disposed after the failing resource, is still there", oldPid)
	}
	old := st.Generations[v1.GenerationName]
	fmt.Printf("old generation %s after the swap: phase=%s reason=%s\n  message: %s\n  resources left: %v\n  ledger drain record: %s\n",
		old.Name, old.Phase, old.Reason, old.Message, old.Resources, h.drainRecordReason("prompt_system"))
	if old.Phase != iteronv1.PhaseFailed || old.Reason != reasons.CleanupFailed || !strings.Contains(old.Message, "socket /run/iteron/probe.sock: close unix socket: input/output error") {
		t.Fatalf("old generation: phase %s reason %s message %q; want Failed, cleanup_failed naming the socket", old.Phase, old.Reason, old.Message)
	}
	if len(old.Resources) != 0 {
		t.Fatalf("old generation still holds %v", old.Resources)
	}
	if reason := h.drainRecordReason("prompt_system"); !strings.HasPrefix(reason, "cleanup_failed: ") || !strings.Contains(reason, "socket /run/iteron/probe.sock") {
		t.Fatalf("drain record reason %q; want cleanup_failed naming the socket", reason)
	}
	// The swap itself committed: the new generation serves, with the state.
	if ms := st.Modules["prompt_system"]; ms.Active != v2.GenerationName || !ms.Serving {
		t.Fatalf("module after the swap: %+v", ms)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(3) {
		t.Fatalf("after the swap: %v; want a=3", out)
	}
}

func TestADrainThatOverrunsItsDeadlineCancelsTheRestAndRecordsAReceipt(t *testing.T) {
	h := newHarness(t)
	short := func(f *verifier.LaunchPlanFields) { f.CancellationDeadline = 300 * time.Millisecond }
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}), short)
	h.apply(SwapPolicy{}, v1)
	h.settle()

	// A stream bound to v1 that goes on until it is cancelled (a Watch whose
	// client never leaves), and one that ends within the deadline.
	scope := h.scopeOf("prompt_system")
	stuck, ends := make(chan struct{}), make(chan struct{})
	var cancelled sync.Once
	cancelledAt := make(chan time.Time, 1)
	if err := scope.TrackWork(context.Background(), "stream stuck-watch", func() {
		cancelled.Do(func() { cancelledAt <- time.Now(); close(stuck) })
	}, stuck); err != nil {
		t.Fatal(err)
	}
	if err := scope.TrackWork(context.Background(), "stream quick", func() { t.Error("the stream that ended was cancelled") }, ends); err != nil {
		t.Fatal(err)
	}
	close(ends)

	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}), short)
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, v2)
	st := h.settle()
	select {
	case <-cancelledAt:
	default:
		t.Fatal("the stream that overran the drain deadline was never cancelled")
	}
	rs := h.receipts().Receipts(v1.GenerationName)
	var timeout *effects.Receipt
	for i := range rs {
		if rs[i].Kind == effects.ReceiptDrainTimeout {
			timeout = &rs[i]
		}
	}
	if timeout == nil {
		t.Fatalf("no drain_timeout receipt on %s: %+v", v1.GenerationName, rs)
	}
	fmt.Printf("drain-timeout receipt: id=%s owner=%s generation=%s component=%s kind=%s class=%s started=%s finished=%s compensation=%s\n  detail: %s\n",
		timeout.ID, timeout.Owner, timeout.Generation, timeout.Component, timeout.Kind, timeout.Class,
		timeout.StartedAt.UTC().Format(time.RFC3339Nano), timeout.FinishedAt.UTC().Format(time.RFC3339Nano), timeout.Compensation, timeout.Detail)
	if timeout.ID != "drain-timeout:"+v1.GenerationName+":stream stuck-watch" || timeout.Class != effects.Cancelable ||
		timeout.Owner != "default/stack" || timeout.Component != "prompt_system" || timeout.Compensation != effects.CompensationNone ||
		!timeout.FinishedAt.After(timeout.StartedAt) || !strings.Contains(timeout.Detail, "300ms") {
		t.Fatalf("drain_timeout receipt %+v", *timeout)
	}
	if n := len(rs); n != 1 {
		t.Fatalf("%d receipts on %s, want 1 (the stream that ended in time leaves none): %+v", n, v1.GenerationName, rs)
	}
	// A drain timeout is evidence, not a cleanup failure: the swap commits
	// and the old generation is Inactive.
	if old := st.Generations[v1.GenerationName]; old.Phase != iteronv1.PhaseInactive || old.Receipts.Total != 1 {
		t.Fatalf("old generation: phase %s receipts %+v", old.Phase, old.Receipts)
	}
}

func TestGenerationsLeaveNoGoroutineBehind(t *testing.T) {
	before := goleak.IgnoreCurrent()
	h := newHarness(t)
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	h.apply(SwapPolicy{}, v1)
	h.settle()
	h.count("prompt_system", "a", 1)
	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, v2)
	h.settle()
	h.count("prompt_system", "a", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// The executor's permanent spawner and reaper goroutines are the test
	// binary's, started before (or by) the first launch.
	if err := goleak.Find(before,
		goleak.IgnoreTopFunction("iteron.dev/operator/internal/spawn.(*spawnerThread).loop"),
		goleak.IgnoreTopFunction("iteron.dev/operator/internal/spawn.reaperLoop")); err != nil {
		t.Fatal(err)
	}
}

// receipts is the harness activation's receipt store.
func (h *harness) receipts() *effects.ReceiptStore {
	h.t.Helper()
	a, err := h.c.runtime(h.key, false)
	if err != nil || a == nil {
		h.t.Fatalf("no runtime for %s: %v", h.key.UID, err)
	}
	return a.receipts
}

// lastBlockedReason is the reason of the module's last blocked record.
func (h *harness) lastBlockedReason(module string) string {
	h.t.Helper()
	dir, err := ledger.ActivationDir(h.stateDir, h.key.UID)
	if err != nil {
		h.t.Fatal(err)
	}
	reason := ""
	if _, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		if r.Module == module && r.Outcome == ledger.OutcomeBlocked && r.Reason != nil {
			reason = *r.Reason
		}
		return nil
	}); err != nil {
		h.t.Fatal(err)
	}
	return reason
}

func TestARollbackWithIncompleteEvidenceSaysSoAndNeverClaimsIrreversibleEffectsRolledBack(t *testing.T) {
	for _, tc := range []struct {
		name       string
		incomplete bool
	}{
		{"complete evidence: the irreversible effect is named as standing", false},
		{"incomplete evidence: the rollback is not claimed clean", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, v1, _ := swapFixture(t)
			var newGen string
			bad := failAfterSwitch(t, h, "atomic_switch", func() {
				// The new generation served after the switch: an
				// irreversible effect, and (in one case) receipts lost.
				st, _ := h.c.Status(h.key.UID)
				newGen = st.Modules["prompt_system"].Active
				if err := h.receipts().Record(effects.Receipt{ID: "run-sent-mail", Generation: newGen, Component: "prompt_system",
					Kind: effects.ReceiptRun, Class: effects.Irreversible, StartedAt: time.Now(), FinishedAt: time.Now(), Detail: "completed"}); err != nil {
					t.Error(err)
				}
				if tc.incomplete {
					h.receipts().MarkIncomplete(newGen, "receipts recorded before the last unclean stop may be lost")
				}
			})
			st := h.settle()
			if newGen != bad.GenerationName {
				t.Fatalf("the generation serving after the switch was %q, want %s", newGen, bad.GenerationName)
			}
			if ms := st.Modules["prompt_system"]; ms.Active != v1.GenerationName {
				t.Fatalf("after the rollback the module serves %s", ms.Active)
			}
			gs := st.Generations[bad.GenerationName]
			reason := h.lastBlockedReason("prompt_system")
			fmt.Printf("%s:\n  ledger blocked reason: %s\n  Generation %s: %s %s: %s\n", tc.name, reason, gs.Name, gs.Phase, gs.Reason, gs.Message)
			for _, where := range []string{reason, gs.Message} {
				if !strings.Contains(where, "1 irreversible effect(s) of "+bad.GenerationName+" stand and are not rolled back") {
					t.Fatalf("%q does not name the irreversible effect as standing", where)
				}
				if got := strings.Contains(where, "evidence incomplete (receipts recorded before the last unclean stop may be lost): this rollback is not claimed clean"); got != tc.incomplete {
					t.Fatalf("%q: says the evidence is incomplete = %v, want %v", where, got, tc.incomplete)
				}
			}
			for _, r := range h.receipts().Receipts(bad.GenerationName) {
				if r.Compensation == effects.CompensationRolledBack {
					t.Fatalf("receipt %s reported rolled back", r.ID)
				}
			}
			if err := h.receipts().SetCompensation(bad.GenerationName, "run-sent-mail", effects.CompensationRolledBack); !errors.Is(err, effects.ErrIrreversible) {
				t.Fatalf("marking the irreversible effect rolled back: %v, want ErrIrreversible", err)
			}
		})
	}
}

func TestRealRunsLeaveTheirReceiptsAQuiesceCancelAndADrainTimeout(t *testing.T) {
	h := newHarness(t)
	short := func(f *verifier.LaunchPlanFields) { f.CancellationDeadline = 300 * time.Millisecond }
	// The old provider serves normally but hangs when told to stop.
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, ImplementationID: "faulty-stop",
		Argv: []string{"--fault", "hang", "--at", "stop"}}), short)
	h.apply(SwapPolicy{}, v1)
	st := h.settle()
	oldPid := st.Modules["prompt_system"].Pid

	// A long run is in flight when the swap quiesces: it is cancelled after
	// the quiesce timeout.
	d, _ := h.c.Dispatcher(h.key.Namespace, h.key.Name, "prompt_system")
	started := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		_, err := d.Invoke(context.Background(), dispatch.Call{ID: "long-run", Input: protocol.MustPayload(`{"key":"a","add":1,"sleep_ms":20000}`),
			Deadline: time.Now().Add(30 * time.Second), OnStart: func(dispatch.Route) { close(started) }})
		ended <- err
	}()
	<-started
	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}), short)
	h.apply(SwapPolicy{QuiesceTimeout: 200 * time.Millisecond}, v2)
	st = h.settle()
	if err := <-ended; err == nil {
		t.Fatal("the run cut by quiesce succeeded")
	}
	if ms := st.Modules["prompt_system"]; ms.Active != v2.GenerationName {
		t.Fatalf("module after the swap: %+v", ms)
	}
	if !processGone(oldPid) {
		t.Fatalf("the old process that hung at stop (pid %d) was not killed", oldPid)
	}
	byKind := map[effects.ReceiptKind]effects.Receipt{}
	for _, r := range h.receipts().Receipts(v1.GenerationName) {
		byKind[r.Kind] = r
		fmt.Printf("receipt of %s: id=%s kind=%s class=%s compensation=%s started=%s finished=%s\n  detail: %s\n", r.Generation, r.ID, r.Kind, r.Class, r.Compensation,
			r.StartedAt.UTC().Format(time.RFC3339Nano), r.FinishedAt.UTC().Format(time.RFC3339Nano), r.Detail)
	}
	if r, ok := byKind[effects.ReceiptQuiesceCancel]; !ok || r.ID != "quiesce-cancel-long-run" || r.Class != effects.Cancelable || !strings.Contains(r.Detail, "200ms quiesce timeout") {
		t.Fatalf("quiesce_cancel receipt %+v (found %v)", r, ok)
	}
	if r, ok := byKind[effects.ReceiptDrainTimeout]; !ok || r.ID != "drain-timeout" || !strings.Contains(r.Detail, "did not stop within its cancellation deadline (300ms)") {
		t.Fatalf("drain_timeout receipt %+v (found %v)", r, ok)
	}
	old := st.Generations[v1.GenerationName]
	if old.Phase != iteronv1.PhaseInactive || old.Reason != reasons.CleanupFailed || old.Receipts.Total != 2 {
		t.Fatalf("old generation: %s %s receipts %+v", old.Phase, old.Reason, old.Receipts)
	}
	if reason := h.drainRecordReason("prompt_system"); !strings.HasPrefix(reason, "cleanup_failed: ") || !strings.Contains(reason, "was killed") {
		t.Fatalf("drain record reason %q", reason)
	}
}
