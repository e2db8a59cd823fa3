package hotswap

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// Crash and renewal policy (DESIGN §7, §8).
const (
	// CrashBudget crashes within CrashWindow make a generation Failed.
	CrashBudget = 5
	// CrashWindow is the window of CrashBudget.
	CrashWindow = 10 * time.Minute
	// firstRelaunchBackoff doubles per crash in the window, up to
	// maxRelaunchBackoff.
	firstRelaunchBackoff = 500 * time.Millisecond
	maxRelaunchBackoff   = 30 * time.Second
	// renewalStdinReserve and renewalStateOpsReserve: a process is renewed
	// before its stdin or state-operation budget falls below these (a frame
	// is at most 1 MiB; a renewal and a checkpoint each need a state
	// operation of the old process).
	renewalStdinReserve    = 2 << 20
	renewalStateOpsReserve = 4
	// startRequestOverhead bounds a start request's bytes besides its run
	// ID and input (contract references, candidate digest, deadline).
	startRequestOverhead = 4 << 10
	// renewalRetryDelay spaces renewal attempts that failed before the switch.
	renewalRetryDelay = 5 * time.Second
	// checkpointIdleWait bounds how long a checkpoint waits for the run slot
	// to empty before it skips this round.
	checkpointIdleWait = 2 * time.Second
	// CheckpointsKept is how many checkpoints are kept per module.
	CheckpointsKept = 3
)

// CommittedGeneration is a module's last committed generation as the ledger
// records it: what a restarted manager relaunches.
type CommittedGeneration struct {
	// Name is the Generation object's name.
	Name string
	// Lineage and Attempt identify it.
	Lineage int64
	Attempt int32
	// ImplementationID, ArtifactSHA256 and AuthoritySHA256 are what ran.
	ImplementationID, ArtifactSHA256, AuthoritySHA256 string
}

// moduleDurability is the crash, renewal and checkpoint state of a module.
type moduleDurability struct {
	crashes       []time.Time
	relaunchAt    time.Time // zero: no relaunch pending
	renewNow      bool      // a queued call did not fit: renew on demand
	renewRetryAt  time.Time
	checkpointDue time.Time
	committed     *CommittedGeneration // recovered from the ledger, not running
	// committedFailure refuses the committed generation's relaunch until
	// the spec changes (its re-intersected authority changed).
	committedFailure *Failure
}

// watchProcess marks the generation crashed if its process exits while it
// is the module's active one and nobody stopped it.
func (a *activationRuntime) watchProcess(m *moduleRuntime, g *generationRuntime, proc Provider) {
	go func() {
		<-proc.Exited()
		tail, dropped := proc.StderrTail()
		a.mu.Lock()
		crashed := m.active == g && g.proc == proc && !a.stopping
		if crashed {
			g.stderrTail, g.stderrDropped = tail, dropped
			a.noteCrash(m, g)
		}
		a.mu.Unlock()
		if crashed {
			a.poke()
			a.notify(g.name)
		}
	}()
}

// noteCrash records a crash of the active generation. Caller holds a.mu.
func (a *activationRuntime) noteCrash(m *moduleRuntime, g *generationRuntime) {
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
		g.phase = iteronv1.PhaseFailed
		g.reason = reasons.ProviderFailed
		g.message = truncateMessage(fmt.Sprintf("%s crashed %d times in %s; not relaunched again (stderr tail in status)", g.name, len(d.crashes), CrashWindow))
		a.failed[g.name] = Failure{Module: m.name, GenerationName: g.name, Code: g.reason, Message: g.message}
		d.relaunchAt = time.Time{}
		a.log("crash budget exhausted", "module", m.name, "generation", g.name, "crashes", len(d.crashes))
		return
	}
	backoff := firstRelaunchBackoff << (len(d.crashes) - 1)
	d.relaunchAt = now.Add(min(backoff, maxRelaunchBackoff))
	g.phase, g.reason = iteronv1.PhasePreparing, reasons.ProviderFailed
	g.message = truncateMessage(fmt.Sprintf("the provider process exited (crash %d of %d allowed in %s); relaunching in %s", len(d.crashes), CrashBudget, CrashWindow, min(backoff, maxRelaunchBackoff)))
	a.log("provider crashed", "module", m.name, "generation", g.name, "relaunchIn", min(backoff, maxRelaunchBackoff))
}

