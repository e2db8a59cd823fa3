package hotswap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// Config configures a Coordinator.
type Config struct {
	// StateDir holds ledgers (ledgers/<uid>) and snapshots (snapshots/<uid>).
	StateDir string
	// Launch starts provider processes.
	Launch providers.Launcher
	// Notify is called (from coordinator goroutines, never under a lock)
	// after an activation's or a generation's state changed, so the
	// controllers requeue them. It must not block.
	Notify func(Notification)
	// Log receives the coordinator's log lines.
	Log logr.Logger
	// QueueLimit bounds each module's call queue (DefaultQueueLimit if 0).
	QueueLimit int
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// AfterPhase, when set, is called after each phase record of a
	// transaction is durable, and with OldStopped once a swap's old process
	// has stopped (before the drain record). Tests use it to act at an exact
	// point of a transaction (a call after the switch, a SIGKILL mid-swap).
	AfterPhase func(key ActivationKey, module, phase string)
	// BeforeRecovery, when set, is called by the activation's worker just
	// before it re-attaches or relaunches a module's last committed
	// generation after a restart, or relaunches a generation whose process
	// ended; it may block. Tests hold a recovery there to make calls
	// inside its window.
	BeforeRecovery func(key ActivationKey, module string)
	// Owner, when set, is the survivor that owns the provider processes
	// across manager restarts (docs/survivor.md): Launch defaults to it, a
	// module's last committed generation is re-attached rather than
	// relaunched when its process still runs there, and Shutdown detaches
	// instead of stopping the providers.
	Owner *providers.SurvivorOwner
	// RecoverAtStart starts the coordinator recovering, as a manager does
	// after a (re)start: until ExpectActivations has named this node's
	// activations and each has been prepared, a call for an activation or
	// module it does not know yet is told to retry (recovering), never that
	// it does not exist.
	RecoverAtStart bool
	// MaxParallelActivations bounds how many provider processes of one
	// activation are spawned and loaded (or stopped at shutdown) together:
	// modules that are ready at the same time have their processes started
	// at once, while their transactions are still recorded one after the
	// other in activate order (prelaunch.go). 0 is the CPU count; 1 starts
	// every process inside its own transaction.
	MaxParallelActivations int
	// Pulled, when set, says when the artifact of a plan's source was
	// pulled into the node's store by this manager (false for a path
	// source, or one already there): a transaction's trace opens with the
	// pull (docs/tracing.md).
	Pulled func(plan verifier.LaunchPlan) (PullTiming, bool)
}

// OldStopped is the AfterPhase point between stopping a swap's old process
// and recording the drain.
const OldStopped = "old_stopped"

// Notification says which objects changed.
type Notification struct {
	// Namespace and Name of the activation.
	Namespace, Name string
	// Generations are the Generation objects whose state changed.
	Generations []string
	// GenerationsOnly says only the Generations changed (a receipt was
	// recorded, a transaction moved to its next phase): the activation need
	// not be looked at again. A transaction's end is reported to the
	// activation when the worker that ran it goes idle.
	GenerationsOnly bool
}

// SwapPolicy is spec.swap.
type SwapPolicy struct {
	// Deadline bounds one whole transaction.
	Deadline time.Duration
	// QuiesceTimeout is how long quiesce waits for the in-flight run.
	QuiesceTimeout time.Duration
	// Cold selects the cold strategy (no state moves).
	Cold bool
	// Discard drops state instead of migrating it.
	Discard bool
}

