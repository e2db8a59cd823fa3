package hotswap

import (
	"fmt"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
)

// firstActivation activates a module that has no active generation:
// verify → shadow_load → atomic_switch → committed.
func (a *activationRuntime) firstActivation(d *Desired, t ModuleTarget) {
	a.mu.Lock()
	m := a.module(t.Module)
	a.mu.Unlock()
	if o := a.c.cfg.Owner; o != nil {
		// Whatever the survivor still runs of this module belongs to no
		// committed generation (a first activation cut short).
		o.ReleaseModule(a.key.UID, m.name, "the module is activated afresh: no committed generation owns it")
	}
	g := a.newGeneration(m, t)
	r, err := a.begin(ledger.KindFirstActivation, m, g, nil, 0, d)
	if err != nil {
		a.beginFailed(m.name, err)
		return
	}
	a.mu.Lock()
	m.register(g)
	a.mu.Unlock()
	m.dispatcher.SetAvailable() // being prepared: calls wait for it
	r.fresh = func() *effects.EffectScope { return g.scope }
	r.run(&transaction{
		kind: ledger.KindFirstActivation,
		phases: []phase{
			r.verifyPhase(nil),
			r.shadowLoadPhase(g),
			r.switchPhase(func() dispatch.Route { return a.route(g) }, func() {
				a.mu.Lock()
				a.activate(m, g, d)
				a.mu.Unlock()
				m.dispatcher.Resume()
			}),
			r.committedPhase(func() {
				a.log("module activated", "module", m.name, "generation", g.name, "pid", g.lastPid)
			}),
		},
		failed: func(pf *phaseFailure, _ bool, _ error) {
			r.markFailed(pf, "failed")
			// Nothing serves the module and nothing is being prepared
			// until the controller hands a new attempt: calls fail at once.
			m.dispatcher.SetUnavailable(string(pf.code), fmt.Sprintf("module %s has no active generation: %s", m.name, r.gen.message))
		},
	})
}
