package gateway

import (
	"encoding/hex"
	"errors"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/survivor"
)

// Invocations that survive the manager (docs/survivor.md): the survivor
// keeps the outcome of every run the gateway dispatched, under its
// invocation, until the manager acknowledges it and for the idempotency
// window after. A manager that starts seeds its table with them
// (Remember), and receives the outcomes of runs still in progress when they
// end (Outcome): a repeat of an invocation answered before the restart gets
// that answer (replayed), and a repeat of one still running waits for it.

// Remember seeds the invocation table with what the survivor kept: ended
// invocations with their outcome, running ones to wait for.
func (s *Server) Remember(outcomes []survivor.Outcome) (ended, running int) {
	for _, o := range outcomes {
		if s.record(o) {
			if o.Done {
				ended++
			} else {
				running++
			}
		}
	}
	return ended, running
}

// Outcome records the outcome of a run that ended while this manager was
// not told (it began under the previous one, or its answer was lost).
func (s *Server) Outcome(o survivor.Outcome) { s.record(o) }

// record adds or finishes the invocation of o; false when o names none.
func (s *Server) record(o survivor.Outcome) bool {
	s.recordMu.Lock()
	defer s.recordMu.Unlock()
	c := o.Call
	if c == nil || c.InvocationID == "" {
		return false
	}
	var fp [32]byte
	if b, err := hex.DecodeString(c.Fingerprint); err == nil && len(b) == len(fp) {
		copy(fp[:], b)
	}
	key := c.Namespace + "\x00" + c.InvocationID
	inv, known := s.table.lookup(key)
	if !known {
		inv = newInvocation()
		inv.namespace, inv.activation, inv.module = c.Namespace, c.Activation, c.Module
		inv.id, inv.key, inv.runID, inv.fingerprint = c.InvocationID, key, o.RunID, fp
		inv.started, inv.generation, inv.generationName = true, c.Generation, c.GenerationName
		inv.handle = &survivedCall{route: dispatch.Route{Lineage: c.Generation, Name: c.GenerationName}}
		got, existing, full := s.table.admit(inv)
		if full != nil {
			return false
		}
		if existing {
			inv = got
		}
	}
	if !o.Done || inv.runID != o.RunID {
		return true
	}
	select {
	case <-inv.done:
		return true // answered already
	default:
	}
	res := dispatch.Result{Lineage: c.Generation, Name: c.GenerationName,
		Terminal: dispatch.Observation{Sequence: o.Sequence, Terminal: true, Body: o.Body}}
	var err error
	if f := o.Failure(); f != nil {
		var ce *dispatch.CallError
		if !errors.As(f, &ce) {
			ce = &dispatch.CallError{Code: reasons.ProviderFailed, Message: f.Error(), Err: f}
		}
		err, res = ce, dispatch.Result{}
	}
	inv.mu.Lock()
	inv.result = res
	if err != nil {
		inv.reason, inv.message, inv.err = s.outcomeOf(inv, err)
	}
	inv.finished = s.cfg.Now()
	inv.size = int64(invocationOverhead + len(res.Terminal.Body) + len(inv.message))
	inv.mu.Unlock()
	close(inv.done)
	inv.signal()
	s.table.markEnded(inv)
	return true
}
