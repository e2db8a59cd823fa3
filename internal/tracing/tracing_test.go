package tracing

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestReadSettings(t *testing.T) {
	endpoint := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range endpoint {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	cases := []struct {
		name     string
		env      map[string]string
		on       bool
		protocol string
		calls    string // the call sampler's description
		err      string
	}{
		{name: "no variable leaves tracing off", env: nil},
		{name: "an OTLP endpoint turns it on over http/protobuf, the specification's default", env: endpoint, on: true, protocol: "http/protobuf",
			calls: "ParentBased{root:TraceIDRatioBased{0.01}"},
		{name: "a traces endpoint alone turns it on", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, on: true, protocol: "http/protobuf"},
		{name: "OTEL_TRACES_EXPORTER=otlp turns it on with the exporter's default endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true, protocol: "http/protobuf"},
		{name: "OTEL_TRACES_EXPORTER=none keeps it off whatever else is set", env: with(map[string]string{"OTEL_TRACES_EXPORTER": "none"})},
		{name: "OTEL_SDK_DISABLED=true keeps it off", env: with(map[string]string{"OTEL_SDK_DISABLED": "true"})},
		{name: "the traces protocol wins over the general one", env: with(map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}), on: true, protocol: "grpc"},
		{name: "a sampler and its ratio are read", env: with(map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}), on: true,
			protocol: "http/protobuf", calls: "ParentBased{root:TraceIDRatioBased{0.25}"},
		{name: "always_on samples every call", env: with(map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}), on: true, protocol: "http/protobuf", calls: "AlwaysOnSampler"},
		{name: "an unknown protocol is refused by name", env: with(map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}), err: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": want grpc or http/protobuf`},
		{name: "an unknown sampler is refused by name", env: with(map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}), err: `OTEL_TRACES_SAMPLER="jaeger_remote"`},
		{name: "a ratio that is not one is refused", env: with(map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}), err: `OTEL_TRACES_SAMPLER_ARG="half"`},
		{name: "a ratio above 1 is refused", env: with(map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}), err: `OTEL_TRACES_SAMPLER_ARG="2"`},
		{name: "an exporter other than otlp is refused", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: `OTEL_TRACES_EXPORTER="zipkin"`},
		{name: "OTEL_SDK_DISABLED must be a boolean", env: with(map[string]string{"OTEL_SDK_DISABLED": "perhaps"}), err: `OTEL_SDK_DISABLED="perhaps"`},
		{name: "a batch size that is not a positive integer is refused", env: with(map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0"}), err: `OTEL_BSP_MAX_EXPORT_BATCH_SIZE="0"`},
		{name: "a schedule delay that is not a number is refused", env: with(map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s"}), err: `OTEL_BSP_SCHEDULE_DELAY="5s"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ReadSettings(envOf(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v; want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.On != tc.on || (tc.protocol != "" && s.Protocol != tc.protocol) {
				t.Fatalf("on %v protocol %q; want %v %q", s.On, s.Protocol, tc.on, tc.protocol)
			}
			if tc.calls != "" && !strings.HasPrefix(s.Calls.Description(), tc.calls) {
				t.Fatalf("call sampler %s; want %s…", s.Calls.Description(), tc.calls)
			}
		})
	}
}

func TestTheBatchSettingsComeFromTheBSPVariables(t *testing.T) {
	s, err := ReadSettings(envOf(map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "250", "OTEL_BSP_EXPORT_TIMEOUT": "1000",
		"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	if want := (BatchSettings{250 * time.Millisecond, time.Second, 100, 100}); s.Batch != want {
		t.Fatalf("batch %+v; want %+v (a batch is never larger than the queue)", s.Batch, want)
	}
}

func TestTransactionsAndRolloutsAreAlwaysSampledAndCallsAsTheCallSamplerSays(t *testing.T) {
	s := Sampler(sdktrace.NeverSample())
	decide := func(attrs ...attribute.KeyValue) sdktrace.SamplingDecision {
		return s.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: newTraceID(), Name: "x", Attributes: attrs}).Decision
	}
	if decide(KindKey.String(KindTransaction)) != sdktrace.RecordAndSample || decide(KindKey.String(KindRollout)) != sdktrace.RecordAndSample {
		t.Fatal("a transaction or rollout was not sampled under a call sampler that samples nothing")
	}
	if decide(KindKey.String(KindCall)) != sdktrace.Drop || decide() != sdktrace.Drop {
		t.Fatal("a call was sampled by a call sampler that samples nothing")
	}
}

