package gateway

import (
	"context"
	"sync"
	"time"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/tracing"
)

// The idempotency window: a client-chosen invocation_id is remembered, with
// its outcome, for InvocationTTL after the call ended, and at most
// MaxInvocations invocations (running ones included) and MaxInvocationBytes
// of recorded outcomes are kept; the oldest ended ones are forgotten first.
// A repeat within the window returns the recorded outcome; a repeat after it
// runs the call again, and so does any repeat after a manager restart (the
// Handshake's instance_id tells a client that happened).
const (
	InvocationTTL      = 10 * time.Minute
	MaxInvocations     = 8192
	MaxInvocationBytes = 64 << 20
)

// invocationOverhead is what an ended invocation costs besides its
// observation and message bytes, for the byte bound.
const invocationOverhead = 512

// invocation is one call made through the gateway, from acceptance to its
// outcome. Its mutable fields are guarded by mu.
type invocation struct {
	key         string // namespace + "\x00" + invocation ID
	id          string // the client's invocation ID (or one the gateway chose)
	runID       string // the run ID the provider sees
	namespace   string
	activation  string
	module      string
	fingerprint [32]byte
	dispatcher  *dispatch.Dispatcher

	done chan struct{} // closed when the outcome is recorded

	// call is the call submitted to the module's dispatcher, its state
	// there included: the dispatcher's part of this one record.
	call dispatch.Call
	// handle is the call's dispatcher handle: whether and where it runs,
	// its cancellation, a package runtime's state of it (&call for a
	// submitted call, which Stop withdraws while it is queued;
	// dispatch.PackageWatch for a package runtime's Watch, in the table
	// only while it is open; survivedCall for one known only from the
	// survivor). nil while the call is being submitted, or when it was
	// refused at once.
	handle dispatch.CallHandle
	// cancelEarly is the reason of a CancelInvocation that came before
	// the handle did; begin cancels the call as it submits it.
	cancelEarly string
	// trace is the call's span, planned as it arrives and made once it is
	// answered (not traced: a zero Planned).
	trace tracing.Planned

	mu             sync.Mutex
	started        bool
	generation     int64
	generationName string
	// revision is the serving generation's revision (metrics).
	revision string
	// arrived is when the call came in (the latency metric).
	arrived time.Time
	// droppedStale is set when an observation of the run was dropped
	// because its generation no longer served the module.
	droppedStale bool
	// binding is where the call's stream is registered while it runs
	// (scope.go).
	binding *streamBinding
	// streaming is set for a Watch: observations are queued for it.
	streaming bool
	events    []event
	notify    chan struct{} // signalled when events grow or the call ends
	// outcome, valid once done is closed
	result   dispatch.Result
	err      error
	reason   string
	message  string
	finished time.Time
	size     int64
}

// event is one observation on its way to a Watch stream.
type event struct {
	generation     int64
	generationName string
	obs            dispatch.Observation
}

func newInvocation() *invocation {
	return &invocation{done: make(chan struct{}), notify: make(chan struct{}, 1)}
}

func (inv *invocation) signal() {
	select {
	case inv.notify <- struct{}{}:
	default:
	}
}

// callHandle is the call's dispatcher handle (nil before it has one).
func (inv *invocation) callHandle() dispatch.CallHandle {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.handle
}

// setHandle records the handle of the submitted call and returns the
// reason of a cancellation requested before it ("" when none was).
func (inv *invocation) setHandle(h dispatch.CallHandle) string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.handle = h
	return inv.cancelEarly
}

// cancelOrNote returns the call's handle to cancel it with, or, before the
// call has one, notes the cancellation for begin and returns nil.
func (inv *invocation) cancelOrNote(reason string) dispatch.CallHandle {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.handle == nil {
		inv.cancelEarly = reason
	}
	return inv.handle
}

// ended reports whether the invocation's outcome is recorded.
func (inv *invocation) ended() bool {
	select {
	case <-inv.done:
		return true
	default:
		return false
	}
}

