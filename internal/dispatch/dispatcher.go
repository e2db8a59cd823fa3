package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/pkg/protocol"
)

// DefaultQueueLimit bounds the calls waiting for one module.
const DefaultQueueLimit = 1024

// Observation is one observation a run emitted, as raw JSON.
type Observation struct {
	// Sequence is the provider's sequence number.
	Sequence uint64
	// Terminal is true for the run's last observation.
	Terminal bool
	// Body is the observation object (raw JSON, validated by the executor);
	// for a package runtime, the result's value as JSON.
	Body []byte
	// Package is a package runtime's whole answer (ok, value, error,
	// dependencies); nil for a line-protocol provider.
	Package *runtimepb.InvokeResponse
}

// Backend runs calls on one generation's process. The coordinator adapts a
// provider process to it; the dispatcher never sees a process directly.
type Backend interface {
	// Run starts a run and blocks until its terminal observation or error,
	// passing every observation (the terminal one included) to observe in
	// order when observe is not nil. ctx ends the wait only; cancelling a run
	// is Cancel's job.
	Run(ctx context.Context, req RunRequest, observe func(Observation)) (Observation, error)
	// Cancel asks the provider to cancel a run and waits (bounded by the
	// cancellation deadline) for it to end.
	Cancel(ctx context.Context, runID, reason string) error
	// Fits reports whether a run with this deadline and requestBytes of run
	// ID and input can complete before the process must be renewed (its
	// lifetime or its stdin would run out); a call that does not fit waits
	// for the renewal.
	Fits(deadline time.Duration, requestBytes int) bool
}

// RunRequest is one run as the dispatcher hands it to a backend: everything
// the run needs is a field here, nothing rides in its context.
type RunRequest struct {
	// ID is the run ID (the call's ID).
	ID string
	// Input is the run's input.
	Input protocol.Payload
	// Deadline is the run's deadline_ms: what remained of the call's
	// deadline when it was dispatched.
	Deadline time.Duration
	// Invocation, when set, is the gateway's invocation the run serves,
	// with the generation that runs it filled in: a survivor keeps the
	// run's outcome under it across manager restarts.
	Invocation *survivor.Invocation
	// Package is what the call asks of a package runtime besides its input
	// (nil for a plain call).
	Package *PackageCall
	// Span is the run's span (invalid when the call is not traced): a
	// backend passes it on to a package runtime.
	Span trace.SpanContext
	// Hop, set with Span, is where a backend that relays the run through
	// the survivor notes when the hop started and ended; the dispatcher
	// makes its span below the run's.
	Hop *HopTimes
}

// HopTimes bound a run's relay through the survivor, as the manager saw it.
type HopTimes struct {
	Start, End time.Time
}

// Route is what the dispatcher sends calls to: one generation's backend.
type Route struct {
	// Lineage is the generation's lineage number.
	Lineage int64
	// Name is the Generation object's name.
	Name string
	// Epoch is the module's epoch at this generation.
	Epoch string
	// Revision is the generation's ModuleTarget.Revision (metrics only).
	Revision string
	// Backend runs the calls.
	Backend Backend
	// Package is the generation's package runtime (nil for a line-protocol
	// provider): Watches are opened on it, and move when it changes.
	Package PackageBackend
	// Slots is how many of the module's runs may run at once on this
	// route: 1 (0 means 1) for a line-protocol provider, whose process runs
	// one at a time; a package runtime's max_concurrent_invocations.
	Slots int
	// Scope holds the generation's live resources (nil when untracked): a
	// stream or watcher bound to this route registers in it, so disposing
	// the generation ends it (TrackWork) and nothing outlives it.
	Scope *effects.EffectScope
}

