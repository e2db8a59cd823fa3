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
	"iteron.dev/operator/internal/reasons"
)

// Crash policy (docs/concepts.md, failure handling).
const (
	// CrashBudget crashes within CrashWindow make a generation Failed.
	CrashBudget = 5
	// CrashWindow is the window of CrashBudget.
	CrashWindow = 10 * time.Minute
	// firstRelaunchBackoff doubles per crash in the window, up to
	// maxRelaunchBackoff.
	firstRelaunchBackoff = 500 * time.Millisecond
	maxRelaunchBackoff   = 30 * time.Second
)

// watchProcess marks the generation crashed if its process exits while it
// is the module's active one and nobody stopped it.
//
// The watch is a resource of the generation's scope (crash-watch): disposing
// the scope stops it. Caller holds a.mu.
func (a *activationRuntime) watchProcess(m *moduleRuntime, g *generationRuntime, proc providers.Provider) {
	w := &watcher{stop: make(chan struct{}), done: make(chan struct{}), handling: make(chan struct{})}
	go func() {
		defer close(w.done)
		select {
		case <-proc.Exited():
		case <-w.stop:
			return
		}
		close(w.handling)
		tail, dropped := proc.StderrTail()
		a.mu.Lock()
		crashed := m.active == g && g.proc == proc && !a.stopping
		switch {
		case crashed && a.health.unwritable != nil:
			// Nothing can be relaunched (or renewed) until the ledger
			// accepts appends: the module serves nothing until then, and
			// says so. Not counted as a crash: a process that reached its
			// end of life because no renewal could be recorded did nothing
			// wrong.
			g.stderrTail, g.stderrDropped = tail, dropped
			g.proc = nil
			a.setPhase(g, iteronv1.PhasePreparing)
			g.reason = reasons.LedgerUnwritable
			g.message = truncateMessage(fmt.Sprintf("the process of %s ended while the ledger cannot be written (a renewal or relaunch must be recorded first): it is relaunched once the ledger accepts appends again", g.name))
			m.dur.relaunchAt = a.c.cfg.Now()
			m.dispatcher.PauseNow()
			m.dispatcher.SetUnavailable(g.reason, g.message)
		case crashed && providers.OwnerLost(proc):
			// The survivor that owned the process went away (restarted,
			// killed): not the provider's fault, not counted as a crash.
			// It is relaunched from its newest durable snapshot as soon as
			// a survivor takes launches again; calls wait for it.
			g.stderrTail, g.stderrDropped = tail, dropped
			g.proc = nil
			a.setPhase(g, iteronv1.PhasePreparing)
			g.reason = reasons.Recovering
			g.message = truncateMessage(fmt.Sprintf("the survivor that owned the process of %s went away: relaunching it from its newest durable snapshot", g.name))
			g.relaunchCause = "the survivor that owned its process went away at " + a.c.cfg.Now().UTC().Format(time.RFC3339)
			m.dur.relaunchAt = a.c.cfg.Now()
			m.dispatcher.PauseNow()
			m.dispatcher.SetRecovering(a.recoveryOf(m))
			a.log("provider process lost with its survivor; relaunching", "module", m.name, "generation", g.name)
		case crashed:
			g.stderrTail, g.stderrDropped = tail, dropped
			g.relaunchCause = "its process exited at " + a.c.cfg.Now().UTC().Format(time.RFC3339)
			a.noteCrash(m, g, "the provider process exited")
		}
		a.mu.Unlock()
		if crashed {
			a.poke()
			a.notify(g.name)
		}
	}()
	g.scope.Release(resCrashWatch) // a watch of an earlier process of the scope, which ended
	if err := g.scope.Track(context.Background(), resCrashWatch, effects.Cancelable, w.dispose); err != nil {
		a.log("crash watch of a disposed generation stopped at once", "generation", g.name, "error", err.Error())
	}
}

