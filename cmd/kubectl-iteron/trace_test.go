package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/test/otlptest"
)

func TestInvokeSendsTheCallersTraceContextToTheGateway(t *testing.T) {
	socket := liveGateway(t, nil)
	args := []string{"invoke", "--socket", socket, "--activation", "stack", "--module", "prompt_system", "--input", `{"key":"t","add":1}`}
	// invokeSpans are the node's call spans, made once the calls were
	// answered (want: how many to wait for, up to 10 s).
	invokeSpans := func(rec *tracetest.SpanRecorder, want int) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			tracing.Flush()
			out = out[:0]
			for _, s := range rec.Ended() {
				if s.Name() == "invoke" {
					out = append(out, s)
				}
			}
			if len(out) >= want || time.Now().After(deadline) {
				return out
			}
		}
	}

	t.Run("--trace starts a sampled trace, prints its ID, and the node's call span is in it", func(t *testing.T) {
		rec := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
		code, _, stderr := runCLI(t, "", append(args, "--trace")...)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		m := regexp.MustCompile(`trace_id=([0-9a-f]{32})`).FindStringSubmatch(stderr)
		if m == nil {
			t.Fatalf("stderr %q names no trace_id", stderr)
		}
		spans := invokeSpans(rec, 1)
		if len(spans) != 1 || spans[0].SpanContext().TraceID().String() != m[1] || !spans[0].Parent().IsRemote() {
			t.Fatalf("the node traced %d call spans; want one in trace %s below the caller's span", len(spans), m[1])
		}
	})
	t.Run("TRACEPARENT is continued as it is, and nothing is printed", func(t *testing.T) {
		rec := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
		t.Setenv("TRACEPARENT", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		code, _, stderr := runCLI(t, "", args...)
		if code != exitOK || strings.Contains(stderr, "trace_id") {
			t.Fatalf("exit %d, stderr %q; want 0 and no trace_id", code, stderr)
		}
		spans := invokeSpans(rec, 1)
		if len(spans) != 1 || spans[0].SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || spans[0].Parent().SpanID().String() != "00f067aa0ba902b7" {
			t.Fatalf("the node traced %d call spans; want one in trace 4bf92f35… below span 00f067aa0ba902b7", len(spans))
		}
	})
	t.Run("without a context nothing is sent and the node's sampler decides", func(t *testing.T) {
		rec := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
		if code, _, stderr := runCLI(t, "", args...); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		time.Sleep(50 * time.Millisecond) // what a traced call's span takes, several times over
		if spans := invokeSpans(rec, 0); len(spans) != 0 {
			t.Fatalf("the node traced %d call spans with a sampler that takes only sampled parents; want none", len(spans))
		}
	})
	t.Run("a malformed OTEL variable is a usage error naming it", func(t *testing.T) {
		t.Setenv("OTEL_TRACES_SAMPLER", "sometimes")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		code, _, stderr := runCLI(t, "", args...)
		if code != exitUsage || !strings.Contains(stderr, `OTEL_TRACES_SAMPLER="sometimes"`) {
			t.Fatalf("exit %d, stderr %q; want a usage error naming OTEL_TRACES_SAMPLER", code, stderr)
		}
	})
}
