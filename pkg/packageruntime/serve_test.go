package packageruntime_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	caminopb "iteron.dev/operator/api/quixos/camino"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/pkg/packageruntime"
	"iteron.dev/operator/test/pkgruntimetest"
)

var binaries map[string]string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "iteron-kv-")
	if err != nil {
		panic(err)
	}
	code := 1
	if binaries, err = pkgruntimetest.Build(dir); err != nil {
		os.Stderr.WriteString("building the package runtimes: " + err.Error() + "\n")
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// runtimeProcess is a kv runtime started the way the manager starts one,
// and a client connected to it.
type runtimeProcess struct {
	key    []byte
	client runtimepb.PackageRuntimeClient
}

func start(t *testing.T) *runtimeProcess {
	t.Helper()
	r := pkgruntimetest.Start(t, binaries[pkgruntimetest.KV])
	conn, err := grpc.NewClient("unix://"+r.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &runtimeProcess{key: r.Key, client: runtimepb.NewPackageRuntimeClient(conn)}
}

func nonce() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (p *runtimeProcess) handshake(t *testing.T) *runtimepb.HandshakeResponse {
	t.Helper()
	n := nonce()
	resp, err := p.client.Handshake(ctxT(t), &runtimepb.HandshakeRequest{OrchProtocolVersion: packageruntime.Protocol, Nonce: n}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if want := packageruntime.Proof(p.key, n, resp.InstanceId, resp.PackageRevisionId); resp.AuthenticationProof != want {
		t.Fatalf("proof %s, want %s", resp.AuthenticationProof, want)
	}
	return resp
}

func str(s string) *caminopb.Value {
	return &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: s}}
}

func (p *runtimeProcess) call(id, export, ns string, hs *runtimepb.HandshakeResponse, input map[string]*caminopb.Value) *runtimepb.InvokeRequest {
	return &runtimepb.InvokeRequest{
		InvocationId: id, Export: &quixospb.PackageExportRef{PackageRevisionId: hs.PackageRevisionId, ExportId: export}, Input: input,
		Context: &runtimepb.InvocationContext{InstanceId: hs.InstanceId, Grant: packageruntime.Grant(p.key, id, ns, export), WorkspaceEpoch: "e1"},
	}
}

func TestTheKVRuntimeAnswersTheHandshakeWithItsProof(t *testing.T) {
	a, b := start(t), start(t)
	ha, hb := a.handshake(t), b.handshake(t)
	if ha.PackageRevisionId != "kv-1.0.0" || ha.RuntimeProtocolVersion != "quixos.runtime/1" || !slices.Equal(ha.ExportIds, []string{"get", "put", "watch"}) {
		t.Fatalf("handshake %+v", ha)
	}
	if ha.InstanceId == hb.InstanceId || len(ha.InstanceId) == 0 {
		t.Fatalf("two processes answered instance IDs %q and %q: an instance ID is new per process", ha.InstanceId, hb.InstanceId)
	}
	_, err := a.client.Handshake(ctxT(t), &runtimepb.HandshakeRequest{OrchProtocolVersion: packageruntime.Protocol, Nonce: nonce()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a second handshake: %v, want FailedPrecondition", err)
	}
}

func TestAHandshakeThatIsNotTheProtocolIsRefused(t *testing.T) {
	p := start(t)
	for _, req := range []*runtimepb.HandshakeRequest{
		{OrchProtocolVersion: "quixos.runtime/2", Nonce: nonce()},
		{OrchProtocolVersion: packageruntime.Protocol, Nonce: "abc"},
		{OrchProtocolVersion: packageruntime.Protocol, Nonce: strings.ToUpper(nonce())},
	} {
		if _, err := p.client.Handshake(ctxT(t), req, grpc.WaitForReady(true)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("handshake %+v: %v, want InvalidArgument", req, err)
		}
	}
	// None of them counted: the real handshake still works.
	p.handshake(t)
}

func TestPutThenGetThroughARealRuntime(t *testing.T) {
	p := start(t)
	hs := p.handshake(t)
	put, err := p.client.Invoke(ctxT(t), p.call("i1", "put", "team-a", hs, map[string]*caminopb.Value{"key": str("k"), "value": str("v1")}))
	if err != nil || !put.Ok {
		t.Fatalf("put: %v %+v", err, put)
	}
	get, err := p.client.Invoke(ctxT(t), p.call("i2", "get", "team-a", hs, map[string]*caminopb.Value{"key": str("k")}))
	if err != nil || !get.Ok || get.Result.GetStringValue() != "v1" {
		t.Fatalf("get: %v %+v", err, get)
	}
	bad, err := p.client.Invoke(ctxT(t), p.call("i3", "get", "team-a", hs, map[string]*caminopb.Value{}))
	if err != nil || bad.Ok || !strings.Contains(bad.Error, "input.key") {
		t.Fatalf("get without a key: %v %+v, want ok=false naming input.key", err, bad)
	}
	st, err := p.client.GetInvocationStatus(ctxT(t), &runtimepb.InvocationControlRequest{InvocationId: "i1"})
	if err != nil || st.State != packageruntime.StateCompleted {
		t.Fatalf("status of i1: %v %+v", err, st)
	}
	st, err = p.client.GetInvocationStatus(ctxT(t), &runtimepb.InvocationControlRequest{InvocationId: "i3"})
	if err != nil || st.State != packageruntime.StateFailed {
		t.Fatalf("status of i3: %v %+v", err, st)
	}
	st, err = p.client.GetInvocationStatus(ctxT(t), &runtimepb.InvocationControlRequest{InvocationId: "never"})
	if err != nil || st.State != packageruntime.StateUnknown {
		t.Fatalf("status of an unseen invocation: %v %+v", err, st)
	}
}

func TestCallsTheRuntimeCannotTrustAreRefused(t *testing.T) {
	p := start(t)
	early := p.call("e0", "get", "team-a", &runtimepb.HandshakeResponse{PackageRevisionId: "kv-1.0.0"}, map[string]*caminopb.Value{"key": str("k")})
	if _, err := p.client.Invoke(ctxT(t), early, grpc.WaitForReady(true)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a call before the handshake: %v, want FailedPrecondition", err)
	}
	hs := p.handshake(t)
	input := map[string]*caminopb.Value{"key": str("k")}
	cases := []struct {
		name string
		edit func(r *runtimepb.InvokeRequest)
		code codes.Code
	}{
		{"a grant for another namespace", func(r *runtimepb.InvokeRequest) {
			r.Context.Grant = "team-b:" + strings.SplitN(r.Context.Grant, ":", 2)[1]
		}, codes.PermissionDenied},
		{"a grant for another invocation", func(r *runtimepb.InvokeRequest) {
			r.Context.Grant = packageruntime.Grant(p.key, "other", "team-a", "get")
		}, codes.PermissionDenied},
		{"a grant for another export", func(r *runtimepb.InvokeRequest) {
			r.Context.Grant = packageruntime.Grant(p.key, r.InvocationId, "team-a", "put")
		}, codes.PermissionDenied},
		{"a grant made with another key", func(r *runtimepb.InvokeRequest) {
			r.Context.Grant = packageruntime.Grant(make([]byte, 32), r.InvocationId, "team-a", "get")
		}, codes.PermissionDenied},
		{"no context at all", func(r *runtimepb.InvokeRequest) { r.Context = nil }, codes.PermissionDenied},
		{"another instance's ID", func(r *runtimepb.InvokeRequest) { r.Context.InstanceId = "0000" }, codes.PermissionDenied},
		{"another revision", func(r *runtimepb.InvokeRequest) { r.Export.PackageRevisionId = "kv-2.0.0" }, codes.InvalidArgument},
		{"an export the runtime lacks", func(r *runtimepb.InvokeRequest) { r.Export.ExportId = "delete" }, codes.NotFound},
		{"an empty invocation ID", func(r *runtimepb.InvokeRequest) { r.InvocationId = "" }, codes.InvalidArgument},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := p.call("x"+string(rune('a'+i)), "get", "team-a", hs, input)
			c.edit(r)
			_, err := p.client.Invoke(ctxT(t), r)
			if status.Code(err) != c.code {
				t.Fatalf("%v, want %v", err, c.code)
			}
		})
	}
	if _, err := p.client.Invoke(ctxT(t), p.call("dup", "get", "team-a", hs, input)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Invoke(ctxT(t), p.call("dup", "get", "team-a", hs, input)); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("a reused invocation ID: %v, want AlreadyExists", err)
	}
}

