package hotswap

import (
	"context"
	"fmt"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
)

// renewalRetryDelay spaces renewal attempts that failed before the switch.
const renewalRetryDelay = 5 * time.Second

// renew moves the active generation into a fresh process (a renewal
// transaction): same implementation, same lineage, same Generation object.
// v2: verify → shadow_load → quiesce → snapshot → restore → readiness →
// atomic_switch → drain → committed; v1: the cold-replace phases. A failure
// before the switch leaves the old process serving and retries later; after
// the switch the renewal goes forward (the fresh process is the same
// generation, so there is nothing to roll back to).
func (a *activationRuntime) renew(d *Desired, m *moduleRuntime) {
	a.mu.Lock()
	g := m.active
	oldProc := g.proc
	m.dur.renewNow = false
	a.mu.Unlock()
	if d == nil || oldProc == nil {
		return
	}
	if oldProc.Budget().Ending() {
		// A process that is exiting cannot be renewed: its crash watch
		// relaunches it (see renewalDue).
		return
	}
	a.mu.Lock()
	g.rCount++
	renewal := g.rCount
	a.mu.Unlock()
	r, err := a.begin(ledger.KindRenewal, m, g, g, renewal, d)
	if err != nil {
		a.beginFailed(m.name, err)
		return
	}
	v2 := g.target.Plan.ProtocolVersion() == 2
	fresh := &generationRuntime{name: g.name, module: m.name, lineage: g.lineage, attempt: g.attempt, target: g.target, scope: effects.NewScope(fmt.Sprintf("%s/r%d", g.name, renewal))}
	a.mu.Lock()
	oldScope := g.scope
	a.mu.Unlock()
	r.fresh = func() *effects.EffectScope { return fresh.scope }
	r.serving = func() *dispatch.Route {
		route := a.routeTo(g, oldProc, oldScope)
		return &route
	}
	var st providers.State
	phases := []phase{
		r.verifyPhase(nil),
		r.shadowLoadPhase(fresh),
		r.quiescePhase(g, func(id string) string { return fmt.Sprintf("quiesce-cancel-%s-r%d", id, renewal) }, "the process is being renewed"),
	}
	if v2 {
		phases = append(phases,
			r.snapshotPhase(g, func() providers.Provider { return oldProc }, SnapshotCheckpoint, &st),
			r.restorePhase(fresh, &st),
			r.readinessPhase(fresh, &st, ""),
		)
	}
	phases = append(phases,
		r.switchPhase(func() dispatch.Route { return a.routeTo(g, fresh.proc, fresh.scope) }, func() {
			a.mu.Lock()
			g.proc, g.scope = fresh.proc, fresh.scope
			g.lastPid, g.procStartedAt = fresh.lastPid, fresh.procStartedAt
			if v2 {
				g.stateDigest = st.StateSHA256
				g.checkpoint = &CheckpointInfo{StateSHA256: st.StateSHA256, At: a.c.cfg.Now()}
			}
			a.activate(m, g, d)
			a.mu.Unlock()
			m.dispatcher.Resume()
		}),
		phase{name: ledger.PhaseDrain, final: true,
			work: func() error {
				stopCtx, cancel := context.WithTimeout(context.Background(), g.target.Plan.CancellationDeadline()+time.Second)
				err := oldProc.Stop(stopCtx, "renewed: a fresh process of the same generation serves")
				cancel()
				// The fresh process serves: a resource of the old one that
				// cannot be released is the ledger's cleanup_failed note and
				// the generation's cleanup error, not a failure of it.
				cleanup := a.dispose(g, oldScope, drainDeadline(g))
				note := ""
				if err != nil {
					note = fmt.Sprintf("the renewed process of %s did not stop within its cancellation deadline and was killed: %s", g.name, firstLine(err.Error()))
					a.recordReceipt(g, effects.Receipt{ID: fmt.Sprintf("drain-timeout-r%d", renewal), Kind: effects.ReceiptDrainTimeout, Class: effects.Cancelable, FinishedAt: a.c.cfg.Now(), Detail: note})
				}
				g.drainNote = joinNotes(note, cleanup)
				return nil
			},
			record: func() error {
				if g.drainNote != "" {
					note := g.drainNote
					g.drainNote = ""
					return r.txn.DrainCleanupFailed(note)
				}
				return r.txn.Drain()
			},
		},
		phase{name: ledger.PhaseCommitted, durable: func() {
			a.mu.Lock()
			g.renewals++
			g.step = iteronv1.StepCommitted
			a.mu.Unlock()
			a.countRenewal(m.name)
			a.log("process renewed", "module", m.name, "generation", g.name, "renewal", g.renewals, "pid", g.lastPid)
		}},
	)
	r.run(&transaction{
		kind:   ledger.KindRenewal,
		phases: phases,
		failed: func(pf *phaseFailure, _ bool, _ error) {
			a.mu.Lock()
			g.step = iteronv1.StepCommitted
			m.dur.renewRetryAt = a.c.cfg.Now().Add(renewalRetryDelay)
			a.mu.Unlock()
			a.log("renewal rolled back", "module", m.name, "generation", g.name, "phase", pf.phase, "reason", pf.code, "message", pf.message)
		},
		forward: func() {
			a.mu.Lock()
			g.renewals++
			g.step = iteronv1.StepCommitted
			a.mu.Unlock()
		},
	})
}
