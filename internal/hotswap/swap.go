package hotswap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/survivor"
)

// swap replaces a module's active generation old with the target:
//
//	hot swap:     verify → shadow_load → quiesce → snapshot → migrate →
//	              restore → readiness → atomic_switch → drain → committed
//	cold replace: verify → shadow_load → quiesce → atomic_switch → drain →
//	              committed (no state moves)
//
// A failure before the switch leaves old serving; after it, the post-switch
// rollback returns to old (relaunching it from the durable rollback
// snapshot if it was already stopped).
func (a *activationRuntime) swap(d *Desired, t ModuleTarget, old *generationRuntime, kind ledger.Kind) {
	a.mu.Lock()
	m := a.module(t.Module)
	a.mu.Unlock()
	g := a.newGeneration(m, t)
	r, err := a.begin(kind, m, g, old, 0, d)
	if err != nil {
		a.beginFailed(m.name, err)
		return
	}
	a.mu.Lock()
	m.register(g)
	a.mu.Unlock()
	hot := kind == ledger.KindHotSwap
	newPlan, oldPlan := g.target.Plan, old.target.Plan
	r.fresh = func() *effects.EffectScope { return g.scope }
	r.serving = func() *dispatch.Route {
		a.mu.Lock()
		defer a.mu.Unlock()
		if old.proc == nil || m.active != old {
			return nil
		}
		route := a.route(old)
		return &route
	}
	var st, migrated providers.State
	var newProc providers.Provider
	phases := []phase{
		// verify: old is the active one; authority and protocol allow the
		// strategy.
		r.verifyPhase(func() *phaseFailure {
			a.mu.Lock()
			isActive := m.active == old
			a.mu.Unlock()
			switch {
			case !isActive:
				return &phaseFailure{ledger.PhaseVerify, reasons.StaleGeneration, fmt.Sprintf("%s is no longer the active generation of %s", old.name, m.name)}
			case hot && newPlan.AuthoritySHA256() != oldPlan.AuthoritySHA256():
				return &phaseFailure{ledger.PhaseVerify, reasons.AuthorityChanged, fmt.Sprintf("admitted capabilities change from %v to %v: a hot swap keeps the authority; use strategy Cold", oldPlan.AdmittedCapabilities(), newPlan.AdmittedCapabilities())}
			case hot && (newPlan.ProtocolVersion() != 2 || oldPlan.ProtocolVersion() != 2):
				return &phaseFailure{ledger.PhaseVerify, reasons.UnsupportedVersion, fmt.Sprintf("a hot swap migrates state and needs protocol 2 on both sides (old %d, new %d); use strategy Cold or stateDisposition Discard", oldPlan.ProtocolVersion(), newPlan.ProtocolVersion())}
			}
			return nil
		}),
		r.shadowLoadPhase(g),
		r.quiescePhase(old, func(id string) string { return "quiesce-cancel-" + id }, "the module is being swapped to "+g.name),
	}
	if hot {
		phases = append(phases,
			r.snapshotPhase(old, func() providers.Provider { return old.proc }, SnapshotRollback, &st),
			phase{name: ledger.PhaseMigrate, fallback: reasons.ProviderFailed, work: func() error {
				sh, err := providers.StateOf(g.proc)
				if err != nil {
					return err
				}
				migrated, err = sh.Migrate(r.ctx, st)
				return err
			}},
			r.restorePhase(g, &migrated),
			r.readinessPhase(g, &migrated, SnapshotRestored),
		)
	}
	phases = append(phases,
		r.switchPhase(func() dispatch.Route { return a.route(g) }, func() {
			// The crash watch starts at the commit: until then a fault of
			// the new process is the transaction's to roll back.
			newProc = g.proc
			a.mu.Lock()
			m.active = g
			a.setPhase(g, iteronv1.PhasePreparing)
			g.activatedAt = a.c.cfg.Now()
			a.setPhase(old, iteronv1.PhaseDraining)
			a.mu.Unlock()
			m.dispatcher.Resume()
			// The old generation's object shows Draining while it drains.
			a.notifyGenerations(old.name)
		}),
		// drain: stop and reap old. A fault of the new process until the
		// drain record rolls back to old.
		phase{name: ledger.PhaseDrain, final: true, touched: []*generationRuntime{old},
			work: func() error {
				if pf := newProcessFault(newProc, ledger.PhaseDrain); pf != nil {
					return pf
				}
				cleanup := a.drain(old, g.name)
				if hook := a.c.cfg.AfterPhase; hook != nil {
					hook(a.key, m.name, OldStopped)
				}
				if pf := newProcessFault(newProc, ledger.PhaseDrain); pf != nil {
					return pf
				}
				old.drainNote = cleanup
				return nil
			},
			record: func() error {
				if old.drainNote != "" {
					return r.txn.DrainCleanupFailed(old.drainNote)
				}
				return r.txn.Drain()
			},
		},
		// The drain is durable: the new generation stands (a later crash is
		// a relaunch of it, never a rollback).
		r.committedPhase(func() {
			a.mu.Lock()
			a.activate(m, g, d)
			a.mu.Unlock()
			a.log("module swapped", "module", m.name, "from", old.name, "to", g.name, "kind", kind.String())
		}),
	)
	r.run(&transaction{
		kind:   kind,
		phases: phases,
		rollback: func(pf *phaseFailure) error {
			return r.rollbackAfterSwitch(old)
		},
		failed: func(pf *phaseFailure, afterSwitch bool, rollbackErr error) {
			what := "failed"
			if afterSwitch {
				what = "failed after the switch"
			}
			r.markFailed(pf, what)
			a.mu.Lock()
			gone := m.active == old && old.proc == nil
			a.mu.Unlock()
			if gone && !afterSwitch {
				// It replaced a generation whose process was given up:
				// nothing serves again, and calls fail at once with why.
				m.dispatcher.SetUnavailable(old.reason, old.message)
			}
			if rollbackErr != nil {
				// The module serves nothing: that, not the new generation's
				// fault, is what the failure says first.
				a.mu.Lock()
				a.failed[g.name] = Failure{Module: m.name, GenerationName: g.name, Code: reasons.RollbackFailed, Message: old.message}
				a.mu.Unlock()
			}
		},
		forward: func() {
			a.mu.Lock()
			a.activate(m, g, d)
			a.mu.Unlock()
		},
	})
}