// Call is one invocation of a module.
type Call struct {
	// ID identifies the invocation (and becomes the run ID).
	ID string
	// Input is the run's input, checked once (by the gateway) and written
	// to the provider as it is.
	Input protocol.Payload
	// Deadline bounds the whole call, waiting included; it becomes the
	// run's deadline_ms when the run starts.
	Deadline time.Time
	// PinnedLineage, when non-zero, requires the call to run on that lineage;
	// after a cutover it fails with stale_generation.
	PinnedLineage int64
	// Observe, when set, receives every observation of the run in order.
	Observe func(Observation)
	// OnStart, when set, is called as the run is dispatched, with the route
	// that serves it.
	OnStart func(Route)
	// Invocation, when set, is the gateway's invocation the run serves: a
	// survivor keeps the run's outcome under it across manager restarts
	// (its generation is filled in at dispatch).
	Invocation *survivor.Invocation
	// Package, when set, is what the call asks of a package runtime
	// besides its input (export, object, dependencies, session, the
	// caller's namespace).
	Package *PackageCall
	// Background runs a cancellation that waits for the provider's
	// acknowledgement (Cancel), so that the submitter can wait for it and
	// report its error (nil: a goroutine of its own, the error dropped).
	Background func(job func() error)
	// Span, when valid and sampled, is the call's span (the gateway's): its
	// queueing and its run are traced below it (docs/tracing.md).
	Span trace.SpanContext

	// state is the dispatcher's part of the call's record, from Submit to
	// its end: a submitted call is one record, its submitter's (the
	// gateway's invocation holds its Call), never copied.
	state pendingCall
}

// Result is a finished call.
type Result struct {
	// Lineage and Name identify the generation that served the call.
	Lineage int64
	Name    string
	// Terminal is the run's terminal observation.
	Terminal Observation
	// QueuedFor is how long the call waited before its run started.
	QueuedFor time.Duration
}

// CallError is a call that failed, with its reason code
// (docs/reference/reasons.md).
type CallError struct {
	// Code is the reason code (queue_full, stale_generation, deadline_exceeded,
	// provider_failed, activation_failed, …).
	Code string
	// Message explains it.
	Message string
	// Err is the underlying error, if any.
	Err error
}

func (e *CallError) Error() string { return e.Code + ": " + e.Message }
func (e *CallError) Unwrap() error { return e.Err }

// ErrDispatcherClosed is wrapped by calls failed because the module was retired.
var ErrDispatcherClosed = errors.New("module retired")

// pendingCall is the dispatcher's state of a call from its submission to
// its end (Call.state). Exactly one party ends it — its run, the dispatch
// loop (stale, expired), its deadline's timer, a withdrawal, SetUnavailable
// or Close — the one that took it out of the queue (or, once dispatched,
// its run), so end runs once.
type pendingCall struct {
	// call is the call this is the state of; d its dispatcher.
	call     *Call
	d        *Dispatcher
	enqueued time.Time
	// expire ends the call when its deadline passes while it is queued
	// (set under d.mu as it is queued).
	expire *time.Timer
	done   func(Result, error)
	result Result
	err    error
	// route is the route it was dispatched to (nil while it has not
	// been), and cancelRequested whether its submitter asked to cancel it;
	// both under the dispatcher's mu.
	route           *Route
	startedAt       time.Time
	cancelRequested bool
	// cut ends its run's context with a CallError as the cause: the host
	// ends a package runtime's call that the runtime did not end after a
	// cancel (set with route).
	cut context.CancelCauseFunc
	// swap is the transaction the call waited for while it was queued
	// (its quiesce paused the dispatcher), for the queue span's link;
	// under the dispatcher's mu.
	swap trace.SpanContext
}

// inFlight describes the call's run. Caller holds the dispatcher's mu.
func (p *pendingCall) inFlight() InFlight {
	return InFlight{CallID: p.call.ID, Route: *p.route, StartedAt: p.startedAt}
}

// end stops the deadline's timer and hands the outcome to whoever submitted
// the call.
func (p *pendingCall) end() {
	if p.expire != nil {
		p.expire.Stop()
	}
	p.done(p.result, p.err)
	if p.route == nil && p.call.Span.IsSampled() && tracing.Enabled() {
		// It never ran: its queueing is all there is to trace (made after
		// the call was answered).
		p.makeQueueSpan(time.Now(), p.err)
	}
}

// InFlight describes a run occupying a slot (a copy, for its reader).
type InFlight struct {
	// CallID is the call's ID (the run ID).
	CallID string
	// Route is the generation running it.
	Route Route
	// StartedAt is when it was dispatched.
	StartedAt time.Time
}

