package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
)

// The load test's bounds: loadWorkers goroutines make loadCalls calls each
// while loadSwaps hot swaps alternate the counter between two
// implementations; loadLead is how many calls the workers may run ahead of
// the next swap's milestone, so that calls keep arriving while it runs.
// probeSleep is how long the probe call each swap's quiesce finds in flight
// holds the run slot.
const (
	loadWorkers = 8
	loadCalls   = 200
	loadSwaps   = 10
	loadLead    = 48
	probeSleep  = 200 * time.Millisecond
)

// quiesceProbe is what one swap's quiesce found in flight, and when.
type quiesceProbe struct {
	id string
	// oldLineage is the generation routed when the swap reached quiesce.
	oldLineage int64
	// pauseAt is when quiesce was about to pause dispatching (the probe
	// already running); quiescedAt and switchedAt are when the quiesce and
	// atomic_switch records were durable (zero if never).
	pauseAt, quiescedAt, switchedAt time.Time
	setupErr                        error
	// The probe's outcome, as its caller saw it.
	resp     *gatewayv1.InvokeResponse
	err      error
	returned chan struct{}
}

// The load alone would pass with quiesce's wait removed: a counter run
// takes microseconds, so none is in flight when a swap pauses, and none is
// left running when the old process is snapshotted. So each swap, at
// shadow_load (just before quiesce pauses the dispatcher), also makes a
// probe call that sleeps probeSleep, and goes on only once the probe runs:
// quiesce always finds a run in flight, and must wait for it (the probe
// finishing on the old generation with its terminal observation, before
// the quiesce record) rather than snapshot under it.
func TestNoCallIsLostOrDoubledAcrossConsecutiveSwapsUnderLoad(t *testing.T) {
	var (
		dmu          sync.Mutex
		dispatched   = map[string][]int64{}   // invocation → lineages that took it
		dispatchedAt = map[string]time.Time{} // invocation → when its run started
		probes       []*quiesceProbe
	)
	h := newHarness(t, func(_ *hotswap.Config, c *Config) {
		c.OnDispatch = func(d Dispatch) {
			dmu.Lock()
			dispatched[d.InvocationID] = append(dispatched[d.InvocationID], d.Route.Lineage)
			dispatchedAt[d.InvocationID] = d.At
			dmu.Unlock()
		}
	})
	impls := []artifacts.Implementation{
		counterImpl(t, module, "counter-v2-a"),
		counterImpl(t, module, "counter-v2-b", func(s *artifacts.Spec) { s.Version = catalog.Version{2, 0, 1} }),
	}
	a := newActivation("default", "load")
	first := h.deploy(a, impls[0], hotswap.SwapPolicy{})
	h.settle(a, first)
	disp, _ := h.coord.Dispatcher("default", "load", module)

	h.mu.Lock()
	h.afterPhase = func(_ hotswap.ActivationKey, _ string, phase string) {
		now := time.Now()
		dmu.Lock()
		n := len(probes)
		var cur *quiesceProbe
		if n > 0 {
			cur = probes[n-1]
		}
		dmu.Unlock()
		switch phase {
		case "shadow_load":
			pr := &quiesceProbe{id: fmt.Sprintf("probe-%d", n+1), returned: make(chan struct{})}
			if r := disp.Route(); r != nil {
				pr.oldLineage = r.Lineage
			}
			dmu.Lock()
			probes = append(probes, pr)
			dmu.Unlock()
			go func() {
				defer close(pr.returned)
				pr.resp, pr.err = h.invoke(nil, &gatewayv1.InvokeRequest{
					Namespace: "default", Activation: "load", Module: module, InvocationId: pr.id,
					InputJson: fmt.Sprintf(`{"key":"probe","add":1,"sleep_ms":%d}`, probeSleep.Milliseconds()),
				})
			}()
			// The dispatcher is not paused yet: the probe runs after the
			// calls queued before it. Quiesce must find it running.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Microsecond) {
				dmu.Lock()
				_, running := dispatchedAt[pr.id]
				dmu.Unlock()
				if running {
					break
				}
				if time.Now().After(deadline) {
					pr.setupErr = fmt.Errorf("the probe was not dispatched within 30s")
					break
				}
			}
			pr.pauseAt = time.Now()
		case "quiesce":
			if cur != nil {
				cur.quiescedAt = now
			}
		case "atomic_switch":
			if cur != nil {
				cur.switchedAt = now
			}
		}
	}
	h.mu.Unlock()

	const total = loadWorkers * loadCalls
	step := int64(total / (loadSwaps + 1))
	var completed, swapsDone atomic.Int64
	swapErr := make(chan error, 1)
	swapsFinished := make(chan struct{})
	go func() {
		defer close(swapsFinished)
		for k := int64(1); k <= loadSwaps; k++ {
			for completed.Load() < k*step {
				time.Sleep(time.Millisecond)
			}
			target := h.deploy(a, impls[k%2], hotswap.SwapPolicy{})
			if err := h.waitActive(a, target, 60*time.Second); err != nil {
				swapErr <- fmt.Errorf("swap %d: %w", k, err)
				return
			}
			swapsDone.Store(k)
		}
	}()

	type call struct {
		worker, seq int
		generation  int64
		count       int64
		err         error
	}
	calls := make([][]call, loadWorkers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range loadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range loadCalls {
				// Keep the calls interleaved with the swaps: run at most
				// loadLead calls past the next swap's milestone.
				for {
					done := swapsDone.Load()
					if done >= loadSwaps || completed.Load() < (done+1)*step+loadLead {
						break
					}
					select {
					case <-swapsFinished:
					case <-time.After(time.Millisecond):
						continue
					}
					break
				}
				id := fmt.Sprintf("load-%d-%d", w, j)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				resp, err := h.client.Invoke(ctx, &gatewayv1.InvokeRequest{
					Namespace: "default", Activation: "load", Module: module, InvocationId: id,
					InputJson: fmt.Sprintf(`{"key":"w%d","add":1}`, w),
				})
				cancel()
				c := call{worker: w, seq: j, err: err}
				if err == nil {
					c.generation = resp.Generation
					c.count = decodeCounter(t, resp.ObservationJson).Count
				}
				calls[w] = append(calls[w], c)
				completed.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	<-swapsFinished
	h.mu.Lock()
	h.afterPhase = nil
	h.mu.Unlock()
	for _, pr := range probes {
		<-pr.returned
	}

	// Each swap's quiesce: the run in flight when it paused (one run slot:
	// the last one dispatched before the pause, which must be the probe)
	// ended on the old generation with its terminal observation, and the
	// quiesce record waited for it; no other run started on the old
	// generation after the pause.
	var waited []string
	for i, pr := range probes {
		dmu.Lock()
		probeAt, probeOn := dispatchedAt[pr.id], dispatched[pr.id]
		var last string
		var onOld []string
		for id, at := range dispatchedAt {
			if at.Before(pr.pauseAt) && (last == "" || at.After(dispatchedAt[last])) {
				last = id
			}
			// The atomic_switch record comes after the dispatcher resumed
			// on the new generation: what the pause forbids is another run
			// on the old one.
			if !pr.switchedAt.IsZero() && at.After(pr.pauseAt) && slices.Contains(dispatched[id], pr.oldLineage) {
				onOld = append(onOld, id)
			}
		}
		dmu.Unlock()
		waited = append(waited, pr.quiescedAt.Sub(probeAt).Round(time.Millisecond).String())
		switch {
		case pr.setupErr != nil:
			t.Errorf("swap %d: %v", i+1, pr.setupErr)
		case last != pr.id:
			t.Errorf("swap %d: the run in flight when quiesce paused was %s, not the probe %s", i+1, last, pr.id)
		case pr.err != nil:
			t.Errorf("swap %d: the probe %s, running when quiesce paused generation %d, failed: %v", i+1, pr.id, pr.oldLineage, pr.err)
		case pr.resp.Generation != pr.oldLineage || len(probeOn) != 1 || probeOn[0] != pr.oldLineage:
			t.Errorf("swap %d: the probe ran on %v and answered from generation %d; want the old generation %d", i+1, probeOn, pr.resp.Generation, pr.oldLineage)
		case decodeCounter(t, pr.resp.ObservationJson).Count != int64(i+1):
			t.Errorf("swap %d: the probe's terminal observation %s; want count %d", i+1, pr.resp.ObservationJson, i+1)
		}
		if pr.quiescedAt.IsZero() || pr.quiescedAt.Sub(probeAt) < probeSleep {
			t.Errorf("swap %d: quiesce was recorded %v after the probe started (a run of %v): it did not wait for the run in flight", i+1, pr.quiescedAt.Sub(probeAt), probeSleep)
		}
		if len(onOld) != 0 {
			t.Errorf("swap %d: %v started on generation %d after quiesce paused it", i+1, onOld, pr.oldLineage)
		}
	}
	t.Logf("quiesce: %d swaps each paused with a run of %v in flight; quiesce recorded after it started: %v", len(probes), probeSleep, waited)
	select {
	case err := <-swapErr:
		t.Fatal(err)
	default:
	}
	if len(probes) < loadSwaps {
		t.Fatalf("%d quiesces seen for %d swaps", len(probes), loadSwaps)
	}

	failures := 0
	served := map[int64]int{}
	for w := range loadWorkers {
		for j, c := range calls[w] {
			id := fmt.Sprintf("load-%d-%d", w, j)
			if c.err != nil {
				failures++
				t.Errorf("call %s failed: %v", id, c.err)
				continue
			}
			dmu.Lock()
			took := dispatched[id]
			dmu.Unlock()
			if len(took) != 1 || took[0] != c.generation {
				t.Errorf("call %s: dispatched to generations %v, answered by %d; want exactly one, the one that answered", id, took, c.generation)
			}
			served[c.generation]++
			// Each worker counts its own key: call j sees exactly j+1, so no
			// call of the worker was lost or applied twice, swaps included.
			if c.count != int64(j+1) {
				t.Errorf("call %s: count %d, want %d", id, c.count, j+1)
			}
		}
	}
	final, resp := h.count(a, module, "w0", 0)
	lineages := slices.Sorted(mapKeys(served))
	t.Logf("load: %d calls by %d workers in %v, %d failed; %d swaps (%d → generation %d); served by generations %v (calls each: %v); counter total %d, want %d",
		total, loadWorkers, elapsed.Round(time.Millisecond), failures, swapsDone.Load(), first.Lineage, resp.Generation, lineages, counts(served, lineages), final.Total, total+len(probes))
	if failures != 0 {
		t.Fatalf("%d calls failed", failures)
	}
	if resp.Generation != 1+loadSwaps {
		t.Fatalf("the module ends on generation %d; want %d after %d swaps", resp.Generation, 1+loadSwaps, loadSwaps)
	}
	if final.Total != int64(total+len(probes)) {
		t.Fatalf("counter total %d after %d calls and %d probes across %d swaps: state lost or doubled", final.Total, total, len(probes), loadSwaps)
	}
	for g := int64(1); g <= 1+loadSwaps; g++ {
		if served[g] == 0 {
			t.Fatalf("generation %d served no call: the swaps did not interleave with the load (%v)", g, served)
		}
	}
}

// waitActive waits until module serves target and the coordinator is idle.
func (h *harness) waitActive(a *activationRef, target hotswap.ModuleTarget, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st, ok := h.coord.Status(a.key.UID)
		if ok && !st.Busy {
			if ms := st.Modules[target.Module]; ms.Active == target.GenerationName {
				return nil
			}
			return fmt.Errorf("module %s settled on %q, want %s (failures %+v)", target.Module, st.Modules[target.Module].Active, target.GenerationName, st.Failures)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("%s did not become active within %v", target.GenerationName, timeout)
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func counts(served map[int64]int, order []int64) []int {
	out := make([]int, len(order))
	for i, g := range order {
		out[i] = served[g]
	}
	return out
}