// noteCrash records a crash of the active generation (its process exited,
// or a relaunch failed for a reason that may pass). Within the crash budget
// it schedules a relaunch with backoff and calls wait for it; past the
// budget the generation is Failed and calls fail at once. Caller holds a.mu.
func (a *activationRuntime) noteCrash(m *moduleRuntime, g *generationRuntime, what string) {
	now := a.c.cfg.Now()
	g.proc = nil
	m.dispatcher.PauseNow()
	a.countCrash(m.name)
	d := &m.dur
	kept := d.crashes[:0]
	for _, t := range d.crashes {
		if now.Sub(t) < CrashWindow {
			kept = append(kept, t)
		}
	}
	d.crashes = append(kept, now)
	if len(d.crashes) >= CrashBudget {
		a.setPhase(g, iteronv1.PhaseFailed)
		g.reason = reasons.ProviderFailed
		g.message = truncateMessage(fmt.Sprintf("%s: %s; it crashed %d times in %s and is not relaunched again (stderr tail in status)", g.name, what, len(d.crashes), CrashWindow))
		a.failed[g.name] = Failure{Module: m.name, GenerationName: g.name, Code: g.reason, Message: g.message}
		d.relaunchAt = time.Time{}
		m.dispatcher.SetUnavailable(g.reason, g.message)
		a.log("crash budget exhausted", "module", m.name, "generation", g.name, "crashes", len(d.crashes))
		return
	}
	backoff := min(firstRelaunchBackoff<<(len(d.crashes)-1), maxRelaunchBackoff)
	d.relaunchAt = now.Add(backoff)
	a.setPhase(g, iteronv1.PhasePreparing)
	g.reason = reasons.ProviderFailed
	g.message = truncateMessage(fmt.Sprintf("%s (crash %d of %d allowed in %s); relaunching in %s", what, len(d.crashes), CrashBudget, CrashWindow, backoff))
	if g.relaunchCause == "" {
		g.relaunchCause = what
	}
	m.dispatcher.SetRecovering(a.recoveryOf(m))
	a.log("provider crashed", "module", m.name, "generation", g.name, "relaunchIn", backoff)
}

// refuseRelaunch records a relaunch refused for a reason that does not
// pass by itself (the bytes on disk no longer verify, the authority
// changed): it is not retried as a crash. The generation is Failed with the
// reason, calls fail at once, and a new spec or a retry request tries
// again. Caller holds a.mu.
func (a *activationRuntime) refuseRelaunch(m *moduleRuntime, g *generationRuntime, pf *phaseFailure) {
	g.proc = nil
	a.setPhase(g, iteronv1.PhaseFailed)
	g.reason = string(pf.code)
	g.message = truncateMessage(fmt.Sprintf("relaunch of %s refused at %s: %s (not retried until the spec changes or a retry is requested)", g.name, pf.phase, pf.message))
	m.dur.relaunchAt = time.Time{}
	m.dur.refused = &Failure{Module: m.name, GenerationName: g.name, Code: g.reason, Message: g.message}
	m.dispatcher.PauseNow()
	m.dispatcher.SetUnavailable(g.reason, g.message)
	a.log("relaunch refused", "module", m.name, "generation", g.name, "reason", pf.code, "message", pf.message)
}

// relaunch restarts a crashed active generation (a relaunch transaction):
// verify → shadow_load → [restore → readiness] → atomic_switch → committed,
// restoring the newest durable snapshot of its lineage.
func (a *activationRuntime) relaunch(d *Desired, m *moduleRuntime) {
	a.mu.Lock()
	g := m.active
	m.dur.relaunchAt = time.Time{}
	a.mu.Unlock()
	if d == nil {
		d = &Desired{Key: a.key, Swap: SwapPolicy{Deadline: 30 * time.Second}}
	}
	if hook := a.c.cfg.BeforeRecovery; hook != nil {
		hook(a.key, m.name)
	}
	a.runRelaunch(d, m, g, g.committedAuthority)
}

