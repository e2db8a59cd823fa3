package fleet

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/tracing"
)

// The outcomes a rollout's spans end with (tracing.OutcomeKey): a node's
// or a rollout's phase otherwise.
const (
	outcomeReady      = "Ready"
	outcomeStalled    = "Stalled"
	outcomeSuperseded = "Superseded"
	outcomeRemoved    = "Removed"
	outcomeDeleted    = "Deleted"
)

// RolloutTraces are the open spans of the sets' rollouts: a rollout is a
// trace, per set and revision, whose root span "rollout" (always sampled:
// tracing.KindRollout) has a span "wave N" per wave and, below its wave, a
// span "node X" per node stamped. A node's span starts with its first
// stamp at the revision and its W3C context goes into that stamp
// (Action.Traceparent), so that the node's transactions link to it; it
// ends when the set sees the activation Ready on that revision, or Stalled
// (failed, with the condition's reason).
//
// A rollout lasts many reconciles, so the reconciler keeps its spans here
// between them. They live only in this process's memory: when the manager
// restarts (or another replica takes the lead) the spans still open are
// lost, never exported (a span is exported when it ends), and the nodes
// stamped before go on untraced; the next stamp starts a new trace.
// Nothing is persisted on purpose: a span cannot be resumed by another
// process, and the annotation a node carries is a link for its
// transactions, not state to rebuild a span from.
//
// Safe for concurrent use; the zero value is ready. While tracing is off
// Stamp and Observe return at once and allocate nothing.
type RolloutTraces struct {
	mu sync.Mutex
	// sets are the traced sets by key; a set deleted and created again
	// under its name is told apart by its UID.
	sets map[types.NamespacedName]*setTraces
}

// setTraces are one set's open rollouts.
type setTraces struct {
	uid types.UID
	// rollouts by revision hash: a revert or nodes created on the stable
	// revision are a trace of their own while a rollout is under way.
	rollouts map[string]*rolloutTrace
}

type rolloutTrace struct {
	root  trace.Span
	ctx   context.Context // carries root
	waves map[int32]*waveTrace
	nodes map[string]*nodeTrace // by node name
	// last is the latest wave started: the waves before it take no more
	// nodes, so they end once their nodes did.
	last int32
}

type waveTrace struct {
	span trace.Span
	ctx  context.Context // carries span
	open int
	// ended is when its last node's span ended (zero while one is open):
	// the wave's end, given to it once no more nodes can join it (a later
	// wave started, the rollout ended), so a wave whose nodes move in
	// batches is one span.
	ended time.Time
}

type nodeTrace struct {
	span        trace.Span
	wave        int32
	traceparent string
}

// Stamp gives each action that stamps an activation (Create, Move,
// Restore) the traceparent of its node's span, starting the rollout's,
// the wave's and the node's spans at the node's first stamp at that
// revision; a stamp decided again (after a write conflict, or a hand edit
// set back) keeps the node's span, and a node stamped at another revision
// ends the span it had (superseded). The reconciler calls it with the
// plan's actions before writing them, after Observe.
func (t *RolloutTraces) Stamp(set *iteronv1.ActivationSet, actions []Action, now time.Time) {
	if t == nil || !tracing.Enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var st *setTraces
	for i := range actions {
		a := &actions[i]
		if !stamps(a) {
			continue
		}
		if st == nil {
			st = t.setOf(set, now)
		}
		for hash, r := range st.rollouts {
			if hash != a.Revision.Hash {
				r.endNode(a.Node, now, outcomeSuperseded, nil)
			}
		}
		r := st.rollouts[a.Revision.Hash]
		if r == nil {
			r = startRollout(set, a.Revision, now)
			st.rollouts[a.Revision.Hash] = r
		}
		n := r.nodes[a.Node]
		if n != nil && n.wave != a.Wave {
			r.endNode(a.Node, now, outcomeSuperseded, nil)
			n = nil
		}
		if n == nil {
			n = r.startNode(set, a, now)
		}
		a.Traceparent = n.traceparent
	}
}