// durabilityWork runs one due relaunch, renewal or checkpoint (only a
// relaunch when relaunchOnly), and reports whether it did something; next is
// when something will be due.
func (a *activationRuntime) durabilityWork(d *Desired, relaunchOnly bool) (did bool, next time.Time) {
	now := a.c.cfg.Now()
	a.mu.Lock()
	var relaunch, renew, checkpoint *moduleRuntime
	for _, name := range sortedModuleNames(a.modules) {
		m := a.modules[name]
		g := m.active
		if g == nil {
			continue
		}
		md := &m.dur
		switch {
		case g.proc == nil && !md.relaunchAt.IsZero():
			if !now.Before(md.relaunchAt) {
				relaunch = pick(relaunch, m)
			} else {
				next = earliest(next, md.relaunchAt)
			}
			continue
		case g.proc == nil || g.phase != iteronv1.PhaseActive || relaunchOnly:
			continue
		}
		if due, at := a.renewalDue(m, g, d); due {
			if now.Before(md.renewRetryAt) {
				next = earliest(next, md.renewRetryAt)
			} else {
				renew = pick(renew, m)
			}
		} else {
			next = earliest(next, at)
		}
		if d != nil && d.CheckpointInterval > 0 && g.target.Plan.ProtocolVersion() == 2 {
			if md.checkpointDue.IsZero() {
				md.checkpointDue = now.Add(d.CheckpointInterval)
			}
			if !now.Before(md.checkpointDue) {
				checkpoint = pick(checkpoint, m)
			} else {
				next = earliest(next, md.checkpointDue)
			}
		}
	}
	a.mu.Unlock()
	switch {
	case relaunch != nil:
		a.relaunch(d, relaunch)
		return true, next
	case renew != nil:
		a.renew(d, renew)
		return true, next
	case checkpoint != nil:
		a.checkpoint(d, checkpoint)
		return true, next
	}
	return false, next
}

func sortedModuleNames(m map[string]*moduleRuntime) []string {
	return slices.Sorted(maps.Keys(m))
}

