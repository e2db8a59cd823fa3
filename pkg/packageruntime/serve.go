// Package packageruntime is the SDK for package runtimes: programs that serve
// the quixos.runtime.PackageRuntime gRPC service to iteron-operator's manager
// (docs/reference/package-runtimes.md). Serve takes what the manager hands a
// runtime at launch (the listening socket on descriptor 4 and the launch key
// on descriptor 5), answers the handshake with its proof, and checks every
// call's invocation context (instance ID and grant) before a Runtime's
// functions see it. It keeps each invocation's state for
// GetInvocationStatus and turns CancelInvocation into the cancellation of the
// call's context.
package packageruntime

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	caminopb "iteron.dev/operator/api/quixos/camino"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
)

// Protocol is the orchestrator protocol version a handshake must carry, and
// the runtime protocol version a runtime answers with.
const Protocol = "quixos.runtime/1"

// Descriptors the manager passes a package runtime at launch.
const (
	// ListenerFD is the listening unix stream socket to serve on.
	ListenerFD = 4
	// LaunchKeyFD is the read end of a pipe carrying the 32-byte launch key.
	LaunchKeyFD = 5
	// LaunchKeyBytes is the launch key's length.
	LaunchKeyBytes = 32
)

// Invocation states of InvocationStatus.state: exactly these five.
const (
	StateUnknown               = "unknown"
	StateRunning               = "running"
	StateCancellationRequested = "cancellation-requested"
	StateCompleted             = "completed"
	StateFailed                = "failed"
)

// retainedInvocations bounds the finished invocations whose state is kept
// for GetInvocationStatus; older ones read as unknown.
const retainedInvocations = 4096

// Call is one Invoke or Watch, checked: its export is one of the runtime's,
// and its grant was issued by the manager for this invocation, caller and
// export.
type Call struct {
	// InvocationID is the manager's ID for this call (a Watch's watch_id).
	InvocationID string
	// Export is the export called, one of Runtime.ExportIDs.
	Export string
	// ObjectID is the object the call is about, or "".
	ObjectID string
	// Input is the call's input object.
	Input map[string]*caminopb.Value
	// Dependencies are the dependencies the caller injected.
	Dependencies []*quixospb.InjectedDependency
	// Namespace is the caller's Kubernetes namespace, from the grant.
	Namespace string
	// SessionID is the caller's session, or "".
	SessionID string
	// Owner is the host-selected owner (owner_conformance_id).
	Owner string
	// WorkspaceEpoch is the module's epoch.
	WorkspaceEpoch string
}

// Result is what an Invoke returns on success.
type Result struct {
	// Value is the result; nil is JSON null.
	Value *caminopb.Value
	// Dependencies are the dependencies the result derives from.
	Dependencies []*runtimepb.DerivedDependency
}

// Event is one value a Watch sends.
type Event struct {
	// Value is the watched value now.
	Value *caminopb.Value
	// Dependencies are the dependencies it derives from.
	Dependencies []*runtimepb.DerivedDependency
}

// Runtime describes a package runtime: what its handshake says, and its
// exports.
type Runtime struct {
	// PackageRevisionID is the revision the manifest pins.
	PackageRevisionID string
	// ExportIDs are the manifest's export IDs.
	ExportIDs []string
	// Capabilities the runtime declares: a subset of those the manifest
	// requests and the manager admitted.
	Capabilities []string
	// MaxMessageBytes bounds messages received and sent; 0 is gRPC's default
	// (4 MiB). Set it to the manifest's limits.max_message_bytes.
	MaxMessageBytes int
	// Invoke answers an Invoke. An error answers ok=false with its text. ctx
	// is cancelled by CancelInvocation and when the manager gives up.
	Invoke func(ctx context.Context, call *Call) (*Result, error)
	// Watch serves a Watch: it sends events with send (the first is marked
	// initial) until ctx is cancelled (CancelInvocation, or the manager closes
	// the stream), then returns nil. An error ends the watch with an event
	// carrying its text. Nil means the runtime has no watchable export.
	Watch func(ctx context.Context, call *Call, send func(Event) error) error
}

