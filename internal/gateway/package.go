package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// Package runtimes behind the gateway. An Invoke goes through the module's
// dispatcher like any call (it queues during a swap and runs on the
// generation routed when it starts), carrying the caller's export, object,
// dependencies and session, and its namespace for the grant. A Watch is the
// runtime's own stream: the gateway opens it on the routed runtime,
// registers it in that generation's scope (disposing the generation closes
// it), and when the module's runtime changes, opens it again on the one the
// dispatcher names (dispatch.AwaitPackageRoute, RoutedAway) — the caller's
// stream continues with the new runtime's initial event.

// Bounds of the package-runtime fields of a request.
const (
	maxObjectIDBytes    = 1024
	maxSessionIDBytes   = 256
	maxDependencies     = 64
	maxDependencyValue  = 64 << 10
	maxDependencyIDSize = 256
)

// DefaultWatchMoveTimeout bounds how long a package runtime's Watch waits
// for the module's next runtime after its own ended (a cutover's drain, a
// crash before the relaunch) before it ends with stale_generation.
const DefaultWatchMoveTimeout = 30 * time.Second

// packageFields is the package-runtime part of a request.
type packageFields struct {
	export, objectID, sessionID string
	dependencies                []*gatewayv1.Dependency
}

// set reports whether any field was given.
func (f packageFields) set() bool {
	return f.export != "" || f.objectID != "" || f.sessionID != "" || len(f.dependencies) > 0
}

// packageCall checks the request's package-runtime fields (each error
// names its field) and makes the call's PackageCall.
func packageCall(namespace string, f packageFields) (*dispatch.PackageCall, error) {
	pc := &dispatch.PackageCall{Export: f.export, ObjectID: f.objectID, SessionID: f.sessionID, Namespace: namespace}
	if f.export != "" {
		if err := protocol.ValidID(f.export); err != nil {
			return nil, fail(reasons.InvalidRequest, fmt.Sprintf("export %q: %v", f.export, err))
		}
	}
	if len(f.objectID) > maxObjectIDBytes {
		return nil, fail(reasons.InvalidRequest, fmt.Sprintf("object_id: %d bytes, at most %d", len(f.objectID), maxObjectIDBytes))
	}
	if len(f.sessionID) > maxSessionIDBytes {
		return nil, fail(reasons.InvalidRequest, fmt.Sprintf("session_id: %d bytes, at most %d", len(f.sessionID), maxSessionIDBytes))
	}
	if len(f.dependencies) > maxDependencies {
		return nil, fail(reasons.InvalidRequest, fmt.Sprintf("dependencies: %d, at most %d", len(f.dependencies), maxDependencies))
	}
	for i, d := range f.dependencies {
		for _, part := range []struct{ name, v string }{{"kind", d.GetKind()}, {"object_id", d.GetObjectId()}, {"attachment_id", d.GetAttachmentId()}, {"projection_id", d.GetProjectionId()}} {
			if len(part.v) > maxDependencyIDSize {
				return nil, fail(reasons.InvalidRequest, fmt.Sprintf("dependencies[%d].%s: %d bytes, at most %d", i, part.name, len(part.v), maxDependencyIDSize))
			}
		}
		dep := &quixospb.InjectedDependency{Kind: d.GetKind(), ObjectId: d.GetObjectId(), AttachmentId: d.GetAttachmentId(), ProjectionId: d.GetProjectionId()}
		if d.GetValueJson() != "" {
			v, err := pkgruntime.ValueFromJSON([]byte(d.GetValueJson()), maxDependencyValue)
			if err != nil {
				return nil, fail(reasons.SchemaMismatch, fmt.Sprintf("dependencies[%d].value_json: %v", i, err))
			}
			dep.Value = v
		}
		pc.Dependencies = append(pc.Dependencies, dep)
	}
	return pc, nil
}

