// Command seedruntime is a package runtime written only from the seed's
// quixos.runtime.PackageRuntime proto and docs/reference/package-runtimes.md,
// without pkg/packageruntime: a second, independent implementation that the
// host side and `kubectl iteron conformance --kind package-runtime` are
// tested against. It keeps one value per key (exports get, put, watch); a
// get of the key "traceparent" answers the call's W3C traceparent metadata.
//
// -fault=<name> makes it misbehave in one way, for the host's fault tests:
// wrong-proof, no-proof, other-revision, other-exports, extra-capability,
// reused-instance, hang-handshake, hang-invoke, hang-watch, bad-state,
// big-result, flood-watch, ignore-cancel, hang-invoke-ignore-cancel,
// crash-invoke, crash-watch, not-initial.
package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	caminopb "iteron.dev/operator/api/quixos/camino"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
)

// defaultFault is the -fault a build gets by default (-ldflags "-X
// main.defaultFault=NAME"): a runtime launched by the manager has no argv to
// say it.
var defaultFault string

var fault = flag.String("fault", defaultFault, "misbehave this way (see the package doc)")

const revision = "seed-kv-1"

// traceparentKey is the key whose get answers the W3C traceparent of the
// call's gRPC metadata (null without one): the host's tests check that a
// traced call's context reaches the runtime.
const traceparentKey = "traceparent"

type server struct {
	runtimepb.UnimplementedPackageRuntimeServer
	key      []byte
	instance string

	mu      sync.Mutex
	values  map[string]*caminopb.Value
	changed chan struct{} // closed and replaced at every put
	states  map[string]string
	cancels map[string]context.CancelFunc
}

func hexMAC(key []byte, parts ...string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strings.Join(parts, "\n")))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *server) Handshake(ctx context.Context, req *runtimepb.HandshakeRequest) (*runtimepb.HandshakeResponse, error) {
	if *fault == "hang-handshake" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	resp := &runtimepb.HandshakeResponse{
		PackageRevisionId: revision, RuntimeProtocolVersion: "quixos.runtime/1",
		ExportIds:  []string{"watch", "put", "get"}, // a set: any order
		InstanceId: s.instance,
	}
	switch *fault {
	case "other-revision":
		resp.PackageRevisionId = "seed-kv-2"
	case "other-exports":
		resp.ExportIds = []string{"get", "put"}
	case "extra-capability":
		resp.Capabilities = []string{"irreversible_external"}
	case "reused-instance":
		resp.InstanceId = "always-the-same"
	}
	resp.AuthenticationProof = hexMAC(s.key, req.GetNonce(), resp.InstanceId, resp.PackageRevisionId)
	switch *fault {
	case "wrong-proof":
		resp.AuthenticationProof = hexMAC(make([]byte, 32), req.GetNonce(), resp.InstanceId, resp.PackageRevisionId)
	case "no-proof":
		resp.AuthenticationProof = ""
	}
	return resp, nil
}

func (s *server) checkContext(id, export string, ic *runtimepb.InvocationContext) error {
	ns, _, _ := strings.Cut(ic.GetGrant(), ":")
	if ic.GetInstanceId() != s.instance || !hmac.Equal([]byte(ic.GetGrant()), []byte(ns+":"+hexMAC(s.key, id, ns, export))) {
		return status.Error(codes.PermissionDenied, "grant or instance does not match")
	}
	return nil
}

func (s *server) setState(id, st string) {
	s.mu.Lock()
	s.states[id] = st
	s.mu.Unlock()
}

func (s *server) Invoke(ctx context.Context, req *runtimepb.InvokeRequest) (*runtimepb.InvokeResponse, error) {
	if err := s.checkContext(req.GetInvocationId(), req.GetExport().GetExportId(), req.GetContext()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.states[req.GetInvocationId()] = "running"
	s.cancels[req.GetInvocationId()] = cancel
	s.mu.Unlock()
	switch *fault {
	case "hang-invoke", "hang-invoke-ignore-cancel":
		// Ends only when cancelled: by CancelInvocation, or (ignoring
		// that) when the host ends the call.
		<-ctx.Done()
		s.setState(req.GetInvocationId(), "failed")
		return nil, ctx.Err()
	case "crash-invoke":
		os.Exit(3)
	case "big-result":
		return &runtimepb.InvokeResponse{Ok: true, Result: &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: strings.Repeat("x", 2<<20)}}}, nil
	}
	key := req.GetInput()["key"].GetStringValue()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states[req.GetInvocationId()] = "completed"
	switch req.GetExport().GetExportId() {
	case "get":
		v := s.values[key]
		if key == traceparentKey {
			// What the host sent of the call's trace context.
			v = nil
			if tp := metadata.ValueFromIncomingContext(ctx, "traceparent"); len(tp) > 0 {
				v = &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: tp[0]}}
			}
		}
		if v == nil {
			v = &caminopb.Value{Kind: &caminopb.Value_NullValue{NullValue: true}}
		}
		return &runtimepb.InvokeResponse{Ok: true, Result: v}, nil
	case "put":
		s.values[key] = req.GetInput()["value"]
		close(s.changed)
		s.changed = make(chan struct{})
		return &runtimepb.InvokeResponse{Ok: true, Result: s.values[key]}, nil
	}
	s.states[req.GetInvocationId()] = "failed"
	return &runtimepb.InvokeResponse{Ok: false, Error: "not invocable: " + req.GetExport().GetExportId()}, nil
}

