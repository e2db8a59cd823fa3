package hotswap

import (
	"context"
	"errors"
	"runtime"
	"sync"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/internal/verifier"
)

// Parallel activation (docs/concepts.md, identity, epoch and plan: the modules
// of a plan that are ready together start together). The slow part of a first
// activation is spawning and loading its process; the ledger rules do not
// move: one transaction at a time per activation, each record appended as its
// phase completes. So what runs concurrently is only that slow part: when the
// worker reaches a first activation, every module of the plan that is ready at
// the same time (its dependencies Active, nothing of its own running or
// committed) has its process spawned and loaded at once, at most
// Config.MaxParallelActivations together. The transactions then run one after
// the other in activate order, each shadow_load taking the process already
// launched for its generation instead of starting one.
//
// A process launched ahead is owned by the worker until a transaction takes
// it; every path that will not use it closes it: a failed launch in the
// wave (the plan halts at that module: everything launched for modules
// after it is closed), a changed desired state, a removal, a shutdown.

// aheadLaunch is a process started (and loaded) ahead of its transaction.
type aheadLaunch struct {
	module string
	plan   verifier.LaunchPlan
	// proc is the process (nil when the launch itself failed).
	proc providers.Provider
	// err is why the launch or the load failed; with proc set, the load
	// failed and the transaction reports it with the process's stderr.
	err error
}

// maxParallel is how many processes a wave spawns and loads together.
func (c *Coordinator) maxParallel() int {
	if c.cfg.MaxParallelActivations > 0 {
		return c.cfg.MaxParallelActivations
	}
	return runtime.NumCPU()
}

// launchWave spawns and loads, concurrently, the processes of every module
// that is ready for a first activation now, from ActivateOrder[from] on
// (the module about to be activated included). It does nothing when at most
// one module is ready or the bound is 1: the transaction launches its own.
func (a *activationRuntime) launchWave(d *Desired, targets map[string]ModuleTarget, from int) {
	limit := a.c.maxParallel()
	if limit < 2 {
		return
	}
	var wave []ModuleTarget
	for _, module := range d.ActivateOrder[from:] {
		t, ok := targets[module]
		if !ok || t.Keep {
			continue
		}
		a.mu.Lock()
		m := a.module(module)
		_, failed := a.failed[t.GenerationName]
		_, have := a.ahead[t.GenerationName]
		ready := m.active == nil && m.dur.committed == nil && !have
		a.mu.Unlock()
		if failed {
			// The plan halts at a failed target: nothing after it runs now.
			break
		}
		if !ready {
			continue
		}
		if code, _ := a.dependencyGate(t); code != "" {
			continue
		}
		wave = append(wave, t)
	}
	if len(wave) < 2 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(d.Swap.Deadline, 1))
	defer cancel()
	results := make([]*aheadLaunch, len(wave))
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i, t := range wave {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = a.launchAhead(ctx, t)
		}()
	}
	wg.Wait()
	// The first failure in plan order halts the plan there: the processes
	// launched for the modules after it would wait unused, so they go now.
	halt := len(results)
	for i, r := range results {
		if r.err != nil {
			halt = i
			break
		}
	}
	var unused []providers.Provider
	a.mu.Lock()
	for i, r := range results {
		if i <= halt {
			a.ahead[wave[i].GenerationName] = r
			continue
		}
		if r.proc != nil {
			unused = append(unused, r.proc)
		}
	}
	a.mu.Unlock()
	if halt < len(results) {
		a.log("a process launched ahead failed; the plan halts at its module", "module", wave[halt].Module, "error", results[halt].err.Error(), "closed", len(unused))
	}
	closeAll(unused, limit)
	a.log("launched a wave of modules together", "modules", len(wave), "parallel", min(limit, len(wave)))
}

// launchAhead spawns and loads one module's process, tagged with the
// transaction that will take it.
func (a *activationRuntime) launchAhead(ctx context.Context, t ModuleTarget) *aheadLaunch {
	r := &aheadLaunch{module: t.Module, plan: t.Plan}
	if o := a.c.cfg.Owner; o != nil {
		// As firstActivation does: whatever the survivor still runs of
		// this module belongs to no committed generation.
		o.ReleaseModule(a.key.UID, t.Module, "the module is activated afresh: no committed generation owns it")
	}
	id, err := ledger.NewTransactionID(a.key.UID, t.Module, uint64(t.Lineage), uint64(t.Attempt), 0)
	if err != nil {
		r.err = err
		return r
	}
	tag := survivor.Tag{ActivationUID: a.key.UID, Module: t.Module, Generation: t.GenerationName, Transaction: id.String()}
	proc, err := a.c.cfg.Launch(ctx, providers.LaunchRequest{Plan: t.Plan, Tag: tag, Epoch: t.Epoch})
	if err != nil {
		r.err = err
		return r
	}
	r.proc = proc
	if err := proc.Load(ctx); err != nil {
		r.err = err
	}
	return r
}

// takeAhead hands a transaction the process launched ahead for g, if its
// plan is still g's (nil otherwise: the transaction launches its own).
func (a *activationRuntime) takeAhead(g *generationRuntime) *aheadLaunch {
	a.mu.Lock()
	r, ok := a.ahead[g.name]
	delete(a.ahead, g.name)
	a.mu.Unlock()
	if !ok {
		return nil
	}
	if !samePlan(r.plan, g.target.Plan) {
		if r.proc != nil {
			_ = r.proc.Close()
		}
		return nil
	}
	return r
}

func samePlan(x, y verifier.LaunchPlan) bool {
	return x.ManifestSHA256() == y.ManifestSHA256() && x.ArtifactSHA256() == y.ArtifactSHA256() && x.AuthoritySHA256() == y.AuthoritySHA256()
}

// dropAhead closes the processes launched ahead that no transaction will
// take: every one when keep is nil, else those whose generation keep
// refuses.
func (a *activationRuntime) dropAhead(keep func(generation string) bool) {
	a.mu.Lock()
	if len(a.ahead) == 0 {
		a.mu.Unlock()
		return
	}
	var unused []providers.Provider
	for name, r := range a.ahead {
		if keep != nil && keep(name) {
			continue
		}
		delete(a.ahead, name)
		if r.proc != nil {
			unused = append(unused, r.proc)
		}
	}
	a.mu.Unlock()
	if len(unused) > 0 {
		a.log("closed processes launched ahead that no transaction will take", "processes", len(unused))
	}
	closeAll(unused, a.c.maxParallel())
}

// dropAheadNotDesired closes what was launched ahead for generations d no
// longer asks for (nil d: all of them).
func (a *activationRuntime) dropAheadNotDesired(d *Desired) {
	if d == nil {
		a.dropAhead(nil)
		return
	}
	a.dropAhead(func(name string) bool {
		for _, t := range d.Modules {
			if t.GenerationName == name && !t.Keep {
				return true
			}
		}
		return false
	})
}

// closeAll closes processes, at most limit at a time.
func closeAll(procs []providers.Provider, limit int) {
	_ = eachParallel(procs, limit, func(p providers.Provider) error { return p.Close() })
}

// eachParallel runs fn for every item, at most limit at a time, and joins
// the errors.
func eachParallel[T any](items []T, limit int, fn func(T) error) error {
	if len(items) == 0 {
		return nil
	}
	limit = max(limit, 1)
	sem := make(chan struct{}, limit)
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = fn(it)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
