package dispatch

import (
	"context"
	"fmt"

	"iteron.dev/operator/internal/reasons"
)

// Withdraw removes a queued call: its Invoke returns (its Submit's done gets) a CallError with
// reasons.Cancelled at once and the call never runs. It reports false when no
// call with that ID is queued (it is running, finished, or unknown); use
// CancelRunning for a running one.
func (d *Dispatcher) Withdraw(callID, reason string) bool {
	found := d.unqueue(func(q *pendingCall) bool { return q.call.ID == callID })
	if found == nil {
		return false
	}
	found.err = &CallError{Code: reasons.Cancelled, Message: fmt.Sprintf("withdrawn from module %s's queue before it ran: %s", d.module, reason)}
	found.end()
	return true
}

// CancelRunning asks the backend to cancel the call with that ID if it is
// the one in the run slot, and waits (bounded by ctx and the backend's
// cancellation deadline) for the provider to acknowledge it. The run then
// ends with the backend's error and Invoke returns it; the dispatcher does
// not retry it. It reports false when that call is not running.
func (d *Dispatcher) CancelRunning(ctx context.Context, callID, reason string) (bool, error) {
	d.mu.Lock()
	p, ok := d.running[callID]
	var backend Backend
	if ok {
		backend = p.route.Backend
	}
	d.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, backend.Cancel(ctx, callID, reason)
}

// Running returns the oldest call in a run slot, if any.
func (d *Dispatcher) Running() (InFlight, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var oldest *pendingCall
	for _, p := range d.running {
		if oldest == nil || p.startedAt.Before(oldest.startedAt) {
			oldest = p
		}
	}
	if oldest == nil {
		return InFlight{}, false
	}
	return oldest.inFlight(), true
}
