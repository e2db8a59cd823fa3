package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net"
	goruntime "runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/pkg/protocol"
)

// ProtocolVersion is the gateway protocol this server speaks.
const ProtocolVersion = "iteron-gateway/1"

// Call deadlines: a call without a deadline of its own (request field or
// gRPC deadline) gets DefaultCallDeadline; no call may ask for more than
// MaxCallDeadline (the protocol's largest deadline_ms).
const (
	DefaultCallDeadline = 30 * time.Second
	MaxCallDeadline     = time.Hour
)

// DefaultStopTimeout bounds how long Stop lets running RPCs finish before
// it closes their connections.
const DefaultStopTimeout = 5 * time.Second

// maxRequestBytes bounds a request message: the 512 KiB input plus room for
// the other fields.
const maxRequestBytes = protocol.MaxPayloadBytes + 64<<10

// Coordinator is what the gateway reads of the node runtime; the
// transaction engine's coordinator is one. The gateway needs nothing else of
// it, so it does not import the engine.
type Coordinator interface {
	// Lookup returns a module's dispatcher, or a *dispatch.CallError saying
	// why there is none (recovering, ledger_corrupt, not_found).
	Lookup(namespace, name, module string) (*dispatch.Dispatcher, error)
	// ServedModules lists every module of every activation on the node.
	ServedModules() []dispatch.ServedModule
}

// Dispatch describes a call whose run just started, for Config.OnDispatch.
type Dispatch struct {
	// Namespace, Activation and Module of the call.
	Namespace, Activation, Module string
	// InvocationID is the client's (or the gateway's) invocation ID.
	InvocationID string
	// Route is the generation that runs it.
	Route dispatch.Route
	// At is when the run was dispatched.
	At time.Time
}

// Config configures a Server.
type Config struct {
	// NodeName is reported by Handshake.
	NodeName string
	// Coordinator serves the calls.
	Coordinator Coordinator
	// Allow says who may call which namespace.
	Allow Allow
	// Socket and SocketGroup are where Start listens (see Listen).
	Socket      string
	SocketGroup int
	// Log receives denied calls and stop errors.
	Log logr.Logger
	// DefaultDeadline replaces DefaultCallDeadline when set.
	DefaultDeadline time.Duration
	// StopTimeout replaces DefaultStopTimeout when set.
	StopTimeout time.Duration
	// OnDispatch, when set, is called (from the dispatcher's goroutine,
	// before the run starts; it must not block) for every call the gateway
	// dispatches: for metrics, and for tests and benchmarks that need the
	// exact moment a generation took a call.
	OnDispatch func(Dispatch)
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// WatchMoveTimeout replaces DefaultWatchMoveTimeout when set: how long
	// a package runtime's Watch waits for the module's next runtime.
	WatchMoveTimeout time.Duration
	// Handover, when set, replaces listening on Socket: the survivor holds
	// the gateway's listening socket across manager restarts
	// (docs/survivor.md) and hands this manager a copy of it (and a new one
	// after the survivor itself restarted). Start serves every listener
	// that arrives; stopping closes only this manager's copies.
	Handover <-chan net.Listener
	// InstanceID, when set, gives the Handshake's instance_id: the
	// survivor's, which changes only when the table of completed
	// invocations did not survive. Default: random per server.
	InstanceID func() string
}

// Server is the gateway: a gatewayv1.GatewayServer over the coordinator's
// dispatchers. Create it with New; serve it with Start (the manager's
// Runnable) or Serve.
type Server struct {
	gatewayv1.UnimplementedGatewayServer

	cfg        Config
	instanceID string
	// runPrefix starts every run ID this server makes: unique per manager
	// start, so that run IDs never repeat in a survivor's outcome table.
	runPrefix string
	table     *invocationTable
	grpc      *grpc.Server

	// ctx ends when the server stops: queued calls are withdrawn.
	ctx    context.Context
	cancel context.CancelFunc
	calls  sync.WaitGroup
	seq    atomic.Uint64
	// dropped counts observations of a stale generation that were dropped.
	dropped atomic.Int64
	// recordMu serializes outcomes arriving from the survivor.
	recordMu sync.Mutex
}

