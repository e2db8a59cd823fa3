package controllers_test

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
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

// waitUnracy waits until every file under paths was last changed more than
// verifier.RacyWindow ago: until then a file's stamp vouches for nothing
// and every reconcile verifies it again, which is right for a file that
// may still be changing but is not what these counts measure.
func waitUnracy(t *testing.T, paths ...string) {
	t.Helper()
	var newest time.Time
	for _, root := range paths {
		err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			if c := time.Unix(st.Ctim.Sec, st.Ctim.Nsec); c.After(newest) {
				newest = c
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Until(newest.Add(verifier.RacyWindow + 100*time.Millisecond)))
}

// TestReconcileCountsOfOneHotSwapAndOfAResync measures what one hot swap
// of one module and one resync with nothing changed cost the reconcilers:
// reconciles, verifications of the sources and writes to the API server.
// The sources are verified once per spec: a resync verifies nothing, a
// spec change once, and an executable rewritten on disk is verified again
// at the next reconcile.
func TestReconcileCountsOfOneHotSwapAndOfAResync(t *testing.T) {
	v2 := source(t, artifacts.CounterV2, "prompt_system", "counter-v2")
	v1 := source(t, artifacts.CounterV1, "prompt_system", "counter")
	act := newActivation(t, "counts", nil, v1)
	waitFor(t, act, "Ready", ready)
	// Once the files are old enough to be vouched for, one reconcile
	// verifies v1 for good.
	waitUnracy(t, v1.CatalogPath, v1.ArtifactRoot, v2.CatalogPath, v2.ArtifactRoot)
	resync(t, act, 1)

	before := settledCounts(t)
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = v2 })
	got := waitFor(t, act, "Ready at generation 2", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && moduleStatus(a, "prompt_system").Generation == 2
	})
	swap := settledCounts(t).minus(before)
	t.Logf("one hot swap of one module: %s", swap)
	cur := moduleStatus(got, "prompt_system")
	if cur.ImplementationID != "counter-v2" {
		t.Fatalf("after the swap: %+v", cur)
	}
	// One reconcile acts on the new spec; one more, once the transaction
	// ended and its Generations show it, reports Ready. Phases of the
	// transaction and the reconciler's own status writes requeue nothing.
	if swap.reconciles < 1 || swap.reconciles > 2 || swap.verifications != 1 {
		t.Fatalf("the swap took %g verifications in %g reconciles; want the new spec verified once in at most 2 reconciles: %s", swap.verifications, swap.reconciles, swap)
	}
	for _, kind := range []string{"generation_create", "activation_status", "generation_status", "event"} {
		if swap.writes[kind] < 1 {
			t.Fatalf("the swap wrote no %s that was counted: %s", kind, swap)
		}
	}

	idle := resync(t, act, 2)
	t.Logf("a resync with nothing changed: %s", idle)
	if idle.verifications != 0 {
		t.Fatalf("a resync with nothing changed verified the sources again: %s", idle)
	}

	// The executable rewritten with other bytes: the next reconcile
	// verifies again, and refuses it as an uncached verification would.
	gen := generations(t, got)[cur.GenerationName]
	exe := gen.Spec.Implementation.Executable
	original, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, append(slices.Clone(original), 0), 0o755); err != nil {
		t.Fatal(err)
	}
	verified := func(want metav1.ConditionStatus) func(*iteronv1.ImplementationActivation) bool {
		return func(a *iteronv1.ImplementationActivation) bool {
			c := condition(a, iteronv1.ConditionVerified)
			return c != nil && c.Status == want && c.ObservedGeneration == a.Generation
		}
	}
	touched := resync(t, act, 3)
	t.Logf("a resync after the executable was rewritten: %s", touched)
	refused := waitFor(t, act, "Verified False", verified(metav1.ConditionFalse))
	if touched.verifications < 1 {
		t.Fatalf("the rewritten executable was not verified again: %s", touched)
	}
	if ms := moduleStatus(refused, "prompt_system"); ms.Reason != reasons.VerificationFailed || !strings.Contains(ms.Message, "hashes to") || ms.GenerationName != cur.GenerationName {
		t.Fatalf("the module after its executable was rewritten: %+v; want verification_failed naming the digest, generation %s still serving", ms, cur.GenerationName)
	}

	// Its bytes back: verified again, and it passes as before.
	if err := os.WriteFile(exe, original, 0o755); err != nil {
		t.Fatal(err)
	}
	restored := resync(t, act, 4)
	t.Logf("a resync after the executable's bytes were put back: %s", restored)
	waitFor(t, act, "Verified True and Ready", func(a *iteronv1.ImplementationActivation) bool {
		return verified(metav1.ConditionTrue)(a) && ready(a)
	})
	if restored.verifications < 1 {
		t.Fatalf("the restored executable was not verified again: %s", restored)
	}
}
