package gateway

import (
	"sync"
	"time"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/dispatch"
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

	// queued is the call in its module's dispatcher (nil for one known
	// only from the survivor, or refused at once): Stop withdraws it.
	queued *dispatch.Queued
	// pkgWatch is the handle of a package runtime's Watch (nil for any
	// other call): its status and cancel are the handle's. Such an
	// invocation is in the table only while it is open.
	pkgWatch *dispatch.PackageWatch

	mu             sync.Mutex
	started        bool
	generation     int64
	generationName string
	// revision is the serving generation's revision (metrics).
	revision string
	// arrived is when the call came in (the latency metric).
	arrived time.Time
	// runtime is the package runtime running the call (nil for a
	// line-protocol provider): status requests are forwarded to it.
	runtime         dispatch.PackageBackend
	cancelRequested bool
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

// runningOn is the package runtime the call runs on, if any.
func (inv *invocation) runningOn() dispatch.PackageBackend {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.runtime
}

// status is the invocation's InvocationStatus now.
func (inv *invocation) status() *gatewayv1.InvocationStatus {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	st := &gatewayv1.InvocationStatus{
		InvocationId: inv.id, Namespace: inv.namespace, Activation: inv.activation, Module: inv.module,
		Generation: inv.generation, GenerationName: inv.generationName,
	}
	select {
	case <-inv.done:
		if inv.err == nil {
			st.State = gatewayv1.InvocationState_INVOCATION_STATE_COMPLETED
		} else {
			st.State = gatewayv1.InvocationState_INVOCATION_STATE_FAILED
			st.Reason, st.Message = inv.reason, inv.message
		}
		return st
	default:
	}
	switch {
	case inv.cancelRequested:
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED
	case inv.started:
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_RUNNING
	default:
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_QUEUED
	}
	return st
}

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
