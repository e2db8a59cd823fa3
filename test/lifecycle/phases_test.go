package lifecycle_test

import (
	"context"
	"slices"
	"sync"
	"syscall"
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

// TestARetiredModuleStaysInStatusAsDrainingUntilItsProcessIsGone removes
// one of two modules' sources while the real manager serves both. The
// retirement is held after its quiesce: the activation's status.modules
// still lists the module, Draining, with the generation whose process still
// runs; once the retirement goes on, the module leaves status.modules only
// when its process is gone.
func TestARetiredModuleStaysInStatusAsDrainingUntilItsProcessIsGone(t *testing.T) {
	const name = "retire-status"
	gen := name + "-store-g1-1"
	keep := operatortest.Source(t, artifacts.CounterV2, "swapper", "counter-v2")
	gone := operatortest.Source(t, artifacts.CounterV2, "store", "store-counter")
	act := newActivationNamed(t, name, keep, gone)
	var pid int64
	operatortest.WaitFor(t, env.Client, act, "both modules Active", func(a *iteronv1.ImplementationActivation) bool {
		st := operatortest.ModuleStatus(a, "store")
		return operatortest.ModuleStatus(a, "swapper").Phase == iteronv1.PhaseActive && st.Phase == iteronv1.PhaseActive
	})
	// The Generation's status is mirrored from the manager after the
	// activation's; the activation can say Active a moment before its
	// Generation shows the pid.
	g := operatortest.WaitGeneration(t, env.Client, "default", gen, "showing its process's pid", func(g *iteronv1.Generation) bool { return g.Status.Pid > 0 })
	pid = g.Status.Pid

	released := make(chan struct{})
	seen := make(chan iteronv1.ModuleStatus, 1)
	holdAt("default", name, "store", "quiesce", func() {
		// The retirement stands still here, its process running, until the
		// status shows the module Draining (or the gate times out).
		var last iteronv1.ModuleStatus
		deadline := time.Now().Add(gateTimeout)
		for time.Now().Before(deadline) {
			var a iteronv1.ImplementationActivation
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &a); err == nil {
				last = operatortest.ModuleStatus(&a, "store")
				if last.Phase == iteronv1.PhaseDraining {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		seen <- last
		<-released
	})
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources = []iteronv1.ActivationSource{keep} })
	var during iteronv1.ModuleStatus
	select {
	case during = <-seen:
	case <-time.After(2 * gateTimeout):
		t.Fatal("the retirement never reached its quiesce")
	}
	alive := syscall.Kill(int(pid), 0) == nil
	close(released)
	t.Logf("during the retirement: status.modules[store] = phase %s, generation %s, message %q; process %d alive: %v", during.Phase, during.GenerationName, during.Message, pid, alive)
	if during.Phase != iteronv1.PhaseDraining || during.GenerationName != gen || !alive {
		t.Fatalf("while its process (pid %d, alive %v) is being retired, status.modules[store] = %+v; want it listed Draining on %s", pid, alive, during, gen)
	}
	after := operatortest.WaitFor(t, env.Client, act, "store gone from status.modules", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.ModuleStatus(a, "store").Module == ""
	})
	if syscall.Kill(int(pid), 0) == nil {
		t.Fatalf("store left status.modules while its process %d still runs", pid)
	}
	for _, c := range after.Status.Conditions {
		if c.Type == iteronv1.ConditionReady {
			t.Logf("after the retirement: %d module(s) listed, Ready %s (%s)", len(after.Status.Modules), c.Status, c.Message)
		}
	}
}
