package gateway

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/tracing"
)

// startCallSpan starts the span of a call through the gateway, continuing
// the caller's W3C trace context from the request's metadata (a root span,
// sampled by the call sampler, when the caller sent none).
func startCallSpan(ctx context.Context, inv *invocation, arrived time.Time) trace.Span {
	name := "invoke"
	if inv.streaming {
		name = "watch"
	}
	_, span := tracing.Tracer().Start(tracing.FromIncoming(ctx), name,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived),
		trace.WithAttributes(tracing.KindKey.String(tracing.KindCall),
			tracing.ActivationKey.String(inv.namespace+"/"+inv.activation), tracing.ModuleKey.String(inv.module),
			tracing.InvocationKey.String(inv.id)))
	return span
}

// endCallSpan ends the call's span with its outcome. Caller holds inv.mu.
func endCallSpan(inv *invocation) {
	if inv.started {
		inv.span.SetAttributes(tracing.GenerationKey.String(inv.generationName), tracing.LineageKey.Int64(inv.generation))
	}
	if inv.err != nil {
		tracing.Fail(inv.span, inv.reason, inv.message)
	} else {
		inv.span.SetStatus(codes.Ok, "")
	}
	inv.span.End()
}

// logValues are the trace and span IDs of the call, for its log lines.
func (inv *invocation) logValues() []any {
	if inv.span == nil {
		return nil
	}
	return tracing.LogValues(inv.span.SpanContext())
}
