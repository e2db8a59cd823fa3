package hotswap

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/providers"
)

// The live resources of a generation live in its EffectScope, registered
// where they are created and disposed in reverse order exactly once:
//
//	process              the process group (launch, re-attach, relaunch of
//	                     the old generation); Reversible: Close stops and
//	                     reaps it
//	route                the dispatcher route to it (the atomic switch);
//	                     Reversible: withdrawn if it still routes
//	crash-watch          the goroutine watching its process exit (activate);
//	                     Cancelable: told to stop, waited for
//	owner-restart-hold   the timer that resumes a module held for a
//	                     survivor restart; Reversible: stopped
//	stream <run>         each gateway Invoke/Watch stream served by it (the
//	                     gateway registers it through Route.Scope when its
//	                     run starts and releases it when it ends);
//	                     Cancelable: waited for until the drain deadline,
//	                     then cancelled with a drain_timeout receipt
//
// Renewals and checkpoints run on the activation's worker, not on goroutines
// of a generation, and a snapshot's temporary file lives only inside the
// store's Put: none of them outlives the call that made it. The process's
// pipes, memfd and sockets are the process's, closed by its Close.

// Resource IDs in a generation's scope.
const (
	resProcess    = "process"
	resRoute      = "route"
	resCrashWatch = "crash-watch"
	resOwnerHold  = "owner-restart-hold"
)

// defaultDrainDeadline bounds a dispose when the generation has no plan to
// take its cancellation deadline from.
const defaultDrainDeadline = 5 * time.Second

// drainDeadline is how long disposing g waits for its cancelable work: its
// plan's cancellation deadline.
func drainDeadline(g *generationRuntime) time.Duration {
	if d := g.target.Plan.CancellationDeadline(); d > 0 {
		return d
	}
	return defaultDrainDeadline
}

// trackProcess registers a generation's process in its scope. When the scope
// is already disposed the process is closed at once and the error says so.
func trackProcess(ctx context.Context, scope *effects.EffectScope, proc providers.Provider) error {
	return scope.Track(ctx, resProcess, effects.Reversible, func(context.Context) error { return proc.Close() })
}

// trackRoute registers a route just installed in m's dispatcher in the scope
// of the generation it serves, replacing an earlier route of that scope
// (which no longer routes: one switch replaced it).
func (a *activationRuntime) trackRoute(route dispatch.Route, m *moduleRuntime) {
	if route.Scope == nil {
		return
	}
	route.Scope.Release(resRoute)
	backend, d := route.Backend, m.dispatcher
	if err := route.Scope.Track(context.Background(), resRoute, effects.Reversible, func(context.Context) error {
		d.WithdrawRoute(backend)
		return nil
	}); err != nil {
		a.log("route of a disposed generation withdrawn at once", "generation", route.Name, "error", err.Error())
	}
}

// switchRoute switches m's dispatcher to g's route and tracks it (outside
// a transaction's switch phase: a re-attach, the relaunch of an old
// generation in a rollback).
func (a *activationRuntime) switchRoute(m *moduleRuntime, g *generationRuntime) error {
	route := a.route(g)
	if _, err := m.dispatcher.Switch(route); err != nil {
		return err
	}
	a.trackRoute(route, m)
	return nil
}

// watcher is a crash watch's handle in its scope.
type watcher struct {
	stop     chan struct{}
	done     chan struct{}
	handling chan struct{}
	once     sync.Once
}

// dispose stops the watch and waits for it, or for it to be committed to
// handling an exit that already happened (it then needs only the
// activation's mutex, which the disposer may hold). Told to stop, a watch
// ends at once: the wait is bounded by effects.CancelGrace, not by the
// drain deadline (which may have passed already).
func (w *watcher) dispose(context.Context) error {
	w.once.Do(func() { close(w.stop) })
	t := time.NewTimer(effects.CancelGrace)
	defer t.Stop()
	select {
	case <-w.done:
	case <-w.handling:
	case <-t.C:
		return fmt.Errorf("the crash watch did not end within %s of being told to stop", effects.CancelGrace)
	}
	return nil
}

// trackOwnerHold registers the timer that resumes a module held for a
// survivor restart in g's scope; fired, it releases itself. A scope already
// disposed stops the timer at once (the error says so).
func trackOwnerHold(scope *effects.EffectScope, t *time.Timer) error {
	scope.Release(resOwnerHold)
	return scope.Track(context.Background(), resOwnerHold, effects.Reversible, func(context.Context) error {
		t.Stop()
		return nil
	})
}

// dispose disposes scope s of g within drain: cancelable work still running
// at that deadline is cancelled and leaves a drain_timeout receipt on g;
// cleanups that fail are collected (the rest still run) and returned as the
// cleanup_failed note, kept as g's cleanup error too. "" when every cleanup
// succeeded. Never called with a.mu held (a crash watch may need it to end).
func (a *activationRuntime) dispose(g *generationRuntime, s *effects.EffectScope, drain time.Duration) string {
	if s == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	started := a.c.cfg.Now()
	held := len(s.Resources())
	err := s.Dispose(ctx)
	timeouts, failures := effects.SplitDisposeErrors(err)
	for _, t := range timeouts {
		a.recordReceipt(g, effects.Receipt{
			ID: "drain-timeout:" + s.Name() + ":" + t.ID, Kind: effects.ReceiptDrainTimeout, Class: t.Class,
			StartedAt: started, FinishedAt: a.c.cfg.Now(),
			Detail: fmt.Sprintf("%s of %s was still running at the drain deadline (%s) and was cancelled: %v", t.ID, s.Name(), drain, t.Err),
		})
	}
	if len(failures) == 0 {
		return ""
	}
	parts := make([]string, len(failures))
	for i, f := range failures {
		parts[i] = fmt.Sprintf("%s: %s", f.ID, firstLine(f.Err.Error()))
	}
	note := truncateMessage(fmt.Sprintf("%d of the %d resources of %s failed to dispose (the others were disposed): %s",
		len(failures), held, s.Name(), strings.Join(parts, "; ")))
	a.mu.Lock()
	g.cleanupErr = note
	a.mu.Unlock()
	a.log("cleanup failed", "generation", g.name, "scope", s.Name(), "error", err.Error())
	return note
}

// joinNotes joins the non-empty notes of one drain.
func joinNotes(notes ...string) string {
	var kept []string
	for _, n := range notes {
		if n != "" {
			kept = append(kept, n)
		}
	}
	return truncateMessage(strings.Join(kept, "; "))
}
