package hotswap

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// hotSwap: verify → shadow_load → quiesce → snapshot → migrate → restore →
// readiness → atomic_switch → drain → committed.
func (a *activationRuntime) hotSwap(_ context.Context, d *Desired, t ModuleTarget, old *generationRuntime) {
	a.swap(d, t, old, ledger.KindHotSwap)
}

// coldReplace: verify → shadow_load → quiesce → atomic_switch → drain →
// committed; no state moves.
func (a *activationRuntime) coldReplace(_ context.Context, d *Desired, t ModuleTarget, old *generationRuntime) {
	a.swap(d, t, old, ledger.KindColdReplace)
}

func (a *activationRuntime) swap(d *Desired, t ModuleTarget, old *generationRuntime, kind ledger.Kind) {
	a.mu.Lock()
	m := a.module(t.Module)
	a.mu.Unlock()
	g := a.newGeneration(m, t)
	r, err := a.begin(kind, m, g, old, 0, d)
	if err != nil {
		a.log("cannot begin a transaction", "module", t.Module, "error", err.Error())
		return
	}
	pf, switched := r.swapPhases(d, old, kind)
	switch {
	case pf == nil:
	case !switched:
		r.abort(pf)
		a.mu.Lock()
		oldServes := old.proc != nil
		a.mu.Unlock()
		if oldServes {
			r.m.dispatcher.Resume()
		}
	default:
		r.rollbackAfterSwitch(d, old, pf)
	}
}

