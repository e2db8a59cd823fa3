package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

// readyWatch watches one activation through the API server and, at every
// status that says Ready for the current spec generation, reads the
// activation's Generations exactly as they were at that status's
// resourceVersion (a consistent read of etcd at that revision, so neither a
// slow test nor a fast controller can hide a disagreement) and checks that
// they agree with Ready.
type readyWatch struct {
	act *iteronv1.ImplementationActivation

	mu sync.Mutex
	// first is the first Ready status seen for each spec generation.
	first map[int64]readyMoment
	// checked counts the Ready statuses checked.
	checked int
	// disagreements explain every Ready status the Generations did not
	// agree with.
	disagreements []string
	// err is why the watch ended early.
	err error
	// seen signals each new first Ready.
	seen chan struct{}
}

// readyMoment is a Ready status and the Generations at its revision.
type readyMoment struct {
	resourceVersion string
	at              time.Time
	modules         []iteronv1.ModuleStatus
	generations     []string // name phase/step, for the log
}

// watchReady starts a readyWatch of act until the end of the test.
func watchReady(t *testing.T, act *iteronv1.ImplementationActivation) *readyWatch {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &iteronv1.ImplementationActivationList{}, client.InNamespace(act.Namespace),
		client.MatchingFields{"metadata.name": act.Name})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	rw := &readyWatch{act: act, first: map[int64]readyMoment{}, seen: make(chan struct{}, 1)}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			a, ok := ev.Object.(*iteronv1.ImplementationActivation)
			if ev.Type == watch.Error || !ok {
				rw.fail(fmt.Errorf("watch event %s: %v", ev.Type, ev.Object))
				return
			}
			if ev.Type == watch.Deleted || !readyForSpec(a) {
				continue
			}
			rw.check(ctx, a)
		}
		if ctx.Err() == nil {
			rw.fail(fmt.Errorf("the watch of %s ended", act.Name))
		}
	}()
	return rw
}

// readyForSpec: Ready=True and observedGeneration for the current spec.
func readyForSpec(a *iteronv1.ImplementationActivation) bool {
	r := condition(a, iteronv1.ConditionReady)
	return r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == a.Generation && a.Status.ObservedGeneration == a.Generation
}

func (rw *readyWatch) fail(err error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.err == nil {
		rw.err = err
	}
	select {
	case rw.seen <- struct{}{}:
	default:
	}
}

// check reads the Generations at a's revision and records whether they
// agree with a's Ready.
func (rw *readyWatch) check(ctx context.Context, a *iteronv1.ImplementationActivation) {
	var list iteronv1.GenerationList
	err := env.Client.List(ctx, &list, client.InNamespace(a.Namespace), &client.ListOptions{Raw: &metav1.ListOptions{
		ResourceVersion: a.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact,
	}})
	if err != nil {
		if ctx.Err() == nil {
			rw.fail(fmt.Errorf("list the Generations at resourceVersion %s: %w", a.ResourceVersion, err))
		}
		return
	}
	var gens []iteronv1.Generation
	var summary []string
	for _, g := range list.Items {
		if metav1.IsControlledBy(&g, a) {
			gens = append(gens, g)
			summary = append(summary, fmt.Sprintf("%s %s/%s", g.Name, orNothing(string(g.Status.Phase)), orNothing(string(g.Status.Step))))
		}
	}
	slices.Sort(summary)
	problems := generationsDisagree(a, gens)
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.checked++
	if len(problems) > 0 {
		rw.disagreements = append(rw.disagreements, fmt.Sprintf("Ready=True for spec generation %d at resourceVersion %s, but %s\n  modules: %+v\n  Generations then: %s",
			a.Generation, a.ResourceVersion, strings.Join(problems, "; "), a.Status.Modules, strings.Join(summary, ", ")))
	}
	if _, ok := rw.first[a.Generation]; !ok {
		rw.first[a.Generation] = readyMoment{resourceVersion: a.ResourceVersion, at: time.Now(), modules: a.Status.Modules, generations: summary}
		select {
		case rw.seen <- struct{}{}:
		default:
		}
	}
}

