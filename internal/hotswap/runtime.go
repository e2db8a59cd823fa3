package hotswap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
)

// maxKeptGenerations bounds the generations a module remembers (active,
// shadow and recent history) so status lookups stay bounded.
const maxKeptGenerations = 16

// generationRuntime is one generation's live state. Fields are guarded by
// the activation's mutex.
type generationRuntime struct {
	name    string
	module  string
	lineage int64
	attempt int32
	target  ModuleTarget

	proc  providers.Provider
	scope *effects.EffectScope

	phase       iteronv1.ModulePhase
	step        iteronv1.GenerationStep
	reason      string
	message     string
	stateDigest string
	checkpoint  *CheckpointInfo
	renewals    int32
	// rCount numbers the generation's /r<n> transactions: renewals,
	// relaunches and its retirement.
	rCount uint64
	// committedAuthority is the authority the ledger committed for a
	// generation recovered after a restart: its relaunches must match it.
	committedAuthority string
	// watched is the process whose exit is being watched.
	watched providers.Provider
	// recovered is set for a committed generation known only from the
	// ledger (no plan in hand): it can only be retired on paper.
	recovered     *CommittedGeneration
	txnID         string
	lastSeq       uint64
	lastHash      string
	startedAt     time.Time
	activatedAt   time.Time
	drainedAt     time.Time
	lastPid       int
	procStartedAt time.Time
	stderrTail    string
	stderrDropped int64
	// sandbox is what the launch of its current (or last) process's
	// sandbox applied (sandbox.go); nil without one.
	sandbox *sandbox.Evidence
	// drainNote is the cleanup_failed note of the drain in progress.
	drainNote string
	// relaunchCause says why the generation's next relaunch happens (its
	// process exited, its survivor went away, it was not re-attached); the
	// relaunch reports it with what it restored.
	relaunchCause string
	// cleanupErr is what disposing the generation's effects failed with.
	cleanupErr string
}

// moduleRuntime is one module's live state.
type moduleRuntime struct {
	name       string
	dispatcher *dispatch.Dispatcher
	active     *generationRuntime
	// retiring is the generation a retirement is draining once it is no
	// longer active: status shows the module Draining until its process is
	// gone.
	retiring *generationRuntime
	gens     map[string]*generationRuntime
	order    []string // generation names, oldest first
	// waiting explains why the module's target is not being activated yet.
	waitingCode, waitingMessage string
	// activateIndex is the module's position in the last activate order,
	// for retiring modules that left the plan.
	activateIndex int
	// dur is the module's crash, renewal and checkpoint state.
	dur moduleDurability
}

func (m *moduleRuntime) remember(g *generationRuntime) {
	if _, ok := m.gens[g.name]; !ok {
		m.order = append(m.order, g.name)
	}
	m.gens[g.name] = g
	for len(m.order) > maxKeptGenerations {
		oldest := m.order[0]
		if m.active != nil && m.active.name == oldest {
			break
		}
		m.order = m.order[1:]
		delete(m.gens, oldest)
	}
}

// activationRuntime owns one activation: its ledger, modules and worker.
type activationRuntime struct {
	c   *Coordinator
	key ActivationKey
	log func(msg string, kv ...any)

	mu       sync.Mutex
	desired  *Desired
	removing bool
	removed  bool
	busy     bool
	// records maps each Generation the plan waits for (Unrecorded) to
	// whether its object was created (true) or refused (false), as
	// Recorded reported; awaitingRecords is set while one is unreported.
	records         map[string]bool
	awaitingRecords bool
	led             *ledger.Ledger
	// opened is set once the ledger was opened and replayed: a later open
	// (after an append failed) only closes the interrupted transaction.
	opened bool
	// ledgerErr is set when the ledger is corrupt: nothing is done until an
	// operator resolves it.
	ledgerErr error
	// health is set while the ledger cannot be written.
	health  ledgerHealth
	modules map[string]*moduleRuntime
	failed  map[string]Failure // by generation name
	// rCounts seeds the /r<n> numbering of generations recovered from the
	// ledger (a transaction ID is never reused).
	rCounts map[string]uint64
	// stopping is set during shutdown: process exits are then not crashes.
	stopping bool
	// receipts are the activation's receipts, kept in its receipts file.
	receipts *effects.ReceiptStore
	// receiptsLoss says why receipts of generations before this manager
	// may be missing ("" when the last manager closed the file cleanly).
	receiptsLoss string
	// ahead holds the processes launched ahead of their first activation,
	// by generation name (prelaunch.go).
	ahead map[string]*aheadLaunch

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
	// hold asks the worker to checkpoint and pause every module before its
	// survivor stops (HoldForOwnerRestart).
	hold chan chan struct{}
}

