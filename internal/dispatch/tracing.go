package dispatch

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/tracing"
)

// A traced call (Call.Span sampled) gets two spans below the caller's:
// "queue", from its submission to its dispatch (or its end, when it never
// ran), linked to the transaction it waited for; and "run", from its
// dispatch to its end, below which a backend puts what it does for the run
// (RunRequest.Span). Both are made only when tracing is on and the call is
// sampled: an untraced call costs a bit test.

// pauseForLocked notes the transaction (sc, from the quiesce's context) that
// paused dispatching: the calls queued now, and those queued until the
// dispatcher resumes, waited for it. Caller holds d.mu.
func (d *Dispatcher) pauseForLocked(sc trace.SpanContext) {
	if !sc.IsValid() {
		return
	}
	d.pausedBy = sc
	for _, q := range d.queue {
		if !q.swap.IsValid() {
			q.swap = sc
		}
	}
}

// traceQueue records the call's queueing, from its submission to at; err
// is why it ended there (nil when it was dispatched).
func (p *pendingCall) traceQueue(at time.Time, err error) {
	opts := []trace.SpanStartOption{trace.WithTimestamp(p.enqueued), trace.WithAttributes(tracing.ModuleKey.String(p.d.module))}
	p.d.mu.Lock()
	swap := p.swap
	p.d.mu.Unlock()
	if swap.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: swap}))
	}
	_, span := tracing.Tracer().Start(tracing.WithRemoteParent(context.Background(), p.call.Span), "queue", opts...)
	if err != nil {
		endSpan(span, err, trace.WithTimestamp(at))
		return
	}
	span.End(trace.WithTimestamp(at))
}

// traceRun records the queueing that ended at started and opens the run's
// span.
func (p *pendingCall) traceRun(started time.Time, route Route) trace.Span {
	p.traceQueue(started, nil)
	_, span := tracing.Tracer().Start(tracing.WithRemoteParent(context.Background(), p.call.Span), "run",
		trace.WithTimestamp(started),
		trace.WithAttributes(tracing.ModuleKey.String(p.d.module), tracing.GenerationKey.String(route.Name), tracing.LineageKey.Int64(route.Lineage)))
	return span
}

// endSpan ends span, failed with err's reason code when err is not nil.
func endSpan(span trace.Span, err error, opts ...trace.SpanEndOption) {
	if err != nil {
		var ce *CallError
		if errors.As(err, &ce) {
			tracing.Fail(span, ce.Code, ce.Message)
		} else {
			tracing.Fail(span, "error", err.Error())
		}
	}
	span.End(opts...)
}