// derivedDependencies renders a runtime's derived dependencies.
func derivedDependencies(ds []*runtimepb.DerivedDependency) []*gatewayv1.Dependency {
	out := make([]*gatewayv1.Dependency, 0, len(ds))
	for _, d := range ds {
		out = append(out, &gatewayv1.Dependency{Kind: d.GetKind(), ObjectId: d.GetObjectId(), AttachmentId: d.GetAttachmentId(), ProjectionId: d.GetProjectionId()})
	}
	return out
}

// fillPackageResponse adds a package runtime's answer to an Invoke's response.
func fillPackageResponse(resp *gatewayv1.InvokeResponse, obs dispatch.Observation) {
	if obs.Package == nil {
		return
	}
	resp.Ok, resp.Error, resp.ValueJson = obs.Package.GetOk(), obs.Package.GetError(), string(obs.Body)
	resp.Dependencies = derivedDependencies(obs.Package.GetDependencies())
}

// packageWatch is an open package-runtime Watch, for status and cancel by
// its invocation_id.
type packageWatch struct {
	mu      sync.Mutex
	watchID string
	route   dispatch.Route // route.Package is the runtime it is open on (nil before)
	// watch is the runtime's open stream; cancelled is set by
	// CancelInvocation, after which the Watch ends (cancelled) and never
	// moves.
	watch     *pkgruntime.Watch
	cancelled bool
}

// cancel marks the Watch cancelled and closes its runtime stream in the
// background: the runtime was asked to end it, and Close cuts it when the
// runtime has not within its cancel_ms (a runtime that ignores the
// cancellation cannot keep the caller's stream open).
func (w *packageWatch) cancel() {
	w.mu.Lock()
	w.cancelled = true
	rw := w.watch
	w.mu.Unlock()
	if rw != nil {
		go rw.Close()
	}
}

func (w *packageWatch) isCancelled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cancelled
}

func (w *packageWatch) current() (dispatch.PackageBackend, string, dispatch.Route) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.route.Package, w.watchID, w.route
}

// packageWatches are the open package-runtime Watches by namespace and
// invocation_id.
type packageWatches struct {
	mu    sync.Mutex
	byKey map[string]*packageWatch
}

func (p *packageWatches) add(key string, w *packageWatch) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byKey == nil {
		p.byKey = map[string]*packageWatch{}
	}
	if _, dup := p.byKey[key]; dup {
		return false
	}
	p.byKey[key] = w
	return true
}

func (p *packageWatches) remove(key string) {
	p.mu.Lock()
	delete(p.byKey, key)
	p.mu.Unlock()
}

func (p *packageWatches) lookup(key string) (*packageWatch, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.byKey[key]
	return w, ok
}

// packageDispatcher returns the module's dispatcher when a package runtime
// serves it now (nil when a line-protocol provider or nothing does).
func (s *Server) packageDispatcher(namespace, activation, module string) *dispatch.Dispatcher {
	d, err := s.cfg.Coordinator.Lookup(namespace, activation, module)
	if err != nil {
		return nil
	}
	if r := d.Route(); r != nil && r.Package != nil {
		return d
	}
	return nil
}

