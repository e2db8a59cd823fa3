package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
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

// PackageWatchRequest is one package-runtime Watch as the caller asked for
// it.
type PackageWatchRequest struct {
	// ID is the caller's invocation ID (named in messages).
	ID string
	// RunID is the runtime's invocation ID of the first stream; a stream
	// moved to the module's next runtime is RunID-m<n>.
	RunID string
	// Call and Input are what each stream is opened with.
	Call  PackageCall
	Input protocol.Payload
	// MoveTimeout bounds the wait for the module's next runtime.
	MoveTimeout time.Duration
	// HostStopping ends a wait for a runtime as interrupted (the host
	// stops), not as the caller's deadline.
	HostStopping context.Context
	// Background runs the close of a stream the caller left, so that the
	// host can wait for it (nil: a goroutine of its own).
	Background func(func())
}

// PackageWatch is the handle of one package-runtime Watch: Follow opens
// it and moves it, RuntimeStatus and Cancel answer for it, and the host
// that relays its events keeps no state of its own about where it runs.
type PackageWatch struct {
	d   *Dispatcher
	req PackageWatchRequest

	mu sync.Mutex
	// openID is the runtime's invocation ID of the stream open now.
	openID string
	// route is the route the stream is open on (Package nil before).
	route Route
	watch *pkgruntime.Watch
	// cancelled is set by Cancel: the Watch then ends (cancelled) and
	// never moves.
	cancelled bool
}

// NewPackageWatch returns the handle of a Watch on the module's package
// runtimes; Follow runs it.
func (d *Dispatcher) NewPackageWatch(req PackageWatchRequest) *PackageWatch {
	if req.HostStopping == nil {
		req.HostStopping = context.Background()
	}
	if req.Background == nil {
		req.Background = func(f func()) { go f() }
	}
	return &PackageWatch{d: d, req: req}
}

// Route is the route the Watch's stream is open on (Package nil before it
// opened).
func (w *PackageWatch) Route() Route {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.route
}

func (w *PackageWatch) isCancelled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cancelled
}

// Started reports the route the Watch is open on: a Watch runs from the
// moment it is asked for (its route is empty until its stream opens).
func (w *PackageWatch) Started() (Route, bool) { return w.Route(), true }

// CancelRequested reports whether Cancel was called.
func (w *PackageWatch) CancelRequested() bool { return w.isCancelled() }

// RuntimeStatus is the runtime's own state of the open stream ("" with a
// nil error before it opened).
func (w *PackageWatch) RuntimeStatus(ctx context.Context) (string, error) {
	w.mu.Lock()
	backend, id := w.route.Package, w.openID
	w.mu.Unlock()
	if backend == nil {
		return "", nil
	}
	return backend.Status(ctx, id)
}

// Cancel ends the Watch: the runtime is asked to end its stream (its
// state is returned), and the stream is closed in the background, cut
// when the runtime has not ended it within its cancel_ms (a runtime that
// ignores the cancellation cannot keep the caller's stream open). A Watch
// not open yet never opens. reason is not the runtime's to read: its
// protocol's cancel carries none.
func (w *PackageWatch) Cancel(ctx context.Context, reason string) (string, error) {
	w.mu.Lock()
	w.cancelled = true
	backend, id, rw := w.route.Package, w.openID, w.watch
	w.mu.Unlock()
	if backend == nil {
		return "", nil
	}
	state, err := backend.CancelInvocation(ctx, id)
	if rw != nil {
		go rw.Close()
	}
	return state, err
}