// swapPhases runs a swap; switched reports whether the atomic switch is
// durable (a failure after it needs the post-switch rollback).
func (r *txnRun) swapPhases(d *Desired, old *generationRuntime, kind ledger.Kind) (pf *phaseFailure, switched bool) {
	defer r.cancel()
	hot := kind == ledger.KindHotSwap
	newPlan, oldPlan := r.gen.target.Plan, old.target.Plan

	// verify: the old is the active one; authority and protocol allow the
	// chosen strategy.
	if err := r.check(ledger.PhaseVerify); err != nil {
		return fail(ledger.PhaseVerify, err, reasons.DeadlineExceeded), false
	}
	r.a.mu.Lock()
	isActive := r.m.active == old
	r.a.mu.Unlock()
	switch {
	case !isActive:
		return &phaseFailure{ledger.PhaseVerify, reasons.StaleGeneration, fmt.Sprintf("%s is no longer the active generation of %s", old.name, r.m.name)}, false
	case hot && newPlan.AuthoritySHA256() != oldPlan.AuthoritySHA256():
		return &phaseFailure{ledger.PhaseVerify, reasons.AuthorityChanged, fmt.Sprintf("admitted capabilities change from %v to %v: a hot swap keeps the authority; use strategy Cold", oldPlan.AdmittedCapabilities(), newPlan.AdmittedCapabilities())}, false
	case hot && (newPlan.ProtocolVersion() != 2 || oldPlan.ProtocolVersion() != 2):
		return &phaseFailure{ledger.PhaseVerify, reasons.UnsupportedVersion, fmt.Sprintf("a hot swap migrates state and needs protocol 2 on both sides (old %d, new %d); use strategy Cold or stateDisposition Discard", oldPlan.ProtocolVersion(), newPlan.ProtocolVersion())}, false
	}
	if err := r.txn.Verify(); err != nil {
		r.ledgerFailure(err)
		return nil, false
	}
	r.recorded(ledger.PhaseVerify)

	// shadow_load
	if err := r.check(ledger.PhaseShadowLoad); err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.DeadlineExceeded), false
	}
	if err := r.launch(r.gen); err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed), false
	}
	if err := r.txn.ShadowLoad(); err != nil {
		r.ledgerFailure(err)
		_ = r.gen.scope.Dispose(context.Background())
		return nil, false
	}
	r.recorded(ledger.PhaseShadowLoad)

	// quiesce: stop dispatching; cancel a run that outlives the timeout.
	if err := r.check(ledger.PhaseQuiesce); err != nil {
		return fail(ledger.PhaseQuiesce, err, reasons.DeadlineExceeded), false
	}
	cancelled, err := r.m.dispatcher.Pause(r.ctx, d.Swap.QuiesceTimeout)
	if cancelled != nil {
		r.a.recordReceipt(old, effects.Receipt{
			ID: "quiesce-cancel-" + cancelled.CallID, Kind: effects.ReceiptQuiesceCancel, Class: effects.Cancelable,
			StartedAt: cancelled.StartedAt, FinishedAt: r.a.c.cfg.Now(),
			Detail: fmt.Sprintf("run %s cancelled after the %s quiesce timeout of the swap to %s", cancelled.CallID, d.Swap.QuiesceTimeout, r.gen.name),
		})
	}
	if err != nil {
		return fail(ledger.PhaseQuiesce, err, reasons.DeadlineExceeded), false
	}
	if err := r.txn.Quiesce(); err != nil {
		r.ledgerFailure(err)
		_ = r.gen.scope.Dispose(context.Background())
		return nil, false
	}
	r.recorded(ledger.PhaseQuiesce)

	var restored State
	if hot {
		// snapshot (old), made durable as the rollback snapshot.
		if err := r.check(ledger.PhaseSnapshot); err != nil {
			return fail(ledger.PhaseSnapshot, err, reasons.DeadlineExceeded), false
		}
		st, err := old.proc.Snapshot(r.ctx, old.lineage)
		if err != nil {
			return fail(ledger.PhaseSnapshot, err, reasons.ProviderFailed), false
		}
		if _, err := r.a.storeSnapshot(old, st, SnapshotRollback); err != nil {
			return &phaseFailure{ledger.PhaseSnapshot, reasons.ProviderFailed, "the rollback snapshot could not be made durable: " + err.Error()}, false
		}
		if err := r.txn.Snapshot(st.StateSHA256); err != nil {
			r.ledgerFailure(err)
			_ = r.gen.scope.Dispose(context.Background())
			return nil, false
		}
		r.a.mu.Lock()
		old.stateDigest = st.StateSHA256
		r.a.mu.Unlock()
		r.recorded(ledger.PhaseSnapshot, old)

		// migrate (new, to lineage + 1)
		if err := r.check(ledger.PhaseMigrate); err != nil {
			return fail(ledger.PhaseMigrate, err, reasons.DeadlineExceeded), false
		}
		migrated, err := r.gen.proc.Migrate(r.ctx, st)
		if err != nil {
			return fail(ledger.PhaseMigrate, err, reasons.ProviderFailed), false
		}
		if err := r.txn.Migrate(); err != nil {
			r.ledgerFailure(err)
			_ = r.gen.scope.Dispose(context.Background())
			return nil, false
		}
		r.recorded(ledger.PhaseMigrate)

		// restore (new)
		if err := r.check(ledger.PhaseRestore); err != nil {
			return fail(ledger.PhaseRestore, err, reasons.DeadlineExceeded), false
		}
		if err := r.gen.proc.Restore(r.ctx, migrated); err != nil {
			return fail(ledger.PhaseRestore, err, reasons.ProviderFailed), false
		}
		if err := r.txn.Restore(migrated.StateSHA256); err != nil {
			r.ledgerFailure(err)
			_ = r.gen.scope.Dispose(context.Background())
			return nil, false
		}
		restored = migrated
		r.a.mu.Lock()
		r.gen.stateDigest = migrated.StateSHA256
		r.a.mu.Unlock()
		r.recorded(ledger.PhaseRestore)

		// readiness (new), and the restored state made durable before the
		// switch: after a durable switch, recovery goes forward with it.
		if err := r.check(ledger.PhaseReadiness); err != nil {
			return fail(ledger.PhaseReadiness, err, reasons.DeadlineExceeded), false
		}
		if err := r.gen.proc.Readiness(r.ctx, r.gen.lineage, migrated.StateSHA256); err != nil {
			return fail(ledger.PhaseReadiness, err, reasons.ProviderFailed), false
		}
		if _, err := r.a.storeSnapshot(r.gen, restored, SnapshotRestored); err != nil {
			return &phaseFailure{ledger.PhaseReadiness, reasons.ProviderFailed, "the restored state could not be made durable: " + err.Error()}, false
		}
		if err := r.txn.Readiness(); err != nil {
			r.ledgerFailure(err)
			_ = r.gen.scope.Dispose(context.Background())
			return nil, false
		}
		r.recorded(ledger.PhaseReadiness)
	}

	// atomic_switch: one pointer swap in the dispatcher, durable before any
	// call reaches the new generation.
	if err := r.check(ledger.PhaseAtomicSwitch); err != nil {
		return fail(ledger.PhaseAtomicSwitch, err, reasons.DeadlineExceeded), false
	}
	if _, err := r.m.dispatcher.Switch(r.a.route(r.gen)); err != nil {
		return fail(ledger.PhaseAtomicSwitch, err, reasons.ActivationFailed), false
	}
	if err := r.txn.AtomicSwitch(); err != nil {
		r.ledgerFailure(err)
		_, _ = r.m.dispatcher.Switch(r.a.route(old))
		_ = r.gen.scope.Dispose(context.Background())
		r.m.dispatcher.Resume()
		return nil, false
	}
	// The crash watch starts at the commit: until then a fault of the new
	// process is the transaction's to roll back.
	newProc := r.gen.proc
	r.a.mu.Lock()
	r.m.active = r.gen
	r.gen.phase, r.gen.activatedAt = iteronv1.PhasePreparing, r.a.c.cfg.Now()
	old.phase = iteronv1.PhaseDraining
	r.a.mu.Unlock()
	r.m.dispatcher.Resume()
	r.recorded(ledger.PhaseAtomicSwitch, old)

	// drain: stop and reap the old. A fault of the new process from the
	// switch until the drain record rolls back to the old: switching back to
	// the old process while it runs, relaunching it once it is stopped.
	if pf := newProcessFault(newProc, ledger.PhaseDrain); pf != nil {
		return pf, true
	}
	cleanup := r.a.drain(old, r.gen.name)
	if hook := r.a.c.cfg.AfterPhase; hook != nil {
		hook(r.a.key, r.m.name, OldStopped)
	}
	if pf := newProcessFault(newProc, ledger.PhaseDrain); pf != nil {
		return pf, true
	}
	var err2 error
	if cleanup != "" {
		err2 = r.txn.DrainCleanupFailed(cleanup)
	} else {
		err2 = r.txn.Drain()
	}
	if err2 != nil {
		r.ledgerFailure(err2)
		return nil, true
	}
	r.recorded(ledger.PhaseDrain, old)

	// The drain is durable: the new generation stands (a later crash is a
	// relaunch of it, never a rollback).
	if err := r.txn.Commit(); err != nil {
		r.ledgerFailure(err)
		return nil, true
	}
	r.a.mu.Lock()
	r.gen.step = iteronv1.StepCommitted
	r.a.activate(r.m, r.gen, d)
	r.a.mu.Unlock()
	r.recorded(ledger.PhaseCommitted)
	r.a.log("module swapped", "module", r.m.name, "from", old.name, "to", r.gen.name, "kind", kind.String())
	return nil, true
}

