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
)

// TestRenewalKeepsServingAcrossTheProcessLifetimeBound runs a provider whose
// process may live 10 s (swap deadline 2 s, quiesce timeout 1 s) under
// sequential calls for 60 s: no call fails, the count never skips or
// repeats, and the ledger shows the renewals that made it possible.
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
		r, err := d.Invoke(context.Background(), Call{ID: fmt.Sprint("c", want), Input: []byte(`{"key":"k","add":1}`), Deadline: time.Now().Add(4 * time.Second)})
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
	renewals := h.transactionsOf("prompt_system") - 1 // less the first activation
	st, _ := h.c.Status(h.key.UID)
	t.Logf("60 s: %d calls, %d failed, %d renewals in the ledger (status says %d), %d processes", calls, failures, renewals, st.Generations[g.GenerationName].Renewals, len(pids))
	if failures != 0 {
		t.Fatalf("%d of %d calls failed; last: %v", failures, calls, lastErr)
	}
	if renewals < 5 || int(st.Generations[g.GenerationName].Renewals) != renewals {
		t.Fatalf("%d renewals in the ledger, %d in status; want at least 5, equal", renewals, st.Generations[g.GenerationName].Renewals)
	}
	for _, p := range h.ledgerPhases() {
		if strings.Contains(p, "blocked") {
			t.Fatalf("a renewal was blocked: %v", h.ledgerPhases())
		}
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
		r, err := d.Invoke(context.Background(), Call{ID: fmt.Sprint("call-", want), Input: []byte(`{"key":"k","add":1}`), Deadline: time.Now().Add(10 * time.Second)})
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
