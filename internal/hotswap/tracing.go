package hotswap

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/tracing"
)

// txnTrace is a transaction's trace (docs/tracing.md): a root span for the
// transaction and a span per ledger phase, each carrying the sequence and
// hash of the record it appended. nil while tracing is off: every method
// is then a no-op, so a transaction pays one atomic load for it.
type txnTrace struct {
	root  trace.Span
	phase trace.Span
	// ctx carries root: the quiesce hands it to the dispatcher, so that
	// calls that wait for the swap link to it.
	ctx context.Context
}

// startTxnTrace starts the transaction's root span (always sampled). It
// links to the rollout node span the activation's stamp carries, if any,
// and, when the transaction's source was pulled for it, opens with that
// pull.
func (a *activationRuntime) startTxnTrace(kind ledger.Kind, id string, gen *generationRuntime, d *Desired) *txnTrace {
	if !tracing.Enabled() {
		return nil
	}
	attrs := []attribute.KeyValue{
		tracing.KindKey.String(tracing.KindTransaction),
		tracing.KindOfTxnKey.String(kind.String()),
		tracing.TransactionKey.String(id),
		tracing.ActivationKey.String(a.key.Namespace + "/" + a.key.Name),
		tracing.ModuleKey.String(gen.module),
		tracing.GenerationKey.String(gen.name),
		tracing.LineageKey.Int64(gen.lineage),
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(attrs...), trace.WithNewRoot()}
	if d != nil && d.RolloutSpan.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: d.RolloutSpan}))
	}
	var pulled *PullTiming
	if f := a.c.cfg.Pulled; f != nil && kind != ledger.KindRetirement {
		if p, ok := f(gen.target.Plan); ok {
			pulled = &p
			opts = append(opts, trace.WithTimestamp(p.Start))
		}
	}
	ctx, root := tracing.Tracer().Start(context.Background(), "transaction "+kind.String(), opts...)
	if pulled != nil {
		_, span := tracing.Tracer().Start(ctx, "pull", trace.WithTimestamp(pulled.Start),
			trace.WithAttributes(attribute.String("iteron.source.digest", pulled.Digest)))
		span.End(trace.WithTimestamp(pulled.End))
	}
	return &txnTrace{root: root, ctx: ctx}
}

// PullTiming is when a source's artifact was pulled into the node's store.
type PullTiming struct {
	// Digest is the artifact's manifest digest.
	Digest string
	// Start and End bound the pull.
	Start, End time.Time
}

// startPhase opens the span of a phase about to run.
func (t *txnTrace) startPhase(name ledger.Phase) {
	if t == nil {
		return
	}
	_, t.phase = tracing.Tracer().Start(t.ctx, string(name), trace.WithAttributes(tracing.PhaseKey.String(string(name))))
}

// recorded closes the phase's span with the record it appended.
func (t *txnTrace) recorded(last ledger.Appended) {
	if t == nil || t.phase == nil {
		return
	}
	t.phase.SetAttributes(tracing.LedgerSeqKey.Int64(int64(last.Sequence)), tracing.LedgerHashKey.String(last.RecordSHA256))
	t.phase.End()
	t.phase = nil
}

// failed marks the phase's span (and the transaction) failed with the
// reason; the span ends with the blocked record (recorded) or, when none
// could be appended, here.
func (t *txnTrace) failed(pf *phaseFailure) {
	if t == nil {
		return
	}
	if t.phase == nil {
		t.startPhase(pf.phase)
	}
	tracing.Fail(t.phase, string(pf.code), pf.message)
	tracing.Fail(t.root, string(pf.code), "at "+string(pf.phase)+": "+pf.message)
	t.root.SetAttributes(tracing.PhaseKey.String(string(pf.phase)))
}

// endPhase ends an open phase span that appended no record.
func (t *txnTrace) endPhase() {
	if t == nil || t.phase == nil {
		return
	}
	t.phase.End()
	t.phase = nil
}

// end closes the transaction's span with its outcome.
func (t *txnTrace) end(outcome ledger.Outcome, last ledger.Appended) {
	if t == nil {
		return
	}
	t.endPhase()
	t.root.SetAttributes(tracing.OutcomeKey.String(string(outcome)),
		tracing.LedgerSeqKey.Int64(int64(last.Sequence)), tracing.LedgerHashKey.String(last.RecordSHA256))
	if outcome == ledger.OutcomeCommitted {
		t.root.SetStatus(codes.Ok, "")
	}
	t.root.End()
}

// logValues are the trace's key-values for a log line of the transaction.
func (t *txnTrace) logValues() []any {
	if t == nil {
		return nil
	}
	sc := t.root.SpanContext()
	if t.phase != nil {
		sc = t.phase.SpanContext()
	}
	return tracing.LogValues(sc)
}

// log is a log line of the transaction: with its trace and span IDs when
// traced.
func (r *txnRun) log(msg string, kv ...any) {
	r.a.log(msg, append(kv, r.trace.logValues()...)...)
}
