package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/tracing"
)

// invokeTrace is the W3C trace context invoke sends with its call, so that
// the node's gateway continues the caller's trace (docs/tracing.md):
//   - with the OTEL_* variables set, invoke traces itself: its own client
//     span, exported like the manager's, is the call's parent;
//   - TRACEPARENT in the environment (a script inside a traced job) is the
//     parent otherwise, as it is;
//   - --trace starts a new sampled trace when there is no parent, and
//     prints its ID on stderr, so that an operator can look the call up.
//
// Without any of these nothing is sent, and the node's own sampler decides.
type invokeTrace struct {
	ctx  context.Context
	span trace.Span
	stop func(context.Context) error
}

// startInvokeTrace returns ctx carrying the context to send in the call's
// metadata. A malformed OTEL_* value is an error naming the variable.
func startInvokeTrace(ctx context.Context, forced bool, stderr io.Writer) (*invokeTrace, error) {
	settings, err := tracing.ReadSettings(os.Getenv)
	if err != nil {
		return nil, err
	}
	t := &invokeTrace{ctx: ctx, stop: func(context.Context) error { return nil }}
	if settings.On {
		if t.stop, err = tracing.FromEnvironment(ctx, "kubectl-iteron"); err != nil {
			return nil, err
		}
	}
	parent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": os.Getenv("TRACEPARENT"), "tracestate": os.Getenv("TRACESTATE")}))
	sc := parent
	switch {
	case settings.On:
		var c context.Context
		c, t.span = tracing.Tracer().Start(tracing.WithRemoteParent(ctx, parent), "kubectl-iteron invoke",
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(tracing.KindKey.String(tracing.KindCall)))
		sc = trace.SpanContextFromContext(c)
	case !sc.IsValid() && forced:
		var tid trace.TraceID
		var sid trace.SpanID
		rand.Read(tid[:])
		rand.Read(sid[:])
		sc = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	}
	if forced && sc.IsValid() {
		fmt.Fprintf(stderr, "trace_id=%s\n", sc.TraceID())
	}
	t.ctx = tracing.ToOutgoing(ctx, sc)
	return t, nil
}

// end ends invoke's own span (with the call's error) and flushes it.
func (t *invokeTrace) end(err error) {
	if t.span != nil {
		if err != nil {
			tracing.Fail(t.span, "error", err.Error())
		}
		t.span.End()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t.stop(ctx) //nolint:errcheck // a trace that cannot be flushed does not fail the call
}