// newProcessFault reports a fault of the new process after the switch.
func newProcessFault(proc Provider, phase ledger.Phase) *phaseFailure {
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
	if old.proc == nil {
		return ""
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), old.target.Plan.CancellationDeadline()+time.Second)
	defer cancel()
	started := a.c.cfg.Now()
	tail, dropped := old.proc.StderrTail()
	err := old.proc.Stop(stopCtx, "drained: replaced by "+successor)
	_ = old.scope.Dispose(context.Background())
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
	old.phase, old.step, old.drainedAt = iteronv1.PhaseInactive, iteronv1.StepDrain, a.c.cfg.Now()
	if note != "" {
		old.reason, old.message = reasons.CleanupFailed, truncateMessage(note)
	}
	a.mu.Unlock()
	return note
}

// rollbackAfterSwitch handles a fault of the new process after a durable
// switch: relaunch the old plan, restore the durable rollback snapshot,
// readiness, switch back, stop the new. If that fails the transaction ends
// rollback_failed: nothing claims a recovery that did not happen.
func (r *txnRun) rollbackAfterSwitch(d *Desired, old *generationRuntime, pf *phaseFailure) {
	r.captureStderr(r.gen)
	if err := r.block(pf); err != nil {
		r.ledgerFailure(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.Swap.Deadline)
	defer cancel()
	_, _ = r.m.dispatcher.Pause(ctx, 0)
	_ = r.gen.scope.Dispose(context.Background())

	err := r.relaunchOld(ctx, old)
	r.a.mu.Lock()
	r.gen.phase, r.gen.step = iteronv1.PhaseFailed, iteronv1.StepRolledBack
	r.gen.reason, r.gen.message = string(pf.code), truncateMessage(fmt.Sprintf("%s failed after the switch (%s): %s", r.gen.name, pf.phase, pf.message))
	r.gen.proc = nil
	r.a.failed[r.gen.name] = Failure{Module: r.m.name, GenerationName: r.gen.name, Code: string(pf.code), Message: r.gen.message}
	r.a.mu.Unlock()
	if err != nil {
		if lerr := r.txn.RollbackFailed(); lerr != nil {
			r.ledgerFailure(lerr)
		}
		r.a.mu.Lock()
		r.m.active = nil
		old.phase, old.reason = iteronv1.PhaseFailed, reasons.RollbackFailed
		old.message = truncateMessage(fmt.Sprintf("the old generation could not be restored after %s failed: %s", r.gen.name, firstLine(err.Error())))
		r.a.failed[r.gen.name] = Failure{Module: r.m.name, GenerationName: r.gen.name, Code: reasons.RollbackFailed, Message: old.message}
		r.a.mu.Unlock()
		r.recorded(ledger.PhaseRolledBack, old)
		r.a.log("post-switch rollback failed", "module", r.m.name, "generation", r.gen.name, "error", err.Error())
		return
	}
	if lerr := r.txn.RollBack(); lerr != nil {
		r.ledgerFailure(lerr)
	}
	r.m.dispatcher.Resume()
	r.recorded(ledger.PhaseRolledBack, old)
	r.a.log("rolled back to the old generation after a post-switch fault", "module", r.m.name, "old", old.name, "failed", r.gen.name)
}

// relaunchOld brings the old generation back: its still-running process
// when it was not drained yet, else a fresh process from its plan with the
// durable rollback snapshot restored.
func (r *txnRun) relaunchOld(ctx context.Context, old *generationRuntime) error {
	r.a.mu.Lock()
	running := old.proc
	r.a.mu.Unlock()
	if running == nil {
		proc, err := r.a.c.cfg.Launch(ctx, old.target.Plan)
		if err != nil {
			return err
		}
		if err := proc.Load(ctx); err != nil {
			_ = proc.Close()
			return err
		}
		if old.target.Plan.ProtocolVersion() == 2 && old.stateDigest != "" {
			snap, err := r.a.c.snapshots.Get(r.a.key.UID, r.m.name, old.stateDigest, SnapshotRollback)
			if err != nil {
				_ = proc.Close()
				return fmt.Errorf("read the rollback snapshot: %w", err)
			}
			st := snap.protocolState()
			if err := proc.Restore(ctx, st); err != nil {
				_ = proc.Close()
				return err
			}
			if err := proc.Readiness(ctx, old.lineage, st.StateSHA256); err != nil {
				_ = proc.Close()
				return err
			}
		}
		old.scope = effects.NewScope(old.name)
		_ = old.scope.Track(ctx, "process", effects.Reversible, func(context.Context) error { return proc.Close() })
		r.a.mu.Lock()
		old.proc = proc
		old.lastPid, old.procStartedAt = proc.Pid(), proc.StartedAt()
		r.a.mu.Unlock()
		running = proc
	}
	if _, err := r.m.dispatcher.Switch(r.a.route(old)); err != nil {
		return err
	}
	r.a.mu.Lock()
	r.a.activate(r.m, old, r.desired)
	old.step = iteronv1.StepRolledBack
	r.a.mu.Unlock()
	return nil
}

// retire: verify → quiesce → [snapshot, kept durable] → drain → committed.
func (a *activationRuntime) retire(_ context.Context, swap SwapPolicy, candidate string, m *moduleRuntime, g *generationRuntime) {
	if swap.Deadline == 0 {
		swap.Deadline = 30 * time.Second
	}
	a.mu.Lock()
	g.rCount++ // a retirement is one more transaction on the generation: /r<n>
	renewal := g.rCount
	a.mu.Unlock()
	r, err := a.begin(ledger.KindRetirement, m, g, g, renewal, &Desired{Key: a.key, CandidateSHA256: candidate, Swap: swap})
	if err != nil {
		a.log("cannot begin a retirement", "module", m.name, "error", err.Error())
		// Without a ledger nothing may be recorded; still reap the process
		// so none is left behind.
		a.forceRetire(m, g)
		return
	}
	defer r.cancel()
	step := func(phase ledger.Phase, record func() error) bool {
		if err := record(); err != nil {
			r.ledgerFailure(err)
			a.forceRetire(m, g)
			return false
		}
		r.recorded(phase)
		return true
	}
	_ = r.check(ledger.PhaseVerify)
	if !step(ledger.PhaseVerify, r.txn.Verify) {
		return
	}
	_ = r.check(ledger.PhaseQuiesce)
	a.mu.Lock()
	g.phase = iteronv1.PhaseDraining
	a.mu.Unlock()
	cancelled, _ := m.dispatcher.Pause(r.ctx, swap.QuiesceTimeout)
	if cancelled != nil {
		a.recordReceipt(g, effects.Receipt{ID: "quiesce-cancel-" + cancelled.CallID, Kind: effects.ReceiptQuiesceCancel, Class: effects.Cancelable,
			StartedAt: cancelled.StartedAt, FinishedAt: a.c.cfg.Now(), Detail: "run cancelled by the module's retirement"})
	}
	if !step(ledger.PhaseQuiesce, r.txn.Quiesce) {
		return
	}
	if g.proc != nil && g.target.Plan.ProtocolVersion() == 2 {
		_ = r.check(ledger.PhaseSnapshot)
		if st, err := g.proc.Snapshot(r.ctx, g.lineage); err == nil {
			if _, err := a.storeSnapshot(g, st, SnapshotRetirement); err == nil {
				a.mu.Lock()
				g.stateDigest = st.StateSHA256
				a.mu.Unlock()
				if !step(ledger.PhaseSnapshot, func() error { return r.txn.Snapshot(st.StateSHA256) }) {
					return
				}
			}
		}
		// A snapshot that fails is skipped: the optional snapshot phase of
		// a retirement never keeps a process alive.
	}
	_ = r.check(ledger.PhaseDrain)
	a.mu.Lock()
	m.active = nil
	a.mu.Unlock()
	cleanup := a.drain(g, "retirement")
	m.dispatcher.Close()
	record := r.txn.Drain
	if cleanup != "" {
		record = func() error { return r.txn.DrainCleanupFailed(cleanup) }
	}
	if !step(ledger.PhaseDrain, record) {
		return
	}
	if !step(ledger.PhaseCommitted, r.txn.Commit) {
		return
	}
	a.mu.Lock()
	g.step = iteronv1.StepCommitted
	delete(a.modules, m.name)
	a.mu.Unlock()
	a.log("module retired", "module", m.name, "generation", g.name)
}

// forceRetireAll reaps every module's process without a ledger and marks
// the activation removed.
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
		a.mu.Unlock()
		if g != nil {
			a.forceRetire(m, g)
		} else {
			m.dispatcher.Close()
			a.mu.Lock()
			delete(a.modules, m.name)
			a.mu.Unlock()
		}
	}
	a.mu.Lock()
	a.removed = true
	a.mu.Unlock()
	a.notify()
}