func orNothing(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// generationsDisagree lists how the Generations of a disagree with a's
// Ready: every module's Generation shows Active at committed, the one it
// replaced (spec.previous) Inactive at drain, and every other one is over
// (Inactive or Failed).
func generationsDisagree(a *iteronv1.ImplementationActivation, gens []iteronv1.Generation) []string {
	byName := map[string]iteronv1.Generation{}
	for _, g := range gens {
		byName[g.Name] = g
	}
	var out []string
	named := map[string]bool{}
	for _, ms := range a.Status.Modules {
		g, ok := byName[ms.GenerationName]
		switch {
		case ms.Phase != iteronv1.PhaseActive:
			out = append(out, fmt.Sprintf("module %s is %s", ms.Module, ms.Phase))
			continue
		case !ok:
			out = append(out, fmt.Sprintf("module %s names %s, which does not exist", ms.Module, ms.GenerationName))
			continue
		case g.Status.Phase != iteronv1.PhaseActive || g.Status.Step != iteronv1.StepCommitted:
			out = append(out, fmt.Sprintf("%s (module %s's) shows %s/%s, not Active/committed", g.Name, ms.Module, orNothing(string(g.Status.Phase)), orNothing(string(g.Status.Step))))
		}
		named[g.Name] = true
		if prev := g.Spec.Previous; prev != "" {
			named[prev] = true
			p, ok := byName[prev]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s replaced %s, which does not exist", g.Name, prev))
			case p.Status.Phase != iteronv1.PhaseInactive || p.Status.Step != iteronv1.StepDrain:
				out = append(out, fmt.Sprintf("%s (replaced by %s) shows %s/%s, not Inactive/drain", prev, g.Name, orNothing(string(p.Status.Phase)), orNothing(string(p.Status.Step))))
			}
		}
	}
	for _, g := range gens {
		if !named[g.Name] && g.Status.Phase != iteronv1.PhaseInactive && g.Status.Phase != iteronv1.PhaseFailed {
			out = append(out, fmt.Sprintf("%s (no module's) shows %s/%s, not over", g.Name, orNothing(string(g.Status.Phase)), orNothing(string(g.Status.Step))))
		}
	}
	return out
}

// waitFirstReady waits for the first Ready status of spec generation gen.
func (rw *readyWatch) waitFirstReady(t *testing.T, gen int64) readyMoment {
	t.Helper()
	deadline := time.NewTimer(90 * time.Second)
	defer deadline.Stop()
	for {
		rw.mu.Lock()
		m, ok := rw.first[gen]
		err := rw.err
		rw.mu.Unlock()
		switch {
		case err != nil:
			t.Fatal(err)
		case ok:
			return m
		}
		select {
		case <-rw.seen:
		case <-deadline.C:
			waitFor(t, rw.act, fmt.Sprintf("Ready for spec generation %d (the watch saw none in 90s)", gen), func(*iteronv1.ImplementationActivation) bool { return false })
		}
	}
}

// agreed fails the test with every Ready status the Generations did not
// agree with, and returns how many were checked.
func (rw *readyWatch) agreed(t *testing.T) int {
	t.Helper()
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if len(rw.disagreements) > 0 {
		t.Fatalf("%d of %d Ready statuses disagreed with the Generations:\n%s", len(rw.disagreements), rw.checked, strings.Join(rw.disagreements, "\n"))
	}
	return rw.checked
}

func TestReadyIsTrueOnlyOnceEveryGenerationShowsItsFinalPhaseAndStep(t *testing.T) {
	// The demo's two modules: context_assembly consumes prompt_system, so
	// every swap of prompt_system reloads both.
	act := newActivation(t, "agree", nil,
		source(t, artifacts.CounterV1, "prompt_system", "counter-v1"),
		source(t, artifacts.CounterV1, "context_assembly", "counter-v1-ctx"),
	)
	rw := watchReady(t, act)
	m := rw.waitFirstReady(t, 1)
	t.Logf("spec generation 1 first Ready at resourceVersion %s; Generations then: %s", m.resourceVersion, strings.Join(m.generations, ", "))

	impls := []string{"counter-v2", "counter-v2-b", "counter-v2-c"}
	for i, id := range impls {
		next := source(t, artifacts.CounterV2, "prompt_system", id)
		updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = next })
		spec := int64(i + 2)
		m := rw.waitFirstReady(t, spec)
		t.Logf("spec generation %d (prompt_system → %s) first Ready at resourceVersion %s; Generations then: %s", spec, id, m.resourceVersion, strings.Join(m.generations, ", "))
		for _, ms := range m.modules {
			if ms.Generation != spec {
				t.Fatalf("first Ready of spec generation %d shows module %s at lineage %d (%s); want %d: the swap did not happen", spec, ms.Module, ms.Generation, ms.GenerationName, spec)
			}
		}
	}
	n := rw.agreed(t)
	t.Logf("%d Ready statuses over %d swaps checked against the Generations at their resourceVersion: all agreed", n, len(impls))
}
