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

	obs  chan protocol.Observation
	done chan struct{}
	once sync.Once

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
	// The buffer holds every observation the run may send (the limit is
	// enforced before sending), so the reader never blocks on a consumer.
	return &Run{ID: id, obs: make(chan protocol.Observation, max(limit, 1)), done: make(chan struct{})}
}

// finish ends the run once: with its terminal observation, or with err
// (ErrRunCancelled, ErrClosed or a *Fault). Called under the Process mutex.
func (r *Run) finish(terminal *protocol.Observation, err error) {
	r.once.Do(func() {
		if terminal != nil {
			r.terminal = *terminal
			r.obs <- *terminal
		}
		r.err = err
		if r.timer != nil {
			r.timer.Stop()
		}
		close(r.obs)
		close(r.done)
	})
}

// Observations delivers every observation of the run, the terminal one
// last, and is closed when the run ends. Its raw observation bytes are the
// provider's, validated, never re-encoded.
func (r *Run) Observations() <-chan protocol.Observation { return r.obs }

// Done is closed when the run has ended.
func (r *Run) Done() <-chan struct{} { return r.done }

// Result is the run's terminal observation, or the error that ended it:
// ErrRunCancelled, ErrClosed (the process was closed or stopped) or the
// *Fault that killed the process. Valid once Done is closed.
func (r *Run) Result() (protocol.Observation, error) {
	<-r.done
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