// ModuleTarget is the desired generation of one module.
type ModuleTarget struct {
	// Module is the module.
	Module string
	// Plan is the verified launch plan.
	Plan verifier.LaunchPlan
	// Epoch is the module's epoch (docs/concepts.md, identity, epoch and
	// plan).
	Epoch string
	// GenerationName is the Generation object of this target.
	GenerationName string
	// Lineage is its lineage number.
	Lineage int64
	// Attempt is its attempt number at that lineage.
	Attempt int32
	// DependsOn are the modules of this activation that must be Active
	// before this one is activated.
	DependsOn []string
	// Revision is the revision label of the activation spec this target
	// was made for (iteron.dev/revision of a stamped activation, "" for
	// others): the gateway's call metrics carry it, so a fleet analysis
	// can tell a rollout's new revision from the old.
	Revision string
	// Keep leaves the module as it runs: its source is still in the spec
	// but has no runnable target now (verification failed, a dependency is
	// unsatisfied, its failed target is not retried). Only Module and
	// Refused are read.
	Keep bool
	// Refused, with Keep, says why the module's last committed generation
	// cannot be relaunched after a restart (its source no longer verifies):
	// while nothing serves the module, calls fail at once with it instead
	// of waiting for a recovery that will not come.
	Refused *Failure
	// Unrecorded says the target's Generation object does not exist yet:
	// nothing of the plan starts until the generation controller reports
	// it created (Coordinator.Recorded), so that every generation that
	// runs has its object before its first ledger record, and an object
	// the API refuses (an admission policy) starts nothing.
	Unrecorded bool
}

// Desired is what the activation controller wants for one activation.
type Desired struct {
	// Key identifies the activation.
	Key ActivationKey
	// SpecGeneration is the metadata.generation this was derived from.
	SpecGeneration int64
	// Retry is the iteron.dev/retry request acted on: a new value (like a
	// new spec) tries again what was refused.
	Retry string
	// CandidateSHA256 is spec.candidateSHA256.
	CandidateSHA256 string
	// Swap is spec.swap.
	Swap SwapPolicy
	// CheckpointInterval is spec.checkpoint.intervalSeconds (0: only at swaps).
	CheckpointInterval time.Duration
	// Modules are the desired modules.
	Modules []ModuleTarget
	// ActivateOrder is the order transactions run in.
	ActivateOrder []string
	// DrainOrder is the reverse; modules no longer desired are retired in
	// the reverse of their last known activation order.
	DrainOrder []string
	// RolloutSpan is the ActivationSet rollout's span for this node, from
	// the stamp's iteron.dev/traceparent annotation (invalid when none):
	// the activation's transactions link to it.
	RolloutSpan trace.SpanContext
}

// Coordinator is the node-local coordinator. Safe for concurrent use.
type Coordinator struct {
	cfg       Config
	snapshots *SnapshotStore

	// started is when the coordinator (the manager) started.
	started time.Time

	mu          sync.Mutex
	activations map[string]*activationRuntime
	closed      bool
	// recovering is true after a start until every activation of the node
	// has been prepared (its ledger replayed): until then a call for an
	// activation or module the coordinator does not know yet is told to
	// retry, never that it does not exist.
	recovering bool
	// expected are the activations still to be prepared while recovering
	// (nil: not known yet).
	expected map[string]bool
}

// recoveryLimit bounds how long the coordinator waits for the activations
// it expects before it stops saying it is recovering.
const recoveryLimit = 2 * time.Minute

// Anchor is a ledger position an activation's status recorded (its head):
// it must be in the chain when the ledger is replayed.
type Anchor struct {
	// Sequence of the record.
	Sequence uint64
	// RecordSHA256 of the record.
	RecordSHA256 string
}

// ErrClosed is returned after Shutdown.
var ErrClosed = errors.New("coordinator is shut down")

