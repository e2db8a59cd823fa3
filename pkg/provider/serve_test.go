package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/protocol"
)

var contracts = protocol.BuiltinContracts("prompt_system")

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// stub is a StatefulProvider whose behaviour each test sets.
type stub struct {
	start     func(ctx context.Context, run *Run) error
	snapshot  func() (jsontext.Value, error)
	restored  *protocol.State
	loadErr   error
	cancelled []string
	mu        sync.Mutex
}

func (s *stub) Load(ctx context.Context, load *Load) error { return s.loadErr }
func (s *stub) Start(ctx context.Context, run *Run) error {
	if s.start != nil {
		return s.start(ctx, run)
	}
	return run.Emit(run.Input, true)
}
func (s *stub) Cancel(ctx context.Context, runID, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelled = append(s.cancelled, runID)
	return nil
}
func (s *stub) Snapshot(ctx context.Context, l Lineage) (jsontext.Value, error) {
	if s.snapshot != nil {
		return s.snapshot()
	}
	return jsontext.Value(`{"b":1,"a":[2.50,"<&>"]}`), nil
}
func (s *stub) Migrate(ctx context.Context, src *protocol.State, target Lineage) (jsontext.Value, error) {
	return jsontext.Value(`{"migrated":` + string(src.State) + `}`), nil
}
func (s *stub) Restore(ctx context.Context, st *protocol.State) error {
	s.restored = st
	return nil
}
func (s *stub) Readiness(ctx context.Context, l Lineage, d string) error {
	if s.restored == nil || s.restored.StateSHA256 != d {
		return Failf("not_ready", "holding no state with %s", d)
	}
	return nil
}

// stateless hides the state operations: a protocol-1 provider.
type stateless struct{ Provider }

type harness struct {
	t      *testing.T
	in     *io.PipeWriter
	frames chan []byte
	served chan error
	next   int
	v      protocol.Version
	impl   string
}

func serve(t *testing.T, p Provider) *harness {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	h := &harness{t: t, in: inW, frames: make(chan []byte, 64), served: make(chan error, 1), v: protocol.V2, impl: "test.impl"}
	if _, ok := p.(StatefulProvider); !ok {
		h.v = protocol.V1
	}
	go func() {
		h.served <- Serve(context.Background(), inR, outW, p)
		outW.Close()
	}()
	go func() {
		lr := protocol.NewLineReader(outR, protocol.MaxFrameBytes)
		for {
			b, err := lr.Next()
			if err != nil {
				close(h.frames)
				return
			}
			h.frames <- b
		}
	}()
	t.Cleanup(func() { inW.Close(); outR.Close() })
	return h
}

func (h *harness) send(p protocol.RequestPayload) *protocol.Request {
	h.t.Helper()
	h.next++
	req := &protocol.Request{Envelope: protocol.Envelope{Protocol: h.v.String(), RequestID: fmt.Sprintf("host-%d", h.next),
		ImplementationID: h.impl, Module: "prompt_system"}, Payload: p}
	b, err := protocol.AppendRequest(nil, req)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.in.Write(append(b, '\n')); err != nil {
		h.t.Fatalf("writing %s: %v", b, err)
	}
	return req
}

func (h *harness) frame() protocol.Frame {
	h.t.Helper()
	select {
	case b, ok := <-h.frames:
		if !ok {
			h.t.Fatal("the provider closed its output")
		}
		f, err := protocol.DecodeFrame(b)
		if err != nil {
			h.t.Fatalf("the provider wrote %s: %v", b, err)
		}
		return f
	case <-time.After(5 * time.Second):
		h.t.Fatal("no frame from the provider")
	}
	return protocol.Frame{}
}

// answer reads the response to req and checks it correlates.
func (h *harness) answer(req *protocol.Request) protocol.ResponsePayload {
	h.t.Helper()
	f := h.frame()
	if f.Response == nil {
		h.t.Fatalf("an observation %+v where the answer to %s was expected", f.Observation, req.RequestID)
	}
	if err := protocol.Correlate(req, f.Response, &contracts); err != nil {
		h.t.Fatalf("the answer to %s does not correlate: %v", req.Payload.Operation(), err)
	}
	return f.Response.Payload
}

func (h *harness) failed(req *protocol.Request, code string) *protocol.Failed {
	h.t.Helper()
	f, ok := h.answer(req).(*protocol.Failed)
	if !ok || f.Code != code {
		h.t.Fatalf("answer to %s: %+v, want failed %q", req.Payload.Operation(), f, code)
	}
	return f
}

