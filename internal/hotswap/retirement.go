package hotswap

import (
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
)

// retire retires a module's generation g (its source was removed, or the
// activation is deleted): verify → quiesce → [snapshot, kept durable] →
// drain → committed. A retirement never keeps a process alive: it ignores
// the deadline and skips a snapshot that fails. Only a ledger that cannot be
// written stops it before the drain; the generation then keeps serving and
// the retirement runs again once the ledger is writable.
func (a *activationRuntime) retire(swap SwapPolicy, candidate string, m *moduleRuntime, g *generationRuntime) {
	if swap.Deadline == 0 {
		swap.Deadline = 30 * time.Second
	}
	a.mu.Lock()
	g.rCount++ // a retirement is one more transaction on the generation: /r<n>
	renewal := g.rCount
	a.mu.Unlock()
	d := &Desired{Key: a.key, CandidateSHA256: candidate, Swap: swap}
	r, err := a.begin(ledger.KindRetirement, m, g, g, renewal, d)
	if err != nil {
		a.mu.Lock()
		g.rCount--
		a.mu.Unlock()
		a.beginFailed(m.name, err)
		return
	}
	r.serving = func() *dispatch.Route {
		a.mu.Lock()
		defer a.mu.Unlock()
		if g.proc == nil {
			return nil
		}
		route := a.route(g)
		return &route
	}
	var st providers.State
	r.run(&transaction{
		kind:       ledger.KindRetirement,
		noDeadline: true,
		phases: []phase{
			r.verifyPhase(nil),
			phase{name: ledger.PhaseQuiesce, work: func() error {
				a.mu.Lock()
				a.setPhase(g, iteronv1.PhaseDraining)
				a.mu.Unlock()
				cancelled, _ := m.dispatcher.Pause(r.ctx, swap.QuiesceTimeout)
				for _, cancelled := range cancelled {
					a.recordReceipt(g, effects.Receipt{ID: "quiesce-cancel-" + cancelled.CallID, Kind: effects.ReceiptQuiesceCancel, Class: effects.Cancelable,
						StartedAt: cancelled.StartedAt, FinishedAt: a.c.cfg.Now(), Detail: "run cancelled by the module's retirement"})
				}
				return nil
			}},
			withSkip(optional(r.snapshotPhase(g, func() providers.Provider { return g.proc }, SnapshotRetirement, &st)), func() bool {
				return g.proc == nil || g.target.Plan.ProtocolVersion() != 2
			}),
			phase{name: ledger.PhaseDrain, final: true,
				work: func() error {
					a.mu.Lock()
					m.active, m.retiring = nil, g
					a.mu.Unlock()
					g.drainNote = a.drain(g, "retirement")
					m.dispatcher.Close()
					a.mu.Lock()
					m.retiring = nil
					a.mu.Unlock()
					return nil
				},
				record: func() error {
					if g.drainNote != "" {
						return r.txn.DrainCleanupFailed(g.drainNote)
					}
					return r.txn.Drain()
				},
			},
			r.committedPhase(func() {
				a.mu.Lock()
				delete(a.modules, m.name)
				a.mu.Unlock()
				a.noteAttached(m.name, nil, "")
				a.log("module retired", "module", m.name, "generation", g.name)
			}),
		},
		failed: func(pf *phaseFailure, _ bool, _ error) {
			a.mu.Lock()
			if g.proc != nil {
				a.setPhase(g, iteronv1.PhaseActive)
			}
			a.mu.Unlock()
			a.log("retirement waits", "module", m.name, "generation", g.name, "reason", pf.code, "message", pf.message)
		},
		forward: func() {
			a.mu.Lock()
			g.step = iteronv1.StepCommitted
			delete(a.modules, m.name)
			a.mu.Unlock()
		},
	})
}

// forceRetireAll reaps every module's process without a ledger (it is
// corrupt: nothing can be recorded) and marks the activation removed: a
// process is never left behind.
func (a *activationRuntime) forceRetireAll() {
	a.mu.Lock()
	var mods []*moduleRuntime
	for _, m := range a.modules {
		mods = append(mods, m)
	}
	a.mu.Unlock()
	for _, m := range mods {
		a.mu.Lock()
		g := m.active
		m.active = nil
		a.mu.Unlock()
		if g != nil {
			a.drain(g, "retirement")
		}
		m.dispatcher.Close()
		a.mu.Lock()
		delete(a.modules, m.name)
		a.mu.Unlock()
	}
	a.mu.Lock()
	a.removed = true
	a.mu.Unlock()
	a.notify()
}

// optional is p with a failure of its work leaving it out: the optional
// snapshot of a retirement never keeps a process alive.
func optional(p phase) phase {
	work := p.work
	p.work = func() error {
		if err := work(); err != nil {
			return errSkipPhase
		}
		return nil
	}
	return p
}