// Serve serves rt on what the manager passed at launch: it reads the launch
// key from descriptor 5, serves on the listening socket of descriptor 4, and
// stops gracefully on SIGTERM (returning nil).
func Serve(rt Runtime) error {
	keyFile := os.NewFile(LaunchKeyFD, "launch-key")
	if keyFile == nil {
		return errors.New("packageruntime: descriptor 5 (the launch key) is not open: was this process started by the iteron manager?")
	}
	key, err := ReadLaunchKey(keyFile)
	keyFile.Close()
	if err != nil {
		return err
	}
	lisFile := os.NewFile(ListenerFD, "listener")
	if lisFile == nil {
		return errors.New("packageruntime: descriptor 4 (the listening socket) is not open")
	}
	lis, err := net.FileListener(lisFile)
	lisFile.Close()
	if err != nil {
		return fmt.Errorf("packageruntime: descriptor 4 is not a listening socket: %w", err)
	}
	srv, err := NewServer(rt, key)
	if err != nil {
		return err
	}
	gs := srv.GRPCServer()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		srv.CancelAll()
		gs.GracefulStop()
	}()
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ReadLaunchKey reads exactly LaunchKeyBytes bytes and then end of file.
func ReadLaunchKey(r io.Reader) ([]byte, error) {
	key := make([]byte, LaunchKeyBytes+1)
	n, err := io.ReadFull(r, key)
	switch {
	case n == LaunchKeyBytes && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return key[:LaunchKeyBytes], nil
	case err == nil:
		return nil, fmt.Errorf("packageruntime: the launch key is longer than %d bytes", LaunchKeyBytes)
	default:
		return nil, fmt.Errorf("packageruntime: the launch key is %d bytes, not %d: %v", n, LaunchKeyBytes, err)
	}
}

// Proof is the handshake's authentication_proof: lowercase hex of
// HMAC-SHA256(key, nonce "\n" instanceID "\n" packageRevisionID).
func Proof(key []byte, nonce, instanceID, packageRevisionID string) string {
	return mac(key, nonce, instanceID, packageRevisionID)
}

// Grant is an InvocationContext's grant: "<namespace>:" followed by lowercase
// hex of HMAC-SHA256(key, invocationID "\n" namespace "\n" exportID).
func Grant(key []byte, invocationID, namespace, exportID string) string {
	return namespace + ":" + mac(key, invocationID, namespace, exportID)
}

func mac(key []byte, parts ...string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(strings.Join(parts, "\n")))
	return hex.EncodeToString(h.Sum(nil))
}

// Server is the PackageRuntime service of one runtime process.
type Server struct {
	runtimepb.UnimplementedPackageRuntimeServer

	rt         Runtime
	key        []byte
	instanceID string

	mu          sync.Mutex
	handshaken  bool
	invocations map[string]*invocation
	finished    []string // finished invocation IDs, oldest first
}

type invocation struct {
	state  string
	cancel context.CancelFunc
}

// NewServer checks rt and returns its service, with a new instance ID.
func NewServer(rt Runtime, key []byte) (*Server, error) {
	if len(key) != LaunchKeyBytes {
		return nil, fmt.Errorf("packageruntime: launch key of %d bytes, want %d", len(key), LaunchKeyBytes)
	}
	if rt.PackageRevisionID == "" || len(rt.ExportIDs) == 0 {
		return nil, errors.New("packageruntime: Runtime.PackageRevisionID and Runtime.ExportIDs are required")
	}
	if rt.Invoke == nil {
		return nil, errors.New("packageruntime: Runtime.Invoke is required")
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	return &Server{rt: rt, key: slices.Clone(key), instanceID: hex.EncodeToString(id), invocations: map[string]*invocation{}}, nil
}

// InstanceID is this process's instance ID, new per process.
func (s *Server) InstanceID() string { return s.instanceID }

// GRPCServer returns a gRPC server with this service registered and the
// runtime's message bound applied.
func (s *Server) GRPCServer() *grpc.Server {
	var opts []grpc.ServerOption
	if s.rt.MaxMessageBytes > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(s.rt.MaxMessageBytes), grpc.MaxSendMsgSize(s.rt.MaxMessageBytes))
	}
	gs := grpc.NewServer(opts...)
	runtimepb.RegisterPackageRuntimeServer(gs, s)
	return gs
}