func newActivationRuntime(c *Coordinator, key ActivationKey) *activationRuntime {
	log := c.cfg.Log.WithValues("activation", key.Namespace+"/"+key.Name, "uid", key.UID)
	a := &activationRuntime{
		c: c, key: key, log: func(msg string, kv ...any) { log.Info(msg, kv...) },
		modules: map[string]*moduleRuntime{}, failed: map[string]Failure{}, records: map[string]bool{}, rCounts: map[string]uint64{}, ahead: map[string]*aheadLaunch{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), hold: make(chan chan struct{}),
	}
	a.openReceipts()
	return a
}

func (a *activationRuntime) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *activationRuntime) setDesired(d Desired) {
	a.mu.Lock()
	if a.desired != nil && sameDesired(*a.desired, d) {
		// The controller re-applies what it applied before (every
		// reconcile does): nothing to do, nothing to report.
		a.mu.Unlock()
		return
	}
	if a.desired == nil || a.desired.SpecGeneration != d.SpecGeneration || a.desired.Retry != d.Retry {
		// A new spec, or a retry request, may have resolved what refused a
		// relaunch: try it again.
		for _, m := range a.modules {
			if m.dur.refused != nil && m.active != nil && m.active.proc == nil {
				m.dur.refused = nil
				m.dur.relaunchAt = a.c.cfg.Now()
				a.setPhase(m.active, iteronv1.PhasePreparing)
				a.callsWait(m)
			}
		}
	}
	d.Modules = slices.Clone(d.Modules)
	for _, t := range d.Modules {
		if !t.Keep {
			// Calls for a module about to be activated wait for it instead
			// of being told it does not exist.
			m := a.module(t.Module)
			if m.dur.recoveryRefused != nil {
				// An earlier spec could not relaunch its committed
				// generation; this one hands it a target.
				m.dur.recoveryRefused = nil
				a.callsWait(m)
			}
			continue
		}
		if m, ok := a.modules[t.Module]; ok && t.Refused != nil && m.dur.committed != nil && m.active == nil {
			// The recovery concluded the committed generation cannot be
			// relaunched (its source no longer verifies): calls fail at
			// once with why, until a spec or a retry hands it a target.
			m.dur.recoveryRefused = t.Refused
			m.dispatcher.SetUnavailable(t.Refused.Code, fmt.Sprintf("module %s cannot serve: the relaunch of its last committed generation %s was refused: %s", t.Module, m.dur.committed.Name, t.Refused.Message))
		}
	}
	a.desired = &d
	for name := range a.records {
		if !slices.ContainsFunc(d.Modules, func(t ModuleTarget) bool { return t.GenerationName == name }) {
			delete(a.records, name)
		}
	}
	if !a.removing {
		a.busy = true
	}
	a.mu.Unlock()
	a.poke()
}

// sameDesired reports whether two desired states ask for the same thing.
func sameDesired(x, y Desired) bool {
	if x.SpecGeneration != y.SpecGeneration || x.Retry != y.Retry || x.CandidateSHA256 != y.CandidateSHA256 || x.Swap != y.Swap ||
		x.CheckpointInterval != y.CheckpointInterval || !slices.Equal(x.ActivateOrder, y.ActivateOrder) ||
		!slices.Equal(x.DrainOrder, y.DrainOrder) || len(x.Modules) != len(y.Modules) {
		return false
	}
	for i := range x.Modules {
		a, b := x.Modules[i], y.Modules[i]
		if a.Module != b.Module || a.Keep != b.Keep || (a.Refused == nil) != (b.Refused == nil) || a.Refused != nil && *a.Refused != *b.Refused ||
			a.GenerationName != b.GenerationName || a.Epoch != b.Epoch ||
			a.Lineage != b.Lineage || a.Attempt != b.Attempt || !slices.Equal(a.DependsOn, b.DependsOn) ||
			a.Plan.ManifestSHA256() != b.Plan.ManifestSHA256() || a.Plan.ArtifactSHA256() != b.Plan.ArtifactSHA256() ||
			a.Plan.AuthoritySHA256() != b.Plan.AuthoritySHA256() {
			return false
		}
	}
	return true
}