// watchPackage serves a Watch on a package runtime until the caller ends
// it, the runtime ends it, or its deadline passes, moving it to the
// module's next runtime whenever the one it runs on goes away.
func (s *Server) watchPackage(req *gatewayv1.WatchRequest, d *dispatch.Dispatcher, stream grpc.ServerStreamingServer[gatewayv1.WatchEvent]) (err error) {
	defer func() { countCall(req.GetNamespace(), req.GetActivation(), req.GetModule(), routeRevision(d), err) }()
	ctx := stream.Context()
	if req.PinnedGeneration != nil {
		return fail(reasons.InvalidRequest, "pinned_generation: a package runtime's Watch moves with the module's runtime; it cannot be pinned")
	}
	if req.GetDeadlineMs() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.GetDeadlineMs())*time.Millisecond)
		defer cancel()
	}
	id := req.GetInvocationId()
	if id != "" {
		if err := protocol.ValidID(id); err != nil {
			return fail(reasons.InvalidRequest, fmt.Sprintf("invocation_id %q: %v", id, err))
		}
	}
	input := []byte(req.GetInputJson())
	if len(input) == 0 {
		input = []byte("{}")
	}
	payload, err := protocol.NewPayload(input)
	if err != nil {
		return fail(reasons.SchemaMismatch, "input_json: "+err.Error())
	}
	pc, err := packageCall(req.GetNamespace(), packageFields{export: req.GetExport(), objectID: req.GetObjectId(), sessionID: req.GetSessionId(), dependencies: req.GetDependencies()})
	if err != nil {
		return err
	}
	runID := "gw-" + s.runPrefix + "-" + strconv.FormatUint(s.seq.Add(1), 10)
	if id == "" {
		id = runID
	}
	key := req.GetNamespace() + "\x00" + id
	entry := &packageWatch{}
	if _, known := s.table.lookup(key); known || !s.watches.add(key, entry) {
		return fail(reasons.InvocationConflict, fmt.Sprintf("invocation_id %q is in use in namespace %s; choose a new one", id, req.GetNamespace()))
	}
	defer s.watches.remove(key)

	var (
		seq  uint64
		last dispatch.PackageBackend
	)
	for moves := 0; ; moves++ {
		if entry.isCancelled() {
			return fail(reasons.Cancelled, fmt.Sprintf("watch %s was cancelled (CancelInvocation)", id))
		}
		route, why := s.awaitPackageRoute(ctx, d, last)
		if why != nil {
			if last == nil || why.Code == reasons.DeadlineExceeded || why.Code == reasons.Interrupted {
				return fail(why.Code, why.Message)
			}
			return fail(reasons.StaleGeneration, fmt.Sprintf("watch %s ended on generation %s and could not move to the module's next runtime: %s", id, entryRouteName(entry), why.Message))
		}
		call := *pc
		call.InvocationID = runID
		if moves > 0 {
			call.InvocationID = runID + "-m" + strconv.Itoa(moves)
		}
		// The runtime's stream does not inherit the caller's deadline: the
		// gateway ends the Watch at that deadline itself (and then closes the
		// runtime's stream), so the runtime cannot end it a moment earlier and
		// make the caller's deadline look like the runtime's own end.
		w, err := route.Package.Watch(context.WithoutCancel(ctx), call, payload)
		if err != nil {
			if last == nil {
				return callFailure(err, route.Lineage)
			}
			return fail(reasons.StaleGeneration, fmt.Sprintf("watch %s could not be opened again on generation %s: %v", id, route.Name, err))
		}
		entry.mu.Lock()
		entry.watchID, entry.route, entry.watch = call.InvocationID, *route, w
		cancelled := entry.cancelled
		entry.mu.Unlock()
		if cancelled { // cancelled while it was being opened
			go w.Close()
		}
		resource := "watch " + call.InvocationID
		if route.Scope != nil {
			// Disposing the generation closes the Watch: the loop then
			// moves it to the runtime that replaced it.
			if err := route.Scope.Track(context.Background(), resource, effects.Cancelable, func(context.Context) error { return w.Close() }); err != nil {
				w.Close()
			}
		}
		closeStream := func() error {
			err := w.Close()
			if route.Scope != nil {
				route.Scope.Release(resource)
			}
			return err
		}
		end, movable := s.relayPackageWatch(ctx, id, w, *route, d, &seq, stream, entry.isCancelled)
		if ctx.Err() != nil {
			// The caller is gone or its deadline passed: it gets its answer
			// now, and the runtime's stream is closed behind it (within
			// cancel_ms, then cut) — its deadline is not the runtime's.
			s.calls.Add(1)
			go func() {
				defer s.calls.Done()
				closeStream()
			}()
			return end
		}
		closeErr := closeStream()
		if !movable {
			if end == nil && closeErr != nil && ctx.Err() == nil {
				return callFailure(closeErr, route.Lineage)
			}
			return end
		}
		last = route.Package
	}
}

func entryRouteName(w *packageWatch) string {
	_, _, r := w.current()
	return r.Name
}

