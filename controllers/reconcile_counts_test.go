package controllers_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

// reconcileCounts are the reconcilers' counters as the manager's registry
// (controller-runtime's, which /metrics serves) exposes them.
type reconcileCounts struct {
	reconciles, verifications float64
	writes                    map[string]float64
}

// readReconcileCounts gathers the counters from the manager's registry: a
// counter that is not registered there fails the test.
func readReconcileCounts(t *testing.T) reconcileCounts {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := reconcileCounts{writes: map[string]float64{}}
	seen := map[string]bool{}
	for _, f := range families {
		seen[f.GetName()] = true
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue()
			switch f.GetName() {
			case "iteron_activation_reconciles_total":
				c.reconciles += v
			case "iteron_activation_verifications_total":
				c.verifications += v
			case "iteron_activation_api_writes_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "kind" {
						c.writes[l.GetValue()] += v
					}
				}
			}
		}
	}
	// The vector has no series before its first write: only the two plain
	// counters are always there.
	for _, name := range []string{"iteron_activation_reconciles_total", "iteron_activation_verifications_total"} {
		if !seen[name] {
			t.Fatalf("%s is not registered with the manager's metrics registry", name)
		}
	}
	return c
}

// minus is what was counted since before.
func (c reconcileCounts) minus(before reconcileCounts) reconcileCounts {
	d := reconcileCounts{reconciles: c.reconciles - before.reconciles, verifications: c.verifications - before.verifications, writes: map[string]float64{}}
	for k, v := range c.writes {
		if v -= before.writes[k]; v != 0 {
			d.writes[k] = v
		}
	}
	return d
}

func (c reconcileCounts) totalWrites() float64 {
	var n float64
	for _, v := range c.writes {
		n += v
	}
	return n
}

func (c reconcileCounts) String() string {
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(c.writes)) {
		kinds = append(kinds, fmt.Sprintf("%s=%g", k, c.writes[k]))
	}
	return fmt.Sprintf("reconciles=%g verifications=%g api_writes=%g {%s}", c.reconciles, c.verifications, c.totalWrites(), strings.Join(kinds, " "))
}

// settledCounts waits until the counters stop moving (nothing reconciles
// for quietFor: the requeues and watch events a change brings are over) and
// returns them. A reconcile that keeps coming back (a requeue loop) shows
// in the figures instead of failing here: this only bounds the wait.
func settledCounts(t *testing.T) reconcileCounts {
	t.Helper()
	const quietFor = 3 * time.Second
	last := readReconcileCounts(t)
	since := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		cur := readReconcileCounts(t)
		if cur.minus(last).String() != (reconcileCounts{writes: map[string]float64{}}).String() {
			last, since = cur, time.Now()
			continue
		}
		if time.Since(since) >= quietFor {
			return cur
		}
	}
	t.Logf("the reconcilers did not settle within 30s; counting from now")
	return last
}

// resync makes the activation's reconciler run with nothing changed: an
// annotation the manager does not read changes (metadata.generation stays),
// the same reconcile a periodic resync or a coordinator notification makes.
// It returns once that reconcile ran and the reconcilers settled.
func resync(t *testing.T, act *iteronv1.ImplementationActivation, n int) reconcileCounts {
	t.Helper()
	before := settledCounts(t)
	ctx := context.Background()
	var cur iteronv1.ImplementationActivation
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(act), &cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations["test.iteron.dev/resync"] = fmt.Sprint(n)
	if err := env.Client.Patch(ctx, &cur, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, act, "a reconcile after the resync", func(*iteronv1.ImplementationActivation) bool {
		return readReconcileCounts(t).reconciles > before.reconciles
	})
	return settledCounts(t).minus(before)
}

// TestReconcileCountsOfOneHotSwapAndOfAResync measures what one hot swap
// of one module and one resync with nothing changed cost the reconcilers:
// reconciles, verifications of the sources and writes to the API server.
func TestReconcileCountsOfOneHotSwapAndOfAResync(t *testing.T) {
	v2 := source(t, artifacts.CounterV2, "prompt_system", "counter-v2")
	act := newActivation(t, "counts", nil, source(t, artifacts.CounterV1, "prompt_system", "counter"))
	waitFor(t, act, "Ready", ready)

	before := settledCounts(t)
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = v2 })
	got := waitFor(t, act, "Ready at generation 2", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && moduleStatus(a, "prompt_system").Generation == 2
	})
	swap := settledCounts(t).minus(before)
	t.Logf("one hot swap of one module: %s", swap)
	if moduleStatus(got, "prompt_system").ImplementationID != "counter-v2" {
		t.Fatalf("after the swap: %+v", moduleStatus(got, "prompt_system"))
	}
	if swap.reconciles < 1 || swap.verifications < 1 {
		t.Fatalf("the swap was made without a counted reconcile and verification: %s", swap)
	}
	for _, kind := range []string{"generation_create", "activation_status", "generation_status", "event"} {
		if swap.writes[kind] < 1 {
			t.Fatalf("the swap wrote no %s that was counted: %s", kind, swap)
		}
	}

	idle := resync(t, act, 1)
	t.Logf("a resync with nothing changed: %s", idle)
	if idle.verifications < 1 {
		t.Fatalf("a resync verified nothing: %s", idle)
	}
}