// New returns a coordinator. It starts nothing until Apply.
func New(cfg Config) (*Coordinator, error) {
	if cfg.Launch == nil && cfg.Owner != nil {
		cfg.Launch = cfg.Owner.Launch
	}
	if cfg.StateDir == "" || cfg.Launch == nil {
		return nil, errors.New("hotswap: Config needs StateDir and Launch")
	}
	if cfg.Notify == nil {
		cfg.Notify = func(Notification) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.QueueLimit == 0 {
		cfg.QueueLimit = dispatch.DefaultQueueLimit
	}
	return &Coordinator{
		cfg: cfg, snapshots: NewSnapshotStore(cfg.StateDir),
		activations: map[string]*activationRuntime{}, started: cfg.Now(), recovering: cfg.RecoverAtStart,
	}, nil
}

// Apply hands the desired state of one activation to the coordinator and
// returns at once; the activation's worker runs the transactions.
func (c *Coordinator) Apply(d Desired) error {
	if d.Key.UID == "" {
		return errors.New("hotswap: Apply needs the activation UID")
	}
	a, err := c.runtime(d.Key, true)
	if err != nil {
		return err
	}
	a.setDesired(d)
	return nil
}

// Recorded reports that the Generation object of target generation of
// activation uid was created (err nil), or why the API refused it: the
// plan that waits for it goes on, or halts (not busy) until a later report
// says it was created.
func (c *Coordinator) Recorded(uid, generation string, err error) {
	c.mu.Lock()
	a, ok := c.activations[uid]
	c.mu.Unlock()
	if !ok {
		return
	}
	a.mu.Lock()
	a.records[generation] = err == nil
	a.mu.Unlock()
	a.poke()
}

// Prepare registers an activation and opens its ledger at once, replaying
// and verifying it, closing an interrupted transaction forward and learning
// each module's last committed generation, so that Status reflects the
// ledger before the controller decides anything. anchor, when set, is the
// ledger head the activation's status recorded: it must be in the chain.
func (c *Coordinator) Prepare(key ActivationKey, anchor *Anchor) error {
	a, err := c.runtime(key, true)
	if err != nil {
		return err
	}
	var la *ledger.Anchor
	if anchor != nil {
		la = &ledger.Anchor{Sequence: anchor.Sequence, RecordSHA256: anchor.RecordSHA256}
	}
	err = a.openLedgerAnchored(la)
	c.prepared(key.UID)
	return err
}

// ExpectActivations tells a starting coordinator which activations of its
// node exist (their UIDs): it reports Recovering until each has been
// prepared (or removed), or recoveryLimit has passed.
func (c *Coordinator) ExpectActivations(uids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.recovering {
		return
	}
	c.expected = map[string]bool{}
	for _, uid := range uids {
		if _, ok := c.activations[uid]; !ok {
			c.expected[uid] = true
		}
	}
	c.doneRecoveringIfAllPrepared()
}

func (c *Coordinator) prepared(uid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expected != nil {
		delete(c.expected, uid)
		c.doneRecoveringIfAllPrepared()
	}
}

// doneRecoveringIfAllPrepared ends recovery. Caller holds c.mu.
func (c *Coordinator) doneRecoveringIfAllPrepared() {
	if c.recovering && c.expected != nil && len(c.expected) == 0 {
		c.recovering = false
		c.cfg.Log.Info("every activation of this node is prepared", "after", c.cfg.Now().Sub(c.started).Round(time.Millisecond))
		go c.releaseUnknown()
	}
}

// releaseUnknown releases the survivor's processes of activations this
// node no longer has (deleted while no manager ran).
func (c *Coordinator) releaseUnknown() {
	if c.cfg.Owner == nil {
		return
	}
	c.cfg.Owner.ReleaseUnknown(func(uid string) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.activations[uid]
		return ok
	})
}

// Recovering reports whether the coordinator is still learning this node's
// activations after a start.
func (c *Coordinator) Recovering() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recovering && c.cfg.Now().Sub(c.started) > recoveryLimit {
		c.recovering = false
		c.cfg.Log.Info("stopped waiting for the activations expected at start", "missing", len(c.expected))
		go c.releaseUnknown()
	}
	return c.recovering
}

