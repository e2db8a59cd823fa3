package lifecycle_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/operatortest"
)

// phaseLog is every phase the API showed for each Generation of one
// activation, as a watch delivered them (consecutive repeats dropped).
type phaseLog struct {
	mu      sync.Mutex
	changed chan struct{}
	seen    map[string][]iteronv1.ModulePhase
}

func watchPhases(t *testing.T, activation string) *phaseLog {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &iteronv1.GenerationList{}, client.InNamespace("default"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	l := &phaseLog{changed: make(chan struct{}, 1), seen: map[string][]iteronv1.ModulePhase{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			g, ok := ev.Object.(*iteronv1.Generation)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || g.Spec.ActivationName != activation || g.Status.Phase == "" {
				continue
			}
			l.mu.Lock()
			if h := l.seen[g.Name]; len(h) == 0 || h[len(h)-1] != g.Status.Phase {
				l.seen[g.Name] = append(h, g.Status.Phase)
			}
			l.mu.Unlock()
			select {
			case l.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		cancel()
		<-done
	})
	return l
}

// history is what the watch saw of a Generation so far.
func (l *phaseLog) history(name string) []iteronv1.ModulePhase {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen[name])
}

// waitUntil returns once cond holds of the log, or after gateTimeout.
func (l *phaseLog) waitUntil(cond func() bool) {
	deadline := time.After(gateTimeout)
	for !cond() {
		select {
		case <-l.changed:
		case <-deadline:
			return
		}
	}
}

func (l *phaseLog) has(name string, p iteronv1.ModulePhase) func() bool {
	return func() bool { return slices.Contains(l.history(name), p) }
}

// TestAHotSwapTakesItsGenerationsThroughEveryPhase watches the
// Generations of an activation on the real API server while the real
// manager activates counter v1 and hot-swaps it to counter v2. The
// transaction is held at shadow_load and at the atomic switch until the
// watch has seen the phase it is in (Preparing; the old generation
// Draining), so the short phases are observed, not hoped for.
func TestAHotSwapTakesItsGenerationsThroughEveryPhase(t *testing.T) {
	const name = "swap-phases"
	g1, g2 := name+"-swapper-g1-1", name+"-swapper-g2-1"
	log := watchPhases(t, name)
	holdAt("default", name, "swapper", "shadow_load", func() { log.waitUntil(log.has(g1, iteronv1.PhasePreparing)) })
	v1 := operatortest.Source(t, artifacts.CounterV1, "swapper", "counter-v1")
	act := newActivationNamed(t, name, v1)
	operatortest.WaitFor(t, env.Client, act, "swapper Active on counter-v1", func(a *iteronv1.ImplementationActivation) bool {
		ms := operatortest.ModuleStatus(a, "swapper")
		return ms.Phase == iteronv1.PhaseActive && ms.GenerationName == g1
	})
	log.waitUntil(log.has(g1, iteronv1.PhaseActive))

	holdAt("default", name, "swapper", "shadow_load", func() { log.waitUntil(log.has(g2, iteronv1.PhasePreparing)) })
	holdAt("default", name, "swapper", "atomic_switch", func() {
		log.waitUntil(func() bool { return log.has(g1, iteronv1.PhaseDraining)() && log.has(g2, iteronv1.PhasePreparing)() })
	})
	v2 := operatortest.Source(t, artifacts.CounterV2, "swapper", "counter-v2")
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources = []iteronv1.ActivationSource{v2} })
	operatortest.WaitFor(t, env.Client, act, "swapper Active on counter-v2", func(a *iteronv1.ImplementationActivation) bool {
		ms := operatortest.ModuleStatus(a, "swapper")
		return ms.Phase == iteronv1.PhaseActive && ms.GenerationName == g2
	})
	log.waitUntil(func() bool { return log.has(g1, iteronv1.PhaseInactive)() && log.has(g2, iteronv1.PhaseActive)() })

	want := map[string][]iteronv1.ModulePhase{
		g1: {iteronv1.PhasePreparing, iteronv1.PhaseActive, iteronv1.PhaseDraining, iteronv1.PhaseInactive},
		g2: {iteronv1.PhasePreparing, iteronv1.PhaseActive},
	}
	for gen, phases := range want {
		got := log.history(gen)
		t.Logf("%s went through %v", gen, got)
		if !slices.Equal(got, phases) {
			t.Errorf("%s went through %v, want %v", gen, got, phases)
		}
	}
}