func (h *harness) load() {
	h.t.Helper()
	req := h.send(&protocol.LoadRequest{LifecycleContract: contracts.Load, DefinitionContract: contracts.Definition, ProviderContract: contracts.Provider,
		ConsumerContract: contracts.Consumer, ObservationSchema: contracts.Observation, ArtifactSHA256: digest, AdmittedCapabilities: []string{}})
	if _, ok := h.answer(req).(*protocol.Loaded); !ok {
		h.t.Fatal("load was not answered loaded")
	}
}

func (h *harness) start(runID, input string) *protocol.Request {
	return h.send(&protocol.StartRequest{LifecycleContract: contracts.Start, RunID: runID, CandidateSHA256: digest,
		InputSchema: contracts.Consumer, Input: jsontext.Value(input), DeadlineMs: 5000})
}

func (h *harness) stop() error {
	h.t.Helper()
	req := h.send(&protocol.StopRequest{LifecycleContract: contracts.Stop, Reason: "done"})
	if _, ok := h.answer(req).(*protocol.Stopped); !ok {
		h.t.Fatal("stop was not answered stopped")
	}
	return h.wait()
}

func (h *harness) wait() error {
	h.t.Helper()
	select {
	case err := <-h.served:
		return err
	case <-time.After(5 * time.Second):
		h.t.Fatal("Serve did not return")
	}
	return nil
}

func TestARunIsStartedThenObservedInSequenceUntilItsTerminalObservation(t *testing.T) {
	s := &stub{start: func(ctx context.Context, run *Run) error {
		for i := range 3 {
			if err := run.EmitValue(map[string]int{"i": i}, i == 2); err != nil {
				return err
			}
		}
		return nil
	}}
	h := serve(t, s)
	h.load()
	req := h.start("run-1", `{}`)
	if _, ok := h.answer(req).(*protocol.Started); !ok {
		t.Fatal("start was not answered started")
	}
	for i := range 3 {
		o := h.frame().Observation
		if o == nil || o.RunID != "run-1" || o.Sequence != uint64(i) || o.Schema != contracts.Observation || o.Terminal != (i == 2) || string(o.Observation) != fmt.Sprintf(`{"i":%d}`, i) {
			t.Fatalf("observation %d: %+v", i, o)
		}
	}
	if err := h.stop(); err != nil {
		t.Fatalf("Serve after stop: %v", err)
	}
}

