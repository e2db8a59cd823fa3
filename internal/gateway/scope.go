package gateway

import (
	"context"
	"time"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
)

// A call's stream (an Invoke or a Watch) is a live resource of the
// generation whose process runs it: it is registered in that generation's
// EffectScope when its run starts and released when its outcome is
// recorded. Disposing the generation meanwhile waits for the call until the
// drain deadline, then cancels its run (the coordinator records a
// drain_timeout receipt).

// streamBinding is where a call's stream is registered.
type streamBinding struct {
	scope *effects.EffectScope
	id    string
}

// bindStream registers inv's stream in the scope of the generation r that
// runs it.
func (s *Server) bindStream(inv *invocation, r dispatch.Route) {
	if r.Scope == nil {
		return
	}
	b := &streamBinding{scope: r.Scope, id: "stream " + inv.runID}
	inv.mu.Lock()
	inv.binding = b
	inv.mu.Unlock()
	cancel := func() { s.cancelRunning(inv, "its generation "+r.Name+" was disposed past its drain deadline") }
	if err := r.Scope.TrackWork(context.Background(), b.id, cancel, inv.done); err != nil {
		s.cfg.Log.Info("a call's stream was not bound to its generation", append([]any{"invocation", inv.id, "generation", r.Name, "error", err.Error()}, inv.logValues()...)...)
	}
}

// unbindStream releases inv's stream from its generation's scope: it ended.
func (s *Server) unbindStream(inv *invocation) {
	inv.mu.Lock()
	b := inv.binding
	inv.binding = nil
	inv.mu.Unlock()
	if b != nil {
		b.scope.Release(b.id)
	}
}

// cancelRunning asks the provider to cancel inv's run, in the background:
// the acknowledgement may take up to the cancellation deadline. Not the
// client's cancellation: the run ends interrupted.
func (s *Server) cancelRunning(inv *invocation, reason string) {
	s.calls.Add(1)
	go func() {
		defer s.calls.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := inv.dispatcher.CancelRunning(ctx, inv.runID, reason); err != nil {
			s.cfg.Log.Info("cancelling a run failed", append([]any{"invocation", inv.id, "run", inv.runID, "error", err.Error()}, inv.logValues()...)...)
		}
	}()
}
