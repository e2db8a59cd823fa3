package procexec

import (
	"context"
	"sync"
	"time"

	"iteron.dev/operator/pkg/protocol"
)

// Run is one run of a provider, from start to its terminal observation, its
// cancellation, or the fault that ended it.
type Run struct {
	// ID is the run ID the host chose.
	ID string

	limit int // evidence_limits.observations
	done  chan struct{}

	// mu guards the delivery of observations. Until Observations is called
	// they are kept in pending (bounded by the run's limits); from then on
	// they go to ch, whose buffer holds every observation the run may still
	// send, so the reader never blocks on a consumer. A run nobody watches
	// allocates no channel.
	mu       sync.Mutex
	pending  []protocol.Observation
	ch       chan protocol.Observation
	ended    bool
	terminal protocol.Observation
	err      error

	// Guarded by the Process's mutex.
	deadline    time.Time
	timer       *time.Timer
	stdoutBytes int64
	count       int
	lastSeq     uint64
}

func newRun(id string, limit int) *Run {
	return &Run{ID: id, limit: max(limit, 1), done: make(chan struct{})}
}

// deliver hands one observation (the terminal one included) to the run's
// consumer. Called by the reader with the Process mutex held.
func (r *Run) deliver(o *protocol.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch != nil {
		r.ch <- *o // room for every observation left: never blocks
		return
	}
	r.pending = append(r.pending, *o)
}

// finish ends the run once: with its terminal observation, or with err
// (ErrRunCancelled, ErrClosed or a *Fault). Called with the Process mutex
// held.
func (r *Run) finish(terminal *protocol.Observation, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	if terminal != nil {
		r.terminal = *terminal
	}
	r.err = err
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.ch != nil {
		close(r.ch)
	}
	close(r.done)
}

// Observations delivers every observation of the run, the terminal one
// last, and is closed when the run ends. Its raw observation bytes are the
// provider's, validated, never re-encoded. The channel is made on the first
// call (with room for every observation the run may send: it never holds
// the provider back); a caller that only wants the outcome uses Result.
func (r *Run) Observations() <-chan protocol.Observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan protocol.Observation, len(r.pending)+max(r.limit-len(r.pending), 0)+1)
		for _, o := range r.pending {
			r.ch <- o
		}
		r.pending = nil
		if r.ended {
			close(r.ch)
		}
	}
	return r.ch
}

// Done is closed when the run has ended.
func (r *Run) Done() <-chan struct{} { return r.done }

// Result is the run's terminal observation, or the error that ended it:
// ErrRunCancelled, ErrClosed (the process was closed or stopped) or the
// *Fault that killed the process. It waits for the run to end.
func (r *Run) Result() (protocol.Observation, error) {
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.terminal, r.err
}

// Wait waits for the run to end (or ctx, which leaves the run running) and
// returns Result.
func (r *Run) Wait(ctx context.Context) (protocol.Observation, error) {
	select {
	case <-r.done:
		return r.Result()
	case <-ctx.Done():
		return protocol.Observation{}, ctx.Err()
	}
}

// StdoutBytes is the number of stdout bytes the run produced, from the
// start request to its end (what evidence_limits.stdout_bytes bounds).
// Valid once Done is closed.
func (r *Run) StdoutBytes() int64 {
	<-r.done
	return r.stdoutBytes
}

// Count is the number of observations the run produced. Valid once Done is
// closed.
func (r *Run) Count() int {
	<-r.done
	return r.count
}