// Remove retires every module of the activation in drain order and reaps
// every process; Status reports Removed when done. Idempotent.
//
// An activation the coordinator does not know (a restarted manager, or one
// already forgotten) has nothing running here: Remove reports it removed
// and creates nothing (no ledger is opened, and so none is re-created).
func (c *Coordinator) Remove(key ActivationKey) (removed bool, err error) {
	c.mu.Lock()
	a, ok := c.activations[key.UID]
	c.mu.Unlock()
	if !ok {
		return true, nil
	}
	a.remove()
	return false, nil
}

// Forget drops a removed activation's runtime state and its files: the
// ledger is archived (never deleted) and its snapshots removed. It refuses
// while the activation still has modules. An activation the coordinator
// does not know (removed before a restart) only has its files dealt with.
func (c *Coordinator) Forget(uid string) error {
	c.mu.Lock()
	a, ok := c.activations[uid]
	c.mu.Unlock()
	if ok {
		st := a.status()
		if !st.Removed {
			return fmt.Errorf("activation %s/%s is not retired yet", st.Key.Namespace, st.Key.Name)
		}
		if err := a.shutdown(context.Background()); err != nil {
			c.cfg.Log.Info("shutting down a retired activation", "uid", uid, "error", err.Error())
		}
		a.forgetMetrics()
		c.mu.Lock()
		delete(c.activations, uid)
		delete(c.expected, uid)
		c.mu.Unlock()
	}
	return c.removeState(uid)
}

// removeState archives an activation's ledger and removes its snapshots.
func (c *Coordinator) removeState(uid string) error {
	return RemoveActivationState(c.cfg.StateDir, uid, c.cfg.Now())
}

// RemoveOrphans archives the ledgers (and removes the snapshots) of
// activations that no longer exist — deleted while no manager ran: live
// holds the UIDs of every activation of this node. The coordinator does it,
// the same way as a finalizer, so nothing else changes the state dir. It
// returns the UIDs it archived.
func (c *Coordinator) RemoveOrphans(live map[string]bool) ([]string, error) {
	uids, err := ledger.ActivationUIDs(c.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	snapUIDs, err := c.snapshots.ActivationUIDs()
	if err != nil {
		return nil, err
	}
	uids = append(uids, snapUIDs...)
	var removed []string
	var errs []error
	seen := map[string]bool{}
	for _, uid := range uids {
		if seen[uid] || live[uid] {
			continue
		}
		seen[uid] = true
		c.mu.Lock()
		_, running := c.activations[uid]
		c.mu.Unlock()
		if running {
			continue
		}
		if err := c.removeState(uid); err != nil {
			errs = append(errs, fmt.Errorf("activation %s: %w", uid, err))
			continue
		}
		removed = append(removed, uid)
	}
	return removed, errors.Join(errs...)
}

// Status returns a snapshot of one activation, and false when the
// coordinator does not know it.
func (c *Coordinator) Status(uid string) (ActivationStatus, bool) {
	c.mu.Lock()
	a, ok := c.activations[uid]
	c.mu.Unlock()
	if !ok {
		return ActivationStatus{}, false
	}
	return a.status(), true
}

// Dispatcher returns the dispatcher of a module of an activation (by
// namespace and name), for the gateway.
func (c *Coordinator) Dispatcher(namespace, name, module string) (*dispatch.Dispatcher, bool) {
	c.mu.Lock()
	var found *activationRuntime
	for _, a := range c.activations {
		if a.key.Namespace == namespace && a.key.Name == name {
			found = a
		}
	}
	c.mu.Unlock()
	if found == nil {
		return nil, false
	}
	return found.dispatcher(module)
}

// Lookup returns the dispatcher of a module of an activation (by namespace
// and name), or a *CallError saying why there is none: recovering (the
// manager is still replaying this node's activations: retry), ledger_corrupt,
// or not_found.
func (c *Coordinator) Lookup(namespace, name, module string) (*dispatch.Dispatcher, error) {
	recovering := c.Recovering()
	c.mu.Lock()
	var found *activationRuntime
	for _, a := range c.activations {
		if a.key.Namespace == namespace && a.key.Name == name {
			found = a
		}
	}
	c.mu.Unlock()
	if found == nil {
		if recovering {
			return nil, &dispatch.CallError{Code: reasons.Recovering, Message: fmt.Sprintf("the manager restarted and is still recovering this node's activations; activation %s/%s is not known yet: retry", namespace, name)}
		}
		return nil, &dispatch.CallError{Code: reasons.NotFound, Message: fmt.Sprintf("no activation %s/%s on this node", namespace, name)}
	}
	if d, ok := found.dispatcher(module); ok {
		return d, nil
	}
	found.mu.Lock()
	ledgerErr, applied := found.ledgerErr, found.desired != nil
	found.mu.Unlock()
	switch {
	case ledgerErr != nil:
		return nil, &dispatch.CallError{Code: reasons.LedgerCorrupt, Message: fmt.Sprintf("activation %s/%s: the ledger is unusable and nothing runs until an operator resolves it: %v", namespace, name, ledgerErr)}
	case recovering || !applied:
		return nil, &dispatch.CallError{Code: reasons.Recovering, Message: fmt.Sprintf("activation %s/%s is still being recovered; module %s is not known yet: retry", namespace, name, module)}
	}
	return nil, &dispatch.CallError{Code: reasons.NotFound, Message: fmt.Sprintf("no module %s in activation %s/%s on this node", module, namespace, name)}
}

// Activations lists the keys of the activations the coordinator knows.
func (c *Coordinator) Activations() []ActivationKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]ActivationKey, 0, len(c.activations))
	for _, a := range c.activations {
		keys = append(keys, a.key)
	}
	return keys
}