// Dispatcher routes one module's calls to its active generation: a bounded
// queue, the route's run slots (one for a line-protocol provider), pause
// (quiesce) and an atomic switch of the route. The
// gateway is a thin adapter over it. Calls arriving during a swap wait in the
// queue — bounded by their own deadlines — instead of failing.
//
// What a call gets while no generation of the module serves is decided here
// and nowhere else (docs/gateway.md, "Errors"); the coordinator only says
// which case holds:
//
//	case                                                  the call                  at its deadline
//	a generation is activated or swapped (SetAvailable)   waits in the queue        deadline_exceeded
//	the ledger's committed generation is recovered:       waits in the queue        recovering (retry)
//	  re-attached or relaunched after a manager restart,
//	  relaunched after a crash (SetRecovering)
//	nothing serves and nothing is prepared                fails at once with the reason (queued calls too)
//	  (SetUnavailable: verification_failed, authority_changed, ledger_corrupt,
//	  ledger_unwritable, a failed activation, a spent crash budget …)
//	the module is retired (Close)                         not_found (queued calls too)
//
// A call that fails before it was dispatched (Call.OnStart never called)
// never ran: the gateway then forgets its invocation ID, so a retry runs it.
type Dispatcher struct {
	module     string
	queueLimit int

	mu     sync.Mutex
	route  *Route
	paused bool
	// pausedBy is the transaction whose quiesce paused dispatching (its
	// root span; invalid when tracing is off or no transaction paused it).
	pausedBy trace.SpanContext
	closed   bool
	queue    []*pendingCall
	// running are the calls in a run slot, by call ID: the same record as
	// when they were queued.
	running map[string]*pendingCall
	idle    chan struct{} // closed when no run is in flight; replaced when one starts
	onNoFit func()
	// unavailable, when set, fails calls at once: nothing serves the module
	// and nothing is being prepared, so waiting out a deadline would only
	// hide the reason.
	unavailable *CallError
	// recovering, when set, is what a call that waited out its deadline
	// gets instead of deadline_exceeded: the module's committed generation
	// is being recovered (re-attached, relaunched), so retrying is right.
	recovering *CallError
	// routeChanged is closed, and replaced, whenever what serves the module
	// changes (a switch, a withdrawn route, unavailable, closed): a stream
	// that follows the module's runtime waits on it instead of polling.
	routeChanged chan struct{}
	kick         chan struct{}
	stop         chan struct{}
	stopped      chan struct{}
}

// routeChangedLocked wakes whoever waits for the module's route to change.
// Caller holds d.mu.
func (d *Dispatcher) routeChangedLocked() {
	close(d.routeChanged)
	d.routeChanged = make(chan struct{})
}

// NewDispatcher returns a paused dispatcher with no route; Switch installs
// the first route and Resume starts dispatching.
func NewDispatcher(module string, queueLimit int) *Dispatcher {
	if queueLimit <= 0 {
		queueLimit = DefaultQueueLimit
	}
	d := &Dispatcher{
		module: module, queueLimit: queueLimit, paused: true, running: map[string]*pendingCall{},
		idle: make(chan struct{}), kick: make(chan struct{}, 1), routeChanged: make(chan struct{}),
		stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	close(d.idle)
	go d.loop()
	return d
}

// Module is the module the dispatcher serves.
func (d *Dispatcher) Module() string { return d.module }

// Route returns the current route (nil before the first switch).
func (d *Dispatcher) Route() *Route {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.route == nil {
		return nil
	}
	r := *d.route
	return &r
}

// QueueLength is the number of calls waiting.
func (d *Dispatcher) QueueLength() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.queue)
}

// Invoke queues a call and waits for its result. It fails at once with
// queue_full when the queue is at its bound, with stale_generation when the
// call pins a lineage that is no longer routed, and with deadline_exceeded
// when its deadline passes while it waits.
func (d *Dispatcher) Invoke(ctx context.Context, call Call) (Result, error) {
	ended := make(chan struct{})
	var res Result
	var resErr error
	c := &call
	c.state = pendingCall{} // a copy of a submitted call is not that call
	err := d.Submit(c, func(r Result, err error) {
		res, resErr = r, err
		close(ended)
	})
	if err != nil {
		return Result{}, err
	}
	select {
	case <-ended:
	case <-ctx.Done():
		// Still queued: withdrawn. Already running: the run's own deadline
		// ends it; its result is waited for so the slot is never
		// double-booked.
		c.Withdraw(&CallError{Code: reasons.DeadlineExceeded, Message: "the caller gave up while the call was queued", Err: ctx.Err()})
		<-ended
	}
	return res, resErr
}