func (a *activationRuntime) remove() {
	a.mu.Lock()
	if !a.removing {
		a.removing = true
		a.busy = true
	}
	a.mu.Unlock()
	a.poke()
}

func (a *activationRuntime) notify(generations ...string) {
	a.c.cfg.Notify(Notification{Namespace: a.key.Namespace, Name: a.key.Name, Generations: generations})
}

// notifyGenerations reports a change that only the generations show: the
// steps of a transaction. The activation hears of the transaction once,
// when the worker that ran it goes idle (run), not once per phase.
func (a *activationRuntime) notifyGenerations(generations ...string) {
	a.c.cfg.Notify(Notification{Namespace: a.key.Namespace, Name: a.key.Name, Generations: generations, GenerationsOnly: true})
}

func (a *activationRuntime) dispatcher(module string) (*dispatch.Dispatcher, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.modules[module]
	if !ok || m.dispatcher == nil {
		return nil, false
	}
	return m.dispatcher, true
}

// run is the activation's worker: one transaction at a time, then the due
// relaunches, renewals and checkpoints, sleeping until the next is due.
func (a *activationRuntime) run() {
	defer close(a.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-a.wake:
		case <-timer.C:
		case done := <-a.hold:
			a.holdForOwnerRestart()
			close(done)
		}
		var next time.Time
		worked := false
		for {
			select {
			case <-a.stop:
				return
			default:
			}
			a.mu.Lock()
			a.awaitingRecords = false // the step says again
			a.mu.Unlock()
			did, n := a.step()
			next = n
			if writable, probeAt := a.ledgerWritable(); !writable {
				// Whatever the step was about, the ledger probe is due.
				next = earliest(next, probeAt)
			}
			if !did {
				break
			}
			worked = true
		}
		a.mu.Lock()
		wasBusy := a.busy
		// A plan waiting for its Generation objects is still in progress:
		// it goes on by itself (Recorded), so it neither rests nor reports.
		a.busy = a.busy && a.awaitingRecords
		a.mu.Unlock()
		if a.busy {
			wasBusy = false
		}
		if worked || wasBusy {
			// Only a change is reported: an idle wake-up must not requeue
			// the controllers (that would make them flap).
			a.notify()
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 10*time.Millisecond))
		}
	}
}