func TestACancelledRunEmitsNothingAfterTheCancelledAnswer(t *testing.T) {
	emitAfter := make(chan error, 1)
	s := &stub{start: func(ctx context.Context, run *Run) error {
		if err := run.EmitValue("working", false); err != nil {
			return err
		}
		<-ctx.Done()
		emitAfter <- run.EmitValue("too late", true)
		return nil
	}}
	h := serve(t, s)
	h.load()
	h.answer(h.start("slow", `{}`))
	if o := h.frame().Observation; o == nil || string(o.Observation) != `"working"` {
		t.Fatalf("first observation %+v", o)
	}
	cancel := h.send(&protocol.CancelRequest{LifecycleContract: contracts.Cancel, RunID: "slow", Reason: "quiesce"})
	if _, ok := h.answer(cancel).(*protocol.Cancelled); !ok {
		t.Fatal("cancel was not answered cancelled")
	}
	if err := <-emitAfter; !errors.Is(err, ErrRunEnded) {
		t.Fatalf("Emit after the cancel: %v, want ErrRunEnded", err)
	}
	if len(s.cancelled) != 1 || s.cancelled[0] != "slow" {
		t.Fatalf("the provider's Cancel hook saw %v", s.cancelled)
	}
	// A cancel for a run that is over is answered too.
	again := h.send(&protocol.CancelRequest{LifecycleContract: contracts.Cancel, RunID: "slow", Reason: "again"})
	h.answer(again)
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestTheSDKBuildsStatesAndChecksTheirDigests(t *testing.T) {
	s := &stub{}
	h := serve(t, s)
	h.load()
	snapReq := h.send(&protocol.SnapshotRequest{LifecycleContract: contracts.Snapshot, RunID: "lineage-prompt_system", Generation: 4, StateSchema: contracts.Snapshot, DeadlineMs: 1000})
	snap := h.answer(snapReq).(*protocol.Snapshotted).State // Correlate recomputed its digest
	if snap.ImplementationID != "test.impl" || snap.Module != "prompt_system" || snap.Generation != 4 {
		t.Fatalf("snapshot %+v", snap)
	}
	migReq := h.send(&protocol.MigrateRequest{LifecycleContract: contracts.Migrate, Source: snap, TargetGeneration: 5, DeadlineMs: 1000})
	mig := h.answer(migReq).(*protocol.Migrated).State
	if mig.Generation != 5 || !strings.HasPrefix(string(mig.State), `{"migrated":`) {
		t.Fatalf("migrated %+v", mig)
	}
	// A state whose claimed digest is not its own never reaches Restore.
	bad := mig
	bad.StateSHA256 = digest
	h.failed(h.send(&protocol.RestoreRequest{LifecycleContract: contracts.Restore, State: bad, DeadlineMs: 1000}), "invalid_state")
	if s.restored != nil {
		t.Fatal("Restore was called with a state whose digest does not match")
	}
	h.answer(h.send(&protocol.RestoreRequest{LifecycleContract: contracts.Restore, State: mig, DeadlineMs: 1000}))
	h.answer(h.send(&protocol.ReadinessRequest{LifecycleContract: contracts.Readiness, RunID: "lineage-prompt_system", Generation: 5, StateSchema: contracts.Snapshot, StateSHA256: mig.StateSHA256, DeadlineMs: 1000}))
	h.failed(h.send(&protocol.ReadinessRequest{LifecycleContract: contracts.Readiness, RunID: "lineage-prompt_system", Generation: 5, StateSchema: contracts.Snapshot, StateSHA256: digest, DeadlineMs: 1000}), "not_ready")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestRequestsOutOfPlaceAreAnsweredWithFailures(t *testing.T) {
	block := make(chan struct{})
	s := &stub{start: func(ctx context.Context, run *Run) error {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil
	}}
	h := serve(t, s)
	snap := &protocol.SnapshotRequest{LifecycleContract: contracts.Snapshot, RunID: "lineage-prompt_system", Generation: 1, StateSchema: contracts.Snapshot, DeadlineMs: 1000}
	h.failed(h.start("early", `{}`), "not_loaded")
	h.load()
	h.failed(h.send(&protocol.LoadRequest{LifecycleContract: contracts.Load, DefinitionContract: contracts.Definition, ProviderContract: contracts.Provider,
		ConsumerContract: contracts.Consumer, ObservationSchema: contracts.Observation, ArtifactSHA256: digest, AdmittedCapabilities: []string{}}), "already_loaded")
	h.impl = "someone.else"
	h.failed(h.start("stranger", `{}`), "wrong_identity")
	h.impl = "test.impl"
	h.answer(h.start("busy", `{}`))
	h.failed(h.start("second", `{}`), "run_active")
	h.failed(h.send(snap), "run_active")
	h.failed(h.send(&protocol.StartRequest{LifecycleContract: contracts.Start, RunID: "bad", CandidateSHA256: digest, InputSchema: contracts.Consumer, Input: jsontext.Value(`{}`), DeadlineMs: 0}), "invalid_request")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestAProtocol1ProviderAnswersStateOperationsUnsupported(t *testing.T) {
	h := serve(t, stateless{&stub{}})
	h.load()
	for _, p := range []protocol.RequestPayload{
		&protocol.SnapshotRequest{LifecycleContract: contracts.Snapshot, RunID: "lineage-prompt_system", Generation: 1, StateSchema: contracts.Snapshot, DeadlineMs: 1000},
		&protocol.ReadinessRequest{LifecycleContract: contracts.Readiness, RunID: "lineage-prompt_system", Generation: 1, StateSchema: contracts.Snapshot, StateSHA256: digest, DeadlineMs: 1000},
	} {
		h.failed(h.send(p), "unsupported_operation")
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestFailuresCarryTheProvidersCodeWithinTheirBounds(t *testing.T) {
	cases := []struct {
		name      string
		err       error
		code      string
		msgLength int
	}{
		{"a plain error is a provider_error", errors.New("disk on fire"), "provider_error", len("disk on fire")},
		{"an *Error keeps its code", Failf("model_missing", "no model %q", "x"), "model_missing", len(`no model "x"`)},
		{"a long code and message are cut to their bounds", &Error{Code: strings.Repeat("c", 200), Message: strings.Repeat("é", 3000)}, strings.Repeat("c", 128), 4096},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &stub{snapshot: func() (jsontext.Value, error) { return nil, tc.err }}
			h := serve(t, s)
			h.load()
			f := h.failed(h.send(&protocol.SnapshotRequest{LifecycleContract: contracts.Snapshot, RunID: "lineage-prompt_system", Generation: 1, StateSchema: contracts.Snapshot, DeadlineMs: 1000}), tc.code)
			if len(f.Message) != tc.msgLength || !utf8.ValidString(f.Message) {
				t.Fatalf("message of %d bytes (valid UTF-8: %v), want %d", len(f.Message), utf8.ValidString(f.Message), tc.msgLength)
			}
		})
	}
}

func TestEmitTakesExactly512KiBAndLeavesStrictnessToTheHost(t *testing.T) {
	results := make(chan []error, 1)
	s := &stub{start: func(ctx context.Context, run *Run) error {
		big := func(n int) jsontext.Value { return jsontext.Value(`"` + strings.Repeat("x", n-2) + `"`) }
		results <- []error{
			run.Emit(big(protocol.MaxPayloadBytes+1), false),
			run.Emit(nil, false),
			run.Emit(big(protocol.MaxPayloadBytes), false),
			run.Emit(jsontext.Value(`{"a":1,"a":2}`), true),
		}
		return nil
	}}
	h := serve(t, s)
	h.load()
	h.answer(h.start("r", `{}`))
	errs := <-results
	if errs[0] == nil || errs[1] == nil {
		t.Fatalf("Emit of 512 KiB + 1 and of nothing: %v, %v; want refusals", errs[0], errs[1])
	}
	if errs[2] != nil || errs[3] != nil {
		t.Fatalf("Emit of exactly 512 KiB and of an unparsed value: %v, %v", errs[2], errs[3])
	}
	if o := h.frame().Observation; o == nil || len(o.Observation) != protocol.MaxPayloadBytes || o.Sequence != 0 {
		t.Fatalf("the first observation written should be the 512 KiB one")
	}
	// The SDK does not parse observations: the host does, and rejects this
	// one (a fault that ends the provider).
	b := <-h.frames
	if _, err := protocol.DecodeFrame(b); protocol.KindOf(err) != protocol.ErrMalformed || !strings.Contains(err.Error(), "duplicate") {
		t.Fatalf("the host decoding %s: %v, want a duplicate-member rejection", b, err)
	}
}

func TestTheNextStartIsAcceptedAsSoonAsTheTerminalObservationIsWritten(t *testing.T) {
	slowReturn := make(chan struct{})
	s := &stub{start: func(ctx context.Context, run *Run) error {
		if err := run.Emit(run.Input, true); err != nil {
			return err
		}
		<-slowReturn // Start is still returning when the host starts the next run
		return nil
	}}
	h := serve(t, s)
	h.load()
	h.answer(h.start("first", `1`))
	if o := h.frame().Observation; o == nil || !o.Terminal {
		t.Fatal("no terminal observation")
	}
	if _, ok := h.answer(h.start("second", `2`)).(*protocol.Started); !ok {
		t.Fatal("a start right after a terminal observation was refused")
	}
	close(slowReturn)
	if o := h.frame().Observation; o == nil || o.RunID != "second" {
		t.Fatalf("observation %+v", o)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStartedWaitsForAQuickRunsFirstObservationAndNoLongerForASlowOne(t *testing.T) {
	release := make(chan struct{})
	s := &stub{start: func(ctx context.Context, run *Run) error {
		<-release
		return run.Emit(run.Input, true)
	}}
	h := serve(t, s)
	h.load()
	req := h.start("slow", `{}`)
	// The run emits nothing until released: started must come on its own.
	if _, ok := h.answer(req).(*protocol.Started); !ok {
		t.Fatal("started was held for a run that does not emit")
	}
	close(release)
	if o := h.frame().Observation; o == nil || !o.Terminal {
		t.Fatal("no terminal observation")
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestProviderBugsTheProtocolCannotReportEndServe(t *testing.T) {
	cases := []struct {
		name  string
		start func(ctx context.Context, run *Run) error
		want  string
	}{
		{"a run that fails", func(ctx context.Context, run *Run) error { return errors.New("boom") }, `run "r" failed: boom`},
		{"a run that ends without a terminal observation", func(ctx context.Context, run *Run) error { return run.EmitValue(1, false) }, "without a terminal observation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := serve(t, &stub{start: tc.start})
			h.load()
			h.answer(h.start("r", `{}`))
			if err := h.wait(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Serve returned %v, want %q", err, tc.want)
			}
		})
	}
}

func TestServeEndsWhenTheHostGoesAway(t *testing.T) {
	h := serve(t, &stub{})
	h.load()
	h.in.Close()
	if err := h.wait(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Serve after the host closed stdin: %v", err)
	}
	h = serve(t, &stub{})
	h.in.Write([]byte("{not json\n"))
	if err := h.wait(); err == nil || !strings.Contains(err.Error(), "undecodable request") {
		t.Fatalf("Serve after an undecodable request: %v", err)
	}
}
