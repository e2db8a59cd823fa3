package gateway

import (
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/tracing"
)

// spanName names the call's span after its RPC.
func (inv *invocation) spanName() string {
	if inv.streaming {
		return "watch"
	}
	return "invoke"
}

// makeCallSpan hands the making of a call's span to tracing.Later, once
// the call was answered: planned as it arrived (continuing the caller's W3C
// trace context from the request's metadata, or a root sampled by the call
// sampler), ended with its outcome.
func makeCallSpan(inv *invocation) {
	inv.mu.Lock()
	started, generation, name := inv.started, inv.generation, inv.generationName
	failed, reason, message, finished := inv.err != nil, inv.reason, inv.message, inv.finished
	inv.mu.Unlock()
	planned, spanName := inv.trace, inv.spanName()
	activation, module, id := inv.namespace+"/"+inv.activation, inv.module, inv.id
	tracing.Later(func(m tracing.Maker) {
		span := m.Make(planned, spanName, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(tracing.ActivationKey.String(activation), tracing.ModuleKey.String(module), tracing.InvocationKey.String(id)))
		if started {
			span.SetAttributes(tracing.GenerationKey.String(name), tracing.LineageKey.Int64(generation))
		}
		if failed {
			tracing.Fail(span, reason, message)
		} else {
			span.SetStatus(codes.Ok, "")
		}
		span.End(trace.WithTimestamp(finished))
	})
}

// logValues are the trace and span IDs of the call, for its log lines.
func (inv *invocation) logValues() []any {
	return tracing.LogValues(inv.trace.SC)
}