// step does the next unit of work and reports whether it did something
// (there may be more), and when timed work is next due.
func (a *activationRuntime) step() (bool, time.Time) {
	if err := a.openLedger(); err != nil {
		a.mu.Lock()
		removing := a.removing
		a.mu.Unlock()
		if removing {
			// Deleting an activation whose ledger is corrupt: nothing can
			// be recorded, but every process is still reaped.
			a.forceRetireAll()
			return false, time.Time{}
		}
		a.log("ledger unusable; not acting on this activation", "error", err.Error())
		return false, time.Time{}
	}
	if o := a.c.cfg.Owner; o != nil && !o.Client().Connected() {
		// Every transaction needs the survivor (its processes, or a
		// launch): wait for it to be back rather than fail.
		return false, a.c.cfg.Now().Add(250 * time.Millisecond)
	}
	if ok, probeAt := a.ledgerWritable(); !ok {
		// Transactions need the ledger: they wait for it to be writable
		// (what was launched ahead for them is launched again then).
		a.dropAhead(nil)
		if a.c.cfg.Now().Before(probeAt) {
			return false, probeAt
		}
		healed := a.probeLedger()
		a.notify()
		if !healed {
			_, probeAt = a.ledgerWritable()
			return false, probeAt
		}
		return true, time.Time{}
	}
	a.mu.Lock()
	removing, desired := a.removing, a.desired
	a.mu.Unlock()

	if removing {
		a.dropAhead(nil)
		return a.retireNext(nil), time.Time{}
	}
	// What was launched ahead for a target that is no longer desired is
	// never taken.
	a.dropAheadNotDesired(desired)
	// Serving comes first: a crashed generation due for its relaunch.
	did, relaunchNext := a.durabilityWork(desired, true)
	if did {
		return true, relaunchNext
	}
	if desired == nil {
		return false, relaunchNext
	}
	// Modules that left the plan are retired first, consumers before
	// providers.
	if a.retireNext(desired) {
		return true, relaunchNext
	}
	if !a.plansRecorded(desired) {
		// What serves meanwhile keeps its checkpoints and renewals.
		return a.durabilityWork(desired, false)
	}
	targets := map[string]ModuleTarget{}
	for _, t := range desired.Modules {
		targets[t.Module] = t
	}
	for i, module := range desired.ActivateOrder {
		t, ok := targets[module]
		if !ok || t.Keep {
			continue
		}
		a.mu.Lock()
		m := a.module(module)
		m.activateIndex = i
		active := m.active
		committed := m.dur.committed
		failure, failed := a.failed[t.GenerationName]
		crashed := active != nil && active.proc == nil
		// givenUp: the active generation's process is gone and is not
		// relaunched (its crash budget spent, its relaunch refused).
		givenUp := false
		if crashed {
			_, givenUp = a.failed[active.name]
		}
		a.mu.Unlock()
		if active != nil && (active.name == t.GenerationName || sameEpochAndAuthority(active.target, t)) {
			// Unchanged: an epoch and authority that did not change never
			// cause a transaction, whichever generation name the target
			// carries (a controller may hand a target computed before the
			// last switch).
			if !crashed {
				a.setWaiting(m, "", "")
			}
			continue
		}
		if failed {
			// The rest of the plan waits: a failed target is not retried
			// until the controller hands a new attempt (and nothing
			// launched ahead for the rest is kept running meanwhile).
			a.dropAhead(nil)
			a.log("plan halted at a failed target", "module", module, "generation", t.GenerationName, "reason", failure.Code)
			return false, relaunchNext
		}
		if crashed && !givenUp {
			// A crashed generation is relaunched before it is swapped.
			continue
		}
		if code, msg := a.dependencyGate(t); code != "" {
			a.setWaiting(m, code, msg)
			continue
		}
		switch {
		case active == nil && committed != nil && committed.Name != t.GenerationName:
			a.setWaiting(m, reasons.StaleGeneration, fmt.Sprintf("the ledger's last committed generation of %s is %s: it is relaunched before %s", module, committed.Name, t.GenerationName))
			continue
		case active != nil && t.Lineage != NextLineage(active.lineage):
			a.setWaiting(m, reasons.StaleGeneration, fmt.Sprintf("target %s (generation %d) does not follow the active generation %s (%d); waiting for a current target", t.GenerationName, t.Lineage, active.name, active.lineage))
			continue
		}
		a.setWaiting(m, "", "")
		switch {
		case active == nil && committed != nil:
			a.relaunchCommitted(desired, m, t, *committed)
		case active == nil:
			a.launchWave(desired, targets, i)
			a.firstActivation(desired, t)
		case givenUp:
			// Nothing of the old generation runs or will: its state cannot
			// move, so the new target replaces it cold, whatever the swap
			// policy (a revert away from a generation that crash-looped is
			// the common case). Calls wait for it meanwhile.
			m.dispatcher.SetAvailable()
			a.swap(desired, t, active, ledger.KindColdReplace)
		case desired.Swap.Cold || desired.Swap.Discard || active.target.Plan.ProtocolVersion() == 1 && t.Plan.ProtocolVersion() == 1:
			a.swap(desired, t, active, ledger.KindColdReplace)
		default:
			a.swap(desired, t, active, ledger.KindHotSwap)
		}
		return true, time.Time{}
	}
	return a.durabilityWork(desired, false)
}

// plansRecorded reports whether every Generation object the plan names
// exists: until then nothing of it starts (ModuleTarget.Unrecorded). It
// notes whether the plan waits for a report still to come (awaitingRecords)
// or for a refused object to be created after all.
func (a *activationRuntime) plansRecorded(d *Desired) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.awaitingRecords = false
	recorded := true
	for _, t := range d.Modules {
		if t.Keep || !t.Unrecorded {
			continue
		}
		created, reported := a.records[t.GenerationName]
		if !created {
			recorded = false
			a.awaitingRecords = a.awaitingRecords || !reported
		}
	}
	return recorded
}

