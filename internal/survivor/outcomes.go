package survivor

import (
	"sync"
	"time"
)

// The outcome table's bounds are the gateway's idempotency window: an
// acknowledged outcome is kept for OutcomeTTL after its run ended, and at
// most MaxOutcomes outcomes and MaxOutcomeBytes of terminal observations
// are kept, the oldest acknowledged first out. An outcome not acknowledged
// yet is never evicted by age or bytes: it is the only record of a run that
// ended while no manager listened. There is one active run per process at
// most, so unacknowledged outcomes are bounded by the processes that ran
// while the manager was away; past MaxOutcomes of them the oldest goes (and
// is logged).
const (
	OutcomeTTL      = 10 * time.Minute
	MaxOutcomes     = 8192
	MaxOutcomeBytes = 64 << 20
)

// outcomeOverhead is what an outcome costs besides its body, for the byte
// bound.
const outcomeOverhead = 512

// outcomeTable keeps one record per invocation, keyed by its invocation
// key (namespace and invocation ID: the gateway's key of it too); only runs
// that carry an invocation are recorded. runs maps the run ID the gateway
// gave the invocation to that key, for the run's end and its
// acknowledgement, which name the run.
type outcomeTable struct {
	now func() time.Time

	mu     sync.Mutex
	byKey  map[string]*Outcome
	runs   map[string]string
	acked  []*Outcome // acknowledged, in the order they were acknowledged
	bytes  int64
	active int
}

func newOutcomeTable(now func() time.Time) *outcomeTable {
	return &outcomeTable{now: now, byKey: map[string]*Outcome{}, runs: map[string]string{}}
}

// invocationKey is an invocation's key: its namespace and invocation ID.
func invocationKey(call *Invocation) string { return call.Namespace + "\x00" + call.InvocationID }

// begin records the run of an invocation in progress; it replaces the
// invocation's earlier record (a run of it that ended and was forgotten by
// the gateway, which then ran it again).
func (t *outcomeTable) begin(runID string, call *Invocation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byKey[invocationKey(call)]; ok {
		t.dropLocked(old)
	}
	o := &Outcome{RunID: runID, Call: call}
	t.byKey[invocationKey(call)] = o
	t.runs[runID] = invocationKey(call)
	t.active++
}

// end records the outcome of an invocation's run (unacknowledged) and
// returns a copy.
func (t *outcomeTable) end(runID string, call *Invocation, seq uint64, body []byte, err *wireError) (Outcome, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.byKey[invocationKey(call)]
	if ok && o.RunID != runID && !o.Done {
		// Another run of the invocation is in progress (the gateway
		// never runs one twice at once): that one keeps the record.
		return Outcome{RunID: runID, Call: call, Done: true, Sequence: seq, Body: body, Err: err, EndedNs: t.now().UnixNano()}, nil
	}
	if !ok || o.RunID != runID {
		// Its record went (it cannot while it runs): recorded anew.
		if ok {
			t.dropLocked(o)
		}
		o = &Outcome{RunID: runID, Call: call}
		t.byKey[invocationKey(call)] = o
		t.runs[runID] = invocationKey(call)
	} else if !o.Done {
		t.active--
	}
	o.Done, o.Sequence, o.Body, o.Err, o.EndedNs = true, seq, body, err, t.now().UnixNano()
	t.bytes += size(o)
	dropped := t.evictLocked()
	return *o, dropped
}

// ack marks outcomes received by the manager: from now on they age out.
func (t *outcomeTable) ack(runIDs []string) {
	if len(runIDs) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range runIDs {
		if o, ok := t.byKey[t.runs[id]]; ok && o.RunID == id && o.Done && !o.Acked {
			o.Acked = true
			t.acked = append(t.acked, o)
		}
	}
	t.evictLocked()
}

// list returns copies of every outcome (done or not), for a new manager.
func (t *outcomeTable) list() []Outcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.evictLocked()
	out := make([]Outcome, 0, len(t.byKey))
	for _, o := range t.byKey {
		out = append(out, *o)
	}
	return out
}

// counts reports (done and unacknowledged, done and acknowledged, active).
func (t *outcomeTable) counts() (unacked, acked, active int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, o := range t.byKey {
		switch {
		case !o.Done:
			active++
		case o.Acked:
			acked++
		default:
			unacked++
		}
	}
	return
}

func size(o *Outcome) int64 { return int64(outcomeOverhead + len(o.Body)) }

// evictLocked applies the bounds; it returns the run IDs of unacknowledged
// outcomes it had to drop (past MaxOutcomes of them).
func (t *outcomeTable) evictLocked() []string {
	cutoff := t.now().Add(-OutcomeTTL).UnixNano()
	for len(t.acked) > 0 {
		o := t.acked[0]
		if t.byKey[invocationKey(o.Call)] != o {
			t.acked = t.acked[1:] // replaced or dropped already
			continue
		}
		if o.EndedNs >= cutoff && len(t.byKey) <= MaxOutcomes && t.bytes <= MaxOutcomeBytes {
			break
		}
		t.acked = t.acked[1:]
		t.dropLocked(o)
	}
	var dropped []string
	for len(t.byKey) > MaxOutcomes {
		var oldest *Outcome
		for _, o := range t.byKey {
			if o.Done && !o.Acked && (oldest == nil || o.EndedNs < oldest.EndedNs) {
				oldest = o
			}
		}
		if oldest == nil {
			break
		}
		t.dropLocked(oldest)
		dropped = append(dropped, oldest.RunID)
	}
	return dropped
}

func (t *outcomeTable) dropLocked(o *Outcome) {
	if t.byKey[invocationKey(o.Call)] == o {
		delete(t.byKey, invocationKey(o.Call))
		delete(t.runs, o.RunID)
		if o.Done {
			t.bytes -= size(o)
		} else {
			t.active--
		}
	}
}
