package hotswap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// phaseFailure is a transaction that cannot continue at a phase.
type phaseFailure struct {
	phase   ledger.Phase
	code    ledger.ReasonCode
	message string
}

func (f *phaseFailure) Error() string {
	return fmt.Sprintf("%s at %s: %s", f.code, f.phase, f.message)
}

// txnRun is one transaction in progress: its ledger handle, deadline and
// the generation it is about.
type txnRun struct {
	a        *activationRuntime
	m        *moduleRuntime
	txn      *ledger.Txn
	gen      *generationRuntime
	deadline time.Time
	// blocked is the reason code the transaction was blocked with.
	blocked string
	// lastAt is when the previous record of the transaction was durable.
	lastAt  time.Time
	desired *Desired
	ctx     context.Context
	cancel  context.CancelFunc
}

// begin opens a ledger transaction. A ledger that refuses is fatal for the
// activation (ledger_corrupt or frozen): nothing else happens until an
// operator resolves it.
func (a *activationRuntime) begin(kind ledger.Kind, m *moduleRuntime, gen *generationRuntime, old *generationRuntime, renewal uint64, d *Desired) (*txnRun, error) {
	lineage, attempt := gen.lineage, gen.attempt
	id, err := ledger.NewTransactionID(a.key.UID, m.name, uint64(lineage), uint64(attempt), renewal)
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
	txn, err := led.Begin(spec)
	if err != nil {
		a.mu.Lock()
		a.ledgerErr = err
		a.mu.Unlock()
		return nil, err
	}
	ctx, cancel := context.WithDeadline(context.Background(), a.c.cfg.Now().Add(d.Swap.Deadline))
	dl, _ := ctx.Deadline()
	a.mu.Lock()
	gen.txnID = id.String()
	a.mu.Unlock()
	return &txnRun{a: a, m: m, txn: txn, gen: gen, deadline: dl, lastAt: a.c.cfg.Now(), desired: d, ctx: ctx, cancel: cancel}, nil
}

// ref is the generation as the ledger names it: from its plan, or from the
// ledger's own record for a committed generation with no plan in hand.
func (g *generationRuntime) ref() ledger.GenerationRef {
	if c := g.recovered; c != nil {
		return ledger.GenerationRef{Generation: uint64(g.lineage), ImplementationID: c.ImplementationID, ArtifactSHA256: c.ArtifactSHA256}
	}
	return ledger.GenerationRef{Generation: uint64(g.lineage), ImplementationID: g.target.Plan.ImplementationID(), ArtifactSHA256: g.target.Plan.ArtifactSHA256()}
}

// authority is the generation's authority digest.
func (g *generationRuntime) authority() string {
	if c := g.recovered; c != nil {
		return c.AuthoritySHA256
	}
	return g.target.Plan.AuthoritySHA256()
}

// check runs before each phase: the transaction's deadline.
func (r *txnRun) check(phase ledger.Phase) error {
	if !r.a.c.cfg.Now().Before(r.deadline) {
		return &phaseFailure{phase, reasons.DeadlineExceeded, "the transaction deadline passed before " + string(phase)}
	}
	r.a.mu.Lock()
	if step := stepOf(phase); step != "" {
		r.gen.step = step
	}
	r.a.mu.Unlock()
	r.a.notify(r.gen.name)
	return nil
}

// recorded notes a durable record in the generation's status and runs the
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
	if hook := r.a.c.cfg.AfterPhase; hook != nil {
		hook(r.a.key, r.m.name, string(phase))
	}
	names := []string{r.gen.name}
	for _, g := range gens {
		names = append(names, g.name)
	}
	r.a.notify(names...)
}

// block appends the blocked record of a failure.
func (r *txnRun) block(pf *phaseFailure) error {
	r.blocked = string(pf.code)
	return r.txn.Block(pf.phase, pf.code, pf.message)
}

// blockedCode is the reason code of the transaction's blocked record.
func (r *txnRun) blockedCode() string {
	if r.blocked != "" {
		return r.blocked
	}
	return reasons.ProviderFailed
}