// sameEpochAndAuthority reports whether a target would change nothing.
func sameEpochAndAuthority(active, t ModuleTarget) bool {
	return Unchanged(active.Epoch, active.Plan.AuthoritySHA256(), t.Epoch, t.Plan.AuthoritySHA256())
}

// Unchanged is the one rule for whether a module's target asks for a
// transaction: a target of the epoch and the admitted authority its active
// generation runs with changes nothing (a narrower ceiling changes what the
// process may do, so it is a reload too). The activation controller plans
// by it; the coordinator holds each target it is handed to it, since a
// target may have been computed before the last switch.
func Unchanged(activeEpoch, activeAuthority, epoch, authority string) bool {
	return activeEpoch != "" && activeEpoch == epoch && activeAuthority == authority
}

// NextLineage is the lineage of the generation that replaces one of
// lineage active: the one rule the activation controller numbers new
// Generations by and the coordinator checks a target against.
func NextLineage(active int64) int64 { return active + 1 }

// dependencyGate refuses to activate a module before the modules it depends
// on are Active in this coordinator (never the informer cache).
func (a *activationRuntime) dependencyGate(t ModuleTarget) (code, message string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, dep := range t.DependsOn {
		m, ok := a.modules[dep]
		if !ok || m.active == nil || m.active.phase != iteronv1.PhaseActive {
			why := "not active yet"
			if ok && m.waitingCode != "" {
				why = m.waitingCode + ": " + m.waitingMessage
			}
			return reasons.DependencyUnsatisfied, fmt.Sprintf("%s waits for %s (%s)", t.Module, dep, why)
		}
	}
	return "", ""
}

func (a *activationRuntime) setWaiting(m *moduleRuntime, code, message string) {
	a.mu.Lock()
	changed := m.waitingCode != code || m.waitingMessage != message
	m.waitingCode, m.waitingMessage = code, message
	nothingServes := m.active == nil
	a.mu.Unlock()
	if nothingServes {
		// Calls wait for a module that is about to be activated; they fail
		// at once, with the reason, for one that waits on something that
		// does not pass by itself.
		if code != "" && reasons.Stalls(code) {
			m.dispatcher.SetUnavailable(code, fmt.Sprintf("module %s has no generation that can serve: %s", m.name, message))
		} else {
			m.dispatcher.SetAvailable()
		}
	}
	if changed {
		a.notify()
	}
}

// module returns (creating) a module's runtime. Caller holds a.mu.
func (a *activationRuntime) module(name string) *moduleRuntime {
	m, ok := a.modules[name]
	if !ok {
		m = &moduleRuntime{name: name, gens: map[string]*generationRuntime{}, dispatcher: dispatch.NewDispatcher(name, a.c.cfg.QueueLimit)}
		a.modules[name] = m
		if a.ledgerErr != nil {
			code, msg := a.ledgerProblem()
			m.dispatcher.SetUnavailable(code, fmt.Sprintf("module %s cannot serve: %s", name, msg))
		}
	}
	return m
}