// New returns a server with a fresh random instance ID.
func New(cfg Config) (*Server, error) {
	if cfg.Coordinator == nil {
		return nil, errors.New("gateway: Config needs a Coordinator")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DefaultDeadline <= 0 {
		cfg.DefaultDeadline = DefaultCallDeadline
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.WatchMoveTimeout <= 0 {
		cfg.WatchMoveTimeout = DefaultWatchMoveTimeout
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("gateway: instance id: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, instanceID: hex.EncodeToString(id[:]), runPrefix: hex.EncodeToString(id[:6]),
		table: newInvocationTable(InvocationTTL, MaxInvocations, MaxInvocationBytes, cfg.Now),
		ctx:   ctx, cancel: cancel,
	}
	// Stream workers serve a call on a goroutine that is already running
	// instead of a new one per stream (grpc-go starts one anyway when all
	// are busy, so a long Watch never holds a call back): measured, the
	// package-runtime Invoke through the gateway ÷ direct went from 2.01-2.05
	// to 1.88-1.94 (BenchmarkPackageInvoke, medians of 5, alternating runs).
	s.grpc = grpc.NewServer(grpc.Creds(PeerCredentials()), grpc.MaxRecvMsgSize(maxRequestBytes), grpc.NumStreamWorkers(uint32(goruntime.NumCPU())))
	gatewayv1.RegisterGatewayServer(s.grpc, s)
	return s, nil
}

// InstanceID identifies the table of completed invocations: random per
// server, or the survivor's instance (Config.InstanceID) when the table
// survives manager restarts there.
func (s *Server) InstanceID() string {
	if s.cfg.InstanceID != nil {
		if id := s.cfg.InstanceID(); id != "" {
			return id
		}
	}
	return s.instanceID
}

// DroppedObservations is how many observations of a stale generation were
// dropped instead of delivered.
func (s *Server) DroppedObservations() int64 { return s.dropped.Load() }

// Serve serves lis until Stop; lis must be a unix socket listener (Listen).
func (s *Server) Serve(lis net.Listener) error {
	return s.grpc.Serve(lis)
}

// Start listens on the configured socket and serves until ctx ends, then
// stops (a controller-runtime Runnable: the manager starts it after the
// state-dir lock is held, which Listen requires).
func (s *Server) Start(ctx context.Context) error {
	errc := make(chan error, 1)
	if s.cfg.Handover != nil {
		go s.serveHandover(ctx, errc)
	} else {
		lis, err := Listen(s.cfg.Socket, s.cfg.SocketGroup)
		if err != nil {
			return err
		}
		s.cfg.Log.Info("gateway listening", "socket", s.cfg.Socket, "group", s.cfg.SocketGroup, "instanceID", s.instanceID)
		go func() { errc <- s.Serve(lis) }()
	}
	select {
	case err := <-errc:
		s.Stop(context.Background())
		return err
	case <-ctx.Done():
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout)
	defer cancel()
	s.Stop(stopCtx)
	if s.cfg.Handover != nil {
		// The handed-over listeners' Serve calls end with Stop; none
		// reports on errc.
		return nil
	}
	return <-errc
}

// serveHandover serves every listener the survivor hands over until ctx
// ends. A caller that connected while no manager served waited in the
// socket's backlog and is accepted now.
func (s *Server) serveHandover(ctx context.Context, errc chan<- error) {
	for {
		select {
		case <-ctx.Done():
			return
		case lis, ok := <-s.cfg.Handover:
			if !ok {
				return
			}
			s.cfg.Log.Info("gateway serving the socket the survivor holds", "socket", s.cfg.Socket, "instanceID", s.InstanceID())
			go func() {
				if err := s.Serve(lis); err != nil && ctx.Err() == nil {
					s.cfg.Log.Info("serving a handed-over listener ended", "error", err.Error())
				}
			}()
		}
	}
}

// NeedLeaderElection is false: every node's manager serves its own gateway.
func (s *Server) NeedLeaderElection() bool { return false }

// Stop stops accepting calls, lets running RPCs finish until ctx ends (or
// StopTimeout, when ctx has no deadline), then closes every connection,
// withdraws the calls still queued and waits for them. The socket file is
// removed.
func (s *Server) Stop(ctx context.Context) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.StopTimeout)
		defer cancel()
	}
	graceful := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(graceful) }()
	select {
	case <-graceful:
	case <-ctx.Done():
		s.grpc.Stop()
		<-graceful
	}
	s.cancel()
	// No handler runs now, so no call is submitted any more: the calls still
	// queued are withdrawn (they never ran: interrupted), the running ones
	// are waited for.
	for _, inv := range s.table.pending() {
		if h, ok := inv.callHandle().(*dispatch.Call); ok {
			h.Withdraw(&dispatch.CallError{Code: reasons.Interrupted, Message: "the gateway stopped before the call ran"})
		}
	}
	waited := make(chan struct{})
	go func() { s.calls.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		s.cfg.Log.Info("gateway stopped with calls still running in their modules")
	}
}

