package pkgruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	caminopb "iteron.dev/operator/api/quixos/camino"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/test/pkgruntimetest"
)

var binaries map[string]string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "iteron-pkgrt-")
	if err != nil {
		panic(err)
	}
	code := 1
	if binaries, err = pkgruntimetest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "building the package runtimes:", err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// pinFor is the pin of the runtime called name, with deadlines short enough
// that a hang is seen in a test.
func pinFor(name string) Pin {
	rev := map[string]string{pkgruntimetest.KV: "kv-1.0.0", pkgruntimetest.Seed: "seed-kv-1"}[name]
	return Pin{
		Manifest: catalog.PackageRuntimeManifest{
			SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: rev, RuntimeProtocolVersion: catalog.PackageRuntimeProtocol,
			Module: "prompt_system", ExportIDs: []string{"get", "put", "watch"}, RequestedCapabilities: []string{},
			Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 10_000, InvokeMs: 10_000, CancelMs: 500},
			Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 8, MaxWatches: 4},
		},
		Admitted: []string{"read_only"}, WorkspaceEpoch: "epoch-1", BindingDigest: "sha256:" + strings.Repeat("0", 64), Owner: "uid-1/prompt_system",
	}
}

func str(s string) *caminopb.Value {
	return &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: s}}
}

func kvCall(export, key string, value *caminopb.Value) Call {
	in := map[string]*caminopb.Value{"key": str(key)}
	if value != nil {
		in["value"] = value
	}
	return Call{Export: export, Input: in, Namespace: "team-a"}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// started is a runtime process and the host's connection to it.
type started struct {
	proc *pkgruntimetest.Runtime
	conn *Conn
}

func dial(t *testing.T, name string, pin Pin, args ...string) (*started, error) {
	t.Helper()
	proc := pkgruntimetest.Start(t, binaries[name], args...)
	conn, err := Dial(ctxT(t), proc.Socket, proc.Key, pin, nil)
	if err == nil {
		t.Cleanup(func() { conn.Close() })
	}
	return &started{proc: proc, conn: conn}, err
}

func mustDial(t *testing.T, name string, pin Pin, args ...string) *started {
	t.Helper()
	s, err := dial(t, name, pin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func wantError(t *testing.T, err error, code, field, detail string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want a pkgruntime.Error %s at %s, got %T %v", code, field, err, err)
	}
	if e.Code != code || e.Field != field || !strings.Contains(e.Error(), detail) {
		t.Fatalf("got %q (code %s, field %s); want code %s, field %s, saying %q", e, e.Code, e.Field, code, field, detail)
	}
}

func TestBothImplementationsServeThroughTheHost(t *testing.T) {
	for _, name := range []string{pkgruntimetest.KV, pkgruntimetest.Seed} {
		t.Run(name, func(t *testing.T) {
			s := mustDial(t, name, pinFor(name))
			if s.conn.InstanceID() == "" {
				t.Fatal("no instance ID after the handshake")
			}
			w, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil))
			if err != nil {
				t.Fatal(err)
			}
			first, err := w.Recv(ctxT(t))
			if err != nil || !first.GetInitial() || first.GetValue().GetNullValue() != true {
				t.Fatalf("first event %v, %v: want initial null", first, err)
			}
			resp, id, err := s.conn.Invoke(ctxT(t), kvCall("put", "k", str("v1")))
			if err != nil || !resp.GetOk() {
				t.Fatalf("put: %v %v", resp, err)
			}
			ev, err := w.Recv(ctxT(t))
			if err != nil || ev.GetInitial() || ev.GetValue().GetStringValue() != "v1" {
				t.Fatalf("event after put %v, %v: want v1", ev, err)
			}
			resp, _, err = s.conn.Invoke(ctxT(t), kvCall("get", "k", nil))
			if err != nil || resp.GetResult().GetStringValue() != "v1" {
				t.Fatalf("get: %v %v", resp, err)
			}
			if st, err := s.conn.Status(ctxT(t), id); err != nil || st != "completed" {
				t.Fatalf("status of the put: %q %v", st, err)
			}
			if st, err := s.conn.Status(ctxT(t), w.ID()); err != nil || st != "running" {
				t.Fatalf("status of the open watch: %q %v", st, err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("closing the watch: %v", err)
			}
			if _, err := w.Recv(ctxT(t)); !errors.Is(err, io.EOF) {
				t.Fatalf("after Close, Recv gave %v; want io.EOF", err)
			}
			if st, err := s.conn.Status(ctxT(t), "inv-never"); err != nil || st != "unknown" {
				t.Fatalf("status of an unseen invocation: %q %v", st, err)
			}
			if _, _, err := s.conn.Invoke(ctxT(t), kvCall("delete", "k", nil)); err == nil {
				t.Fatal("an export the manifest lacks was called")
			} else {
				wantError(t, err, "not_found", "export", `"delete" is not one of the runtime's exports`)
			}
		})
	}
}

func TestAHandshakeThatDoesNotMatchThePinFailsTheActivation(t *testing.T) {
	seed := pinFor(pkgruntimetest.Seed)
	cases := []struct {
		name, fault, field, detail string
		pin                        func(p *Pin)
		seen                       func(string) bool
	}{
		{name: "a proof made with another key", fault: "wrong-proof", field: "handshake.authentication_proof", detail: "does not prove the launch key"},
		{name: "a missing proof", fault: "no-proof", field: "handshake.authentication_proof", detail: "missing"},
		{name: "another revision than the pinned one", fault: "other-revision", field: "handshake.package_revision_id", detail: `"seed-kv-2", but the manifest pins "seed-kv-1"`},
		{name: "exports other than the pinned set", fault: "other-exports", field: "handshake.export_ids", detail: "[get put], but the manifest pins [get put watch]"},
		{name: "a capability beyond the admitted set", fault: "extra-capability", field: "handshake.capabilities", detail: `"irreversible_external" is not among the admitted capabilities [read_only]`},
		{name: "an instance ID an earlier process answered", fault: "reused-instance", field: "handshake.instance_id", detail: "new per process",
			seen: func(id string) bool { return id == "always-the-same" }},
		{name: "no answer within the handshake deadline", fault: "hang-handshake", field: "handshake", detail: "no answer within deadlines.handshake_ms (300ms)",
			pin: func(p *Pin) { p.Manifest.Deadlines.HandshakeMs = 300 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pin := seed
			if c.pin != nil {
				c.pin(&pin)
			}
			proc := pkgruntimetest.Start(t, binaries[pkgruntimetest.Seed], "-fault="+c.fault)
			conn, err := Dial(ctxT(t), proc.Socket, proc.Key, pin, c.seen)
			if err == nil {
				conn.Close()
				t.Fatal("the handshake was accepted")
			}
			wantError(t, err, "activation_failed", c.field, c.detail)
			// What the host does next: kill the group. Nothing is left.
			proc.Kill()
			if err := syscall.Kill(-proc.Pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Fatalf("the runtime's group is still there: %v", err)
			}
		})
	}
}

func TestAnInvokeThatHangsIsCancelledOnTheRuntimeAtItsDeadline(t *testing.T) {
	pin := pinFor(pkgruntimetest.Seed)
	pin.Manifest.Deadlines.InvokeMs = 300
	s := mustDial(t, pkgruntimetest.Seed, pin, "-fault=hang-invoke")
	_, id, err := s.conn.Invoke(ctxT(t), kvCall("get", "k", nil))
	wantError(t, err, "deadline_exceeded", "invoke", "no answer within 300ms")
	st, err := s.conn.Status(ctxT(t), id)
	if err != nil || (st != "cancellation-requested" && st != "failed") {
		t.Fatalf("the runtime's state of the hung invocation: %q %v; want it cancelled", st, err)
	}
}

func TestTheInvocationBoundAnswersQueueFullWithoutWaiting(t *testing.T) {
	pin := pinFor(pkgruntimetest.Seed)
	pin.Manifest.Limits.MaxConcurrentInvocations = 1
	s := mustDial(t, pkgruntimetest.Seed, pin, "-fault=hang-invoke")
	ctx, cancel := context.WithCancel(ctxT(t))
	hung := make(chan error, 1)
	go func() { _, _, err := s.conn.Invoke(ctx, kvCall("get", "k", nil)); hung <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.conn.invokes) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	_, _, err := s.conn.Invoke(ctxT(t), kvCall("get", "k", nil))
	wantError(t, err, "queue_full", "invocations", "bound of 1 is reached")
	cancel()
	wantError(t, <-hung, "cancelled", "invoke", "the caller went away")
	if len(s.conn.invokes) != 0 {
		t.Fatal("the cancelled invocation kept its token")
	}
}

func TestAStateOutsideTheFiveIsAProtocolViolation(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=bad-state")
	_, err := s.conn.Status(ctxT(t), "inv-1")
	wantError(t, err, "provider_failed", "status.state", `"done" is not one of unknown, running, cancellation-requested, completed, failed`)
}

func TestAResultOverTheMessageBoundIsRefused(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=big-result")
	_, _, err := s.conn.Invoke(ctxT(t), kvCall("get", "k", nil))
	wantError(t, err, "provider_failed", "invoke", "over limits.max_message_bytes")
}

func TestARuntimeThatCrashesMidInvokeFailsTheCall(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=crash-invoke")
	_, _, err := s.conn.Invoke(ctxT(t), kvCall("get", "k", nil))
	wantError(t, err, "provider_failed", "invoke", "unreachable")
	<-s.proc.Exited()
}

func TestARuntimeThatCrashesMidWatchEndsTheWatchWithAnError(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=crash-watch")
	w, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil))
	if err != nil {
		t.Fatal(err)
	}
	var got error
	for got == nil {
		_, got = w.Recv(ctxT(t))
	}
	if errors.Is(got, io.EOF) {
		t.Fatal("a crash mid-watch looked like a clean end")
	}
	wantError(t, got, "provider_failed", "watch", "")
	<-s.proc.Exited()
	if len(s.conn.watches) != 0 {
		t.Fatal("the crashed watch kept its token")
	}
}