// fail turns a provider or host error at a phase into a phaseFailure.
func fail(phase ledger.Phase, err error, fallback ledger.ReasonCode) *phaseFailure {
	var pf *phaseFailure
	if errors.As(err, &pf) {
		return pf
	}
	return &phaseFailure{phase: phase, code: codeOf(err, fallback), message: firstLine(err.Error())}
}

// ledgerFailure handles a ledger append that failed: the ledger is frozen
// until it is reopened and replayed, so nothing more can be recorded.
func (r *txnRun) ledgerFailure(err error) {
	r.a.mu.Lock()
	r.a.ledgerErr = fmt.Errorf("ledger append failed; the ledger refuses appends until it is replayed: %w", err)
	r.a.mu.Unlock()
	r.a.log("ledger append failed", "error", err.Error())
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

// newGeneration registers a generation for a target and marks it Preparing.
func (a *activationRuntime) newGeneration(m *moduleRuntime, t ModuleTarget) *generationRuntime {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := &generationRuntime{
		name: t.GenerationName, module: m.name, lineage: t.Lineage, attempt: t.Attempt, target: t,
		phase: iteronv1.PhasePreparing, step: iteronv1.StepVerify, startedAt: a.c.cfg.Now(),
		scope: effects.NewScope(t.GenerationName), rCount: a.rCounts[t.GenerationName],
	}
	m.remember(g)
	return g
}

// launch starts and loads a generation's process, tracked in its scope.
func (r *txnRun) launch(g *generationRuntime) error {
	proc, err := r.a.c.cfg.Launch(r.ctx, g.target.Plan)
	if err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
	}
	r.a.mu.Lock()
	g.proc = proc
	g.lastPid = proc.Pid()
	g.procStartedAt = proc.StartedAt()
	r.a.mu.Unlock()
	_ = g.scope.Track(r.ctx, "process", effects.Reversible, func(context.Context) error { return proc.Close() })
	if err := proc.Load(r.ctx); err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
	}
	return nil
}

// abort records blocked + rolled_back for a failure before the switch,
// disposes the failed generation (its process is reaped) and marks it
// Failed. The old generation, if any, keeps serving.
func (r *txnRun) abort(pf *phaseFailure) {
	defer r.cancel()
	r.captureStderr(r.gen)
	_ = r.gen.scope.Dispose(context.Background())
	if err := r.block(pf); err != nil {
		r.ledgerFailure(err)
	} else if err := r.txn.RollBack(); err != nil {
		r.ledgerFailure(err)
	}
	r.a.mu.Lock()
	r.gen.phase, r.gen.step = iteronv1.PhaseFailed, iteronv1.StepRolledBack
	r.gen.reason, r.gen.message = string(pf.code), truncateMessage(fmt.Sprintf("%s failed at %s: %s", r.gen.name, pf.phase, pf.message))
	r.gen.proc = nil
	r.a.failed[r.gen.name] = Failure{Module: r.m.name, GenerationName: r.gen.name, Code: string(pf.code), Message: r.gen.message}
	r.a.mu.Unlock()
	r.recorded(ledger.PhaseRolledBack)
	r.a.log("transaction rolled back", "module", r.m.name, "generation", r.gen.name, "phase", pf.phase, "reason", pf.code, "message", pf.message)
}

func (r *txnRun) captureStderr(g *generationRuntime) {
	if g.proc == nil {
		return
	}
	tail, dropped := g.proc.StderrTail()
	r.a.mu.Lock()
	g.stderrTail, g.stderrDropped = tail, dropped
	r.a.mu.Unlock()
}

// route is the dispatcher route of a generation. Runs of a provider
// admitted irreversible_external or trust_mutating effects leave a receipt.
func (a *activationRuntime) route(g *generationRuntime) Route {
	var backend Backend = g.proc
	if class, ok := receiptClass(g.target.Plan.AdmittedCapabilities()); ok {
		backend = &receiptBackend{Backend: g.proc, a: a, g: g, class: class}
	}
	return Route{Lineage: g.lineage, Name: g.name, Epoch: g.target.Epoch, Backend: backend}
}

