package otlptest

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"iteron.dev/operator/internal/tracing"
)

// TraceTo turns tracing on in the test's process as a node's OTEL_*
// variables would, exporting over OTLP/gRPC to a new Receiver: calls are
// traced only when their caller's context is sampled
// (parentbased_always_off), transactions and rollouts always, batches go
// out every 50 ms. service is the default service.name (OTEL_SERVICE_NAME,
// set before, wins). Tracing goes off again, flushed, when the test ends.
func TraceTo(t *testing.T, service string) *Receiver {
	t.Helper()
	rcv := Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.Endpoint())
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	shutdown, err := tracing.FromEnvironment(context.Background(), service)
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.Enabled() {
		t.Fatal("tracing is off with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			t.Errorf("tracing shutdown: %v", err)
		}
	})
	return rcv
}

// Record turns tracing on for the test, calls sampled by calls (always
// wrapped in the manager's tracing.Sampler, with its ID generator), and
// returns the recorder of the spans ended; tracing goes off when the test
// ends. Spans planned for calls are made by tracing.Later: Flush first.
func Record(t *testing.T, calls sdktrace.Sampler) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	s := tracing.Sampler(calls)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(s), sdktrace.WithIDGenerator(tracing.IDGenerator()))
	t.Cleanup(tracing.Install(tp, s))
	return rec
}
