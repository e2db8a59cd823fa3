package providers

import (
	"context"
	"sync/atomic"
	"time"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/pkg/protocol"
)

// NewExecutorLauncher adapts the process executor to a Launcher: every
// provider is a procexec.Process started from its verified launch plan.
func NewExecutorLauncher(exec *procexec.Executor) Launcher {
	return func(ctx context.Context, req LaunchRequest) (Provider, error) {
		p, err := exec.LaunchIn(req.Plan, req.Scratch())
		if err != nil {
			return nil, err
		}
		return &processProvider{p: p}, nil
	}
}

// processProvider is a procexec.Process as a Provider.
type processProvider struct {
	p *procexec.Process
	runAllowance
}

// runAllowance is the dispatch bookkeeping both provider processes (own and
// survivor-held) keep: the renewal margin a run must leave and the runs
// started, from which Fits and the deadline a run is given follow.
type runAllowance struct {
	// margin is the renewal margin (swap deadline + quiesce timeout, at
	// most half the lifetime): a run is dispatched only if it fits the
	// remaining lifetime less this.
	margin atomic.Int64
	// runs counts the runs started on this process.
	runs atomic.Int64
}

// SetRenewalMargin sets the margin a run must leave before the process's
// end of life.
func (a *runAllowance) SetRenewalMargin(d time.Duration) { a.margin.Store(int64(d)) }

// fits is Backend.Fits for a process with budget b whose plan's lifetime is
// runtime.
func (a *runAllowance) fits(b procexec.Budget, runtime, deadline time.Duration, requestBytes int) bool {
	return fits(b, runtime, time.Duration(a.margin.Load()), a.runs.Load(), deadline, requestBytes)
}

// start counts a run and returns the deadline it is given: the call's,
// clamped to the plan's lifetime and to what the process has left before
// the renewal margin (at least a millisecond, so the executor decides).
func (a *runAllowance) start(b procexec.Budget, runtime, deadline time.Duration) time.Duration {
	a.runs.Add(1)
	return max(min(deadline, runtime, b.Lifetime-time.Duration(a.margin.Load())), time.Millisecond)
}

func (pp *processProvider) Pid() int             { return pp.p.Pid() }
func (pp *processProvider) StartedAt() time.Time { return pp.p.StartedAt() }
func (pp *processProvider) Exited() <-chan struct{} {
	return pp.p.Done()
}
func (pp *processProvider) Close() error { return pp.p.Close() }
func (pp *processProvider) StderrTail() (string, int64) {
	return string(pp.p.StderrTail()), pp.p.StderrDropped()
}

func (pp *processProvider) Load(ctx context.Context) error {
	_, err := pp.p.Load(ctx)
	return err
}

func (pp *processProvider) Budget() Budget {
	b := pp.p.Budget()
	return Budget{Lifetime: b.Lifetime, StdinBytes: b.StdinBytes, StateOperations: b.StateOperations}
}

func (pp *processProvider) Fits(deadline time.Duration, requestBytes int) bool {
	return pp.runAllowance.fits(pp.p.Budget(), pp.p.Plan().RuntimeDeadline(), deadline, requestBytes)
}

// fits is the dispatch rule of every provider (Backend.Fits): whether a run
// with deadline and requestBytes of run ID and input can complete in a
// process with budget b (of a plan whose lifetime is runtime), leaving the
// renewal margin and what a renewal needs of its stdin; runs is the number
// of runs the process started.
func fits(b procexec.Budget, runtime, margin time.Duration, runs int64, deadline time.Duration, requestBytes int) bool {
	// The start request must leave the stdin a renewal needs (its snapshot
	// and cancel requests); otherwise the process would refuse the run.
	stdinLeft := b.StdinBytes - int64(requestBytes) - StartRequestOverhead
	if stdinLeft < RenewalStdinReserve {
		return false
	}
	// A run is given at most what a freshly renewed process could give it:
	// its lifetime less the margin and a tenth for the renewal itself. A
	// longer deadline would never fit any process and renew forever.
	d := min(deadline, runtime-margin-runtime/10)
	if b.Fits(d, margin) {
		return true
	}
	// A process that has not run anything yet is as fresh as a renewal
	// would make it: it takes the call, with the time it has left (Run
	// clamps the deadline), so each renewal serves at least one call.
	return runs == 0 && b.Lifetime > margin
}

func (pp *processProvider) Run(ctx context.Context, req dispatch.RunRequest, observe func(dispatch.Observation)) (dispatch.Observation, error) {
	deadline := pp.start(pp.p.Budget(), pp.p.Plan().RuntimeDeadline(), req.Deadline)
	run, err := pp.p.StartPayload(ctx, req.ID, req.Input, deadline)
	if err != nil {
		return dispatch.Observation{}, err
	}
	if observe != nil {
		// Only a caller that watches the run pays for its observation
		// channel (a run's limit can be thousands of slots).
		for o := range run.Observations() {
			observe(observationOf(o))
		}
	}
	terminal, err := run.Result()
	if err != nil {
		return dispatch.Observation{}, err
	}
	return observationOf(terminal), nil
}

func observationOf(o protocol.Observation) dispatch.Observation {
	return dispatch.Observation{Sequence: o.Sequence, Terminal: o.Terminal, Body: o.Observation}
}

func (pp *processProvider) Cancel(ctx context.Context, runID, reason string) error {
	return pp.p.Cancel(ctx, runID, reason)
}

func (pp *processProvider) Stop(ctx context.Context, reason string) error {
	return pp.p.Stop(ctx, reason)
}

// stateDeadline is what is left of the transaction for one state
// operation, within the protocol's 1..3,600,000 ms.
func stateDeadline(ctx context.Context) time.Duration {
	d := time.Hour
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	return max(d, time.Millisecond)
}

func (pp *processProvider) Snapshot(ctx context.Context, lineage int64) (State, error) {
	return pp.p.Snapshot(ctx, uint64(lineage), stateDeadline(ctx))
}

func (pp *processProvider) Migrate(ctx context.Context, from State) (State, error) {
	return pp.p.Migrate(ctx, from, stateDeadline(ctx))
}

func (pp *processProvider) Restore(ctx context.Context, st State) error {
	_, err := pp.p.Restore(ctx, st, stateDeadline(ctx))
	return err
}

func (pp *processProvider) Readiness(ctx context.Context, lineage int64, digest string) error {
	_, err := pp.p.Readiness(ctx, uint64(lineage), digest, stateDeadline(ctx))
	return err
}