// A submitted *Call is its submitter's handle of it (CallHandle): whether
// and where it runs, its withdrawal from the queue and its cancellation.
// The gateway reads an invocation's state from it and keeps none of its
// own.

// Withdraw takes the call out of the queue and ends it with err (its done
// is called before Withdraw returns). It reports false when the call is no
// longer queued: it runs, or has ended.
func (c *Call) Withdraw(err *CallError) bool {
	p := &c.state
	if p.d == nil || !p.d.withdraw(p) {
		return false
	}
	p.err = err
	p.end()
	return true
}

// Started reports the route the call was dispatched to, if it was.
func (c *Call) Started() (Route, bool) {
	p := &c.state
	if p.d == nil {
		return Route{}, false
	}
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	if p.route == nil {
		return Route{}, false
	}
	return *p.route, true
}

// CancelRequested reports whether Cancel was called.
func (c *Call) CancelRequested() bool {
	p := &c.state
	if p.d == nil {
		return false
	}
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	return p.cancelRequested
}

// Cancel ends the call at its submitter's request. A queued call is
// withdrawn: it ends (cancelled) before Cancel returns and never runs. A
// run on a package runtime is cancelled by the runtime, whose state is
// returned (cancellation-requested while the run winds down), and ended by
// the host if the runtime has not ended it within its cancel_ms. A run on a
// line-protocol provider is asked to cancel in the background (Background):
// the acknowledgement may take up to the cancellation deadline. A call
// that ended is left as it ended.
func (c *Call) Cancel(ctx context.Context, reason string) (runtimeState string, err error) {
	d := c.state.d
	if d == nil {
		return "", nil
	}
	d.mu.Lock()
	c.state.cancelRequested = true
	d.mu.Unlock()
	if c.Withdraw(&CallError{Code: reasons.Cancelled, Message: fmt.Sprintf("withdrawn from module %s's queue before it ran: %s", d.module, reason)}) {
		return "", nil
	}
	route, started := c.Started()
	if !started {
		return "", nil
	}
	if route.Package != nil {
		state, err := route.Package.CancelInvocation(ctx, c.ID)
		c.cutUnlessEnded(route.Package, state, err)
		return state, err
	}
	job := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := d.CancelRunning(ctx, c.ID, reason)
		return err
	}
	if bg := c.Background; bg != nil {
		bg(job)
	} else {
		go func() { _ = job() }()
	}
	return "", nil
}

// cutUnlessEnded bounds a cancelled package run: the runtime had
// cancel_ms to end it, after which the host ends the call itself (the
// runtime's handler sees its request cancelled). A runtime that answered
// unknown has not read the run's request yet (it is on its way), so it
// has nothing to wind down and the call is ended at once: waiting for it
// would hold the slot until invoke_ms.
func (c *Call) cutUnlessEnded(runtime PackageBackend, state string, cancelErr error) {
	d, p := c.state.d, &c.state
	d.mu.Lock()
	cut := p.cut
	d.mu.Unlock()
	wait := runtime.CancellationDeadline()
	why := &CallError{Code: reasons.Cancelled, Message: fmt.Sprintf("%s of module %s was cancelled and its runtime had not ended it within deadlines.cancel_ms (%v): the manager ended the call", c.describe(), d.module, wait)}
	if cancelErr == nil && state == "unknown" {
		wait = 0
		why.Message = fmt.Sprintf("%s of module %s was cancelled before its runtime had read it: the manager ended the call", c.describe(), d.module)
	}
	time.AfterFunc(wait, func() { cut(why) })
}

// describe names the call as its caller knows it, and its run.
func (c *Call) describe() string {
	if c.Invocation != nil && c.Invocation.InvocationID != "" && c.Invocation.InvocationID != c.ID {
		return fmt.Sprintf("invocation %s (run %s)", c.Invocation.InvocationID, c.ID)
	}
	return "run " + c.ID
}

