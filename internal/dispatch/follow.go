package dispatch

import (
	"context"
	"fmt"
	"time"

	"iteron.dev/operator/internal/reasons"
)

// A package runtime's Watch is a stream, not a run: it stays open on the
// runtime it was opened on and, when that runtime stops serving the module
// (a cutover, a crash and its relaunch), moves to the next one. Which
// runtime a stream goes on to, and when it gives up, is the dispatcher's
// rule as much as where a call runs: the gateway only relays.

// AwaitPackageRoute returns the module's route once a package runtime other
// than last serves it (last nil: any package runtime), waiting at most
// timeout; or why no runtime will: a line-protocol provider serves it now
// (stale_generation), it was retired (stale_generation), nothing can serve
// it (its reason), nothing took over within timeout (stale_generation), or
// ctx ended (deadline_exceeded). It wakes on every change of the route,
// never by polling.
func (d *Dispatcher) AwaitPackageRoute(ctx context.Context, last PackageBackend, timeout time.Duration) (*Route, *CallError) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		d.mu.Lock()
		r, closed, unavailable, changed := d.route, d.closed, d.unavailable, d.routeChanged
		d.mu.Unlock()
		switch {
		case closed:
			return nil, &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("module %s was retired", d.module)}
		case r != nil && r.Package != nil && r.Package != last:
			route := *r
			return &route, nil
		case r != nil && r.Package == nil && r.Backend != nil:
			return nil, &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("module %s is now served by a line-protocol provider (generation %s), which has no Watch of a package runtime", d.module, r.Name)}
		case unavailable != nil:
			err := *unavailable
			return nil, &err
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("no runtime of module %s took over within %s", d.module, timeout)}
		case <-ctx.Done():
			return nil, &CallError{Code: reasons.DeadlineExceeded, Message: "the caller stopped watching: " + ctx.Err().Error(), Err: ctx.Err()}
		}
	}
}

// RoutedAway reports whether route's runtime no longer serves the module:
// the route moved on, or its process exited — waiting up to grace for
// either, since a crash breaks a stream before its exit is reaped.
func (d *Dispatcher) RoutedAway(route Route, grace time.Duration) bool {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		d.mu.Lock()
		cur, changed := d.route, d.routeChanged
		d.mu.Unlock()
		if cur == nil || cur.Package != route.Package {
			return true
		}
		select {
		case <-route.Package.Exited():
			return true
		case <-changed:
		case <-timer.C:
			return false
		}
	}
}