// relaunchCommitted starts the ledger's last committed generation of a
// module after a manager restart: a relaunch restoring its newest durable
// snapshot. Its receipts from before the restart are gone: the evidence is
// reported incomplete.
func (a *activationRuntime) relaunchCommitted(d *Desired, m *moduleRuntime, t ModuleTarget, c CommittedGeneration) {
	g := a.newGeneration(m, t)
	a.mu.Lock()
	g.committedAuthority = c.AuthoritySHA256
	m.register(g)
	m.active = g // so a crash of the relaunched process is seen as one
	m.dur.committed = nil
	m.dispatcher.SetRecovering(fmt.Sprintf("activation %s/%s is being recovered: module %s's last committed generation %s is being re-attached or relaunched", a.key.Namespace, a.key.Name, m.name, g.name))
	a.mu.Unlock()
	if a.receiptsLoss != "" {
		// Its receipts survive in the receipts file — unless the last
		// manager did not close it: then what it recorded last may be lost.
		a.receipts.MarkIncomplete(g.name, a.receiptsLoss)
	}
	if hook := a.c.cfg.BeforeRecovery; hook != nil {
		hook(a.key, m.name)
	}
	if a.c.cfg.Owner != nil {
		proc, why := a.reattach(m, g, t, c, d)
		if proc != nil {
			a.adopt(d, m, g, c, proc)
			return
		}
		a.log("not re-attached: relaunching from the newest durable snapshot", "module", m.name, "generation", g.name, "why", why)
		a.mu.Lock()
		g.relaunchCause = "the process of " + g.name + " was not re-attached after the manager restarted (" + why + ")"
		a.mu.Unlock()
	}
	a.runRelaunch(d, m, g, c.AuthoritySHA256)
}

// runRelaunch runs the relaunch transaction of g. authority, when set, is
// the authority the ledger committed: a plan whose re-intersected authority
// differs is refused.
func (a *activationRuntime) runRelaunch(d *Desired, m *moduleRuntime, g *generationRuntime, authority string) {
	a.mu.Lock()
	g.rCount++
	renewal := g.rCount
	a.mu.Unlock()
	r, err := a.begin(ledger.KindRelaunch, m, g, nil, renewal, d)
	if err != nil {
		a.beginFailed(m.name, err)
		a.mu.Lock()
		// Relaunched once the ledger is writable again.
		m.dur.relaunchAt = a.c.cfg.Now()
		a.mu.Unlock()
		return
	}
	plan := g.target.Plan
	a.mu.Lock()
	a.callsWait(m) // being relaunched: calls wait for it
	a.mu.Unlock()
	r.fresh = func() *effects.EffectScope { return g.scope }
	var snap providers.State
	var stored StoredSnapshot
	haveSnapshot := false
	r.run(&transaction{
		kind: ledger.KindRelaunch,
		phases: []phase{
			r.verifyPhase(func() *phaseFailure {
				if authority != "" && plan.AuthoritySHA256() != authority {
					return &phaseFailure{ledger.PhaseVerify, reasons.AuthorityChanged, fmt.Sprintf("the node's capability ceiling changed: admitted capabilities are now %v (authority %s), the ledger committed %s", plan.AdmittedCapabilities(), plan.AuthoritySHA256(), authority)}
				}
				if plan.ProtocolVersion() == 2 {
					s, ok, err := a.newestSnapshot(m.name, g)
					if err != nil {
						return &phaseFailure{ledger.PhaseVerify, reasons.VerificationFailed, "the newest durable snapshot is unreadable: " + err.Error()}
					}
					snap, stored, haveSnapshot = s.protocolState(), s, ok
				}
				// What is left of the process that ended (its reaping, its
				// route, its crash watch) is disposed before a new scope
				// holds the relaunched one.
				a.mu.Lock()
				ended := g.scope
				a.mu.Unlock()
				a.dispose(g, ended, drainDeadline(g))
				a.mu.Lock()
				g.scope = effects.NewScope(fmt.Sprintf("%s/r%d", g.name, renewal))
				a.mu.Unlock()
				return nil
			}),
			r.shadowLoadPhase(g),
			withSkip(r.restorePhase(g, &snap), func() bool { return !haveSnapshot }),
			withSkip(r.readinessPhase(g, &snap, ""), func() bool { return !haveSnapshot }),
			r.switchPhase(func() dispatch.Route { return a.route(g) }, func() {
				a.mu.Lock()
				a.activate(m, g, d)
				a.mu.Unlock()
				m.dispatcher.Resume()
			}),
			r.committedPhase(func() {
				note := relaunchNote(a.c.cfg.Now(), g, d, plan.ProtocolVersion(), haveSnapshot, stored)
				a.mu.Lock()
				if g.reason == "" {
					// Serving again: the status says what the relaunch
					// restored and what it could not.
					g.message = truncateMessage(note)
				}
				g.relaunchCause = ""
				a.mu.Unlock()
				a.log("generation relaunched", "module", m.name, "generation", g.name, "pid", g.lastPid, "restored", g.stateDigest, "note", note)
			}),
		},
		failed: func(pf *phaseFailure, _ bool, _ error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			g.proc = nil
			switch {
			case m.active != g:
			case pf.code == reasons.LedgerUnwritable:
				// Not the provider's fault: relaunched once the ledger is
				// writable again; until then nothing serves the module.
				a.setPhase(g, iteronv1.PhasePreparing)
				g.reason = string(pf.code)
				g.message = truncateMessage(fmt.Sprintf("relaunch of %s waits for the ledger: %s", g.name, pf.message))
				m.dur.relaunchAt = a.c.cfg.Now()
				m.dispatcher.PauseNow()
				m.dispatcher.SetUnavailable(g.reason, g.message)
			case reasons.Stalls(string(pf.code)):
				a.refuseRelaunch(m, g, pf)
			default:
				a.noteCrash(m, g, fmt.Sprintf("relaunch of %s failed at %s: %s", g.name, pf.phase, pf.message))
			}
		},
	})
}