// recorder installs a provider recording ended spans, with the call
// sampler calls, and removes it when the test ends.
func recorder(t *testing.T, calls sdktrace.Sampler) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	s := Sampler(calls)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(s), sdktrace.WithIDGenerator(IDGenerator()))
	t.Cleanup(Install(tp, s))
	return rec
}

func TestAPlannedCallIsMadeLaterWithThePlannedIDsAndItsChildrenBelowIt(t *testing.T) {
	rec := recorder(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: newTraceID(), SpanID: newSpanID(), TraceFlags: trace.FlagsSampled, Remote: true})
	start := time.Now().Add(-time.Second)
	call := PlanCall(parent, "invoke", start)
	if !call.Traced() || call.SC.TraceID() != parent.TraceID() || call.SC.SpanID() == parent.SpanID() {
		t.Fatalf("planned %+v below a sampled parent; want traced, in its trace, with an ID of its own", call.SC)
	}
	child := PlanChild(call.SC, start.Add(time.Millisecond))
	Later(func(m Maker) {
		m.Make(child, "run").End()
		m.Make(call, "invoke").End()
	})
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans made on the call's path; want none until Later's turn", n)
	}
	Flush()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans made; want 2", len(spans))
	}
	run, invoke := spans[0], spans[1]
	if invoke.SpanContext().SpanID() != call.SC.SpanID() || invoke.Parent().SpanID() != parent.SpanID() || !invoke.StartTime().Equal(start) {
		t.Fatalf("invoke span %s below %s from %s; want the planned %s below %s from %s",
			invoke.SpanContext().SpanID(), invoke.Parent().SpanID(), invoke.StartTime(), call.SC.SpanID(), parent.SpanID(), start)
	}
	if run.Parent().SpanID() != call.SC.SpanID() || run.SpanContext().SpanID() != child.SC.SpanID() {
		t.Fatal("the run's span is not the planned child of the call's")
	}
}

func TestACallThatIsNotSampledIsNotPlannedAndTracingOffPlansNothing(t *testing.T) {
	if PlanCall(trace.SpanContext{}, "invoke", time.Now()).Traced() {
		t.Fatal("a call was planned with tracing off")
	}
	rec := recorder(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	if PlanCall(trace.SpanContext{}, "invoke", time.Now()).Traced() {
		t.Fatal("a root call was planned by a sampler that samples no root")
	}
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: newTraceID(), SpanID: newSpanID(), Remote: true})
	if PlanCall(unsampled, "invoke", time.Now()).Traced() || PlanChild(unsampled, time.Now()).Traced() {
		t.Fatal("a call below an unsampled parent was planned")
	}
	Flush()
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans made", n)
	}
}

func TestIncomingParentReadsTheW3CContextOfTheRequestAndIgnoresAMalformedOne(t *testing.T) {
	recorder(t, sdktrace.AlwaysSample())
	in := func(kv ...string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	sc := IncomingParent(in("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate", "vendor=x"))
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsSampled() || !sc.IsRemote() || sc.TraceState().Get("vendor") != "x" {
		t.Fatalf("parsed %+v", sc)
	}
	for _, bad := range []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"} {
		if sc := IncomingParent(in("traceparent", bad)); sc.IsValid() {
			t.Errorf("traceparent %q parsed as %+v", bad, sc)
		}
	}
	if IncomingParent(context.Background()).IsValid() {
		t.Error("a request without metadata has a parent")
	}
}

// FuzzTraceparent checks the fast traceparent parser against the SDK's
// propagator: both accept the same values and read the same context.
func FuzzTraceparent(f *testing.F) {
	for _, s := range []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "ff-0-0-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, ok := parseTraceparent(v)
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": v}))
		if ok != want.IsValid() {
			t.Fatalf("%q: fast parser says valid=%v, the SDK %v", v, ok, want.IsValid())
		}
		if ok && (got.TraceID() != want.TraceID() || got.SpanID() != want.SpanID() || got.IsSampled() != want.IsSampled()) {
			t.Fatalf("%q: fast parser %+v, the SDK %+v", v, got, want)
		}
	})
}