func TestAWatchStartsWithItsInitialEventFollowsPutsAndEndsWhenCancelled(t *testing.T) {
	p := start(t)
	hs := p.handshake(t)
	p.client.Invoke(ctxT(t), p.call("p0", "put", "team-a", hs, map[string]*caminopb.Value{"key": str("k"), "value": str("v0")}))
	w := p.call("w1", "watch", "team-a", hs, map[string]*caminopb.Value{"key": str("k")})
	stream, err := p.client.Watch(ctxT(t), &runtimepb.WatchRequest{InvocationId: w.InvocationId, Export: w.Export, Input: w.Input, Context: w.Context})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || !first.Initial || first.WatchId != "w1" || first.Value.GetStringValue() != "v0" {
		t.Fatalf("first event %+v, %v; want initial v0 of watch w1", first, err)
	}
	p.client.Invoke(ctxT(t), p.call("p1", "put", "team-a", hs, map[string]*caminopb.Value{"key": str("k"), "value": str("v1")}))
	next, err := stream.Recv()
	if err != nil || next.Initial || next.Value.GetStringValue() != "v1" {
		t.Fatalf("event after a put %+v, %v; want v1, not initial", next, err)
	}
	st, err := p.client.GetInvocationStatus(ctxT(t), &runtimepb.InvocationControlRequest{InvocationId: "w1"})
	if err != nil || st.State != packageruntime.StateRunning {
		t.Fatalf("status of an open watch: %+v, %v", st, err)
	}
	st, err = p.client.CancelInvocation(ctxT(t), &runtimepb.InvocationControlRequest{InvocationId: "w1"})
	if err != nil || (st.State != packageruntime.StateCancellationRequested && st.State != packageruntime.StateCompleted) {
		t.Fatalf("cancel: %+v, %v", st, err)
	}
	if ev, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after cancel the stream gave %+v, %v; want its end", ev, err)
	}
}