func TestAWatchWhoseFirstEventIsNotInitialIsCut(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=not-initial")
	w, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Recv(ctxT(t))
	wantError(t, err, "provider_failed", "watch.initial", "the first event of a watch must have initial set")
	if _, err := w.Recv(ctxT(t)); !errors.Is(err, io.EOF) {
		t.Fatalf("after the violation: %v; want the watch ended", err)
	}
}

func TestAWatchThatIsNeverClosedAfterItsCancellationIsCut(t *testing.T) {
	for _, fault := range []string{"ignore-cancel", "hang-watch"} {
		t.Run(fault, func(t *testing.T) {
			pin := pinFor(pkgruntimetest.Seed)
			pin.Manifest.Limits.MaxWatches = 1
			s := mustDial(t, pkgruntimetest.Seed, pin, "-fault="+fault)
			w, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil))
			if err != nil {
				t.Fatal(err)
			}
			if fault == "ignore-cancel" {
				if ev, err := w.Recv(ctxT(t)); err != nil || !ev.GetInitial() {
					t.Fatalf("initial event: %v %v", ev, err)
				}
			}
			if _, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil)); err == nil {
				t.Fatal("a second watch past max_watches=1 was opened")
			} else {
				wantError(t, err, "queue_full", "watches", "bound of 1")
			}
			err = w.Close()
			wantError(t, err, "provider_failed", "watch", "did not end watch "+w.ID()+" within deadlines.cancel_ms (500ms)")
			// The cut stream gave its token back: a new watch opens.
			again, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil))
			if err != nil {
				t.Fatalf("after the cut, a new watch: %v", err)
			}
			again.Close()
		})
	}
}