// newProcessFault reports a fault of the new process after the switch.
func newProcessFault(proc providers.Provider, phase ledger.Phase) *phaseFailure {
	if proc == nil {
		return nil
	}
	select {
	case <-proc.Exited():
		return &phaseFailure{phase, reasons.ProviderFailed, fmt.Sprintf("the new generation's process (pid %d) exited after the switch", proc.Pid())}
	default:
		return nil
	}
}

// drain stops an old generation's process within its cancellation
// deadline; one that will not stop is killed and a drain-timeout receipt
// recorded. It returns the cleanup_failed note, or "".
func (a *activationRuntime) drain(old *generationRuntime, successor string) string {
	a.mu.Lock()
	proc, scope := old.proc, old.scope
	a.mu.Unlock()
	if proc == nil {
		// No process (it ended, or the generation is known only from the
		// ledger): what else it held is still released.
		cleanup := a.dispose(old, scope, drainDeadline(old))
		a.mu.Lock()
		switch {
		case cleanup != "":
			a.setPhase(old, iteronv1.PhaseFailed)
			old.reason, old.message = reasons.CleanupFailed, cleanup
		case old.phase == iteronv1.PhaseDraining:
			// Switched away from (a generation whose process was given
			// up): drained, its reason kept for the reader.
			old.step, old.drainedAt = iteronv1.StepDrain, a.c.cfg.Now()
			a.setPhase(old, iteronv1.PhaseInactive)
		}
		a.mu.Unlock()
		return cleanup
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), old.target.Plan.CancellationDeadline()+time.Second)
	defer cancel()
	started := a.c.cfg.Now()
	tail, dropped := proc.StderrTail()
	err := proc.Stop(stopCtx, "drained: replaced by "+successor)
	cleanup := a.dispose(old, scope, drainDeadline(old))
	note := ""
	if err != nil {
		note = fmt.Sprintf("%s did not stop within its cancellation deadline (%s) and was killed: %s", old.name, old.target.Plan.CancellationDeadline(), firstLine(err.Error()))
		a.recordReceipt(old, effects.Receipt{
			ID: "drain-timeout", Kind: effects.ReceiptDrainTimeout, Class: effects.Cancelable,
			StartedAt: started, FinishedAt: a.c.cfg.Now(), Detail: note,
		})
	}
	a.mu.Lock()
	old.proc = nil
	old.stderrTail, old.stderrDropped = tail, dropped
	old.step, old.drainedAt = iteronv1.StepDrain, a.c.cfg.Now()
	if cleanup != "" {
		// A resource of the generation could not be released: it is
		// Failed, and keeps that error (and its receipts) for the reader.
		a.setPhase(old, iteronv1.PhaseFailed)
		old.reason, old.message = reasons.CleanupFailed, joinNotes(note, cleanup)
	} else {
		a.setPhase(old, iteronv1.PhaseInactive)
		if note != "" {
			old.reason, old.message = reasons.CleanupFailed, truncateMessage(note)
		}
	}
	a.mu.Unlock()
	return joinNotes(note, cleanup)
}

