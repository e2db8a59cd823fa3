package hotswap

import (
	"context"
	"errors"
	"fmt"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// Every transaction kind — first activation, hot swap, cold replace,
// renewal, relaunch, retirement — is a list of phases run by one runner
// with one failure policy:
//
//   - before each phase the transaction's deadline is checked (phases after
//     the switch always run: the transaction can only finish or roll back);
//   - the phase's work runs, then its record is appended durably, then what
//     the record makes true is applied in memory;
//   - work that fails before the switch ends the transaction with blocked +
//     rolled_back: what the transaction started is disposed and what served
//     before serves again; after the switch the kind's rollback runs (a swap
//     returns to its old generation), or, for a kind with nothing to return
//     to, the failure cannot happen;
//   - a record that cannot be appended (disk full, I/O error) ends the
//     transaction the same way, except that nothing more can be recorded:
//     the ledger is frozen, the activation is ledger_unwritable, and the
//     records that close the transaction truthfully are written once the
//     ledger accepts appends again (see ledger_health.go). A record that
//     could not be appended after work that cannot be undone (a drain
//     stopped the old process, a committed record after a durable drain)
//     closes the transaction forward instead.

// phaseFailure is a transaction that cannot continue at a phase.
type phaseFailure struct {
	phase   ledger.Phase
	code    ledger.ReasonCode
	message string
}

func (f *phaseFailure) Error() string {
	return fmt.Sprintf("%s at %s: %s", f.code, f.phase, f.message)
}

// fail turns a provider or host error at a phase into a phaseFailure.
func fail(phase ledger.Phase, err error, fallback ledger.ReasonCode) *phaseFailure {
	var pf *phaseFailure
	if errors.As(err, &pf) {
		return pf
	}
	return &phaseFailure{phase: phase, code: codeOf(err, fallback), message: firstLine(err.Error())}
}

// phase is one step of a transaction: its work, then its durable record.
type phase struct {
	name ledger.Phase
	// skip, when it reports true, leaves the phase out (the optional
	// restore and readiness of a relaunch without a snapshot, the optional
	// snapshot of a retirement).
	skip func() bool
	// work does the phase. Its error fails the transaction at this phase
	// with the error's reason, or fallback when it carries none.
	work     func() error
	fallback ledger.ReasonCode
	// record appends the phase's record; nil appends the plain record.
	record func() error
	// undo reverts the work when its record cannot be appended and the
	// transaction goes back (the in-memory switch).
	undo func()
	// final marks work that cannot be undone (a drain stopped the old
	// process): a record that fails after it closes the transaction forward
	// unless the kind has a rollback.
	final bool
	// durable applies what the record makes true, once it is durable.
	durable func()
	// touched are other generations whose ledger position the record moves.
	touched []*generationRuntime
}

// errSkipPhase, returned by the work of an optional phase, leaves the phase
// out instead of failing the transaction.
var errSkipPhase = errors.New("optional phase skipped")

// transaction is a kind's phases and its part of the failure policy.
type transaction struct {
	kind   ledger.Kind
	phases []phase
	// rollback returns to what served before, after a durable switch (the
	// post-switch rollback of a swap). nil for kinds that go forward.
	rollback func(pf *phaseFailure) error
	// failed does the kind's bookkeeping of a failure, after the common
	// policy disposed what the transaction started and restored service:
	// mark the generation Failed, count a crash, schedule a retry.
	// afterSwitch says the kind's rollback ran; rollbackErr is why it could
	// not restore what served before.
	failed func(pf *phaseFailure, afterSwitch bool, rollbackErr error)
	// forward applies in memory what a transaction closed forward (its
	// remaining records written later) makes true.
	forward func()
	// noDeadline runs every phase whatever the time (a retirement must
	// always finish: it never keeps a process alive).
	noDeadline bool
}

// txnRun is one transaction in progress: its ledger handle, deadline and
// the generations it is about.
type txnRun struct {
	a   *activationRuntime
	m   *moduleRuntime
	txn *ledger.Txn
	// gen is the generation the transaction is about.
	gen *generationRuntime
	// fresh is the scope of what the transaction starts (the new or the
	// renewed process); disposed when it fails before its switch.
	fresh func() *effects.EffectScope
	// serving is the route that serves until the switch (nil: nothing
	// served before); restored when the transaction fails before it.
	serving func() *dispatch.Route
	// blocked is the reason code the transaction was blocked with.
	blocked  string
	deadline time.Time
	// lastAt is when the previous record of the transaction was durable.
	lastAt  time.Time
	desired *Desired
	ctx     context.Context
	cancel  context.CancelFunc
	// trace is the transaction's trace (nil while tracing is off).
	trace *txnTrace
}

// begin opens a ledger transaction. A ledger that refuses is reported to
// the caller; nothing has started yet.
func (a *activationRuntime) begin(kind ledger.Kind, m *moduleRuntime, gen *generationRuntime, old *generationRuntime, renewal uint64, d *Desired) (*txnRun, error) {
	id, err := ledger.NewTransactionID(a.key.UID, m.name, uint64(gen.lineage), uint64(gen.attempt), renewal)
	if err != nil {
		return nil, err
	}
	spec := ledger.TxnSpec{Kind: kind, ID: id, CandidateSHA256: d.CandidateSHA256, AuthoritySHA256: gen.authority(), DeadlineMs: uint64(max(d.Swap.Deadline.Milliseconds(), 1))}
	if kind != ledger.KindRetirement {
		spec.New = gen.ref()
	}
	if old != nil {
		spec.Old = old.ref()
	}
	a.mu.Lock()
	led := a.led
	a.mu.Unlock()
	if led == nil {
		return nil, errors.New("the ledger is not open")
	}
	txn, err := led.Begin(spec)
	if err != nil {
		return nil, err
	}
	tr := a.startTxnTrace(kind, id.String(), gen, d)
	parent := context.Background()
	if tr != nil {
		parent = tr.ctx
	}
	ctx, cancel := context.WithDeadline(parent, a.c.cfg.Now().Add(d.Swap.Deadline))
	dl, _ := ctx.Deadline()
	a.mu.Lock()
	gen.txnID = id.String()
	if kind != ledger.KindRenewal {
		// Status is not at rest while a transaction runs (a renewal is
		// routine and changes nothing a reader waits for).
		a.busy = true
	}
	a.mu.Unlock()
	return &txnRun{a: a, m: m, txn: txn, gen: gen, deadline: dl, lastAt: a.c.cfg.Now(), desired: d, ctx: ctx, cancel: cancel, trace: tr,
		fresh: func() *effects.EffectScope { return nil }, serving: func() *dispatch.Route { return nil }}, nil
}

// run runs the transaction's phases and applies the failure policy. It
// reports whether the transaction committed.
func (r *txnRun) run(t *transaction) bool {
	defer r.cancel()
	defer func() { r.trace.end(r.txn.Outcome(), r.txn.Last()) }()
	final := false
	for i := range t.phases {
		p := &t.phases[i]
		if p.skip != nil && p.skip() {
			continue
		}
		if !t.noDeadline && !r.txn.Switched() && !final {
			if !r.a.c.cfg.Now().Before(r.deadline) {
				pf := &phaseFailure{p.name, reasons.DeadlineExceeded, "the transaction deadline passed before " + string(p.name)}
				r.trace.failed(pf)
				r.fail(t, pf)
				return false
			}
		}
		r.markStep(p.name)
		r.trace.startPhase(p.name)
		if p.work != nil {
			err := p.work()
			if errors.Is(err, errSkipPhase) {
				r.trace.endPhase()
				continue
			}
			if err != nil {
				pf := fail(p.name, err, p.fallback)
				r.trace.failed(pf)
				r.fail(t, pf)
				return false
			}
		}
		final = final || p.final
		record := p.record
		if record == nil {
			record = r.plainRecord(p.name)
		}
		if err := record(); err != nil {
			r.unwritable(t, p, final, err)
			return false
		}
		r.trace.recorded(r.txn.Last())
		if p.durable != nil {
			p.durable()
		}
		r.recorded(p.name, p.touched...)
	}
	return true
}

// plainRecord is the record of a phase that carries nothing but itself.
func (r *txnRun) plainRecord(name ledger.Phase) func() error {
	switch name {
	case ledger.PhaseVerify:
		return r.txn.Verify
	case ledger.PhaseShadowLoad:
		return r.txn.ShadowLoad
	case ledger.PhaseQuiesce:
		return r.txn.Quiesce
	case ledger.PhaseMigrate:
		return r.txn.Migrate
	case ledger.PhaseReadiness:
		return r.txn.Readiness
	case ledger.PhaseAtomicSwitch:
		return r.txn.AtomicSwitch
	case ledger.PhaseDrain:
		return r.txn.Drain
	case ledger.PhaseCommitted:
		return r.txn.Commit
	}
	return func() error { return fmt.Errorf("phase %s needs its own record", name) }
}

// fail is the failure policy for work that failed (the ledger still
// accepts appends).
func (r *txnRun) fail(t *transaction, pf *phaseFailure) {
	r.blocked = string(pf.code)
	if note := r.a.rollbackEvidence(r.gen); note != "" {
		// The blocked record and the Generation's status say what the
		// rollback cannot undo or cannot vouch for.
		pf.message = truncateMessage(pf.message + "; " + note)
	}
	r.captureStderr(r.gen)
	id := r.txn.Identity().TransactionID
	if !r.txn.Switched() || t.rollback == nil {
		if note := r.restoreService(); note != "" {
			// The blocked record says what could not be cleaned up too.
			pf.message = truncateMessage(pf.message + "; " + reasons.CleanupFailed + ": " + note)
		}
		if err := r.txn.Block(pf.phase, pf.code, pf.message); err != nil {
			r.a.closeLater(err, rolledBack(id, pf, false, nil))
		} else {
			r.trace.recorded(r.txn.Last())
			r.trace.startPhase(ledger.PhaseRolledBack)
			if err := r.txn.RollBack(); err != nil {
				r.a.closeLater(err, rolledBack(id, pf, false, nil))
			} else {
				r.trace.recorded(r.txn.Last())
			}
		}
		t.failed(pf, false, nil)
		r.recorded(ledger.PhaseRolledBack)
		return
	}
	// After the switch: the kind's rollback returns to what served before.
	blockErr := r.txn.Block(pf.phase, pf.code, pf.message)
	if blockErr == nil {
		r.trace.recorded(r.txn.Last())
	}
	r.trace.startPhase(ledger.PhaseRolledBack)
	rbErr := t.rollback(pf)
	end := r.txn.RollBack
	if rbErr != nil {
		end = r.txn.RollbackFailed
	}
	switch {
	case blockErr != nil:
		r.a.closeLater(blockErr, rolledBack(id, pf, true, rbErr))
	default:
		if err := end(); err != nil {
			r.a.closeLater(err, rolledBack(id, pf, true, rbErr))
		} else {
			r.trace.recorded(r.txn.Last())
		}
	}
	t.failed(pf, true, rbErr)
	r.recorded(ledger.PhaseRolledBack)
}

// unwritable is the failure policy for a record that could not be
// appended: nothing more can be recorded until the ledger is replayed. How
// the transaction ends is decided here and kept durably outside the ledger
// (pending.go), so that a replay — by the probe, or by a manager restarted
// before the disk is freed — closes it as it truly ended.
func (r *txnRun) unwritable(t *transaction, p *phase, final bool, err error) {
	pf := &phaseFailure{p.name, reasons.LedgerUnwritable, "the " + string(p.name) + " record could not be appended: " + firstLine(err.Error())}
	r.trace.failed(pf)
	r.blocked = string(pf.code)
	id := r.txn.Identity().TransactionID
	switched := r.txn.Switched()
	forward := func(why string) {
		// The work is done and cannot be undone: the transaction stands,
		// and its remaining records are written once the ledger accepts
		// appends again.
		if p.durable != nil {
			p.durable()
		}
		if t.forward != nil {
			t.forward()
		}
		r.a.closeLater(err, &pendingClose{TransactionID: id, Close: closeForwardHow})
		r.log("ledger append failed: the transaction stands and is closed forward once the ledger is writable", "module", r.m.name, "phase", p.name, "why", why, "error", err.Error())
	}
	switch {
	case p.name == ledger.PhaseCommitted || (switched || final) && t.rollback == nil:
		forward("past the point of no return")
	case switched || final:
		// After a durable switch the kind's rollback returns to what
		// served before — only if that decision can be kept durably: a
		// replay would otherwise close the transaction forward (its switch
		// is durable) while the old generation serves.
		intent := rolledBack(id, pf, true, nil)
		if werr := r.a.keepPending(intent); werr != nil {
			forward("the rollback could not be recorded outside the ledger either (" + firstLine(werr.Error()) + "): going forward keeps memory and a replay in agreement")
			break
		}
		r.captureStderr(r.gen)
		rbErr := t.rollback(pf)
		r.a.closeLater(err, rolledBack(id, pf, true, rbErr))
		t.failed(pf, true, rbErr)
	default:
		if p.undo != nil {
			p.undo()
		}
		r.captureStderr(r.gen)
		r.restoreService()
		r.a.closeLater(err, rolledBack(id, pf, false, nil))
		t.failed(pf, false, nil)
	}
	r.a.notifyGenerations(r.gen.name)
}

// restoreService disposes what the transaction started and lets what served
// before serve again. It returns the cleanup_failed note of that dispose,
// or "".
func (r *txnRun) restoreService() string {
	note := ""
	if s := r.fresh(); s != nil {
		note = r.a.dispose(r.gen, s, drainDeadline(r.gen))
	}
	// A switch that did not become durable was undone by its phase: the
	// route is what served before, which only needs to dispatch again.
	if route := r.serving(); route != nil {
		r.m.dispatcher.Resume()
	}
	return note
}

// markStep shows the phase in progress on the generation's status.
func (r *txnRun) markStep(phase ledger.Phase) {
	r.a.mu.Lock()
	if step := stepOf(phase); step != "" {
		r.gen.step = step
	}
	r.a.mu.Unlock()
	r.a.notifyGenerations(r.gen.name)
}

// recorded notes a durable record in the generations' status and runs the
// test hook.
func (r *txnRun) recorded(phase ledger.Phase, gens ...*generationRuntime) {
	now := r.a.c.cfg.Now()
	r.a.countAppend()
	r.a.observePhase(r.m.name, string(phase), now.Sub(r.lastAt))
	r.lastAt = now
	switch o := r.txn.Outcome(); {
	case phase == ledger.PhaseCommitted:
		r.a.countTransaction(r.m.name, "committed")
	case phase == ledger.PhaseRolledBack && o == ledger.OutcomeRollbackFailed:
		r.a.countTransaction(r.m.name, reasons.RollbackFailed)
	case phase == ledger.PhaseRolledBack:
		r.a.countTransaction(r.m.name, r.blockedCode())
	}
	last := r.txn.Last()
	r.a.mu.Lock()
	for _, g := range append(gens, r.gen) {
		g.txnID = r.txn.Identity().TransactionID
		g.lastSeq, g.lastHash = last.Sequence, last.RecordSHA256
	}
	r.a.mu.Unlock()
	if phase == ledger.PhaseCommitted || phase == ledger.PhaseRolledBack {
		// A transaction's end makes the receipts recorded so far durable
		// too (a module without checkpoints — protocol 1, or an interval
		// of 0 — has no other sync before the manager stops).
		r.a.syncReceipts()
	}
	names := []string{r.gen.name}
	for _, g := range gens {
		names = append(names, g.name)
	}
	// Notify first: a hook that holds the transaction (a test watching the
	// phases through the API) must not hold back the status they show.
	r.a.notifyGenerations(names...)
	if hook := r.a.c.cfg.AfterPhase; hook != nil {
		hook(r.a.key, r.m.name, string(phase))
	}
}

// blockedCode is the reason code of the transaction's blocked record.
func (r *txnRun) blockedCode() string {
	if r.blocked != "" {
		return r.blocked
	}
	return reasons.ProviderFailed
}

// phaseSteps names the Generation step of each ledger phase.
var phaseSteps = map[ledger.Phase]iteronv1.GenerationStep{
	ledger.PhaseVerify: iteronv1.StepVerify, ledger.PhaseShadowLoad: iteronv1.StepShadowLoad,
	ledger.PhaseQuiesce: iteronv1.StepQuiesce, ledger.PhaseSnapshot: iteronv1.StepSnapshot,
	ledger.PhaseMigrate: iteronv1.StepMigrate, ledger.PhaseRestore: iteronv1.StepRestore,
	ledger.PhaseReadiness: iteronv1.StepReadiness, ledger.PhaseAtomicSwitch: iteronv1.StepAtomicSwitch,
	ledger.PhaseDrain: iteronv1.StepDrain, ledger.PhaseCommitted: iteronv1.StepCommitted,
}

func stepOf(p ledger.Phase) iteronv1.GenerationStep { return phaseSteps[p] }