// RuntimeStatus is a package runtime's own state of the call's run ("" with
// a nil error for a call not running on one).
func (c *Call) RuntimeStatus(ctx context.Context) (string, error) {
	route, started := c.Started()
	if !started || route.Package == nil {
		return "", nil
	}
	return route.Package.Status(ctx, c.ID)
}

// Submit queues a call without waiting for it: done is called exactly
// once, with its result or its CallError, by whatever ends it — its run,
// its deadline passing while it waits, the dispatcher refusing it at
// dispatch, a withdrawal, SetUnavailable, Close. done runs on the goroutine
// that ended the call and must not block. A call refused at once (the
// cases Invoke lists) returns the error, and done is never called.
//
// Nothing waits for a submitted call: a caller that needs the result in
// its own goroutine uses Invoke; the gateway hands the outcome on from
// done, so a call costs no goroutine of its own while it is queued.
func (d *Dispatcher) Submit(call *Call, done func(Result, error)) error {
	if call.Deadline.IsZero() {
		return &CallError{Code: reasons.DeadlineExceeded, Message: "a call needs a deadline"}
	}
	if call.state.d != nil {
		return &CallError{Code: reasons.InvalidRequest, Message: fmt.Sprintf("call %s was submitted already: a call is submitted once", call.ID)}
	}
	enqueued := time.Now()
	d.mu.Lock()
	switch {
	case d.closed:
		d.mu.Unlock()
		return &CallError{Code: reasons.NotFound, Message: fmt.Sprintf("module %s was retired: it is no longer on this node", d.module), Err: ErrDispatcherClosed}
	case d.unavailable != nil:
		err := *d.unavailable
		d.mu.Unlock()
		return &err
	case call.PinnedLineage != 0 && d.route != nil && d.route.Lineage != call.PinnedLineage:
		cur := d.route.Lineage
		d.mu.Unlock()
		return &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("module %s serves generation %d, the call pins %d", d.module, cur, call.PinnedLineage)}
	case len(d.queue) >= d.queueLimit:
		d.mu.Unlock()
		return &CallError{Code: reasons.QueueFull, Message: fmt.Sprintf("module %s has %d calls waiting", d.module, d.queueLimit)}
	}
	// Accepted: from here on the call's state is the dispatcher's (a call
	// refused above keeps none, and may be submitted again).
	p := &call.state
	*p = pendingCall{call: call, d: d, enqueued: enqueued, done: done, swap: d.pausedBy}
	d.queue = append(d.queue, p)
	p.expire = time.AfterFunc(time.Until(call.Deadline), func() { d.expire(p) })
	d.mu.Unlock()
	d.poke()
	return nil
}

// expire ends a call whose deadline passed while it was queued; one that
// is running meanwhile is ended by its run.
func (d *Dispatcher) expire(p *pendingCall) {
	if d.withdraw(p) {
		p.err = d.expiredInQueue(p)
		p.end()
	}
}

// expiredInQueue is the answer to a call whose deadline passed while it
// waited: recovering while the module's committed generation is being
// recovered (a retry will find it serving), else deadline_exceeded.
func (d *Dispatcher) expiredInQueue(p *pendingCall) *CallError {
	waited := time.Since(p.enqueued).Round(time.Millisecond)
	d.mu.Lock()
	recovering := d.recovering
	d.mu.Unlock()
	if recovering != nil {
		return &CallError{Code: reasons.Recovering, Message: fmt.Sprintf("%s; the call waited %s in module %s's queue: retry", recovering.Message, waited, d.module)}
	}
	return &CallError{Code: reasons.DeadlineExceeded, Message: fmt.Sprintf("the deadline passed after %s in module %s's queue", waited, d.module)}
}

// withdraw takes p out of the queue; false when it is not there.
func (d *Dispatcher) withdraw(p *pendingCall) bool {
	return d.unqueue(func(q *pendingCall) bool { return q == p }) != nil
}

// unqueue takes the first queued call that match reports out of the queue
// and returns it (nil when none matches): whoever takes a call out of the
// queue is the one that ends it.
func (d *Dispatcher) unqueue(match func(*pendingCall) bool) *pendingCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.IndexFunc(d.queue, match)
	if i < 0 {
		return nil
	}
	p := d.queue[i]
	d.queue = slices.Delete(d.queue, i, i+1)
	return p
}