// awaitPackageRoute is the dispatcher's AwaitPackageRoute, ended also when
// the gateway stops (interrupted).
func (s *Server) awaitPackageRoute(ctx context.Context, d *dispatch.Dispatcher, last dispatch.PackageBackend) (*dispatch.Route, *dispatch.CallError) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	r, why := d.AwaitPackageRoute(ctx, last, s.cfg.WatchMoveTimeout)
	if why != nil && why.Code == reasons.DeadlineExceeded && s.ctx.Err() != nil {
		return nil, &dispatch.CallError{Code: reasons.Interrupted, Message: "the gateway is stopping"}
	}
	return r, why
}

// relayPackageWatch sends w's events to the caller until the Watch ends. It
// reports how it ended, and whether the Watch should move: the runtime it
// ran on is no longer the module's (switched away from, or exited).
func (s *Server) relayPackageWatch(ctx context.Context, id string, w *pkgruntime.Watch, route dispatch.Route, d *dispatch.Dispatcher, seq *uint64, stream grpc.ServerStreamingServer[gatewayv1.WatchEvent], cancelled func() bool) (error, bool) {
	for {
		ev, err := w.Recv(ctx)
		if err == nil {
			*seq++
			value := "null"
			if ev.GetValue() != nil {
				b, verr := pkgruntime.ValueToJSON(ev.GetValue())
				if verr != nil {
					return fail(reasons.ProviderFailed, fmt.Sprintf("watch %s: event value: %v", id, verr)), false
				}
				value = string(b)
			}
			out := &gatewayv1.WatchEvent{
				InvocationId: id, Generation: route.Lineage, GenerationName: route.Name, Sequence: *seq,
				Initial: ev.GetInitial(), ValueJson: value, ObservationJson: value,
				Dependencies: derivedDependencies(ev.GetDependencies()), Error: ev.GetError(), Terminal: ev.GetError() != "",
			}
			if serr := stream.Send(out); serr != nil {
				return serr, false
			}
			if ev.GetError() != "" {
				return nil, false
			}
			continue
		}
		if ctx.Err() != nil {
			return fail(reasons.DeadlineExceeded, fmt.Sprintf("the caller stopped watching %s: %v", id, ctx.Err())), false
		}
		if s.ctx.Err() != nil {
			return fail(reasons.Interrupted, "the gateway is stopping"), false
		}
		if cancelled() {
			return fail(reasons.Cancelled, fmt.Sprintf("watch %s was cancelled (CancelInvocation)", id)), false
		}
		if d.RoutedAway(route, time.Second) {
			return nil, true
		}
		if errors.Is(err, io.EOF) {
			// The runtime ended the Watch itself and still serves.
			return nil, false
		}
		return callFailure(err, route.Lineage), false
	}
}

// callFailure is the status of a failed call: its reason code kept.
func callFailure(err error, generation int64) error {
	ce := dispatch.Classify(err, generation)
	return failure(reasons.GRPCCode(ce.Code), ce.Code, ce.Message, generation)
}

// packageWatchStatus answers GetInvocationStatus and CancelInvocation for
// an open package-runtime Watch: RUNNING with the runtime's own state, or
// CANCELLATION_REQUESTED once cancel asked the runtime to end it.
func (s *Server) packageWatchStatus(ctx context.Context, req *gatewayv1.InvocationControlRequest, w *packageWatch, cancel bool) *gatewayv1.InvocationStatus {
	backend, watchID, route := w.current()
	st := &gatewayv1.InvocationStatus{InvocationId: req.GetInvocationId(), Namespace: req.GetNamespace(),
		Generation: route.Lineage, GenerationName: route.Name, State: gatewayv1.InvocationState_INVOCATION_STATE_RUNNING}
	if backend == nil {
		if cancel { // not open on a runtime yet: it never will be
			w.cancel()
			st.State = gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED
		}
		return st
	}
	var state string
	var err error
	if cancel {
		state, err = backend.CancelInvocation(ctx, watchID)
		st.State = gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED
		w.cancel()
	} else {
		state, err = backend.Status(ctx, watchID)
	}
	if err != nil {
		st.Message = err.Error()
		return st
	}
	st.RuntimeState = state
	return st
}
