package providers

import (
	"context"
	"time"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// State is a module's state as it moves between generations (the
// protocol's State: the host recomputed its digest).
type State = protocol.State

// Provider is one provider process as the coordinator drives it. The
// executor's Process satisfies it through an adapter (see NewExecutorLauncher).
type Provider interface {
	dispatch.Backend
	// Pid is the process id.
	Pid() int
	// StartedAt is when the process started.
	StartedAt() time.Time
	// Load binds the verified artifact and contracts (the shadow_load phase).
	Load(ctx context.Context) error
	// Stop asks the process to exit and waits, escalating to killing its
	// group after the cancellation deadline; an error means it had to be
	// killed or did not exit cleanly.
	Stop(ctx context.Context, reason string) error
	// Close kills the group and reaps it; idempotent.
	Close() error
	// Exited is closed once the process has exited, for any reason.
	Exited() <-chan struct{}
	// StderrTail returns the newest stderr bytes and how many were dropped.
	StderrTail() (string, int64)
	// Budget is what remains of the process's per-process bounds.
	Budget() Budget
	// SetRenewalMargin sets the lifetime a run must leave unused (the swap
	// deadline plus the quiesce timeout: the time a renewal needs).
	SetRenewalMargin(time.Duration)
}

// StateHolder is a provider whose state the host moves between
// generations: a provider process, its own or survivor-held. A package
// runtime holds none the host can move, and is not one.
type StateHolder interface {
	// Snapshot exports the state of the given lineage.
	Snapshot(ctx context.Context, lineage int64) (State, error)
	// Migrate converts state to lineage from.Generation + 1.
	Migrate(ctx context.Context, from State) (State, error)
	// Restore imports state.
	Restore(ctx context.Context, st State) error
	// Readiness proves the process is ready for the restored state.
	Readiness(ctx context.Context, lineage int64, digest string) error
}

// Budget is what remains of a process's per-process bounds
// (docs/operations.md, renewals).
type Budget struct {
	// Lifetime is what remains of runtime_deadline_ms.
	Lifetime time.Duration
	// StdinBytes is what remains of the 8 MiB of stdin.
	StdinBytes int64
	// StateOperations is what remains of the 64 state operations.
	StateOperations int
}

// Ending reports a process that is exiting (or has exited): its executor
// reports no budget at all. Such a process is never renewed: its crash
// watch relaunches it.
func (b Budget) Ending() bool { return b == Budget{} }

// Launcher starts a provider process from a verified launch plan (not yet
// loaded).
type Launcher func(ctx context.Context, req LaunchRequest) (Provider, error)

// LaunchRequest is one launch as the engine asks for it: everything the
// launcher needs is a field here, nothing rides in the context.
type LaunchRequest struct {
	// Plan is the verified launch plan.
	Plan verifier.LaunchPlan
	// Tag says which activation, module, generation and transaction the
	// launch is for: a survivor keeps it with the process, and it names the
	// generation's scratch directory.
	Tag survivor.Tag
	// Epoch is the module's epoch at the generation (a package runtime's
	// workspace epoch).
	Epoch string
}

// Owner is the launch's owner as a package runtime names it
// ("<activation uid>/<module>").
func (r LaunchRequest) Owner() string { return r.Tag.ActivationUID + "/" + r.Tag.Module }

// Scratch is the scratch directory's name of the launch (one per
// activation and generation).
func (r LaunchRequest) Scratch() string { return survivor.ScratchKey(r.Tag) }

// The bounds of a process's budget a provider keeps in reserve
// (docs/operations.md, checkpoints and renewals).
const (
	// RenewalStdinReserve and RenewalStateOpsReserve: a process is renewed
	// before its stdin or state-operation budget falls below these (a frame
	// is at most 1 MiB; a renewal and a checkpoint each need a state
	// operation of the old process).
	RenewalStdinReserve    = 2 << 20
	RenewalStateOpsReserve = 4
	// StartRequestOverhead bounds a start request's bytes besides its run
	// ID and input (contract references, candidate digest, deadline).
	StartRequestOverhead = 4 << 10
)

// StateOf is p's state operations, or the failure of a transaction that
// asked a provider holding no state for them.
func StateOf(p Provider) (StateHolder, error) {
	if sh, ok := p.(StateHolder); ok {
		return sh, nil
	}
	return nil, &dispatch.CallError{Code: reasons.UnsupportedVersion, Message: "a package runtime holds no state the host can move"}
}