func (d *Dispatcher) poke() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// loop dispatches queued calls one at a time while not paused.
func (d *Dispatcher) loop() {
	defer close(d.stopped)
	for {
		select {
		case <-d.stop:
			return
		case <-d.kick:
		}
		for d.dispatchOne() {
		}
	}
}

// dispatchOne starts the head call if it can; it reports whether it did
// something (so the loop tries again).
func (d *Dispatcher) dispatchOne() bool {
	d.mu.Lock()
	if d.paused || d.closed || d.route == nil || len(d.running) >= max(d.route.Slots, 1) || len(d.queue) == 0 {
		d.mu.Unlock()
		return false
	}
	p := d.queue[0]
	route := *d.route
	if p.call.PinnedLineage != 0 && p.call.PinnedLineage != route.Lineage {
		d.queue = d.queue[1:]
		d.mu.Unlock()
		p.err = &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("module %s switched to generation %d while the call, pinned to %d, waited", d.module, route.Lineage, p.call.PinnedLineage)}
		p.end()
		return true
	}
	remaining := time.Until(p.call.Deadline)
	if remaining <= 0 {
		d.queue = d.queue[1:]
		d.mu.Unlock()
		p.err = d.expiredInQueue(p)
		p.end()
		return true
	}
	if !route.Backend.Fits(remaining, len(p.call.ID)+p.call.Input.Len()) {
		// The process is about to be renewed: ask for the renewal now and
		// wait for the switch (Switch and Resume poke the loop).
		onNoFit := d.onNoFit
		d.mu.Unlock()
		if onNoFit != nil {
			onNoFit()
		}
		return false
	}
	d.queue = d.queue[1:]
	if len(d.running) == 0 {
		d.idle = make(chan struct{})
	}
	// Only a package runtime's run is ever cut (cutUnlessEnded): a
	// line-protocol run's context costs nothing more than its deadline.
	runCtx, cut := context.Background(), context.CancelCauseFunc(func(error) {})
	if route.Package != nil {
		runCtx, cut = context.WithCancelCause(runCtx)
	}
	p.route, p.startedAt, p.cut = &route, time.Now(), cut
	d.running[p.call.ID] = p
	d.mu.Unlock()

	go d.run(runCtx, p, route, remaining)
	return true
}

func (d *Dispatcher) run(runCtx context.Context, p *pendingCall, route Route, deadline time.Duration) {
	started := time.Now()
	if p.call.OnStart != nil {
		p.call.OnStart(route)
	}
	ctx, cancel := context.WithTimeout(runCtx, deadline+time.Second)
	req := RunRequest{ID: p.call.ID, Input: p.call.Input, Deadline: deadline, Package: p.call.Package}
	var rt *runTrace
	if p.call.Span.IsSampled() && tracing.Enabled() {
		rt = &runTrace{run: tracing.PlanChild(p.call.Span, started), route: route}
		req.Span, req.Hop = rt.run.SC, &rt.hop
	}
	if p.call.Invocation != nil {
		inv := *p.call.Invocation
		inv.Generation, inv.GenerationName = route.Lineage, route.Name
		req.Invocation = &inv
	}
	var terminal Observation
	var err error
	if field := p.call.Package.RuntimeOnlyField(); field != "" && route.Package == nil {
		err = &CallError{Code: reasons.SchemaMismatch, Message: fmt.Sprintf("%s: module %s is served by a line-protocol provider (generation %d); %s applies to package runtimes only", field, d.module, route.Lineage, field)}
	} else {
		terminal, err = route.Backend.Run(ctx, req, p.call.Observe)
	}
	cancel()
	if err != nil {
		// Declared here, not above: errors.As moves it to the heap, and a
		// run that succeeded should not pay for it.
		var cutWhy *CallError
		if errors.As(context.Cause(runCtx), &cutWhy) {
			// The host ended the call after a cancel: its error says so
			// rather than the transport's.
			err = cutWhy
		}
	}
	p.cut(nil)
	var ns interface{ NotStarted() bool }
	if err != nil && errors.As(err, &ns) && ns.NotStarted() && time.Until(p.call.Deadline) > 0 {
		// The run never reached a provider (its owner, the survivor, went
		// away first): the call waits at the head of the queue for the
		// relaunch, as calls that arrive now do, instead of failing.
		d.mu.Lock()
		d.queue = append([]*pendingCall{p}, d.queue...)
		// Its deadline has not passed, so its timer has not fired: it still
		// ends the call at the deadline if it cannot run by then.
		d.endRunLocked(p.call.ID)
		d.mu.Unlock()
		time.AfterFunc(20*time.Millisecond, d.poke)
		return
	}
	p.result = Result{Lineage: route.Lineage, Name: route.Name, Terminal: terminal, QueuedFor: started.Sub(p.enqueued)}
	d.mu.Lock()
	current := d.route
	d.mu.Unlock()
	if err == nil && (current == nil || current.Lineage != route.Lineage) {
		// The route only switches between runs, so this cannot happen; if
		// it ever did, output of a generation no longer routed is dropped.
		p.result = Result{}
		err = &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("generation %d answered after module %s had switched away from it; its output was dropped", route.Lineage, d.module)}
	}
	if err != nil {
		p.err = Classify(err, route.Lineage)
	}
	runErr := p.err
	p.end()
	if rt != nil {
		// Answered: the call's queueing and run are traced now, off its
		// path.
		p.makeQueueSpan(started, nil)
		rt.make(time.Now(), runErr)
	}

	d.mu.Lock()
	d.endRunLocked(p.call.ID)
	d.mu.Unlock()
	d.poke()
}