// authorize returns the caller when it may call namespace.
func (s *Server) authorize(ctx context.Context, namespace string) (Peer, error) {
	p, ok := PeerFromContext(ctx)
	if !ok {
		return Peer{}, fail(reasons.Unauthenticated, "the connection carries no peer credentials (the gateway serves a unix socket only)")
	}
	if !IsNamespaceName(namespace) {
		return p, fail(reasons.InvalidRequest, fmt.Sprintf("namespace %q is not a namespace name", namespace))
	}
	if !s.cfg.Allow.Permits(p.UID, p.GID, namespace) {
		s.cfg.Log.Info("gateway call denied", "uid", p.UID, "gid", p.GID, "pid", p.PID, "namespace", namespace)
		return p, fail(reasons.PermissionDenied, fmt.Sprintf("uid %d (gid %d) may not call namespace %q", p.UID, p.GID, namespace))
	}
	return p, nil
}

// Handshake implements gatewayv1.GatewayServer.
func (s *Server) Handshake(ctx context.Context, req *gatewayv1.HandshakeRequest) (*gatewayv1.HandshakeResponse, error) {
	p, ok := PeerFromContext(ctx)
	if !ok {
		return nil, fail(reasons.Unauthenticated, "the connection carries no peer credentials (the gateway serves a unix socket only)")
	}
	if req.GetProtocolVersion() != "" && req.GetProtocolVersion() != ProtocolVersion {
		return nil, fail(reasons.UnsupportedVersion, fmt.Sprintf("protocol %q is not spoken here; this gateway speaks %s", req.GetProtocolVersion(), ProtocolVersion))
	}
	resp := &gatewayv1.HandshakeResponse{
		NodeName: s.cfg.NodeName, InstanceId: s.InstanceID(), ProtocolVersions: []string{ProtocolVersion},
		Caller: &gatewayv1.Caller{Uid: p.UID, Gid: p.GID, Pid: p.PID, Namespaces: s.cfg.Allow.Namespaces(p.UID, p.GID)},
		Nonce:  req.GetNonce(),
	}
	for _, m := range s.cfg.Coordinator.ServedModules() {
		if !s.cfg.Allow.Permits(p.UID, p.GID, m.Namespace) {
			continue
		}
		resp.Modules = append(resp.Modules, &gatewayv1.ModuleInfo{
			Namespace: m.Namespace, Activation: m.Activation, Module: m.Module,
			Generation: m.Lineage, GenerationName: m.GenerationName, Epoch: m.Epoch,
			ImplementationId: m.ImplementationID, Phase: m.Phase, Reason: m.Reason,
		})
	}
	sort.Slice(resp.Modules, func(i, j int) bool {
		a, b := resp.Modules[i], resp.Modules[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Activation != b.Activation {
			return a.Activation < b.Activation
		}
		return a.Module < b.Module
	})
	return resp, nil
}

// callRequest is the common part of InvokeRequest and WatchRequest.
type callRequest struct {
	namespace, activation, module, invocationID, input string
	deadlineMs                                         uint64
	pinned                                             *int64
	// pkg are the package-runtime fields.
	pkg packageFields
}

// Invoke implements gatewayv1.GatewayServer.
func (s *Server) Invoke(ctx context.Context, req *gatewayv1.InvokeRequest) (*gatewayv1.InvokeResponse, error) {
	inv, replayed, err := s.begin(ctx, callRequest{
		namespace: req.GetNamespace(), activation: req.GetActivation(), module: req.GetModule(),
		invocationID: req.GetInvocationId(), input: req.GetInputJson(), deadlineMs: req.GetDeadlineMs(),
		pinned: req.PinnedGeneration,
		pkg:    packageFields{export: req.GetExport(), objectID: req.GetObjectId(), sessionID: req.GetSessionId(), dependencies: req.GetDependencies()},
	}, false)
	if err != nil {
		countCall(req.GetNamespace(), req.GetActivation(), req.GetModule(), "", err)
		return nil, err
	}
	select {
	case <-inv.done:
	case <-ctx.Done():
		// The call goes on (bounded by its deadline); a repeat with the same
		// invocation_id gets its outcome.
		return nil, fail(reasons.DeadlineExceeded, fmt.Sprintf("the caller stopped waiting for invocation %s: %v", inv.id, ctx.Err()))
	}
	if inv.err != nil {
		return nil, inv.err
	}
	resp := &gatewayv1.InvokeResponse{
		InvocationId: inv.id, Generation: inv.result.Lineage, GenerationName: inv.result.Name,
		ObservationJson: string(inv.result.Terminal.Body), Sequence: inv.result.Terminal.Sequence,
		QueuedMs: uint64(inv.result.QueuedFor.Milliseconds()), Replayed: replayed,
	}
	fillPackageResponse(resp, inv.result.Terminal)
	return resp, nil
}

// Watch implements gatewayv1.GatewayServer.
func (s *Server) Watch(req *gatewayv1.WatchRequest, stream grpc.ServerStreamingServer[gatewayv1.WatchEvent]) error {
	ctx := stream.Context()
	if _, err := s.authorize(ctx, req.GetNamespace()); err != nil {
		return err
	}
	if d := s.packageDispatcher(req.GetNamespace(), req.GetActivation(), req.GetModule()); d != nil {
		return s.watchPackage(req, d, stream)
	}
	inv, replayed, err := s.beginAuthorized(ctx, callRequest{
		namespace: req.GetNamespace(), activation: req.GetActivation(), module: req.GetModule(),
		invocationID: req.GetInvocationId(), input: req.GetInputJson(), deadlineMs: req.GetDeadlineMs(),
		pinned: req.PinnedGeneration,
		pkg:    packageFields{export: req.GetExport(), objectID: req.GetObjectId(), sessionID: req.GetSessionId(), dependencies: req.GetDependencies()},
	}, true)
	if err != nil {
		countCall(req.GetNamespace(), req.GetActivation(), req.GetModule(), "", err)
		return err
	}
	if replayed {
		select {
		case <-inv.done:
		case <-ctx.Done():
			return fail(reasons.DeadlineExceeded, fmt.Sprintf("the caller stopped waiting for invocation %s: %v", inv.id, ctx.Err()))
		}
		if inv.err != nil {
			return inv.err
		}
		return stream.Send(&gatewayv1.WatchEvent{
			InvocationId: inv.id, Generation: inv.result.Lineage, GenerationName: inv.result.Name,
			Sequence: inv.result.Terminal.Sequence, Terminal: true, ObservationJson: string(inv.result.Terminal.Body), Replayed: true,
		})
	}
	sentTerminal := false
	for {
		inv.mu.Lock()
		pending := inv.events
		inv.events = nil
		inv.mu.Unlock()
		for _, ev := range pending {
			if err := stream.Send(&gatewayv1.WatchEvent{
				InvocationId: inv.id, Generation: ev.generation, GenerationName: ev.generationName,
				Sequence: ev.obs.Sequence, Terminal: ev.obs.Terminal, ObservationJson: string(ev.obs.Body),
			}); err != nil {
				return err
			}
			sentTerminal = sentTerminal || ev.obs.Terminal
		}
		select {
		case <-inv.notify:
			continue
		case <-ctx.Done():
			return fail(reasons.DeadlineExceeded, fmt.Sprintf("the caller stopped watching invocation %s: %v", inv.id, ctx.Err()))
		case <-inv.done:
		}
		// Ended: drain what arrived last, then report the outcome.
		inv.mu.Lock()
		rest := len(inv.events)
		inv.mu.Unlock()
		if rest > 0 {
			continue
		}
		if inv.err != nil {
			return inv.err
		}
		if !sentTerminal {
			return stream.Send(&gatewayv1.WatchEvent{
				InvocationId: inv.id, Generation: inv.result.Lineage, GenerationName: inv.result.Name,
				Sequence: inv.result.Terminal.Sequence, Terminal: true, ObservationJson: string(inv.result.Terminal.Body),
			})
		}
		return nil
	}
}

// begin authorizes and validates a call and returns its invocation: the
// one already known under its invocation_id (replayed true), or a new one
// whose call is now queued in the module's dispatcher.
func (s *Server) begin(ctx context.Context, req callRequest, streaming bool) (*invocation, bool, error) {
	if _, err := s.authorize(ctx, req.namespace); err != nil {
		return nil, false, err
	}
	return s.beginAuthorized(ctx, req, streaming)
}

// beginAuthorized is begin for a caller already authorized for
// req.namespace.
func (s *Server) beginAuthorized(ctx context.Context, req callRequest, streaming bool) (*invocation, bool, error) {
	arrived := time.Now()
	if err := validName(req.activation); err != nil {
		return nil, false, fail(reasons.InvalidRequest, "activation: "+err.Error())
	}
	if err := protocol.ValidModule(req.module); err != nil {
		return nil, false, fail(reasons.InvalidRequest, fmt.Sprintf("module %q: %v", req.module, err))
	}
	id := req.invocationID
	if id != "" {
		if err := protocol.ValidID(id); err != nil {
			return nil, false, fail(reasons.InvalidRequest, fmt.Sprintf("invocation_id %q: %v", id, err))
		}
	}
	if req.pinned != nil && *req.pinned <= 0 {
		return nil, false, fail(reasons.InvalidRequest, fmt.Sprintf("pinned_generation %d: a lineage number is at least 1", *req.pinned))
	}
	input := []byte(req.input)
	if len(input) == 0 {
		input = []byte("{}")
	}
	// One strict pass: the input checked (written to the provider as it is,
	// never checked again in this process) and its canonical form for the
	// fingerprint.
	payload, canonical, err := protocol.NewCanonicalPayload(input)
	if err != nil {
		return nil, false, fail(reasons.SchemaMismatch, "input_json: "+err.Error())
	}
	if req.deadlineMs > uint64(MaxCallDeadline.Milliseconds()) {
		return nil, false, fail(reasons.InvalidRequest, fmt.Sprintf("deadline_ms %d exceeds %d", req.deadlineMs, MaxCallDeadline.Milliseconds()))
	}
	budget := s.cfg.DefaultDeadline
	if req.deadlineMs > 0 {
		budget = time.Duration(req.deadlineMs) * time.Millisecond
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < budget {
		budget = time.Until(dl)
	}
	budget = min(budget, MaxCallDeadline)
	if budget <= 0 {
		return nil, false, fail(reasons.DeadlineExceeded, "the call's deadline passed before it arrived")
	}

	pc, err := packageCall(req.namespace, req.pkg)
	if err != nil {
		return nil, false, err
	}
	fp := fingerprint(req.activation, req.module, req.pinned, canonical, req.pkg)
	n := s.seq.Add(1)
	runID := "gw-" + s.runPrefix + "-" + strconv.FormatUint(n, 10)
	if id == "" {
		id = runID
	}
	key := req.namespace + "\x00" + id
	// A repeat is answered from the table even if the module has gone since.
	if known, ok := s.table.lookup(key); ok {
		return s.repeat(known, fp, id, req.namespace)
	}

	callDeadline := time.Now().Add(budget)
	var d *dispatch.Dispatcher
	err = s.whileRecovering(ctx, callDeadline, func() error {
		var err error
		d, err = s.cfg.Coordinator.Lookup(req.namespace, req.activation, req.module)
		if err != nil {
			reason, message := reasons.NotFound, err.Error()
			var ce *dispatch.CallError
			if errors.As(err, &ce) {
				reason, message = ce.Code, ce.Message
			}
			return fail(reason, message)
		}
		// What a module that nothing serves answers — wait, recovering,
		// or its reason at once — is the dispatcher's rule (dispatch.Dispatcher).
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	// A repeat that became known while this call waited (the survivor's
	// outcomes arrive as the manager re-attaches).
	if known, ok := s.table.lookup(key); ok {
		return s.repeat(known, fp, id, req.namespace)
	}
	inv := newInvocation()
	inv.namespace, inv.activation, inv.module, inv.dispatcher, inv.streaming = req.namespace, req.activation, req.module, d, streaming
	inv.arrived = arrived
	inv.id, inv.key, inv.runID, inv.fingerprint = id, key, runID, fp
	known, existing, full := s.table.admit(inv)
	if full != nil {
		return nil, false, fail(reasons.QueueFull, fmt.Sprintf("the gateway remembers %d invocations that have not ended; retry later", full.n))
	}
	if existing {
		return s.repeat(known, fp, id, req.namespace)
	}

	deadline := callDeadline
	var pinned int64
	if req.pinned != nil {
		pinned = *req.pinned
	}
	// The dispatcher's record of the call is part of the invocation's: one
	// record per invocation, from the table to the call's end.
	inv.call = dispatch.Call{
		ID: inv.runID, Input: payload, Deadline: deadline, PinnedLineage: pinned,
		OnStart: func(r dispatch.Route) { s.started(inv, r) },
		Invocation: &survivor.Invocation{Namespace: inv.namespace, InvocationID: inv.id, Fingerprint: hex.EncodeToString(fp[:]),
			Activation: inv.activation, Module: inv.module},
		Package: pc,
		Background: func(job func() error) {
			s.calls.Add(1)
			go func() {
				defer s.calls.Done()
				if err := job(); err != nil {
					s.cfg.Log.Info("cancelling a run failed", append([]any{"invocation", inv.id, "run", inv.runID, "error", err.Error()}, inv.logValues()...)...)
				}
			}()
		},
	}
	if tracing.Enabled() {
		inv.trace = tracing.PlanCall(tracing.IncomingParent(ctx), inv.spanName(), arrived)
		inv.call.Span = inv.trace.SC
	}
	if streaming {
		// Only a Watch needs the run's observations (an Invoke gets the
		// terminal one as the result, and the dispatcher drops the output
		// of a generation it no longer routes to).
		inv.call.Observe = func(o dispatch.Observation) { s.observe(inv, o) }
	}
	s.calls.Add(1)
	// No goroutine waits for the call: the dispatcher hands its outcome to
	// ended from whatever ends it (its run, its deadline, a withdrawal).
	if err := d.Submit(&inv.call, func(res dispatch.Result, err error) { s.ended(inv, res, err) }); err != nil {
		s.ended(inv, dispatch.Result{}, err)
		return inv, false, nil
	}
	if early := inv.setHandle(&inv.call); early != "" {
		// CancelInvocation came while the call was being submitted.
		inv.call.Cancel(context.Background(), early)
	}
	return inv, false, nil
}

// ended records the outcome of a call the gateway submitted.
func (s *Server) ended(inv *invocation, res dispatch.Result, err error) {
	defer s.calls.Done()
	var ce *dispatch.CallError
	inv.mu.Lock()
	neverRan := err != nil && !inv.started
	inv.mu.Unlock()
	if neverRan && !(errors.As(err, &ce) && (ce.Code == reasons.Cancelled || ce.Code == reasons.StaleGeneration)) {
		// Refused before it was dispatched (a full queue, a module that
		// cannot serve, a recovery that outlasted its deadline): it
		// never ran, so a retry under the same invocation_id may run it.
		// What no retry changes stays its outcome: the client cancelled
		// it, or it pins a generation that no longer serves.
		s.table.abandon(inv)
	}
	s.finish(inv, res, err)
}

// recoveringPoll is how often a call that arrived while the manager
// recovers looks again.
const recoveringPoll = 20 * time.Millisecond

// whileRecovering runs try until it returns anything but a recovering
// answer, or the call's deadline (or ctx) ends: a call that arrives while
// the manager (re)attaches to this node's activations waits for it instead
// of being told to retry. At the deadline the last answer stands.
func (s *Server) whileRecovering(ctx context.Context, deadline time.Time, try func() error) error {
	for {
		err := try()
		if f, ok := ReasonOf(err); !ok || f.Reason != reasons.Recovering {
			return err
		}
		wait := min(recoveringPoll, time.Until(deadline))
		if wait <= 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-s.ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// repeat answers a request whose invocation_id is known: the same call gets
// the known invocation, a different one is refused.
func (s *Server) repeat(known *invocation, fp [32]byte, id, namespace string) (*invocation, bool, error) {
	if known.fingerprint != fp {
		return nil, false, fail(reasons.InvocationConflict, fmt.Sprintf("invocation_id %q was used in namespace %s for a different call (activation %s, module %s, or its input); choose a new one", id, namespace, known.activation, known.module))
	}
	return known, true, nil
}

// fingerprint identifies what a call asks for, so that an invocation_id
// reused for a different call is refused rather than answered with another
// call's outcome.
func fingerprint(activation, module string, pinned *int64, canonicalInput []byte, pkg packageFields) [32]byte {
	h := sha256.New()
	if pkg.set() {
		// Only calls that name package-runtime fields hash them, so the
		// fingerprints of every other call stay as they were.
		h.Write([]byte("package\x00"))
		writeLengthPrefixed(h, pkg.export, pkg.objectID, pkg.sessionID)
		for _, d := range pkg.dependencies {
			writeLengthPrefixed(h, d.GetKind(), d.GetObjectId(), d.GetAttachmentId(), d.GetProjectionId(), d.GetValueJson())
		}
	}
	writeLengthPrefixed(h, activation, module)
	var pin [9]byte
	if pinned != nil {
		pin[0] = 1
		binary.BigEndian.PutUint64(pin[1:], uint64(*pinned))
	}
	h.Write(pin[:])
	h.Write(canonicalInput)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// writeLengthPrefixed writes each part after its length (8 bytes, big
// endian), so that no two lists of parts hash alike.
func writeLengthPrefixed(h hash.Hash, parts ...string) {
	for _, part := range parts {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
}

// started records the generation that took the call.
func (s *Server) started(inv *invocation, r dispatch.Route) {
	inv.mu.Lock()
	inv.started, inv.generation, inv.generationName, inv.revision = true, r.Lineage, r.Name, r.Revision
	inv.mu.Unlock()
	s.bindStream(inv, r)
	if s.cfg.OnDispatch != nil {
		s.cfg.OnDispatch(Dispatch{Namespace: inv.namespace, Activation: inv.activation, Module: inv.module, InvocationID: inv.id, Route: r, At: time.Now()})
	}
}

// observe queues an observation for a Watch stream. Output of a stale
// generation — one that no longer serves the module when the observation
// arrives — is dropped, and the call then fails with stale_generation: a
// caller never sees a result computed on state that was migrated away.
// The check is made as each observation arrives (the run still holds the
// module's run slot), never afterwards: a run that ended before a switch
// is not stale.
func (s *Server) observe(inv *invocation, o dispatch.Observation) {
	inv.mu.Lock()
	generation, name, streaming := inv.generation, inv.generationName, inv.streaming
	inv.mu.Unlock()
	if inv.dispatcher != nil && stale(generation, inv.dispatcher.Route()) {
		s.dropped.Add(1)
		inv.mu.Lock()
		inv.droppedStale = true
		inv.mu.Unlock()
		return
	}
	if !streaming {
		return
	}
	inv.mu.Lock()
	inv.events = append(inv.events, event{generation: generation, generationName: name, obs: o})
	inv.mu.Unlock()
	inv.signal()
}

// stale reports whether output of the generation servedBy must be dropped
// because current no longer routes to it. The dispatcher switches only
// between runs, so this holds for every run it finished; the check keeps
// the guarantee independent of that.
func stale(servedBy int64, current *dispatch.Route) bool {
	return current == nil || current.Lineage != servedBy
}

// finish records the outcome of a call.
func (s *Server) finish(inv *invocation, res dispatch.Result, err error) {
	inv.mu.Lock()
	if err == nil && inv.droppedStale {
		err = &dispatch.CallError{Code: reasons.StaleGeneration, Message: fmt.Sprintf("generation %d answered after module %s had switched away from it; its output was dropped", res.Lineage, inv.module)}
		res = dispatch.Result{}
	}
	inv.result = res
	if err != nil {
		inv.reason, inv.message, inv.err = s.outcomeOf(inv, err)
	}
	inv.finished = s.cfg.Now()
	inv.size = int64(invocationOverhead + len(res.Terminal.Body) + len(inv.message))
	outcome, revision, started := inv.err, inv.revision, inv.started
	inv.mu.Unlock()
	countCall(inv.namespace, inv.activation, inv.module, revision, outcome)
	if started {
		observeCall(inv.namespace, inv.activation, inv.module, revision, time.Since(inv.arrived))
	}
	close(inv.done)
	s.unbindStream(inv)
	inv.signal()
	s.table.markEnded(inv)
	if inv.trace.Traced() {
		// Answered: the call's span is made now, off its path.
		makeCallSpan(inv)
	}
}

// outcomeOf maps a dispatcher error to the invocation's reason, message
// and gRPC status. Caller holds inv.mu.
func (s *Server) outcomeOf(inv *invocation, err error) (reason, message string, status error) {
	ce := dispatch.Classify(err, inv.generation)
	reason, message = ce.Code, ce.Message
	generation := inv.generation
	switch {
	case reason == reasons.Interrupted && inv.handle != nil && inv.handle.CancelRequested():
		reason, message = reasons.Cancelled, "the run was cancelled at the client's request"
	case s.ctx.Err() != nil && !inv.started && reason != reasons.Cancelled && reason != reasons.Interrupted:
		reason, message = reasons.Interrupted, "the gateway stopped before the call ran"
	case reason == reasons.StaleGeneration:
		if inv.dispatcher == nil {
			break
		}
		if r := inv.dispatcher.Route(); r != nil {
			generation = r.Lineage
		}
	}
	code := reasons.GRPCCode(reason)
	if inv.started {
		code = reasons.RunGRPCCode(reason)
	}
	return reason, message, failure(code, reason, message, generation)
}

// GetInvocationStatus implements gatewayv1.GatewayServer.
func (s *Server) GetInvocationStatus(ctx context.Context, req *gatewayv1.InvocationControlRequest) (*gatewayv1.InvocationStatus, error) {
	inv, err := s.control(ctx, req)
	if err != nil {
		return unknownStatus(req), err
	}
	if inv == nil {
		return unknownStatus(req), nil
	}
	st := inv.status()
	if h := inv.callHandle(); h != nil && !inv.ended() {
		// Forwarded: a package runtime's own view of the run.
		state, err := h.RuntimeStatus(ctx)
		if err != nil {
			st.Message = err.Error()
		}
		st.RuntimeState = state
	}
	return st, nil
}

// CancelInvocation implements gatewayv1.GatewayServer: a queued call is
// withdrawn (FAILED, reason cancelled, it never runs); a running one is
// CANCELLATION_REQUESTED while the provider is asked to cancel it (a
// package runtime's state of it returned); an ended one is reported as it
// ended. What happens is the call's handle's (dispatch.CallHandle).
func (s *Server) CancelInvocation(ctx context.Context, req *gatewayv1.InvocationControlRequest) (*gatewayv1.InvocationStatus, error) {
	inv, err := s.control(ctx, req)
	if err != nil {
		return unknownStatus(req), err
	}
	if inv == nil {
		return unknownStatus(req), nil
	}
	if inv.ended() {
		return inv.status(), nil
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled by the client"
	}
	if len(reason) > 256 {
		reason = reason[:256]
	}
	h := inv.cancelOrNote(reason)
	if h == nil {
		// Not submitted yet: begin cancels it as it submits it.
		return inv.status(), nil
	}
	state, err := h.Cancel(ctx, reason)
	st := inv.status()
	if err != nil {
		st.Message = err.Error()
	}
	st.RuntimeState = state
	return st, nil
}

// control authorizes a status or cancel request and finds its invocation
// (nil when unknown).
func (s *Server) control(ctx context.Context, req *gatewayv1.InvocationControlRequest) (*invocation, error) {
	if _, err := s.authorize(ctx, req.GetNamespace()); err != nil {
		return nil, err
	}
	if err := protocol.ValidID(req.GetInvocationId()); err != nil {
		return nil, fail(reasons.InvalidRequest, fmt.Sprintf("invocation_id %q: %v", req.GetInvocationId(), err))
	}
	inv, ok := s.table.lookup(req.GetNamespace() + "\x00" + req.GetInvocationId())
	if !ok {
		return nil, nil
	}
	return inv, nil
}

func unknownStatus(req *gatewayv1.InvocationControlRequest) *gatewayv1.InvocationStatus {
	return &gatewayv1.InvocationStatus{InvocationId: req.GetInvocationId(), Namespace: req.GetNamespace(), State: gatewayv1.InvocationState_INVOCATION_STATE_UNKNOWN}
}

// validName checks an object name (a DNS subdomain: at most 253 bytes of
// lowercase alphanumerics, '-' and '.', alphanumeric at both ends).
func validName(s string) error {
	if len(s) == 0 || len(s) > 253 {
		return fmt.Errorf("%d bytes, want 1..253", len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && ((c != '-' && c != '.') || i == 0 || i == len(s)-1) {
			return fmt.Errorf("%q is not an object name", s)
		}
	}
	return nil
}
