// Package tracing is the manager's OpenTelemetry tracing: configured by the
// standard OTEL_* environment variables (FromEnvironment), off when none
// asks for it, and cheap enough to leave in every path when off (Enabled is
// one atomic load; nothing is allocated).
//
// What is traced (docs/tracing.md): a transaction is a trace with a span per
// ledger phase, always sampled; a call through the gateway is a span,
// continuing the caller's W3C trace context, with its queueing, its run and
// the survivor hop below it; an ActivationSet's rollout is a trace of its
// waves whose node spans the node transactions link to.
package tracing

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every span the operator makes.
const ScopeName = "iteron.dev/operator"

// KindKey is the attribute every root span of the operator carries at its
// start, naming what it traces; the sampler reads it (Sampler).
const KindKey = attribute.Key("iteron.span")

// The values of KindKey.
const (
	// KindTransaction is a node transaction's root span: always sampled.
	KindTransaction = "transaction"
	// KindRollout is an ActivationSet rollout's root span: always sampled.
	KindRollout = "rollout"
	// KindCall is a call's span: sampled by the configured call sampler.
	KindCall = "call"
)

// Attribute keys the operator's spans carry.
const (
	ModuleKey        = attribute.Key("iteron.module")
	GenerationKey    = attribute.Key("iteron.generation")
	LineageKey       = attribute.Key("iteron.lineage")
	TransactionKey   = attribute.Key("iteron.transaction")
	KindOfTxnKey     = attribute.Key("iteron.transaction.kind")
	PhaseKey         = attribute.Key("iteron.phase")
	LedgerSeqKey     = attribute.Key("iteron.ledger.sequence")
	LedgerHashKey    = attribute.Key("iteron.ledger.record_sha256")
	ReasonKey        = attribute.Key("iteron.reason")
	OutcomeKey       = attribute.Key("iteron.outcome")
	InvocationKey    = attribute.Key("iteron.invocation")
	ActivationKey    = attribute.Key("iteron.activation")
	ActivationSetKey = attribute.Key("iteron.activationset")
	RevisionKey      = attribute.Key("iteron.revision")
	WaveKey          = attribute.Key("iteron.wave")
	NodeKey          = attribute.Key("iteron.node")
)

// current is the installed tracer; nil while tracing is off. last is the
// tracer installed last, kept after it is uninstalled: a call planned
// while tracing was on has its spans made with it (Later) even when
// tracing went off before they were.
var current, last atomic.Pointer[installed]

type installed struct {
	tracer  trace.Tracer
	sampler sdktrace.Sampler
}

// Install makes tp the process's tracer provider and turns tracing on; the
// returned function turns it off again (tests and benchmarks use it to
// compare; the manager calls FromEnvironment once). sampler is tp's own:
// a call's spans are decided with it as the call arrives and made after
// it is answered (PlanCall). tp must generate IDs with IDGenerator.
func Install(tp trace.TracerProvider, sampler sdktrace.Sampler) (uninstall func()) {
	in := &installed{tracer: tp.Tracer(ScopeName), sampler: sampler}
	current.Store(in)
	last.Store(in)
	return func() { current.CompareAndSwap(in, nil) }
}

// Enabled reports whether tracing is on. Every traced path checks it first,
// so that tracing off costs one atomic load and no allocation.
func Enabled() bool { return current.Load() != nil }

// Tracer is the installed tracer, or a no-op one while tracing is off.
func Tracer() trace.Tracer {
	if in := current.Load(); in != nil {
		return in.tracer
	}
	return noopTracer
}

// Propagator carries a span's context across a process boundary: the W3C
// trace context (traceparent, tracestate) and baggage.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Fail marks span failed with the reason code and its message.
func Fail(span trace.Span, reason, message string) {
	span.SetAttributes(ReasonKey.String(reason))
	span.SetStatus(codes.Error, reason+": "+message)
}

// LogValues are the key-value pairs a log line inside a traced operation
// carries (trace_id, span_id); none when sc is not valid.
func LogValues(sc trace.SpanContext) []any {
	if !sc.IsValid() {
		return nil
	}
	return []any{"trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String()}
}

// WithRemoteParent returns ctx carrying sc as its (remote) parent span, for
// starting a span below one known only by its context.
func WithRemoteParent(ctx context.Context, sc trace.SpanContext) context.Context {
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
