package gateway

import (
	"sync"

	"iteron.dev/operator/internal/survivor"
)

// OutcomeRelay hands a survivor client's outcomes (its OnOutcome) to the
// gateway. An outcome that arrives before the gateway exists (a run that
// ends between the attachment's listing, which named it running, and the
// gateway's start) is held for it, not dropped: the survivor counts an
// outcome delivered once it is handed over, and a retry of that
// invocation would wait for an end that never comes.
type OutcomeRelay struct {
	mu sync.Mutex
	// hold is whether outcomes are kept until a gateway starts (false:
	// this manager serves no gateway).
	hold bool
	to   outcomeSink
	held []survivor.Outcome
}

// outcomeSink is what the relay feeds: a Server's invocation table.
type outcomeSink interface {
	Remember(listed []survivor.Outcome) (ended, running int)
	Outcome(survivor.Outcome)
}

// NewOutcomeRelay returns a relay that holds outcomes until Start when
// hold is set, and drops them until then otherwise.
func NewOutcomeRelay(hold bool) *OutcomeRelay { return &OutcomeRelay{hold: hold} }

// Deliver passes o to the gateway, or holds it until one starts.
func (r *OutcomeRelay) Deliver(o survivor.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.to != nil:
		r.to.Outcome(o)
	case r.hold:
		r.held = append(r.held, o)
	}
}

// Start seeds s with the invocations the attachment listed, then with the
// outcomes held since, and passes every later one to it.
func (r *OutcomeRelay) Start(s *Server, listed []survivor.Outcome) (ended, running int) {
	return r.start(s, listed)
}

func (r *OutcomeRelay) start(to outcomeSink, listed []survivor.Outcome) (ended, running int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ended, running = to.Remember(listed)
	for _, o := range r.held {
		to.Outcome(o)
	}
	r.to, r.held = to, nil
	return ended, running
}
