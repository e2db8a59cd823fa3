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
const (
	loadWorkers = 8
	loadCalls   = 200
	loadSwaps   = 10
	loadLead    = 48
)

func TestNoCallIsLostOrDoubledAcrossConsecutiveSwapsUnderLoad(t *testing.T) {
	var (
		dmu        sync.Mutex
		dispatched = map[string][]int64{} // invocation → lineages that took it
	)
	h := newHarness(t, func(_ *hotswap.Config, c *Config) {
		c.OnDispatch = func(d Dispatch) {
			dmu.Lock()
			dispatched[d.InvocationID] = append(dispatched[d.InvocationID], d.Route.Lineage)
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
	select {
	case err := <-swapErr:
		t.Fatal(err)
	default:
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
		total, loadWorkers, elapsed.Round(time.Millisecond), failures, swapsDone.Load(), first.Lineage, resp.Generation, lineages, counts(served, lineages), final.Total, total)
	if failures != 0 {
		t.Fatalf("%d calls failed", failures)
	}
	if resp.Generation != 1+loadSwaps {
		t.Fatalf("the module ends on generation %d; want %d after %d swaps", resp.Generation, 1+loadSwaps, loadSwaps)
	}
	if final.Total != total {
		t.Fatalf("counter total %d after %d calls across %d swaps: state lost or doubled", final.Total, total, loadSwaps)
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