// retireNext retires one module that is not desired (all of them when
// desired is nil), in drain order; it reports whether it did something.
func (a *activationRuntime) retireNext(desired *Desired) bool {
	a.mu.Lock()
	var candidates []*moduleRuntime
	for name, m := range a.modules {
		if desired != nil && slices.ContainsFunc(desired.Modules, func(t ModuleTarget) bool { return t.Module == name }) {
			continue
		}
		candidates = append(candidates, m)
	}
	// Drain order: the reverse of the last activation order.
	sort.Slice(candidates, func(i, j int) bool {
		if candidates[i].activateIndex != candidates[j].activateIndex {
			return candidates[i].activateIndex > candidates[j].activateIndex
		}
		return candidates[i].name > candidates[j].name
	})
	var next *moduleRuntime
	for _, m := range candidates {
		if m.active != nil {
			next = m
			break
		}
		if c := m.dur.committed; c != nil {
			// Committed before a restart, never relaunched, now gone from
			// the spec: its retirement is recorded so the ledger agrees.
			m.dur.committed = nil
			if o := a.c.cfg.Owner; o != nil {
				o.ReleaseModule(a.key.UID, m.name, "its module left the spec while no manager ran")
			}
			g := &generationRuntime{name: c.Name, module: m.name, lineage: c.Lineage, attempt: c.Attempt, recovered: c,
				rCount: a.rCounts[c.Name], phase: iteronv1.PhaseInactive, scope: effects.NewScope(c.Name)}
			m.active = g
			next = m
			break
		}
	}
	if next == nil {
		// Nothing left with a process: drop the modules that left.
		for _, m := range candidates {
			m.dispatcher.Close()
			delete(a.modules, m.name)
		}
		if desired == nil && !a.removed {
			a.removed = true
			a.mu.Unlock()
			a.notify()
			return false
		}
		a.mu.Unlock()
		return false
	}
	active := next.active
	a.mu.Unlock()
	var swap SwapPolicy
	var candidate string
	if d := a.currentDesired(); d != nil {
		swap, candidate = d.Swap, d.CandidateSHA256
	}
	a.retire(swap, candidate, next, active)
	a.mu.Lock()
	defer a.mu.Unlock()
	_, stillThere := a.modules[next.name]
	// A retirement that had to wait (for the ledger) did nothing yet.
	return !stillThere || next.active == nil
}

func (a *activationRuntime) currentDesired() *Desired {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.desired
}

