package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// Package runtimes behind the gateway. An Invoke goes through the module's
// dispatcher like any call (it queues during a swap and runs on the
// generation routed when it starts), carrying the caller's export, object,
// dependencies and session, and its namespace for the grant. A Watch is the
// runtime's own stream, run by its dispatcher handle (dispatch.PackageWatch):
// opened on the routed runtime, registered in that generation's scope
// (disposing the generation closes it), and when the module's runtime
// changes, opened again on the next one — the caller's stream continues
// with the new runtime's initial event. The gateway relays its events and
// keeps it in the invocation table while it is open.

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
	// The Watch is an invocation of the table like any call (an ID in use
	// is refused, status and cancel find it there); where it runs and
	// where it moves is its dispatcher handle's.
	inv := newInvocation()
	inv.namespace, inv.activation, inv.module, inv.dispatcher, inv.streaming = req.GetNamespace(), req.GetActivation(), req.GetModule(), d, true
	inv.id, inv.key, inv.runID = id, req.GetNamespace()+"\x00"+id, runID
	watch := d.NewPackageWatch(dispatch.PackageWatchRequest{
		ID: id, RunID: runID, Call: *pc, Input: payload, MoveTimeout: s.cfg.WatchMoveTimeout, HostStopping: s.ctx,
		Background: func(f func()) {
			s.calls.Add(1)
			go func() { defer s.calls.Done(); f() }()
		},
	})
	inv.handle = watch
	switch _, existing, full := s.table.admit(inv); {
	case full != nil:
		return fail(reasons.QueueFull, fmt.Sprintf("the gateway remembers %d invocations that have not ended; retry later", full.n))
	case existing:
		return fail(reasons.InvocationConflict, fmt.Sprintf("invocation_id %q is in use in namespace %s; choose a new one", id, req.GetNamespace()))
	}
	defer func() {
		// Forgotten once it ends, as a Watch the runtime no longer knows:
		// its ID may be used again.
		close(inv.done)
		s.table.abandon(inv)
	}()
	var seq uint64
	lineage, err := watch.Follow(ctx, func(ev *runtimepb.WatchEvent, route dispatch.Route) error {
		seq++
		value := "null"
		if ev.GetValue() != nil {
			b, verr := pkgruntime.ValueToJSON(ev.GetValue())
			if verr != nil {
				return fail(reasons.ProviderFailed, fmt.Sprintf("watch %s: event value: %v", id, verr))
			}
			value = string(b)
		}
		return stream.Send(&gatewayv1.WatchEvent{
			InvocationId: id, Generation: route.Lineage, GenerationName: route.Name, Sequence: seq,
			Initial: ev.GetInitial(), ValueJson: value, ObservationJson: value,
			Dependencies: derivedDependencies(ev.GetDependencies()), Error: ev.GetError(), Terminal: ev.GetError() != "",
		})
	})
	var ce *dispatch.CallError
	if errors.As(err, &ce) {
		return failure(reasons.GRPCCode(ce.Code), ce.Code, ce.Message, lineage)
	}
	return err
}

// callFailure is the status of a failed call: its reason code kept.
func callFailure(err error, generation int64) error {
	ce := dispatch.Classify(err, generation)
	return failure(reasons.GRPCCode(ce.Code), ce.Code, ce.Message, generation)
}