func pick(cur, m *moduleRuntime) *moduleRuntime {
	if cur == nil {
		return m
	}
	return cur
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// renewalMargin is the lifetime a renewal needs: the swap deadline plus the
// quiesce timeout.
func renewalMargin(d *Desired, runtimeDeadline time.Duration) time.Duration {
	if d == nil {
		return 0
	}
	// A process lives at most its runtime deadline. A margin as long as
	// that would make every process due for renewal as soon as it starts
	// (a renewal storm): half the lifetime is the most a renewal is given.
	return min(d.Swap.Deadline+d.Swap.QuiesceTimeout, runtimeDeadline/2)
}

// renewalDue reports whether the active process must be renewed now, and
// otherwise when it will be. Caller holds a.mu.
func (a *activationRuntime) renewalDue(m *moduleRuntime, g *generationRuntime, d *Desired) (bool, time.Time) {
	b := g.proc.Budget()
	margin := renewalMargin(d, g.target.Plan.RuntimeDeadline())
	if m.dur.renewNow || b.Lifetime <= margin || b.StdinBytes < renewalStdinReserve || b.StateOperations < renewalStateOpsReserve {
		return true, time.Time{}
	}
	return false, a.c.cfg.Now().Add(b.Lifetime - margin)
}

// activate marks a generation Active on a module with a fresh process: the
// crash watch, the renewal margin and the on-demand renewal hook. Caller
// holds a.mu.
func (a *activationRuntime) activate(m *moduleRuntime, g *generationRuntime, d *Desired) {
	m.active = g
	g.phase, g.reason, g.message = iteronv1.PhaseActive, "", ""
	if g.activatedAt.IsZero() {
		g.activatedAt = a.c.cfg.Now()
	}
	m.dur.renewNow = false
	m.dur.committed = nil
	if g.proc != nil {
		g.proc.SetRenewalMargin(renewalMargin(d, g.target.Plan.RuntimeDeadline()))
		if g.watched != g.proc {
			g.watched = g.proc
			a.watchProcess(m, g, g.proc)
		}
	}
	m.dispatcher.SetOnNoFit(func() {
		a.mu.Lock()
		m.dur.renewNow = true
		a.mu.Unlock()
		a.poke()
	})
}

// relaunch restarts a crashed active generation (a relaunch transaction):
// verify → shadow_load → [restore → readiness] → atomic_switch → committed,
// restoring the newest durable snapshot of its lineage.
func (a *activationRuntime) relaunch(d *Desired, m *moduleRuntime) {
	a.mu.Lock()
	g := m.active
	g.rCount++
	renewal := g.rCount
	m.dur.relaunchAt = time.Time{}
	a.mu.Unlock()
	if d == nil {
		d = &Desired{Key: a.key, Swap: SwapPolicy{Deadline: 30 * time.Second}}
	}
	pf := a.runRelaunch(d, m, g, renewal, g.committedAuthority)
	if pf != nil {
		a.mu.Lock()
		// A relaunch that fails counts as a crash.
		if m.active == g && g.proc == nil {
			a.noteCrashOf(m, g, pf)
		}
		a.mu.Unlock()
	}
}

// noteCrashOf records a failed relaunch as a crash. Caller holds a.mu.
func (a *activationRuntime) noteCrashOf(m *moduleRuntime, g *generationRuntime, pf *phaseFailure) {
	a.noteCrash(m, g)
	if g.phase == iteronv1.PhaseFailed {
		g.message = truncateMessage(g.message + "; last failure: " + pf.message)
	}
}

// runRelaunch runs the relaunch transaction of g. authority, when set, is
// the authority the ledger committed: a plan whose re-intersected authority
// differs is refused.
func (a *activationRuntime) runRelaunch(d *Desired, m *moduleRuntime, g *generationRuntime, renewal uint64, authority string) *phaseFailure {
	r, err := a.begin(ledger.KindRelaunch, m, g, nil, renewal, d)
	if err != nil {
		a.log("cannot begin a relaunch", "module", m.name, "error", err.Error())
		return &phaseFailure{ledger.PhaseVerify, reasons.LedgerCorrupt, err.Error()}
	}
	defer r.cancel()
	plan := g.target.Plan
	if err := r.check(ledger.PhaseVerify); err != nil {
		pf := fail(ledger.PhaseVerify, err, reasons.DeadlineExceeded)
		r.abortRelaunch(pf)
		return pf
	}
	if authority != "" && plan.AuthoritySHA256() != authority {
		pf := &phaseFailure{ledger.PhaseVerify, reasons.AuthorityChanged, fmt.Sprintf("the node's capability ceiling changed: admitted capabilities are now %v (authority %s), the ledger committed %s", plan.AdmittedCapabilities(), plan.AuthoritySHA256(), authority)}
		r.abortRelaunch(pf)
		return pf
	}
	if err := r.txn.Verify(); err != nil {
		r.ledgerFailure(err)
		return &phaseFailure{ledger.PhaseVerify, reasons.LedgerCorrupt, err.Error()}
	}
	r.recorded(ledger.PhaseVerify)
	if err := r.check(ledger.PhaseShadowLoad); err != nil {
		pf := fail(ledger.PhaseShadowLoad, err, reasons.DeadlineExceeded)
		r.abortRelaunch(pf)
		return pf
	}
	g.scope = effects.NewScope(g.name)
	if err := r.launch(g); err != nil {
		pf := fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
		r.abortRelaunch(pf)
		return pf
	}
	if err := r.txn.ShadowLoad(); err != nil {
		r.ledgerFailure(err)
		_ = g.scope.Dispose(context.Background())
		return &phaseFailure{ledger.PhaseShadowLoad, reasons.LedgerCorrupt, err.Error()}
	}
	r.recorded(ledger.PhaseShadowLoad)
	if plan.ProtocolVersion() == 2 {
		snap, ok, err := a.newestSnapshot(m.name, g)
		if err != nil {
			pf := &phaseFailure{ledger.PhaseRestore, reasons.VerificationFailed, "the newest durable snapshot is unreadable: " + err.Error()}
			r.abortRelaunch(pf)
			return pf
		}
		if ok {
			st := snap.protocolState()
			if err := r.check(ledger.PhaseRestore); err != nil {
				pf := fail(ledger.PhaseRestore, err, reasons.DeadlineExceeded)
				r.abortRelaunch(pf)
				return pf
			}
			if err := g.proc.Restore(r.ctx, st); err != nil {
				pf := fail(ledger.PhaseRestore, err, reasons.ProviderFailed)
				r.abortRelaunch(pf)
				return pf
			}
			if err := r.txn.Restore(st.StateSHA256); err != nil {
				r.ledgerFailure(err)
				_ = g.scope.Dispose(context.Background())
				return &phaseFailure{ledger.PhaseRestore, reasons.LedgerCorrupt, err.Error()}
			}
			a.mu.Lock()
			g.stateDigest = st.StateSHA256
			a.mu.Unlock()
			r.recorded(ledger.PhaseRestore)
			if err := r.check(ledger.PhaseReadiness); err != nil {
				pf := fail(ledger.PhaseReadiness, err, reasons.DeadlineExceeded)
				r.abortRelaunch(pf)
				return pf
			}
			if err := g.proc.Readiness(r.ctx, g.lineage, st.StateSHA256); err != nil {
				pf := fail(ledger.PhaseReadiness, err, reasons.ProviderFailed)
				r.abortRelaunch(pf)
				return pf
			}
			if err := r.txn.Readiness(); err != nil {
				r.ledgerFailure(err)
				_ = g.scope.Dispose(context.Background())
				return &phaseFailure{ledger.PhaseReadiness, reasons.LedgerCorrupt, err.Error()}
			}
			r.recorded(ledger.PhaseReadiness)
		}
	}
	if err := r.check(ledger.PhaseAtomicSwitch); err != nil {
		pf := fail(ledger.PhaseAtomicSwitch, err, reasons.DeadlineExceeded)
		r.abortRelaunch(pf)
		return pf
	}
	_, _ = m.dispatcher.Pause(r.ctx, 0)
	if _, err := m.dispatcher.Switch(a.route(g)); err != nil {
		pf := fail(ledger.PhaseAtomicSwitch, err, reasons.ActivationFailed)
		r.abortRelaunch(pf)
		return pf
	}
	if err := r.txn.AtomicSwitch(); err != nil {
		r.ledgerFailure(err)
		_ = g.scope.Dispose(context.Background())
		return &phaseFailure{ledger.PhaseAtomicSwitch, reasons.LedgerCorrupt, err.Error()}
	}
	a.mu.Lock()
	a.activate(m, g, d)
	a.mu.Unlock()
	m.dispatcher.Resume()
	r.recorded(ledger.PhaseAtomicSwitch)
	if err := r.txn.Commit(); err != nil {
		r.ledgerFailure(err)
		return nil
	}
	a.mu.Lock()
	g.step = iteronv1.StepCommitted
	a.mu.Unlock()
	r.recorded(ledger.PhaseCommitted)
	a.log("generation relaunched", "module", m.name, "generation", g.name, "pid", g.proc.Pid(), "restored", g.stateDigest)
	return nil
}

// abortRelaunch records a relaunch that cannot continue; the generation
// stays without a process (the crash path decides what next).
func (r *txnRun) abortRelaunch(pf *phaseFailure) {
	r.captureStderr(r.gen)
	if r.gen.scope != nil {
		_ = r.gen.scope.Dispose(context.Background())
	}
	if err := r.block(pf); err != nil {
		r.ledgerFailure(err)
	} else if err := r.txn.RollBack(); err != nil {
		r.ledgerFailure(err)
	}
	r.a.mu.Lock()
	r.gen.proc = nil
	r.gen.reason, r.gen.message = string(pf.code), truncateMessage(fmt.Sprintf("relaunch of %s failed at %s: %s", r.gen.name, pf.phase, pf.message))
	r.a.mu.Unlock()
	r.recorded(ledger.PhaseRolledBack)
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

// renew moves the active generation into a fresh process (a renewal
// transaction): same implementation, same lineage, same Generation object.
// v2: verify → shadow_load → quiesce → snapshot → restore → readiness →
// atomic_switch → drain → committed; v1: the cold-replace phases.
func (a *activationRuntime) renew(d *Desired, m *moduleRuntime) {
	a.mu.Lock()
	g := m.active
	oldProc := g.proc
	g.rCount++
	renewal := g.rCount
	m.dur.renewNow = false
	a.mu.Unlock()
	if d == nil || oldProc == nil {
		return
	}
	r, err := a.begin(ledger.KindRenewal, m, g, g, renewal, d)
	if err != nil {
		a.log("cannot begin a renewal", "module", m.name, "error", err.Error())
		return
	}
	defer r.cancel()
	v2 := g.target.Plan.ProtocolVersion() == 2
	fresh := &generationRuntime{name: g.name, module: m.name, lineage: g.lineage, attempt: g.attempt, target: g.target, scope: effects.NewScope(g.name + "/renewal")}
	failBefore := func(pf *phaseFailure) {
		_ = fresh.scope.Dispose(context.Background())
		if err := r.block(pf); err != nil {
			r.ledgerFailure(err)
		} else if err := r.txn.RollBack(); err != nil {
			r.ledgerFailure(err)
		}
		m.dispatcher.Resume()
		a.mu.Lock()
		m.dur.renewRetryAt = a.c.cfg.Now().Add(renewalRetryDelay)
		a.mu.Unlock()
		r.recorded(ledger.PhaseRolledBack)
		a.log("renewal rolled back", "module", m.name, "generation", g.name, "phase", pf.phase, "reason", pf.code, "message", pf.message)
	}
	step := func(phase ledger.Phase, do func() error, fallback ledger.ReasonCode, record func() error) bool {
		if err := r.check(phase); err != nil {
			failBefore(fail(phase, err, reasons.DeadlineExceeded))
			return false
		}
		if do != nil {
			if err := do(); err != nil {
				failBefore(fail(phase, err, fallback))
				return false
			}
		}
		if err := record(); err != nil {
			r.ledgerFailure(err)
			_ = fresh.scope.Dispose(context.Background())
			m.dispatcher.Resume()
			return false
		}
		r.recorded(phase)
		return true
	}
	var st State
	ok := step(ledger.PhaseVerify, nil, "", r.txn.Verify) &&
		step(ledger.PhaseShadowLoad, func() error { return r.launch(fresh) }, reasons.ActivationFailed, r.txn.ShadowLoad) &&
		step(ledger.PhaseQuiesce, func() error {
			cancelled, err := m.dispatcher.Pause(r.ctx, d.Swap.QuiesceTimeout)
			if cancelled != nil {
				a.recordReceipt(g, effects.Receipt{ID: fmt.Sprintf("quiesce-cancel-%s-r%d", cancelled.CallID, renewal), Kind: effects.ReceiptQuiesceCancel, Class: effects.Cancelable,
					StartedAt: cancelled.StartedAt, FinishedAt: a.c.cfg.Now(), Detail: "run cancelled by a renewal's quiesce timeout"})
			}
			return err
		}, reasons.DeadlineExceeded, r.txn.Quiesce)
	if ok && v2 {
		ok = step(ledger.PhaseSnapshot, func() error {
			var err error
			if st, err = oldProc.Snapshot(r.ctx, g.lineage); err != nil {
				return err
			}
			_, err = a.storeSnapshot(g, st, SnapshotCheckpoint)
			return err
		}, reasons.ProviderFailed, func() error { return r.txn.Snapshot(st.StateSHA256) }) &&
			step(ledger.PhaseRestore, func() error { return fresh.proc.Restore(r.ctx, st) }, reasons.ProviderFailed, func() error { return r.txn.Restore(st.StateSHA256) }) &&
			step(ledger.PhaseReadiness, func() error { return fresh.proc.Readiness(r.ctx, g.lineage, st.StateSHA256) }, reasons.ProviderFailed, r.txn.Readiness)
	}
	if !ok {
		return
	}
	if err := r.check(ledger.PhaseAtomicSwitch); err != nil {
		failBefore(fail(ledger.PhaseAtomicSwitch, err, reasons.DeadlineExceeded))
		return
	}
	freshRoute := Route{Lineage: g.lineage, Name: g.name, Epoch: g.target.Epoch, Backend: fresh.proc}
	if _, err := m.dispatcher.Switch(freshRoute); err != nil {
		failBefore(fail(ledger.PhaseAtomicSwitch, err, reasons.ActivationFailed))
		return
	}
	if err := r.txn.AtomicSwitch(); err != nil {
		r.ledgerFailure(err)
		_, _ = m.dispatcher.Switch(a.route(g))
		_ = fresh.scope.Dispose(context.Background())
		m.dispatcher.Resume()
		return
	}
	oldScope := g.scope
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
	r.recorded(ledger.PhaseAtomicSwitch)

	// drain the old process.
	stopCtx, cancel := context.WithTimeout(context.Background(), g.target.Plan.CancellationDeadline()+time.Second)
	err = oldProc.Stop(stopCtx, "renewed: a fresh process of the same generation serves")
	cancel()
	_ = oldScope.Dispose(context.Background())
	if err != nil {
		note := fmt.Sprintf("the renewed process of %s did not stop within its cancellation deadline and was killed: %s", g.name, firstLine(err.Error()))
		a.recordReceipt(g, effects.Receipt{ID: fmt.Sprintf("drain-timeout-r%d", renewal), Kind: effects.ReceiptDrainTimeout, Class: effects.Cancelable, FinishedAt: a.c.cfg.Now(), Detail: note})
		err = r.txn.DrainCleanupFailed(note)
	} else {
		err = r.txn.Drain()
	}
	if err != nil {
		r.ledgerFailure(err)
		return
	}
	r.recorded(ledger.PhaseDrain)
	if err := r.txn.Commit(); err != nil {
		r.ledgerFailure(err)
		return
	}
	a.mu.Lock()
	g.renewals++
	g.step = iteronv1.StepCommitted
	a.mu.Unlock()
	a.countRenewal(m.name)
	r.recorded(ledger.PhaseCommitted)
	a.log("process renewed", "module", m.name, "generation", g.name, "renewal", g.renewals, "pid", fresh.proc.Pid())
}

// checkpoint makes the active generation's state durable between runs.
func (a *activationRuntime) checkpoint(d *Desired, m *moduleRuntime) {
	a.mu.Lock()
	g := m.active
	proc := g.proc
	m.dur.checkpointDue = a.c.cfg.Now().Add(d.CheckpointInterval)
	a.mu.Unlock()
	if proc == nil {
		return
	}
	if err := a.takeCheckpoint(m, g, proc, checkpointIdleWait); err != nil {
		a.log("checkpoint skipped", "module", m.name, "generation", g.name, "error", err.Error())
	}
}

// takeCheckpoint pauses the module between runs, snapshots its state, makes
// it durable and resumes.
func (a *activationRuntime) takeCheckpoint(m *moduleRuntime, g *generationRuntime, proc Provider, idleWait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.target.Plan.RuntimeDeadline())
	defer cancel()
	wasPaused := m.dispatcher.Paused()
	if !m.dispatcher.PauseWhenIdle(ctx, idleWait) {
		return fmt.Errorf("a run kept the slot busy for %s", idleWait)
	}
	if !wasPaused {
		defer m.dispatcher.Resume()
	}
	st, err := proc.Snapshot(ctx, g.lineage)
	if err != nil {
		return err
	}
	if _, err := a.storeSnapshot(g, st, SnapshotCheckpoint); err != nil {
		return err
	}
	_ = a.c.snapshots.Prune(a.key.UID, m.name, SnapshotCheckpoint, CheckpointsKept)
	a.mu.Lock()
	g.stateDigest = st.StateSHA256
	g.checkpoint = &CheckpointInfo{StateSHA256: st.StateSHA256, At: a.c.cfg.Now()}
	a.mu.Unlock()
	a.notify(g.name)
	return nil
}

// recoverFromLedger learns, from a ledger opened after a restart, each
// module's last committed generation (to relaunch it), the /r<n> numbers
// already used, and the attempts that failed (never retried for the same
// spec). Caller holds a.mu.
func (a *activationRuntime) recoverFromLedger(led *ledger.Ledger) error {
	st := led.State()
	for module, c := range st.LastCommitted {
		if c.Generation == 0 || c.Kind == ledger.KindRetirement {
			continue
		}
		id, err := ledger.ParseTransactionID(c.TransactionID)
		if err != nil {
			return err
		}
		m := a.module(module)
		m.dur.committed = &CommittedGeneration{
			Name:    iteronv1.GenerationName(a.key.Name, module, int64(c.Generation), int32(id.Attempt())),
			Lineage: int64(c.Generation), Attempt: int32(id.Attempt()),
			ImplementationID: c.ImplementationID, ArtifactSHA256: c.ArtifactSHA256, AuthoritySHA256: c.AuthoritySHA256,
		}
	}
	if st.Records == 0 {
		return nil
	}
	type txnSeen struct {
		name     string
		blocked  *ledger.Record
		kind     string
		terminal ledger.Outcome
	}
	txns := map[string]*txnSeen{}
	_, err := ledger.Replay(led.Dir(), ledger.VerifyOptions{}, func(r *ledger.Record) error {
		id, err := ledger.ParseTransactionID(r.TransactionID)
		if err != nil {
			return err
		}
		name := iteronv1.GenerationName(a.key.Name, r.Module, int64(id.Lineage()), int32(id.Attempt()))
		a.rCounts[name] = max(a.rCounts[name], id.Renewal())
		t, ok := txns[r.TransactionID]
		if !ok {
			t = &txnSeen{name: name}
			txns[r.TransactionID] = t
		}
		if r.Outcome == ledger.OutcomeBlocked {
			rec := *r
			t.blocked = &rec
		}
		if r.Phase == ledger.PhaseRolledBack && id.Renewal() == 0 && r.NewGeneration != 0 {
			// A first activation, hot swap or cold replace that rolled back:
			// that attempt failed.
			code, msg := "provider_failed", ""
			if t.blocked != nil && t.blocked.Reason != nil {
				code, msg, _ = strings.Cut(*t.blocked.Reason, ": ")
			}
			a.failed[name] = Failure{Module: r.Module, GenerationName: name, Code: code, Message: truncateMessage(msg),
				Retryable: msg == ledger.RecoveryMessage}
		}
		return nil
	})
	return err
}