func (s *server) Watch(req *runtimepb.WatchRequest, stream grpc.ServerStreamingServer[runtimepb.WatchEvent]) error {
	id := req.GetInvocationId()
	if err := s.checkContext(id, req.GetExport().GetExportId(), req.GetContext()); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	s.mu.Lock()
	s.states[id] = "running"
	s.cancels[id] = cancel
	s.mu.Unlock()
	key := req.GetInput()["key"].GetStringValue()
	first := true
	for n := 0; ; n++ {
		s.mu.Lock()
		v, changed := s.values[key], s.changed
		s.mu.Unlock()
		if v == nil {
			v = &caminopb.Value{Kind: &caminopb.Value_NullValue{NullValue: true}}
		}
		ev := &runtimepb.WatchEvent{WatchId: id, Value: v, Initial: first && *fault != "not-initial"}
		switch {
		case *fault == "hang-watch":
			<-stream.Context().Done() // never sends, ignores cancellation
			return nil
		case *fault == "crash-watch" && !first:
			os.Exit(3)
		case *fault == "flood-watch":
			ev.Value = &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: fmt.Sprintf("%d-%d-%s", n, time.Now().UnixNano(), strings.Repeat("f", 1000))}}
		}
		if err := stream.Send(ev); err != nil {
			return nil
		}
		first = false
		if *fault == "flood-watch" || *fault == "crash-watch" {
			continue
		}
		select {
		case <-ctx.Done():
			if *fault == "ignore-cancel" {
				<-stream.Context().Done() // keeps the stream open after a cancellation
			}
			s.setState(id, "completed")
			return nil
		case <-changed:
		}
	}
}

func (s *server) GetInvocationStatus(_ context.Context, req *runtimepb.InvocationControlRequest) (*runtimepb.InvocationStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.states[req.GetInvocationId()]
	if !ok {
		st = "unknown"
	}
	if *fault == "bad-state" {
		st = "done"
	}
	return &runtimepb.InvocationStatus{InvocationId: req.GetInvocationId(), State: st}, nil
}

func (s *server) CancelInvocation(_ context.Context, req *runtimepb.InvocationControlRequest) (*runtimepb.InvocationStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.states[req.GetInvocationId()]
	if !ok {
		st = "unknown"
	}
	if st == "running" {
		st = "cancellation-requested"
		s.states[req.GetInvocationId()] = st
		if *fault != "ignore-cancel" && *fault != "hang-invoke-ignore-cancel" {
			s.cancels[req.GetInvocationId()]()
		}
	}
	return &runtimepb.InvocationStatus{InvocationId: req.GetInvocationId(), State: st}, nil
}

func main() {
	flag.Parse()
	key := make([]byte, 33)
	n, err := io.ReadFull(os.NewFile(5, "key"), key)
	if n != 32 || err == nil {
		fmt.Fprintf(os.Stderr, "seedruntime: descriptor 5 gave %d bytes (%v), want 32 then end of file\n", n, err)
		os.Exit(2)
	}
	lis, err := net.FileListener(os.NewFile(4, "listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "seedruntime: descriptor 4:", err)
		os.Exit(2)
	}
	inst := make([]byte, 8)
	f, _ := os.Open("/dev/urandom")
	io.ReadFull(f, inst)
	f.Close()
	s := &server{key: key[:32], instance: fmt.Sprintf("%x-%d", inst, time.Now().UnixNano()), values: map[string]*caminopb.Value{},
		changed: make(chan struct{}), states: map[string]string{}, cancels: map[string]context.CancelFunc{}}
	gs := grpc.NewServer(grpc.MaxSendMsgSize(16 << 20))
	runtimepb.RegisterPackageRuntimeServer(gs, s)
	if err := gs.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, "seedruntime:", err)
		os.Exit(1)
	}
}