// rollbackAfterSwitch returns to the old generation after a fault of the
// new one past a durable switch: relaunch the old plan if it was stopped,
// restore the durable rollback snapshot, readiness, switch back, stop the
// new. An error means the old generation could not be restored: the module
// serves nothing (rollback_failed) — nothing claims a recovery that did not
// happen.
func (r *txnRun) rollbackAfterSwitch(old *generationRuntime) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.desired.Swap.Deadline)
	defer cancel()
	// The old generation's state changes here (relaunched, or Failed): its
	// Generation object is mirrored only when it is named.
	defer r.a.notifyGenerations(old.name)
	m := r.m
	_, _ = m.dispatcher.Pause(ctx, 0)
	r.a.mu.Lock()
	failedScope := r.gen.scope
	r.a.mu.Unlock()
	r.a.dispose(r.gen, failedScope, drainDeadline(r.gen))
	err := r.relaunchOld(ctx, old)
	if err != nil {
		msg := truncateMessage(fmt.Sprintf("the old generation could not be restored after %s failed: %s", r.gen.name, firstLine(err.Error())))
		r.a.mu.Lock()
		m.active = nil
		r.a.setPhase(old, iteronv1.PhaseFailed)
		old.reason, old.message = reasons.RollbackFailed, msg
		r.a.mu.Unlock()
		_, _ = m.dispatcher.Switch(dispatch.Route{})
		m.dispatcher.SetUnavailable(reasons.RollbackFailed, msg)
		r.log("post-switch rollback failed", "module", m.name, "generation", r.gen.name, "error", err.Error())
		return err
	}
	m.dispatcher.Resume()
	r.log("rolled back to the old generation after a post-switch fault", "module", m.name, "old", old.name, "failed", r.gen.name)
	return nil
}

// relaunchOld brings the old generation back: its still-running process
// when it was not drained yet, else a fresh process from its plan with the
// durable rollback snapshot restored.
func (r *txnRun) relaunchOld(ctx context.Context, old *generationRuntime) error {
	r.a.mu.Lock()
	running := old.proc
	r.a.mu.Unlock()
	if running == nil {
		// The old generation's tag: its scratch directory is the one it
		// had, and a survivor that holds the process knows whose it is.
		tag := survivor.Tag{ActivationUID: r.a.key.UID, Module: r.m.name, Generation: old.name, Transaction: r.txn.Identity().TransactionID}
		proc, err := r.a.c.cfg.Launch(ctx, providers.LaunchRequest{Plan: old.target.Plan, Tag: tag, Epoch: old.target.Epoch})
		if err != nil {
			return err
		}
		if err := proc.Load(ctx); err != nil {
			return errors.Join(err, proc.Close())
		}
		if old.target.Plan.ProtocolVersion() == 2 && old.stateDigest != "" {
			snap, err := r.a.c.snapshots.Get(r.a.key.UID, r.m.name, old.stateDigest, SnapshotRollback)
			if err != nil {
				return errors.Join(fmt.Errorf("read the rollback snapshot: %w", err), proc.Close())
			}
			st := snap.protocolState()
			sh, err := providers.StateOf(proc)
			if err == nil {
				err = sh.Restore(ctx, st)
			}
			if err == nil {
				err = sh.Readiness(ctx, old.lineage, st.StateSHA256)
			}
			if err != nil {
				return errors.Join(err, proc.Close())
			}
		}
		scope := effects.NewScope(old.name + "/rollback-" + r.gen.name)
		if err := trackProcess(ctx, scope, proc); err != nil {
			return err
		}
		r.a.mu.Lock()
		old.scope = scope
		old.proc = proc
		old.lastPid, old.procStartedAt = proc.Pid(), proc.StartedAt()
		r.a.mu.Unlock()
	}
	if err := r.a.switchRoute(r.m, old); err != nil {
		return err
	}
	r.a.mu.Lock()
	r.a.activate(r.m, old, r.desired)
	old.step = iteronv1.StepRolledBack
	r.a.mu.Unlock()
	return nil
}

// storeSnapshot makes a generation's state durable under the state dir.
func (a *activationRuntime) storeSnapshot(g *generationRuntime, st providers.State, kind string) (string, error) {
	return a.c.snapshots.Put(a.key.UID, a.storedSnapshot(g, st, kind))
}

// storedSnapshot is a generation's state as the snapshot store keeps it.
func (a *activationRuntime) storedSnapshot(g *generationRuntime, st providers.State, kind string) StoredSnapshot {
	return StoredSnapshot{
		Module: g.module, ImplementationID: st.ImplementationID, Lineage: int64(st.Generation), StateSchema: st.StateSchema,
		StateSHA256: st.StateSHA256, Kind: kind, TakenUnixMs: a.c.cfg.Now().UnixMilli(), State: json.RawMessage(st.State),
	}
}