// Follow opens the Watch on the runtime that serves the module and hands
// each event to emit with the route it came from, until the runtime ends
// the Watch (nil), the caller's ctx ends, the Watch is cancelled, or no
// runtime takes it over (a CallError), or emit fails (its error). When the
// runtime it is open on stops serving the module (a cutover, a crash and
// its relaunch), the stream is opened again on the next one: a caller sees
// one Watch across them. lineage is the generation the Watch was open on
// when it ended, 0 when it never opened or could not move on (the caller's
// failure detail).
func (w *PackageWatch) Follow(ctx context.Context, emit func(*runtimepb.WatchEvent, Route) error) (lineage int64, err error) {
	var last PackageBackend
	for moves := 0; ; moves++ {
		if w.isCancelled() {
			return 0, w.cancelledError()
		}
		route, why := w.awaitRoute(ctx, last)
		if why != nil {
			if last == nil || why.Code == reasons.DeadlineExceeded || why.Code == reasons.Interrupted {
				return 0, why
			}
			return 0, &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("watch %s ended on generation %s and could not move to the module's next runtime: %s", w.req.ID, w.Route().Name, why.Message)}
		}
		call := w.req.Call
		call.InvocationID = w.req.RunID
		if moves > 0 {
			call.InvocationID = w.req.RunID + "-m" + strconv.Itoa(moves)
		}
		// The runtime's stream does not inherit the caller's deadline: the
		// Watch ends at that deadline here (and then closes the runtime's
		// stream), so the runtime cannot end it a moment earlier and make
		// the caller's deadline look like the runtime's own end.
		rw, err := route.Package.Watch(context.WithoutCancel(ctx), call, w.req.Input)
		if err != nil {
			if last == nil {
				return route.Lineage, Classify(err, route.Lineage)
			}
			return 0, &CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("watch %s could not be opened again on generation %s: %v", w.req.ID, route.Name, err), Err: err}
		}
		w.mu.Lock()
		w.openID, w.route, w.watch = call.InvocationID, *route, rw
		cancelled := w.cancelled
		w.mu.Unlock()
		if cancelled { // cancelled while it was being opened
			go rw.Close()
		}
		resource := "watch " + call.InvocationID
		if route.Scope != nil {
			// Disposing the generation closes the Watch: the loop then
			// moves it to the runtime that replaced it.
			if err := route.Scope.Track(context.Background(), resource, effects.Cancelable, func(context.Context) error { return rw.Close() }); err != nil {
				rw.Close()
			}
		}
		closeStream := func() error {
			err := rw.Close()
			if route.Scope != nil {
				route.Scope.Release(resource)
			}
			return err
		}
		end, movable := w.relay(ctx, rw, *route, emit)
		if ctx.Err() != nil {
			// The caller is gone or its deadline passed: it gets its answer
			// now, and the runtime's stream is closed behind it (within
			// cancel_ms, then cut): its deadline is not the runtime's.
			w.req.Background(func() { closeStream() })
			return route.Lineage, end
		}
		closeErr := closeStream()
		if !movable {
			if end == nil && closeErr != nil {
				return route.Lineage, Classify(closeErr, route.Lineage)
			}
			return route.Lineage, end
		}
		last = route.Package
	}
}

func (w *PackageWatch) cancelledError() *CallError {
	return &CallError{Code: reasons.Cancelled, Message: fmt.Sprintf("watch %s was cancelled (CancelInvocation)", w.req.ID)}
}

// awaitRoute is AwaitPackageRoute, ended also when the host stops
// (interrupted).
func (w *PackageWatch) awaitRoute(ctx context.Context, last PackageBackend) (*Route, *CallError) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(w.req.HostStopping, cancel)
	defer stop()
	r, why := w.d.AwaitPackageRoute(ctx, last, w.req.MoveTimeout)
	if why != nil && why.Code == reasons.DeadlineExceeded && w.req.HostStopping.Err() != nil {
		return nil, &CallError{Code: reasons.Interrupted, Message: "the gateway is stopping"}
	}
	return r, why
}

// relay hands rw's events to emit until the stream ends. It reports how
// it ended, and whether the Watch should move: the runtime it ran on no
// longer serves the module (switched away from, or exited).
func (w *PackageWatch) relay(ctx context.Context, rw *pkgruntime.Watch, route Route, emit func(*runtimepb.WatchEvent, Route) error) (error, bool) {
	for {
		ev, err := rw.Recv(ctx)
		if err == nil {
			if err := emit(ev, route); err != nil {
				return err, false
			}
			if ev.GetError() != "" {
				return nil, false
			}
			continue
		}
		switch {
		case ctx.Err() != nil:
			return &CallError{Code: reasons.DeadlineExceeded, Message: fmt.Sprintf("the caller stopped watching %s: %v", w.req.ID, ctx.Err()), Err: ctx.Err()}, false
		case w.req.HostStopping.Err() != nil:
			return &CallError{Code: reasons.Interrupted, Message: "the gateway is stopping"}, false
		case w.isCancelled():
			return w.cancelledError(), false
		case w.d.RoutedAway(route, time.Second):
			return nil, true
		case errors.Is(err, io.EOF):
			// The runtime ended the Watch itself and still serves.
			return nil, false
		}
		return Classify(err, route.Lineage), false
	}
}

// CallHandle is what the submitter of a call (the *Call it submitted) or
// the opener of a package runtime's Watch (PackageWatch) holds of it: whether and where it
// runs, its cancellation and the runtime's own state of it. The gateway
// answers an invocation's status and cancel requests through it alone.
type CallHandle interface {
	// Started reports the route the call was dispatched to, if it was.
	Started() (Route, bool)
	// CancelRequested reports whether Cancel was called.
	CancelRequested() bool
	// Cancel ends the call at its submitter's request and returns the
	// runtime's state of it (a package runtime's; "" otherwise).
	Cancel(ctx context.Context, reason string) (runtimeState string, err error)
	// RuntimeStatus is a package runtime's own state of the call.
	RuntimeStatus(ctx context.Context) (string, error)
}

var (
	_ CallHandle = (*Call)(nil)
	_ CallHandle = (*PackageWatch)(nil)
)