// endRunLocked frees a run's slot. Caller holds d.mu.
func (d *Dispatcher) endRunLocked(callID string) {
	delete(d.running, callID)
	if len(d.running) == 0 {
		close(d.idle)
	}
}

// Pause stops dispatching new calls (quiesce) and waits up to timeout for the
// runs in flight. Those still running then are cancelled (Pause waits for
// the cancellations to end, bounded by ctx) and returned, for the receipts.
// Calls keep queueing while paused.
func (d *Dispatcher) Pause(ctx context.Context, timeout time.Duration) ([]InFlight, error) {
	d.mu.Lock()
	d.paused = true
	if tracing.Enabled() {
		d.pauseForLocked(trace.SpanContextFromContext(ctx))
	}
	idle := d.idle
	d.mu.Unlock()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-idle:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
	}
	d.mu.Lock()
	var cancelled []InFlight
	for _, p := range d.running {
		cancelled = append(cancelled, p.inFlight())
	}
	idle = d.idle
	d.mu.Unlock()
	if len(cancelled) == 0 {
		return nil, nil
	}
	slices.SortFunc(cancelled, func(a, b InFlight) int { return a.StartedAt.Compare(b.StartedAt) })
	var errs []error
	for _, r := range cancelled {
		errs = append(errs, r.Route.Backend.Cancel(ctx, r.CallID, "quiesce timeout: the module is being swapped"))
	}
	select {
	case <-idle:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return cancelled, errors.Join(errs...)
}

// PauseNow stops dispatching new calls at once, without waiting for the
// run in flight (a crashed process: the run already failed).
func (d *Dispatcher) PauseNow() {
	d.mu.Lock()
	d.paused = true
	d.mu.Unlock()
}

// PauseWhenIdle pauses dispatching once no run is in flight, waiting up to
// timeout for the slot to empty; it never cancels a run. It reports whether
// the dispatcher is now paused and idle; when it is not, dispatching goes on
// as before. Checkpoints use it to snapshot between runs.
func (d *Dispatcher) PauseWhenIdle(ctx context.Context, timeout time.Duration) bool {
	d.mu.Lock()
	wasPaused := d.paused
	d.paused = true
	idle := d.idle
	d.mu.Unlock()
	select {
	case <-idle:
		return true
	default:
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
	case <-timer.C:
	}
	if !wasPaused {
		d.Resume()
	}
	return false
}

// SetOnNoFit sets the function called when the head call does not fit the
// current process's remaining lifetime (it must not block): the coordinator
// renews the process on demand.
func (d *Dispatcher) SetOnNoFit(f func()) {
	d.mu.Lock()
	d.onNoFit = f
	d.mu.Unlock()
}

// Closed reports whether the module was retired (Close).
func (d *Dispatcher) Closed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Paused reports whether dispatching is paused.
func (d *Dispatcher) Paused() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.paused
}

