package hotswap

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// TestRenewalKeepsServingAcrossTheProcessLifetimeBound runs a provider whose
// process may live 10 s (swap deadline 2 s, quiesce timeout 1 s) under
// sequential calls for 60 s: no call fails, the count never skips or
// repeats, and the ledger shows the renewals that made it possible. A call
// may wait up to 20 s: on a stalled machine a renewal can overrun its 2 s
// deadline and be rolled back (deadline_exceeded, the old process serving
// on); that is the one kind of blocked renewal the test accepts, and the
// calls must still not fail.
func TestRenewalKeepsServingAcrossTheProcessLifetimeBound(t *testing.T) {
	if testing.Short() {
		t.Skip("a 60-second soak")
	}
	h := newHarness(t)
	g := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, RuntimeDeadlineMs: 10_000}))
	h.applyWith(SwapPolicy{Deadline: 2 * time.Second, QuiesceTimeout: time.Second}, 0, g)
	h.settle()
	d, _ := h.c.Dispatcher(h.key.Namespace, h.key.Name, "prompt_system")

	start := time.Now()
	calls, failures := 0, 0
	var lastErr error
	pids := map[int]bool{}
	for want := 1; time.Since(start) < 60*time.Second; want++ {
		r, err := d.Invoke(context.Background(), dispatch.Call{ID: fmt.Sprint("c", want), Input: protocol.MustPayload(`{"key":"k","add":1}`), Deadline: time.Now().Add(20 * time.Second)})
		calls++
		if err != nil {
			failures++
			lastErr = err
			want--
			continue
		}
		var out struct{ Count int }
		if err := json.Unmarshal(r.Terminal.Body, &out); err != nil {
			t.Fatal(err)
		}
		if out.Count != want {
			t.Fatalf("call %d: count %d, want %d (state lost or doubled across a renewal)", calls, out.Count, want)
		}
		if st, ok := h.c.Status(h.key.UID); ok {
			pids[st.Modules["prompt_system"].Pid] = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	committed, overran := 0, 0
	dir, err := ledger.ActivationDir(h.stateDir, h.key.UID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		switch {
		case r.Phase == ledger.PhaseCommitted:
			committed++
		case r.Outcome == ledger.OutcomeBlocked && r.Reason != nil && strings.HasPrefix(*r.Reason, reasons.DeadlineExceeded+": "):
			overran++
		case r.Outcome == ledger.OutcomeBlocked:
			t.Errorf("a renewal was blocked at sequence %d (%s), not by its deadline", r.Sequence, r.Phase)
		}
		return nil
	}); err != nil {
		t.Fatalf("the ledger does not verify: %v", err)
	}
	renewals := committed - 1 // less the first activation
	st, _ := h.c.Status(h.key.UID)
	t.Logf("60 s: %d calls, %d failed, %d renewals committed in the ledger (status says %d), %d rolled back past their deadline, %d processes",
		calls, failures, renewals, st.Generations[g.GenerationName].Renewals, overran, len(pids))
	if failures != 0 {
		t.Fatalf("%d of %d calls failed; last: %v", failures, calls, lastErr)
	}
	if renewals < 5 || int(st.Generations[g.GenerationName].Renewals) != renewals {
		t.Fatalf("%d renewals committed in the ledger, %d in status; want at least 5, equal", renewals, st.Generations[g.GenerationName].Renewals)
	}
}

// TestRenewalKeepsServingWhenAProcessUsesUpItsStdin makes 30 000 sequential
// calls (about 14 MiB of start requests, against 8 MiB of stdin per
// process): no call fails, the count never skips or repeats, and the ledger
// shows the renewals that made it possible.
func TestRenewalKeepsServingWhenAProcessUsesUpItsStdin(t *testing.T) {
	if testing.Short() {
		t.Skip("30 000 calls")
	}
	h := newHarness(t)
	g := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.applyWith(SwapPolicy{Deadline: 5 * time.Second, QuiesceTimeout: time.Second}, 0, g)
	h.settle()
	d, _ := h.c.Dispatcher(h.key.Namespace, h.key.Name, "prompt_system")

	const calls = 30000
	pids := map[int]bool{}
	for want := 1; want <= calls; want++ {
		r, err := d.Invoke(context.Background(), dispatch.Call{ID: fmt.Sprint("call-", want), Input: protocol.MustPayload(`{"key":"k","add":1}`), Deadline: time.Now().Add(10 * time.Second)})
		if err != nil {
			t.Fatalf("call %d of %d: %v", want, calls, err)
		}
		var out struct{ Count int }
		if err := json.Unmarshal(r.Terminal.Body, &out); err != nil {
			t.Fatal(err)
		}
		if out.Count != want {
			t.Fatalf("call %d: count %d (state lost or doubled across a renewal)", want, out.Count)
		}
		if want%1000 == 0 {
			if st, ok := h.c.Status(h.key.UID); ok {
				pids[st.Modules["prompt_system"].Pid] = true
			}
		}
	}
	renewals := h.transactionsOf("prompt_system") - 1 // less the first activation
	st, _ := h.c.Status(h.key.UID)
	t.Logf("%d calls, 0 failed, %d renewals in the ledger (status says %d), %d processes seen", calls, renewals, st.Generations[g.GenerationName].Renewals, len(pids))
	if renewals < 2 || int(st.Generations[g.GenerationName].Renewals) != renewals {
		t.Fatalf("%d renewals in the ledger, %d in status; want at least 2, equal", renewals, st.Generations[g.GenerationName].Renewals)
	}
}