// Observe ends what one reconcile's view shows over, given Compute's input
// and plan: the span of a node whose activation is Ready on the span's
// revision, Stalled there (failed with the condition's reason), on another
// revision or gone; a wave once its nodes ended and a later wave started;
// and a rollout when it completed, when it stopped (a halt: failed with
// its cause, once none of its nodes is in flight), when the trace of the
// stable revision (a revert, nodes created on it) came to rest, or when a
// newer template superseded it.
func (t *RolloutTraces) Observe(in *Input, plan *Plan) {
	if t == nil || !tracing.Enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	key := types.NamespacedName{Namespace: in.Set.Namespace, Name: in.Set.Name}
	st := t.sets[key]
	if st == nil {
		return
	}
	now := in.Now
	if st.uid != in.Set.UID {
		st.end(now, outcomeDeleted)
		delete(t.sets, key)
		return
	}
	stamped := map[string]string{} // node → the revision hash a stamp of this plan writes
	for i := range plan.Actions {
		if a := &plan.Actions[i]; stamps(a) {
			stamped[a.Node] = a.Revision.Hash
		}
	}
	acts := map[string]*Activation{}
	for i := range in.Activations {
		if a := &in.Activations[i]; a.Owned {
			if prior, ok := acts[a.Node]; !ok || prior.Deleting {
				acts[a.Node] = a
			}
		}
	}
	update, current := in.Update.Hash, ""
	if r, ok := in.Revisions[plan.Status.CurrentRevision]; ok {
		current = r.Hash
	}
	phase := plan.Status.Phase
	for hash, r := range st.rollouts {
		for node := range r.nodes {
			if stamped[node] == hash {
				continue // stamped again: still in flight
			}
			a := acts[node]
			switch {
			case a == nil:
				r.endNode(node, now, outcomeRemoved, nil)
			case a.Revision != hash:
				r.endNode(node, now, outcomeSuperseded, nil)
			case a.Deleting:
				// Not done: it is stamped again once its finalizer let
				// it go.
			case a.Stalled != nil:
				r.endNode(node, now, outcomeStalled, a.Stalled)
			case a.Ready:
				r.endNode(node, now, outcomeReady, nil)
			}
		}
		switch h := plan.Status.Halt; {
		case hash == update && phase == iteronv1.RolloutCompleted:
			r.end(now, string(phase), nil)
		case hash == update && h != nil && h.Revision == in.Update.Name:
			if len(r.nodes) > 0 {
				r.endWaves(now, false)
				continue // its nodes in flight end first
			}
			reason := string(h.Cause)
			if reason == "" {
				reason = iteronv1.ReasonRolloutHalted
			}
			r.end(now, string(phase), &metav1.Condition{Reason: reason, Message: h.Message})
		case hash != update && hash != current:
			r.end(now, outcomeSuperseded, nil)
		case hash != update && AtRest(phase) && len(r.nodes) == 0:
			var failed *metav1.Condition
			if phase == iteronv1.RolloutRevertFailed {
				failed = &metav1.Condition{Reason: iteronv1.ReasonRevertFailed, Message: plan.Message}
			}
			r.end(now, string(phase), failed)
		default:
			r.endWaves(now, false)
			continue
		}
		delete(st.rollouts, hash)
	}
	if len(st.rollouts) == 0 {
		delete(t.sets, key)
	}
}

// Forget ends every span of a set being deleted or gone: its rollouts end
// there.
func (t *RolloutTraces) Forget(key types.NamespacedName, now time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.sets[key]; st != nil {
		st.end(now, outcomeDeleted)
		delete(t.sets, key)
	}
}

// setOf is the set's entry, made when missing; a set created again under
// the name of one traced before ends that one's spans.
func (t *RolloutTraces) setOf(set *iteronv1.ActivationSet, now time.Time) *setTraces {
	key := types.NamespacedName{Namespace: set.Namespace, Name: set.Name}
	st := t.sets[key]
	if st != nil && st.uid != set.UID {
		st.end(now, outcomeDeleted)
		st = nil
	}
	if st == nil {
		if t.sets == nil {
			t.sets = map[types.NamespacedName]*setTraces{}
		}
		st = &setTraces{uid: set.UID, rollouts: map[string]*rolloutTrace{}}
		t.sets[key] = st
	}
	return st
}