// Switch atomically replaces the route: every call dispatched after it runs
// on the new generation. The dispatcher must be paused (the caller resumes
// it when the transaction allows). Calls pinned to the old lineage that are
// still queued fail with stale_generation when they reach the head.
func (d *Dispatcher) Switch(route Route) (previous *Route, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.paused {
		return nil, fmt.Errorf("switch module %s: the dispatcher is not paused", d.module)
	}
	for id := range d.running {
		return nil, fmt.Errorf("switch module %s: run %s is still in flight", d.module, id)
	}
	previous = d.route
	defer d.routeChangedLocked()
	if route.Backend == nil {
		// Undoing a first switch: no route at all again.
		d.route = nil
		return previous, nil
	}
	d.route = &route
	// A generation serves again: what was being recovered is.
	d.recovering = nil
	return previous, nil
}

// WithdrawRoute removes the route if it still sends calls to backend (its
// generation is being disposed) and reports whether it did: calls then wait
// for the next switch instead of reaching a process that is going away. A
// route that already moved on is left alone.
func (d *Dispatcher) WithdrawRoute(backend Backend) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.route == nil || d.route.Backend != backend {
		return false
	}
	d.route = nil
	d.routeChangedLocked()
	return true
}

// SetUnavailable makes calls fail at once with code and message, the queued
// ones included: the module has no generation able to serve and none is
// being prepared. SetAvailable or SetRecovering ends it.
func (d *Dispatcher) SetUnavailable(code, message string) {
	d.mu.Lock()
	d.unavailable = &CallError{Code: code, Message: message}
	d.recovering = nil
	d.routeChangedLocked()
	queue := d.queue
	d.queue = nil
	d.mu.Unlock()
	for _, p := range queue {
		err := CallError{Code: code, Message: message}
		p.err = &err
		p.end()
	}
}

// SetAvailable lets calls wait in the queue again (a generation is being
// prepared, or serves). A recovery in progress stays one (SetRecovering).
func (d *Dispatcher) SetAvailable() {
	d.mu.Lock()
	d.unavailable = nil
	d.mu.Unlock()
}

// SetRecovering lets calls wait in the queue while the module's committed
// generation is being recovered — re-attached or relaunched after a manager
// restart, relaunched after a crash — and makes a call whose deadline passes
// first get recovering (retry), with message saying what is being
// recovered. It ends when a route is switched in (the generation serves) or
// SetUnavailable (the recovery concluded the module cannot serve).
func (d *Dispatcher) SetRecovering(message string) {
	d.mu.Lock()
	d.unavailable = nil
	d.recovering = &CallError{Code: reasons.Recovering, Message: message}
	d.mu.Unlock()
}

// Recovering reports the recovery calls wait for, or nil.
func (d *Dispatcher) Recovering() *CallError {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.recovering == nil {
		return nil
	}
	err := *d.recovering
	return &err
}

// Unavailable reports why calls fail at once, or nil when they wait or run.
func (d *Dispatcher) Unavailable() *CallError {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.unavailable == nil {
		return nil
	}
	err := *d.unavailable
	return &err
}

// Resume starts dispatching again.
func (d *Dispatcher) Resume() {
	d.mu.Lock()
	d.paused = false
	d.pausedBy = trace.SpanContext{}
	d.mu.Unlock()
	d.poke()
}

// Wake makes the dispatcher re-check whether the head call can run (for
// example after a backend's remaining lifetime changed).
func (d *Dispatcher) Wake() { d.poke() }

// Close fails every queued call (not_found: the module was retired), waits
// for the in-flight run to finish, and stops the dispatcher. Idempotent.
func (d *Dispatcher) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		<-d.stopped
		return
	}
	d.closed = true
	d.recovering = nil
	d.routeChangedLocked()
	queue := d.queue
	d.queue = nil
	idle := d.idle
	d.mu.Unlock()
	for _, p := range queue {
		p.err = &CallError{Code: reasons.NotFound, Message: fmt.Sprintf("module %s was retired while the call waited: it is no longer on this node", d.module), Err: ErrDispatcherClosed}
		p.end()
	}
	<-idle
	close(d.stop)
	<-d.stopped
}