// status is the invocation's InvocationStatus now: its outcome once it
// ended, else what its handle says.
func (inv *invocation) status() *gatewayv1.InvocationStatus {
	h := inv.callHandle()
	var route dispatch.Route
	started, cancelRequested := false, false
	if h != nil {
		route, started = h.Started()
		cancelRequested = h.CancelRequested()
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	st := &gatewayv1.InvocationStatus{
		InvocationId: inv.id, Namespace: inv.namespace, Activation: inv.activation, Module: inv.module,
		Generation: inv.generation, GenerationName: inv.generationName,
	}
	if started && route.Lineage != 0 {
		st.Generation, st.GenerationName = route.Lineage, route.Name
	}
	if inv.ended() {
		if inv.err == nil {
			st.State = gatewayv1.InvocationState_INVOCATION_STATE_COMPLETED
		} else {
			st.State = gatewayv1.InvocationState_INVOCATION_STATE_FAILED
			st.Reason, st.Message = inv.reason, inv.message
		}
		return st
	}
	switch {
	case cancelRequested || inv.cancelEarly != "":
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED
	case started:
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_RUNNING
	default:
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_QUEUED
	}
	return st
}

// survivedCall is the handle of a call known only from the survivor (its
// run began before this manager started): it runs on the generation the
// survivor named, and can be neither withdrawn nor cancelled from here —
// its outcome arrives when it ends.
type survivedCall struct {
	route dispatch.Route

	mu              sync.Mutex
	cancelRequested bool
}

func (c *survivedCall) Started() (dispatch.Route, bool) { return c.route, true }

func (c *survivedCall) CancelRequested() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancelRequested
}

func (c *survivedCall) Cancel(context.Context, string) (string, error) {
	c.mu.Lock()
	c.cancelRequested = true
	c.mu.Unlock()
	return "", nil
}

func (c *survivedCall) RuntimeStatus(context.Context) (string, error) { return "", nil }

// invocationTable is the bounded idempotency window. Ended invocations are
// kept in the order they ended, so the oldest is forgotten first.
type invocationTable struct {
	ttl        time.Duration
	maxEntries int
	maxBytes   int64
	now        func() time.Time

	mu     sync.Mutex
	byKey  map[string]*invocation
	ended  []*invocation // by end time, oldest first
	bytes  int64
	forgot int64 // ended invocations forgotten early (size bounds)
}

func newInvocationTable(ttl time.Duration, maxEntries int, maxBytes int64, now func() time.Time) *invocationTable {
	return &invocationTable{ttl: ttl, maxEntries: maxEntries, maxBytes: maxBytes, now: now, byKey: map[string]*invocation{}}
}

// errTableFull is returned by admit when every remembered invocation is
// still running.
type errTableFull struct{ n int }

// admit returns the invocation already known under inv.key (existing true),
// or records inv. It refuses (errTableFull) when the table is at its bound
// and nothing ended can be forgotten.
func (t *invocationTable) admit(inv *invocation) (*invocation, bool, *errTableFull) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	if old, ok := t.byKey[inv.key]; ok {
		return old, true, nil
	}
	for len(t.byKey) >= t.maxEntries {
		if !t.forgetOldestLocked() {
			return nil, false, &errTableFull{n: len(t.byKey)}
		}
		t.forgot++
	}
	t.byKey[inv.key] = inv
	return inv, false, nil
}

// abandon forgets an invocation that was refused before it was accepted
// (its call never ran), so that a retry under the same ID may run.
func (t *invocationTable) abandon(inv *invocation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[inv.key] == inv {
		delete(t.byKey, inv.key)
	}
}

// ended records that inv's outcome is final; it stays for the TTL unless
// the bounds force it out earlier.
func (t *invocationTable) markEnded(inv *invocation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[inv.key] != inv {
		return
	}
	t.ended = append(t.ended, inv)
	t.bytes += inv.size
	t.expireLocked()
	for t.bytes > t.maxBytes && t.forgetOldestLocked() {
		t.forgot++
	}
}

func (t *invocationTable) lookup(key string) (*invocation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	inv, ok := t.byKey[key]
	return inv, ok
}

// expireLocked forgets ended invocations older than the TTL.
func (t *invocationTable) expireLocked() {
	cutoff := t.now().Add(-t.ttl)
	for len(t.ended) > 0 && t.ended[0].finished.Before(cutoff) {
		t.forgetOldestLocked()
	}
}

// forgetOldestLocked forgets the invocation that ended first; false when
// none has ended.
func (t *invocationTable) forgetOldestLocked() bool {
	if len(t.ended) == 0 {
		return false
	}
	inv := t.ended[0]
	t.ended[0] = nil
	t.ended = t.ended[1:]
	t.bytes -= inv.size
	if t.byKey[inv.key] == inv {
		delete(t.byKey, inv.key)
	}
	return true
}

// pending returns the invocations whose outcome is not recorded yet.
func (t *invocationTable) pending() []*invocation {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*invocation
	for _, inv := range t.byKey {
		select {
		case <-inv.done:
		default:
			out = append(out, inv)
		}
	}
	return out
}

// stats reports the table's size, for tests and metrics.
func (t *invocationTable) stats() (entries, ended int, bytes, forgotten int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey), len(t.ended), t.bytes, t.forgot
}