// ServedModules lists every module of every activation the coordinator
// knows, for the gateway's handshake.
func (c *Coordinator) ServedModules() []dispatch.ServedModule {
	var out []dispatch.ServedModule
	for _, key := range c.Activations() {
		st, ok := c.Status(key.UID)
		if !ok {
			continue
		}
		for _, ms := range st.Modules {
			out = append(out, dispatch.ServedModule{
				Namespace: key.Namespace, Activation: key.Name, Module: ms.Module,
				Lineage: ms.Lineage, GenerationName: ms.Active, Epoch: ms.Epoch,
				ImplementationID: ms.ImplementationID, Phase: string(ms.Phase), Reason: ms.Reason,
			})
		}
	}
	return out
}

// Shutdown stops every worker after its current transaction, then stops
// every provider and closes the ledgers. Calls fail afterwards.
func (c *Coordinator) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	all := make([]*activationRuntime, 0, len(c.activations))
	for _, a := range c.activations {
		all = append(all, a)
	}
	c.mu.Unlock()
	var errs []error
	for _, a := range all {
		if err := a.shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Coordinator) runtime(key ActivationKey, create bool) (*activationRuntime, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if a, ok := c.activations[key.UID]; ok {
		return a, nil
	}
	if !create {
		return nil, fmt.Errorf("activation %s is unknown", key.UID)
	}
	a := newActivationRuntime(c, key)
	c.activations[key.UID] = a
	go a.run()
	return a, nil
}

// HoldForOwnerRestart is called when the survivor that owns the providers
// is about to stop (docs/survivor.md): every module serving a protocol-2
// generation is checkpointed and paused until its relaunch, so that
// nothing is lost. It returns when every activation did so, or ctx ended.
func (c *Coordinator) HoldForOwnerRestart(ctx context.Context) {
	c.mu.Lock()
	all := make([]*activationRuntime, 0, len(c.activations))
	for _, a := range c.activations {
		all = append(all, a)
	}
	c.mu.Unlock()
	for _, a := range all {
		done := make(chan struct{})
		select {
		case a.hold <- done:
			select {
			case <-done:
			case <-ctx.Done():
				return
			}
		case <-a.done:
		case <-ctx.Done():
			return
		}
	}
}