// forceRetire reaps a module's process without a ledger (the ledger is
// unusable): a process is never left behind.
func (a *activationRuntime) forceRetire(m *moduleRuntime, g *generationRuntime) {
	a.mu.Lock()
	m.active = nil
	a.mu.Unlock()
	a.drain(g, "retirement")
	m.dispatcher.Close()
	a.mu.Lock()
	delete(a.modules, m.name)
	a.mu.Unlock()
}

// storeSnapshot makes a generation's state durable under the state dir.
func (a *activationRuntime) storeSnapshot(g *generationRuntime, st State, kind string) (string, error) {
	return a.c.snapshots.Put(a.key.UID, StoredSnapshot{
		Module: g.module, ImplementationID: st.ImplementationID, Lineage: int64(st.Generation), StateSchema: st.StateSchema,
		StateSHA256: st.StateSHA256, Kind: kind, TakenUnixMs: a.c.cfg.Now().UnixMilli(), State: json.RawMessage(st.State),
	})
}

// recordReceipt stores a receipt for a generation.
func (a *activationRuntime) recordReceipt(g *generationRuntime, rc effects.Receipt) {
	rc.Owner = a.key.Namespace + "/" + a.key.Name
	rc.Generation = g.name
	rc.Component = g.module
	if err := a.c.receipts.Record(rc); err != nil {
		a.log("receipt not recorded", "generation", g.name, "error", err.Error())
	}
}
