package provider

import (
	"context"
	"io"
	"testing"
	"time"

	"iteron.dev/operator/pkg/protocol"
)

// lingering emits its terminal observation and then returns from Start only
// when released: the host sees the run end before Start returns.
type lingering struct {
	release chan struct{}
	starts  chan string
}

func (l *lingering) Load(context.Context, *Load) error { return nil }
func (l *lingering) Start(ctx context.Context, run *Run) error {
	l.starts <- run.ID
	if err := run.Emit([]byte(`{"ok":true}`), true); err != nil {
		return err
	}
	<-l.release
	return nil
}
func (l *lingering) Cancel(context.Context, string, string) error { return nil }

func TestAStartRightAfterATerminalObservationWaitsForTheRunInsteadOfFailing(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &lingering{release: make(chan struct{}), starts: make(chan string, 2)}
	served := make(chan error, 1)
	go func() { served <- Serve(context.Background(), inR, outW, p) }()
	t.Cleanup(func() { inW.Close(); outR.Close() })

	c := protocol.BuiltinContracts("prompt_system")
	env := func(id string) protocol.Envelope {
		return protocol.Envelope{Protocol: protocol.ProtocolV1, RequestID: id, ImplementationID: "t.impl", Module: "prompt_system"}
	}
	send := func(r *protocol.Request) {
		t.Helper()
		b, err := protocol.AppendRequest(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inW.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	lines := protocol.NewLineReader(outR, protocol.MaxFrameBytes)
	next := func() protocol.Frame {
		t.Helper()
		line, err := lines.Next()
		if err != nil {
			t.Fatal(err)
		}
		f, err := protocol.DecodeFrame(line)
		if err != nil {
			t.Fatalf("frame %s: %v", line, err)
		}
		return f
	}
	start := func(id, runID string) *protocol.Request {
		return &protocol.Request{Envelope: env(id), Payload: &protocol.StartRequest{
			LifecycleContract: c.Start, RunID: runID, CandidateSHA256: "sha256:0000000000000000000000000000000000000000000000000000000000000000",
			InputSchema: c.Consumer, Input: []byte(`{}`), DeadlineMs: 10000,
		}}
	}
	send(&protocol.Request{Envelope: env("host-1"), Payload: &protocol.LoadRequest{
		LifecycleContract: c.Load, DefinitionContract: c.Definition, ProviderContract: c.Provider, ConsumerContract: c.Consumer,
		ObservationSchema: c.Observation, ArtifactSHA256: "sha256:0000000000000000000000000000000000000000000000000000000000000000", AdmittedCapabilities: []string{},
	}})
	if f := next(); f.Response == nil || f.Response.Payload.Result() != protocol.ResultLoaded {
		t.Fatalf("load answered %+v", f)
	}
	send(start("host-2", "run-1"))
	if f := next(); f.Response == nil || f.Response.Payload.Result() != protocol.ResultStarted {
		t.Fatalf("first start answered %+v", f)
	}
	if f := next(); f.Observation == nil || !f.Observation.Terminal || f.Observation.RunID != "run-1" {
		t.Fatalf("want run-1's terminal observation, got %+v", f)
	}
	// The host saw run-1 end and starts run-2 while run-1's Start has not
	// returned yet.
	send(start("host-3", "run-2"))
	time.Sleep(50 * time.Millisecond)
	close(p.release)
	f := next()
	if f.Response == nil {
		t.Fatalf("second start answered %+v", f)
	}
	if failed, ok := f.Response.Payload.(*protocol.Failed); ok {
		t.Fatalf("second start refused: %s: %s", failed.Code, failed.Message)
	}
	if f.Response.Payload.Result() != protocol.ResultStarted {
		t.Fatalf("second start answered %+v", f.Response.Payload)
	}
	if got := []string{<-p.starts, <-p.starts}; got[0] != "run-1" || got[1] != "run-2" {
		t.Fatalf("runs started: %v", got)
	}
}