// committedRenewals counts the renewals of module committed in the ledger
// (every committed transaction but the first activation).
func (h *harness) committedRenewals(module string) int {
	h.t.Helper()
	n := -1
	for _, p := range h.ledgerPhases() {
		if p == module+":committed:committed" {
			n++
		}
	}
	return n
}

func TestAProcessWhoseLifetimeIsShorterThanTheSwapMarginIsNotRenewedOverAndOver(t *testing.T) {
	// runtime_deadline_ms 10 s under the default swap policy (deadline 30 s,
	// quiesce 10 s): a 40 s margin would make every process due for
	// renewal the moment it starts. The margin is capped at half the
	// lifetime, so for the first 5 s nothing is due.
	h := newHarness(t)
	g := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, RuntimeDeadlineMs: 10_000}))
	h.applyWith(SwapPolicy{Deadline: 30 * time.Second, QuiesceTimeout: 10 * time.Second}, 0, g)
	h.settle()
	time.Sleep(3 * time.Second)
	st := h.settle()
	if n := h.committedRenewals("prompt_system"); n != 0 || st.Generations[g.GenerationName].Renewals != 0 {
		t.Fatalf("%d renewals in the ledger (status %d) within 3 s of a 10 s lifetime; want none", n, st.Generations[g.GenerationName].Renewals)
	}
	d, _ := h.c.Dispatcher(h.key.Namespace, h.key.Name, "prompt_system")
	r, err := d.Invoke(context.Background(), dispatch.Call{ID: "c1", Input: protocol.MustPayload(`{"key":"k","add":1}`), Deadline: time.Now().Add(4 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Count int }
	if err := json.Unmarshal(r.Terminal.Body, &out); err != nil || out.Count != 1 {
		t.Fatalf("the call answered count %d (%v)", out.Count, err)
	}
}

func TestACallWithADeadlineLongerThanAnyProcessCanGiveRunsAfterOneRenewalAtMost(t *testing.T) {
	// A 20 s caller deadline against a 10 s process lifetime (margin 3 s):
	// no process can promise the call 20 s, and no renewal makes one that
	// can. A call gets at most what a freshly renewed process can give
	// (the lifetime less the margin and a tenth), and a process that has
	// not run anything yet takes the call whatever it asks: each call waits
	// for one renewal at most, never for an endless series of them.
	h := newHarness(t)
	g := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, RuntimeDeadlineMs: 10_000}))
	h.applyWith(SwapPolicy{Deadline: 2 * time.Second, QuiesceTimeout: time.Second}, 0, g)
	h.settle()
	d, _ := h.c.Dispatcher(h.key.Namespace, h.key.Name, "prompt_system")
	const calls = 5
	for i := 1; i <= calls; i++ {
		r, err := d.Invoke(context.Background(), dispatch.Call{ID: fmt.Sprint("c", i), Input: protocol.MustPayload(`{"key":"k","add":1}`), Deadline: time.Now().Add(20 * time.Second)})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		var out struct{ Count int }
		if err := json.Unmarshal(r.Terminal.Body, &out); err != nil || out.Count != i {
			t.Fatalf("call %d: count %d (%v)", i, out.Count, err)
		}
		time.Sleep(1200 * time.Millisecond) // past the tenth of the lifetime a fresh process has to spare
	}
	st := h.settle()
	n := h.committedRenewals("prompt_system")
	t.Logf("%d calls with a 20 s deadline on a 10 s process: %d renewals (status %d)", calls, n, st.Generations[g.GenerationName].Renewals)
	if n > calls || int(st.Generations[g.GenerationName].Renewals) != n {
		t.Fatalf("%d renewals in the ledger (status %d) for %d calls; want at most one per call, equal", n, st.Generations[g.GenerationName].Renewals, calls)
	}
}