// CancelAll cancels every running invocation (on SIGTERM).
func (s *Server) CancelAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, inv := range s.invocations {
		if inv.cancel != nil {
			inv.cancel()
		}
	}
}

// Handshake answers the manager's handshake once.
func (s *Server) Handshake(_ context.Context, req *runtimepb.HandshakeRequest) (*runtimepb.HandshakeResponse, error) {
	if req.GetOrchProtocolVersion() != Protocol {
		return nil, status.Errorf(codes.InvalidArgument, "orch_protocol_version %q is not %q", req.GetOrchProtocolVersion(), Protocol)
	}
	if n, err := hex.DecodeString(req.GetNonce()); err != nil || len(n) != 32 || strings.ToLower(req.GetNonce()) != req.GetNonce() {
		return nil, status.Errorf(codes.InvalidArgument, "nonce %q is not 64 lowercase hex digits", req.GetNonce())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handshaken {
		return nil, status.Error(codes.FailedPrecondition, "this runtime has already answered a handshake")
	}
	s.handshaken = true
	return &runtimepb.HandshakeResponse{
		PackageRevisionId:      s.rt.PackageRevisionID,
		RuntimeProtocolVersion: Protocol,
		ExportIds:              slices.Clone(s.rt.ExportIDs),
		InstanceId:             s.instanceID,
		AuthenticationProof:    Proof(s.key, req.GetNonce(), s.instanceID, s.rt.PackageRevisionID),
		Capabilities:           slices.Clone(s.rt.Capabilities),
	}, nil
}

// check validates a call's export and context and returns it as a Call.
func (s *Server) check(invocationID string, export *quixospb.PackageExportRef, objectID string, input map[string]*caminopb.Value,
	deps []*quixospb.InjectedDependency, ic *runtimepb.InvocationContext) (*Call, error) {
	s.mu.Lock()
	handshaken := s.handshaken
	s.mu.Unlock()
	if !handshaken {
		return nil, status.Error(codes.FailedPrecondition, "no handshake yet")
	}
	if invocationID == "" {
		return nil, status.Error(codes.InvalidArgument, "invocation_id is empty")
	}
	if export.GetPackageRevisionId() != s.rt.PackageRevisionID {
		return nil, status.Errorf(codes.InvalidArgument, "export.package_revision_id %q is not this runtime's %q", export.GetPackageRevisionId(), s.rt.PackageRevisionID)
	}
	if !slices.Contains(s.rt.ExportIDs, export.GetExportId()) {
		return nil, status.Errorf(codes.NotFound, "export.export_id %q is not one of %v", export.GetExportId(), s.rt.ExportIDs)
	}
	if ic.GetInstanceId() != s.instanceID {
		return nil, status.Errorf(codes.PermissionDenied, "context.instance_id %q is not this process's", ic.GetInstanceId())
	}
	ns, _, ok := strings.Cut(ic.GetGrant(), ":")
	if !ok || !hmac.Equal([]byte(ic.GetGrant()), []byte(Grant(s.key, invocationID, ns, export.GetExportId()))) {
		return nil, status.Error(codes.PermissionDenied, "context.grant was not issued for this invocation, caller and export")
	}
	return &Call{
		InvocationID: invocationID, Export: export.GetExportId(), ObjectID: objectID, Input: input,
		Dependencies: deps, Namespace: ns, SessionID: ic.GetSessionId(), Owner: ic.GetOwnerConformanceId(),
		WorkspaceEpoch: ic.GetWorkspaceEpoch(),
	}, nil
}

// begin records a running invocation with its cancel function.
func (s *Server) begin(id string, cancel context.CancelFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.invocations[id]; dup {
		return status.Errorf(codes.AlreadyExists, "invocation_id %q is already in use", id)
	}
	s.invocations[id] = &invocation{state: StateRunning, cancel: cancel}
	return nil
}

// end records how an invocation ended, and forgets the oldest finished one
// past the bound.
func (s *Server) end(id string, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inv := s.invocations[id]
	inv.cancel = nil
	if failed {
		inv.state = StateFailed
	} else {
		inv.state = StateCompleted
	}
	s.finished = append(s.finished, id)
	if len(s.finished) > retainedInvocations {
		delete(s.invocations, s.finished[0])
		s.finished = s.finished[1:]
	}
}

// Invoke runs one export call.
func (s *Server) Invoke(ctx context.Context, req *runtimepb.InvokeRequest) (*runtimepb.InvokeResponse, error) {
	call, err := s.check(req.GetInvocationId(), req.GetExport(), req.GetObjectId(), req.GetInput(), req.GetDependencies(), req.GetContext())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := s.begin(call.InvocationID, cancel); err != nil {
		return nil, err
	}
	res, err := s.rt.Invoke(ctx, call)
	s.end(call.InvocationID, err != nil)
	if err != nil {
		return &runtimepb.InvokeResponse{Ok: false, Error: err.Error()}, nil
	}
	if res == nil {
		res = &Result{}
	}
	if res.Value == nil {
		res.Value = &caminopb.Value{Kind: &caminopb.Value_NullValue{NullValue: true}}
	}
	return &runtimepb.InvokeResponse{Ok: true, Result: res.Value, Dependencies: res.Dependencies}, nil
}

// Watch serves one watch stream.
func (s *Server) Watch(req *runtimepb.WatchRequest, stream grpc.ServerStreamingServer[runtimepb.WatchEvent]) error {
	call, err := s.check(req.GetInvocationId(), req.GetExport(), req.GetObjectId(), req.GetInput(), req.GetDependencies(), req.GetContext())
	if err != nil {
		return err
	}
	if s.rt.Watch == nil {
		return status.Errorf(codes.Unimplemented, "export %q cannot be watched", call.Export)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	if err := s.begin(call.InvocationID, cancel); err != nil {
		return err
	}
	first := true
	send := func(e Event) error {
		ev := &runtimepb.WatchEvent{WatchId: call.InvocationID, Value: e.Value, Dependencies: e.Dependencies, Initial: first}
		if ev.Value == nil {
			ev.Value = &caminopb.Value{Kind: &caminopb.Value_NullValue{NullValue: true}}
		}
		first = false
		return stream.Send(ev)
	}
	werr := s.rt.Watch(ctx, call, send)
	s.end(call.InvocationID, werr != nil)
	if werr != nil && ctx.Err() == nil {
		// An event with error set ends the watch (wire contract); the stream
		// then closes normally.
		return stream.Send(&runtimepb.WatchEvent{WatchId: call.InvocationID, Error: werr.Error(), Initial: first})
	}
	return nil
}

// GetInvocationStatus reports an invocation's state ("unknown" when this
// process never saw it, or has forgotten it).
func (s *Server) GetInvocationStatus(_ context.Context, req *runtimepb.InvocationControlRequest) (*runtimepb.InvocationStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked(req.GetInvocationId()), nil
}

// CancelInvocation cancels a running invocation's context; its state is
// cancellation-requested until the export returns.
func (s *Server) CancelInvocation(_ context.Context, req *runtimepb.InvocationControlRequest) (*runtimepb.InvocationStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inv, ok := s.invocations[req.GetInvocationId()]; ok && inv.state == StateRunning {
		inv.state = StateCancellationRequested
		inv.cancel()
	}
	return s.statusLocked(req.GetInvocationId()), nil
}

func (s *Server) statusLocked(id string) *runtimepb.InvocationStatus {
	st := StateUnknown
	if inv, ok := s.invocations[id]; ok {
		st = inv.state
	}
	return &runtimepb.InvocationStatus{InvocationId: id, State: st}
}