func TestToOutgoingWritesATraceparentThePropagatorReads(t *testing.T) {
	state, _ := trace.ParseTraceState("vendor=x")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: newTraceID(), SpanID: newSpanID(), TraceFlags: trace.FlagsSampled, TraceState: state})
	md, _ := metadata.FromOutgoingContext(ToOutgoing(context.Background(), sc))
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": md.Get("traceparent")[0], "tracestate": md.Get("tracestate")[0]}))
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsSampled() || got.TraceState().Get("vendor") != "x" {
		t.Fatalf("sent %v, read back %+v", md, got)
	}
	if _, ok := metadata.FromOutgoingContext(ToOutgoing(context.Background(), trace.SpanContext{})); ok {
		t.Fatal("an invalid context was sent")
	}
}

// countingExporter counts what it is sent, and fails when told to.
type countingExporter struct {
	mu       sync.Mutex
	batches  []int
	fail     error
	shutdown bool
}

func (e *countingExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, len(s))
	return e.fail
}

func (e *countingExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdown = true
	return nil
}

func (e *countingExporter) sent() (batches []int, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range e.batches {
		total += n
	}
	return append([]int(nil), e.batches...), total
}

func TestTheBatcherExportsFullBatchesAtOnceDropsOverItsQueueAndFlushesOnShutdown(t *testing.T) {
	exp := &countingExporter{}
	b := NewBatcher(exp, BatchSettings{ScheduleDelay: time.Hour, ExportTimeout: time.Second, MaxQueueSize: 10, MaxExportBatch: 4}).(*batcher)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	tr := tp.Tracer("t")
	for range 4 {
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, total := exp.sent(); total < 4; _, total = exp.sent() {
		if time.Now().After(deadline) {
			t.Fatal("a full batch was not exported before the schedule's delay (an hour)")
		}
		time.Sleep(time.Millisecond)
	}
	// The exporter is not woken again below a batch: fill the queue past
	// its bound while holding the lock the export needs.
	b.mu.Lock()
	b.queue = append(b.queue, make([]sdktrace.ReadOnlySpan, 10-len(b.queue))...)
	b.mu.Unlock()
	_, s := tr.Start(context.Background(), "over")
	s.End()
	if b.Dropped() != 1 {
		t.Fatalf("dropped %d; want the span over the queue's bound", b.Dropped())
	}
	b.mu.Lock()
	b.queue = b.queue[:0]
	b.mu.Unlock()
	for range 3 {
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	batches, total := exp.sent()
	if total != 7 || !exp.shutdown {
		t.Fatalf("batches %v (shut down %v); want 7 spans, the last 3 sent by the shutdown", batches, exp.shutdown)
	}
	_, s = tr.Start(context.Background(), "after")
	s.End()
	if _, total := exp.sent(); total != 7 {
		t.Fatal("a span ended after the shutdown was exported")
	}
}

func TestAFailedExportIsReportedByForceFlushAndTheNextBatchIsStillSent(t *testing.T) {
	exp := &countingExporter{fail: errors.New("collector unavailable")}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(NewBatcher(exp, BatchSettings{time.Hour, time.Second, 10, 10})))
	defer tp.Shutdown(context.Background()) //nolint:errcheck // checked by the other test
	_, s := tr(tp).Start(context.Background(), "s")
	s.End()
	if err := tp.ForceFlush(context.Background()); err == nil || !strings.Contains(err.Error(), "collector unavailable") {
		t.Fatalf("ForceFlush: %v; want the exporter's error", err)
	}
	exp.mu.Lock()
	exp.fail = nil
	exp.mu.Unlock()
	_, s = tr(tp).Start(context.Background(), "s")
	s.End()
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if batches, _ := exp.sent(); len(batches) != 2 {
		t.Fatalf("batches %v; want the failed one and the next", batches)
	}
}

func tr(tp trace.TracerProvider) trace.Tracer { return tp.Tracer("t") }