func TestAFloodingWatchIsHeldBackByASlowReader(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=flood-watch")
	w, err := s.conn.Watch(ctxT(t), kvCall("watch", "k", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Each flood event is "<n>-<unix ns when sent>-<1000 bytes>".
	next := func() (n int, sent time.Time) {
		ev, err := w.Recv(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.SplitN(ev.GetValue().GetStringValue(), "-", 3)
		n, _ = strconv.Atoi(f[0])
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		return n, time.Unix(0, ns)
	}
	next() // the initial event
	// Read nothing for a second: a runtime that could send without limit
	// sends hundreds of thousands of 1 KB events in that time.
	time.Sleep(time.Second)
	resume := time.Now()
	ahead, last := 0, 0
	for {
		n, sent := next()
		if last != 0 && n != last+1 {
			t.Fatalf("event %d after %d: events were lost or reordered", n, last)
		}
		last = n
		if sent.After(resume) {
			break
		}
		ahead++
	}
	// Flow control bounds what was sent while nobody read: the stream's
	// window (64 KiB) and the transports' buffers, measured at 126 events of
	// 1 KB every time here; 256 leaves room, and is orders of magnitude below
	// what an unbounded sender sends in a second.
	if ahead > 256 {
		t.Fatalf("%d events were sent while the reader read nothing: nothing held the runtime back", ahead)
	}
	for i := 0; i < 500; i++ {
		if n, _ := next(); n != last+1 {
			t.Fatalf("event %d after %d: events were lost or reordered", n, last)
		} else {
			last = n
		}
	}
	t.Logf("while the reader paused 1 s, the runtime sent %d events (1 KB each) and was held there; the next 500 followed in order", ahead)
}