// receiptClass is the effect class of a provider's runs, by its admitted
// capabilities: irreversible_external runs are Irreversible (never reported
// as rolled back), trust_mutating runs Compensatable.
func receiptClass(admitted []string) (effects.Class, bool) {
	switch {
	case slices.Contains(admitted, "irreversible_external"):
		return effects.Irreversible, true
	case slices.Contains(admitted, "trust_mutating"):
		return effects.Compensatable, true
	}
	return 0, false
}

// receiptBackend records a receipt for every run of a provider whose runs
// have effects that cannot simply be undone.
type receiptBackend struct {
	Backend
	a     *activationRuntime
	g     *generationRuntime
	class effects.Class
}

func (b *receiptBackend) Run(ctx context.Context, runID string, input []byte, deadline time.Duration, observe func(Observation)) (Observation, error) {
	started := b.a.c.cfg.Now()
	obs, err := b.Backend.Run(ctx, runID, input, deadline, observe)
	detail := "completed"
	if err != nil {
		detail = "ended without a terminal observation: " + firstLine(err.Error())
	}
	b.a.recordReceipt(b.g, effects.Receipt{ID: "run-" + runID, Kind: effects.ReceiptRun, Class: b.class, StartedAt: started, FinishedAt: b.a.c.cfg.Now(), Detail: detail})
	return obs, err
}

// firstActivation: verify → shadow_load → atomic_switch → committed.
func (a *activationRuntime) firstActivation(_ context.Context, d *Desired, t ModuleTarget) {
	a.mu.Lock()
	m := a.module(t.Module)
	a.mu.Unlock()
	g := a.newGeneration(m, t)
	r, err := a.begin(ledger.KindFirstActivation, m, g, nil, 0, d)
	if err != nil {
		a.log("cannot begin a transaction", "module", t.Module, "error", err.Error())
		return
	}
	if pf := r.firstActivationPhases(); pf != nil {
		r.abort(pf)
	}
}

func (r *txnRun) firstActivationPhases() *phaseFailure {
	defer r.cancel()
	if err := r.check(ledger.PhaseVerify); err != nil {
		return fail(ledger.PhaseVerify, err, reasons.DeadlineExceeded)
	}
	if err := r.txn.Verify(); err != nil {
		r.ledgerFailure(err)
		return nil
	}
	r.recorded(ledger.PhaseVerify)

	if err := r.check(ledger.PhaseShadowLoad); err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.DeadlineExceeded)
	}
	if err := r.launch(r.gen); err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
	}
	if err := r.txn.ShadowLoad(); err != nil {
		r.ledgerFailure(err)
		_ = r.gen.scope.Dispose(context.Background())
		return nil
	}
	r.recorded(ledger.PhaseShadowLoad)

	if err := r.check(ledger.PhaseAtomicSwitch); err != nil {
		return fail(ledger.PhaseAtomicSwitch, err, reasons.DeadlineExceeded)
	}
	if _, err := r.m.dispatcher.Pause(r.ctx, 0); err != nil {
		return fail(ledger.PhaseAtomicSwitch, err, reasons.DeadlineExceeded)
	}
	if _, err := r.m.dispatcher.Switch(r.a.route(r.gen)); err != nil {
		return fail(ledger.PhaseAtomicSwitch, err, reasons.ActivationFailed)
	}
	if err := r.txn.AtomicSwitch(); err != nil {
		// Not durably switched: undo the in-memory switch.
		r.ledgerFailure(err)
		_, _ = r.m.dispatcher.Switch(Route{})
		_ = r.gen.scope.Dispose(context.Background())
		return nil
	}
	r.a.mu.Lock()
	r.a.activate(r.m, r.gen, r.desired)
	r.a.mu.Unlock()
	r.m.dispatcher.Resume()
	r.recorded(ledger.PhaseAtomicSwitch)

	if err := r.txn.Commit(); err != nil {
		r.ledgerFailure(err)
		return nil
	}
	r.a.mu.Lock()
	r.gen.step = iteronv1.StepCommitted
	r.a.mu.Unlock()
	r.recorded(ledger.PhaseCommitted)
	r.a.log("module activated", "module", r.m.name, "generation", r.gen.name, "pid", r.gen.proc.Pid())
	return nil
}