// shutdown stops the worker after its current transaction, stops
// dispatching, checkpoints every Active protocol-2 generation (so a restart
// loses nothing) and stops every process, then closes the ledger.
func (a *activationRuntime) shutdown(ctx context.Context) error {
	a.mu.Lock()
	a.stopping = true
	a.mu.Unlock()
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.done
	a.dropAhead(nil)
	a.mu.Lock()
	type live struct {
		m *moduleRuntime
		g *generationRuntime
		p providers.Provider
	}
	var procs []live
	var dispatchers []*dispatch.Dispatcher
	for _, m := range a.modules {
		dispatchers = append(dispatchers, m.dispatcher)
		if m.active != nil && m.active.proc != nil {
			procs = append(procs, live{m, m.active, m.active.proc})
		}
	}
	led := a.led
	a.led = nil
	a.mu.Unlock()
	var errs []error
	if a.c.cfg.Owner != nil {
		// Detach: the survivor keeps every provider running, with its
		// state and pid, for the next manager to re-attach. The run in
		// flight of each module ends in the survivor (its outcome kept).
		for _, d := range dispatchers {
			d.Close()
		}
		// The survivor owns the processes from here; what else the
		// generations hold (crash watches, routes, timers) ends with this
		// manager.
		for _, l := range procs {
			a.mu.Lock()
			scope := l.g.scope
			a.mu.Unlock()
			scope.Release(resProcess)
			if note := a.dispose(l.g, scope, drainDeadline(l.g)); note != "" {
				errs = append(errs, fmt.Errorf("detach %s: %s: %s", l.g.name, reasons.CleanupFailed, note))
			}
		}
		if led != nil {
			if err := led.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := a.closeReceipts(); err != nil {
			errs = append(errs, err)
		}
		a.log("detached from the survivor: its providers keep running", "modules", len(procs))
		return errors.Join(errs...)
	}
	for _, l := range procs {
		// Let the run in flight finish if it can, then cancel it.
		if !l.m.dispatcher.PauseWhenIdle(ctx, l.g.target.Plan.CancellationDeadline()) {
			_, _ = l.m.dispatcher.Pause(ctx, 0)
		}
		if l.g.target.Plan.ProtocolVersion() == 2 {
			if err := a.takeCheckpoint(l.m, l.g, l.p, 0); err != nil {
				errs = append(errs, fmt.Errorf("checkpoint %s before shutdown: %w", l.g.name, err))
			}
		}
	}
	for _, d := range dispatchers {
		d.Close()
	}
	// The providers stop together, at most MaxParallelActivations at a
	// time: nothing is recorded, and each waits only for its own process.
	if err := eachParallel(procs, a.c.maxParallel(), func(l live) error {
		// The scope's process resource closes the process; so does
		// Close here if the scope could not (idempotent).
		defer l.p.Close()
		stopErr := error(nil)
		if err := l.p.Stop(ctx, "manager shutting down"); err != nil {
			stopErr = fmt.Errorf("stop %s: %w", l.g.name, err)
		}
		a.mu.Lock()
		scope := l.g.scope
		a.mu.Unlock()
		if note := a.dispose(l.g, scope, drainDeadline(l.g)); note != "" {
			return errors.Join(stopErr, fmt.Errorf("shut down %s: %s: %s", l.g.name, reasons.CleanupFailed, note))
		}
		return stopErr
	}); err != nil {
		errs = append(errs, err)
	}
	if led != nil {
		if err := led.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.closeReceipts(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// status builds a consistent snapshot.
func (a *activationRuntime) status() ActivationStatus {
	st, led := a.statusLocked()
	// The ledger's and the receipts' summaries are read after a.mu is let
	// go: each waits for its store's lock, which an append holds across its
	// fsync, and a status read holding a.mu meanwhile would make every
	// call's dispatcher lookup (and the transaction's next step) wait for
	// the disk too.
	if led != nil {
		sum := led.Summary()
		st.Ledger = &sum
	}
	for name, gs := range st.Generations {
		sum := a.receipts.Summary(name)
		gs.Receipts = ReceiptCounts{Total: int32(sum.Total), Irreversible: int32(sum.Irreversible), Truncated: sum.Truncated,
			IncompleteReason: sum.IncompleteReason, ReversibleRuns: sum.ReversibleRuns}
		st.Generations[name] = gs
	}
	return st
}

// statusLocked is the status but for the ledger's and the receipts'
// summaries, and the ledger to read the first from.
func (a *activationRuntime) statusLocked() (ActivationStatus, *ledger.Ledger) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setActiveGauge()
	st := ActivationStatus{
		Key: a.key, Busy: a.busy, Removing: a.removing, Removed: a.removed,
		Modules: map[string]ModuleStatus{}, Generations: map[string]GenerationStatus{},
	}
	st.FailedAttempts = make(map[string]Failure, len(a.failed))
	for name, f := range a.failed {
		st.FailedAttempts[name] = f
	}
	if a.desired != nil {
		st.AppliedSpecGeneration = a.desired.SpecGeneration
		st.Targets = make(map[string]string, len(a.desired.Modules))
		for _, t := range a.desired.Modules {
			if t.GenerationName != "" {
				st.Targets[t.Module] = t.GenerationName
			}
			if f, ok := a.failed[t.GenerationName]; ok {
				st.Failures = append(st.Failures, f)
			}
		}
	}
	if a.led != nil {
		st.LedgerFile = a.led.Dir()
	}
	if a.ledgerErr != nil {
		st.LedgerError = a.ledgerErr.Error()
	}
	if a.health.unwritable != nil {
		_, st.LedgerUnwritable = a.ledgerProblem()
	}
	for name, m := range a.modules {
		ms := ModuleStatus{Module: name, Phase: iteronv1.PhaseInactive, Reason: m.waitingCode, Message: m.waitingMessage}
		if c := m.dur.committed; c != nil && m.active == nil {
			cc := *c
			ms.Committed = &cc
		}
		g := m.active
		if g == nil {
			g = m.retiring
		}
		if g != nil {
			ms.Active, ms.ImplementationID, ms.Lineage, ms.Epoch = g.name, g.target.Plan.ImplementationID(), g.lineage, g.target.Epoch
			ms.AdmittedCapabilities = g.target.Plan.AdmittedCapabilities()
			ms.AuthoritySHA256, ms.Attempt = g.target.Plan.AuthoritySHA256(), g.attempt
			ms.Phase = g.phase
			if g.proc != nil {
				ms.Pid = g.proc.Pid()
			}
			ms.Serving = g.proc != nil && g.phase == iteronv1.PhaseActive
			if g.reason != "" && (ms.Reason == "" || !ms.Serving) {
				// What keeps the generation from serving comes first.
				ms.Reason, ms.Message = g.reason, g.message
			}
		}
		if !ms.Serving && ms.Reason == "" && a.health.unwritable != nil {
			ms.Reason, ms.Message = a.ledgerProblem()
		}
		st.Modules[name] = ms
		for _, g := range m.gens {
			st.Generations[g.name] = a.generationStatus(g)
		}
	}
	return st, a.led
}

func (a *activationRuntime) generationStatus(g *generationRuntime) GenerationStatus {
	gs := GenerationStatus{
		Name: g.name, Module: g.module, Lineage: g.lineage, Attempt: g.attempt, Phase: g.phase, Step: g.step,
		Renewals: g.renewals, StateSHA256: g.stateDigest, Reason: g.reason, Message: g.message,
		TransactionID: g.txnID, LastSequence: g.lastSeq, LastRecordSHA256: g.lastHash,
		StartedAt: g.startedAt, ActivatedAt: g.activatedAt, DrainedAt: g.drainedAt,
		StderrTail: g.stderrTail, StderrDropped: g.stderrDropped, LastPid: g.lastPid,
	}
	if g.checkpoint != nil {
		cp := *g.checkpoint
		gs.LastCheckpoint = &cp
	}
	if g.proc != nil {
		gs.Pid = g.proc.Pid()
		gs.ProcessStartedAt = g.proc.StartedAt()
		gs.StderrTail, gs.StderrDropped = g.proc.StderrTail()
	}
	if g.scope != nil {
		gs.Resources = g.scope.Resources()
	}
	gs.Sandbox = g.sandboxStatus()
	if g.cleanupErr != "" && gs.Reason == "" {
		gs.Reason, gs.Message = reasons.CleanupFailed, g.cleanupErr
	}
	return gs
}

// truncateMessage bounds a status message to 1 KiB at a rune boundary.
func truncateMessage(s string) string {
	if len(s) <= iteronv1.MaxMessageBytes {
		return s
	}
	cut := iteronv1.MaxMessageBytes - len("…")
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// firstLine is the first line of s, for ledger reasons and messages.
func firstLine(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}

// ownerRestartHold bounds how long modules stay paused after their
// survivor asked for a checkpoint before it stops: if their processes do
// not end by then (the survivor did not stop after all), they serve again.
const ownerRestartHold = time.Minute

// holdForOwnerRestart checkpoints every module serving a protocol-2
// generation and leaves it paused: the survivor is about to stop, and its
// providers with it. Nothing a call does after the checkpoint can be lost:
// calls wait in the queue for the relaunch from that checkpoint. Runs by
// the worker, between transactions.
func (a *activationRuntime) holdForOwnerRestart() {
	a.mu.Lock()
	type live struct {
		m *moduleRuntime
		g *generationRuntime
		p providers.Provider
	}
	var all []live
	for _, m := range a.modules {
		if g := m.active; g != nil && g.proc != nil && g.phase == iteronv1.PhaseActive {
			all = append(all, live{m, g, g.proc})
		}
	}
	a.mu.Unlock()
	for _, l := range all {
		ctx, cancel := context.WithTimeout(context.Background(), l.g.target.Plan.CancellationDeadline()+time.Second)
		if !l.m.dispatcher.PauseWhenIdle(ctx, l.g.target.Plan.CancellationDeadline()) {
			_, _ = l.m.dispatcher.Pause(ctx, 0)
		}
		cancel()
		if l.g.target.Plan.ProtocolVersion() == 2 {
			if err := a.takeCheckpoint(l.m, l.g, l.p, 0); err != nil {
				a.log("checkpoint before the survivor stops failed", "module", l.m.name, "generation", l.g.name, "error", err.Error())
			} else {
				a.log("checkpointed before the survivor stops; calls wait for the relaunch", "module", l.m.name, "generation", l.g.name)
			}
		}
		m, g, p := l.m, l.g, l.p
		a.mu.Lock()
		scope := g.scope
		a.mu.Unlock()
		hold := time.AfterFunc(ownerRestartHold, func() {
			scope.Release(resOwnerHold)
			a.mu.Lock()
			still := m.active == g && g.proc == p
			a.mu.Unlock()
			if still {
				select {
				case <-p.Exited():
				default:
					a.log("the survivor did not stop after asking for a checkpoint; serving again", "module", m.name)
					m.dispatcher.Resume()
				}
			}
		})
		if err := trackOwnerHold(scope, hold); err != nil {
			a.log("the hold of a disposed generation was stopped at once", "generation", g.name, "error", err.Error())
		}
	}
}