func (st *setTraces) end(now time.Time, outcome string) {
	for _, r := range st.rollouts {
		r.end(now, outcome, nil)
	}
	st.rollouts = nil
}

// stamps reports whether an action stamps an activation from a revision.
func stamps(a *Action) bool {
	return (a.Kind == Create || a.Kind == Move || a.Kind == Restore) && a.Revision != nil
}

func startRollout(set *iteronv1.ActivationSet, rev *Revision, now time.Time) *rolloutTrace {
	ctx, root := tracing.Tracer().Start(context.Background(), "rollout", trace.WithNewRoot(), trace.WithTimestamp(now),
		trace.WithAttributes(
			tracing.KindKey.String(tracing.KindRollout),
			tracing.ActivationSetKey.String(set.Namespace+"/"+set.Name),
			tracing.RevisionKey.String(rev.Name),
		))
	return &rolloutTrace{root: root, ctx: ctx, waves: map[int32]*waveTrace{}, nodes: map[string]*nodeTrace{}}
}

func (r *rolloutTrace) startNode(set *iteronv1.ActivationSet, a *Action, now time.Time) *nodeTrace {
	w := r.waves[a.Wave]
	if w == nil {
		ctx, span := tracing.Tracer().Start(r.ctx, "wave "+strconv.Itoa(int(a.Wave)), trace.WithTimestamp(now),
			trace.WithAttributes(tracing.WaveKey.Int(int(a.Wave))))
		w = &waveTrace{span: span, ctx: ctx}
		r.waves[a.Wave] = w
		if a.Wave > r.last {
			r.last = a.Wave
			r.endWaves(now, false)
		}
	}
	w.open++
	w.ended = time.Time{}
	_, span := tracing.Tracer().Start(w.ctx, "node "+a.Node, trace.WithTimestamp(now),
		trace.WithAttributes(
			tracing.NodeKey.String(a.Node),
			tracing.ActivationKey.String(set.Namespace+"/"+a.Activation),
			tracing.WaveKey.Int(int(a.Wave)),
		))
	n := &nodeTrace{span: span, wave: a.Wave, traceparent: traceparent(span.SpanContext())}
	r.nodes[a.Node] = n
	return n
}

// endNode ends node's span, if it has one here; failed marks it failed
// with the condition's reason and message.
func (r *rolloutTrace) endNode(node string, now time.Time, outcome string, failed *metav1.Condition) {
	n := r.nodes[node]
	if n == nil {
		return
	}
	delete(r.nodes, node)
	n.span.SetAttributes(tracing.OutcomeKey.String(outcome))
	if failed != nil {
		tracing.Fail(n.span, failed.Reason, failed.Message)
	}
	n.span.End(trace.WithTimestamp(now))
	if w := r.waves[n.wave]; w != nil {
		if w.open--; w.open == 0 {
			w.ended = now
		}
	}
}

// endWaves ends the waves whose nodes all ended and that no node joins any
// more (those before the latest), or, with all, every wave, at the end of
// its last node (now for one still open).
func (r *rolloutTrace) endWaves(now time.Time, all bool) {
	for wave, w := range r.waves {
		if !all && (w.open > 0 || wave >= r.last) {
			continue
		}
		end := w.ended
		if w.open > 0 || end.IsZero() {
			end = now
		}
		w.span.End(trace.WithTimestamp(end))
		delete(r.waves, wave)
	}
}

// end ends the rollout: the nodes still open (with the rollout's outcome),
// the waves, then the root; failed marks the root failed.
func (r *rolloutTrace) end(now time.Time, outcome string, failed *metav1.Condition) {
	for node := range r.nodes {
		r.endNode(node, now, outcome, nil)
	}
	r.endWaves(now, true)
	r.root.SetAttributes(tracing.OutcomeKey.String(outcome))
	if failed != nil {
		tracing.Fail(r.root, failed.Reason, failed.Message)
	}
	r.root.End(trace.WithTimestamp(now))
}

// traceparent is sc as a W3C traceparent header value ("" when sc is not
// valid): what a stamp writes as iteron.dev/traceparent.
func traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	tracing.Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c.Get("traceparent")
}
