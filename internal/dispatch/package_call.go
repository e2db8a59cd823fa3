package dispatch

import (
	"context"
	"time"

	quixospb "iteron.dev/operator/api/quixos/quixos"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/pkg/protocol"
)

// PackageCall is what a call to a package runtime carries besides its
// input: the caller's choices and the namespace its grant names.
type PackageCall struct {
	// InvocationID, when set, is the runtime's invocation ID for the call
	// (unique per runtime process); empty: the run ID.
	InvocationID string
	// Export is one of the runtime's export IDs; empty: its only export.
	Export string
	// ObjectID is the object the call is about, or "".
	ObjectID string
	// Dependencies are the caller's injected dependencies.
	Dependencies []*quixospb.InjectedDependency
	// SessionID is the caller's session, or "".
	SessionID string
	// Namespace is the caller's namespace (SO_PEERCRED → namespace): the
	// grant the runtime can check names it.
	Namespace string
}

// RuntimeOnlyField names the first field of the call that only a package
// runtime can take ("" when none): a line-protocol provider must refuse it
// rather than drop it.
func (c *PackageCall) RuntimeOnlyField() string {
	switch {
	case c == nil:
		return ""
	case c.Export != "":
		return "export"
	case c.ObjectID != "":
		return "object_id"
	case len(c.Dependencies) > 0:
		return "dependencies"
	case c.SessionID != "":
		return "session_id"
	}
	return ""
}

// PackageBackend is what a package runtime's route offers besides runs:
// Watch streams, the runtime's own view of an invocation, and the process
// the route is bound to (a Watch moves when it changes).
type PackageBackend interface {
	// Watch opens a Watch on the runtime.
	Watch(ctx context.Context, call PackageCall, input protocol.Payload) (*pkgruntime.Watch, error)
	// Status is the runtime's state of an invocation (one of the five).
	Status(ctx context.Context, invocationID string) (string, error)
	// Cancel asks the runtime to cancel an invocation and returns its state.
	CancelInvocation(ctx context.Context, invocationID string) (string, error)
	// CancellationDeadline is the runtime's deadlines.cancel_ms: how long
	// a run it was asked to cancel has to end before the host ends it.
	CancellationDeadline() time.Duration
	// Exports are the runtime's export IDs.
	Exports() []string
	// Exited is closed once the runtime's process has exited.
	Exited() <-chan struct{}
	// Pid is the runtime's pid.
	Pid() int
}
