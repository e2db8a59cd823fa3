package dispatch

import (
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/tracing"
)

// A traced call (Call.Span sampled) gets spans below the caller's: "queue",
// from its submission to its dispatch (or its end, when it never ran),
// linked to the transaction it waited for; "run", from its dispatch to its
// end; and "survivor_hop" below the run, when its backend relays it
// through the survivor. They are planned on the call's path (the run's
// context goes to a package runtime) and made once the call was answered
// (tracing.Planned): an untraced call costs a bit test.

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

// runTrace is a traced run's plan.
type runTrace struct {
	run   tracing.Planned
	route Route
	hop   HopTimes
}

// makeQueueSpan hands tracing.Later the call's queueing span, from its
// submission to at; err is why it ended there (nil when it was
// dispatched).
func (p *pendingCall) makeQueueSpan(at time.Time, err error) {
	p.d.mu.Lock()
	swap := p.swap
	p.d.mu.Unlock()
	planned := tracing.PlanChild(p.call.Span, p.enqueued)
	tracing.Later(func(m tracing.Maker) {
		var opts []trace.SpanStartOption
		if swap.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: swap}))
		}
		endSpan(m.Make(planned, "queue", opts...), err, trace.WithTimestamp(at))
	})
}

// make hands tracing.Later the run's span, ended at end with err, and its
// hop's.
func (rt *runTrace) make(end time.Time, err error) {
	tracing.Later(func(m tracing.Maker) {
		span := m.Make(rt.run, "run", trace.WithAttributes(tracing.GenerationKey.String(rt.route.Name), tracing.LineageKey.Int64(rt.route.Lineage)))
		if !rt.hop.Start.IsZero() {
			m.Make(tracing.PlanChild(rt.run.SC, rt.hop.Start), "survivor_hop").End(trace.WithTimestamp(rt.hop.End))
		}
		endSpan(span, err, trace.WithTimestamp(end))
	})
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