// relaunchNote says what a relaunch of g restored, and what was lost: the
// state a provider built after the snapshot it restored (bounded by the
// checkpoint interval).
func relaunchNote(now time.Time, g *generationRuntime, d *Desired, protocolVersion int, restored bool, s StoredSnapshot) string {
	cause := g.relaunchCause
	if cause == "" {
		cause = "the manager restarted"
	}
	head := fmt.Sprintf("relaunched at %s (%s)", now.UTC().Format(time.RFC3339), cause)
	switch {
	case protocolVersion != 2:
		return head + ": a protocol-1 provider keeps no state"
	case !restored:
		return head + ": no durable snapshot of its lineage existed, it started with empty state"
	}
	taken := time.UnixMilli(s.TakenUnixMs).UTC()
	bound := "checkpoints are off (spec.checkpoint.intervalSeconds 0): only swaps, renewals and shutdowns snapshot"
	if d != nil && d.CheckpointInterval > 0 {
		bound = fmt.Sprintf("at most spec.checkpoint.intervalSeconds (%s) of it", d.CheckpointInterval)
	}
	return fmt.Sprintf("%s: state %s restored from its %s snapshot taken at %s; what the provider did after that snapshot is lost (%s)",
		head, s.StateSHA256, s.Kind, taken.Format(time.RFC3339Nano), bound)
}

// withSkip is p, left out when skip reports true.
func withSkip(p phase, skip func() bool) phase {
	p.skip = skip
	return p
}

// newestSnapshot is the newest durable snapshot of g's lineage and
// implementation.
func (a *activationRuntime) newestSnapshot(module string, g *generationRuntime) (StoredSnapshot, bool, error) {
	all, err := a.c.snapshots.List(a.key.UID, module)
	if err != nil {
		return StoredSnapshot{}, false, err
	}
	for i := len(all) - 1; i >= 0; i-- {
		s := all[i]
		if s.Lineage == g.lineage && s.ImplementationID == g.target.Plan.ImplementationID() {
			return s, true, nil
		}
	}
	return StoredSnapshot{}, false, nil
}
