package providers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// Package runtimes (quixos.runtime.PackageRuntime servers) go through the
// same Generations, ledger and transactions as line-protocol providers. The
// host moves no state for them (the seed's service has no state
// operations), so their plans say protocol 1 and every version change is a
// cold replace: shadow-load (launch + handshake), quiesce, atomic switch,
// drain. Invokes queue in the module's dispatcher like any run; Watches are
// long-lived streams the gateway opens on the route's PackageBackend and
// moves to the next generation's runtime when the route changes.

// WithPackageRuntimes returns a Launcher that starts package-runtime plans
// with runtimes and every other plan with line. runtimes nil refuses
// package runtimes (activation_failed).
func WithPackageRuntimes(line Launcher, runtimes *pkgruntime.Launcher) Launcher {
	return func(ctx context.Context, req LaunchRequest) (Provider, error) {
		plan := req.Plan
		m, ok := plan.PackageRuntime()
		if !ok {
			return line(ctx, req)
		}
		if runtimes == nil {
			return nil, &dispatch.CallError{Code: reasons.ActivationFailed, Message: fmt.Sprintf("module %s is a package runtime and this manager launches none", plan.Module())}
		}
		pin := pkgruntime.Pin{
			Manifest: m, Admitted: plan.AdmittedCapabilities(), WorkspaceEpoch: req.Epoch,
			BindingDigest: plan.AuthoritySHA256(), Owner: req.Owner(),
			Sandbox: plan.Sandbox(), Scratch: req.Scratch(),
		}
		r, err := runtimes.Launch(ctx, pin, plan.ArtifactRoot())
		if err != nil {
			return nil, err
		}
		return &packageProvider{r: r, plan: plan, exports: m.ExportIDs}, nil
	}
}

// packageProvider adapts a launched, handshaken runtime to Provider and
// PackageBackend.
type packageProvider struct {
	r       *pkgruntime.Runtime
	plan    verifier.LaunchPlan
	exports []string
}

var (
	_ Provider                = (*packageProvider)(nil)
	_ dispatch.PackageBackend = (*packageProvider)(nil)
)

func (p *packageProvider) Pid() int                { return p.r.Pid() }
func (p *packageProvider) StartedAt() time.Time    { return p.r.StartedAt() }
func (p *packageProvider) Exited() <-chan struct{} { return p.r.Exited() }
func (p *packageProvider) Exports() []string       { return p.exports }

// CancellationDeadline is the manifest's deadlines.cancel_ms.
func (p *packageProvider) CancellationDeadline() time.Duration { return p.plan.CancellationDeadline() }

// SetRenewalMargin does nothing: a runtime has no lifetime budget to renew
// before.
func (p *packageProvider) SetRenewalMargin(time.Duration) {}

// Load does nothing: the handshake, the runtime's load, ran at launch.
func (p *packageProvider) Load(context.Context) error { return nil }

// Budget is unbounded: a package runtime has no per-process lifetime,
// stdin or state-operation bounds (its calls have their own deadlines).
func (p *packageProvider) Budget() Budget {
	return Budget{Lifetime: time.Duration(math.MaxInt64), StdinBytes: math.MaxInt64, StateOperations: math.MaxInt32}
}

// Fits always holds: nothing of the process runs out.
func (p *packageProvider) Fits(time.Duration, int) bool { return true }

func (p *packageProvider) StderrTail() (string, int64) { return string(p.r.StderrTail()), 0 }

// Stop asks the runtime to end (SIGTERM) and waits up to its cancel_ms,
// then kills its group; an error says it had to be killed or left pids.
func (p *packageProvider) Stop(ctx context.Context, reason string) error {
	grace := p.plan.CancellationDeadline()
	if dl, ok := ctx.Deadline(); ok {
		grace = max(min(grace, time.Until(dl)), time.Millisecond)
	}
	return teardownError(p.r.Stop(grace), true)
}

// Close kills the runtime's group and reaps it; idempotent.
func (p *packageProvider) Close() error { return teardownError(p.r.Kill(), false) }

func teardownError(t pkgruntime.Teardown, clean bool) error {
	if len(t.Unreaped) > 0 {
		return fmt.Errorf("pids %v of the runtime's group were still there at the kill deadline", t.Unreaped)
	}
	if clean && !t.Exit.Exited && t.Exit.Signal != syscall.SIGTERM {
		return fmt.Errorf("the runtime did not stop by itself within its cancel_ms: %s", t.Exit)
	}
	return nil
}

// call turns a dispatcher call into the runtime's.
func (p *packageProvider) call(pc dispatch.PackageCall, runID string, input protocol.Payload) (pkgruntime.Call, error) {
	export := pc.Export
	if export == "" {
		if len(p.exports) != 1 {
			return pkgruntime.Call{}, &dispatch.CallError{Code: reasons.SchemaMismatch, Message: fmt.Sprintf("export: module %s's runtime has the exports %v; the call must name one", p.plan.Module(), p.exports)}
		}
		export = p.exports[0]
	}
	m, _ := p.plan.PackageRuntime()
	in, err := pkgruntime.MapFromJSON(input.Raw(), int(m.Limits.MaxMessageBytes))
	if err != nil {
		return pkgruntime.Call{}, &dispatch.CallError{Code: reasons.SchemaMismatch, Message: "input_json: " + err.Error(), Err: err}
	}
	id := pc.InvocationID
	if id == "" {
		id = runID
	}
	return pkgruntime.Call{InvocationID: id, Export: export, ObjectID: pc.ObjectID, Input: in, Dependencies: pc.Dependencies,
		Namespace: pc.Namespace, SessionID: pc.SessionID}, nil
}

// Run invokes the runtime. The terminal observation's body is the result's
// value as JSON, and Package holds the whole response (ok, error,
// dependencies). A failure keeps the runtime's reason code.
func (p *packageProvider) Run(ctx context.Context, req dispatch.RunRequest, observe func(dispatch.Observation)) (dispatch.Observation, error) {
	var pc dispatch.PackageCall
	if req.Package != nil {
		pc = *req.Package
	}
	call, err := p.call(pc, req.ID, req.Input)
	if err != nil {
		return dispatch.Observation{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, req.Deadline)
	defer cancel()
	// The runtime continues the call's trace (gRPC metadata).
	ctx = tracing.ToOutgoing(ctx, req.Span)
	resp, _, err := p.r.Conn().Invoke(ctx, call)
	if err != nil {
		return dispatch.Observation{}, runtimeCallError(err)
	}
	obs, err := observationOfResponse(resp)
	if err != nil {
		return dispatch.Observation{}, err
	}
	if observe != nil {
		observe(obs)
	}
	return obs, nil
}

// observationOfResponse renders an InvokeResponse as the run's terminal
// observation: the value as JSON in Body (null when absent).
func observationOfResponse(resp *runtimepb.InvokeResponse) (dispatch.Observation, error) {
	body := []byte("null")
	if resp.GetResult() != nil {
		b, err := pkgruntime.ValueToJSON(resp.GetResult())
		if err != nil {
			return dispatch.Observation{}, &dispatch.CallError{Code: reasons.ProviderFailed, Message: "invoke.value: " + err.Error(), Err: err}
		}
		body = b
	}
	return dispatch.Observation{Sequence: 1, Terminal: true, Body: body, Package: resp}, nil
}

// runtimeCallError keeps a runtime failure's reason code for the caller.
func runtimeCallError(err error) error {
	var pe *pkgruntime.Error
	if errors.As(err, &pe) {
		return &dispatch.CallError{Code: pe.Code, Message: pe.Message(), Err: err}
	}
	return err
}

// Cancel asks the runtime to cancel a run (CancelInvocation, within its
// cancel_ms).
func (p *packageProvider) Cancel(ctx context.Context, runID, reason string) error {
	_, err := p.CancelInvocation(ctx, runID)
	return err
}

// CancelInvocation asks the runtime to cancel an invocation and returns
// the state it answers.
func (p *packageProvider) CancelInvocation(ctx context.Context, invocationID string) (string, error) {
	st, err := p.r.Conn().Cancel(ctx, invocationID)
	return st, runtimeCallError(err)
}

// Status is the runtime's state of an invocation.
func (p *packageProvider) Status(ctx context.Context, invocationID string) (string, error) {
	st, err := p.r.Conn().Status(ctx, invocationID)
	return st, runtimeCallError(err)
}

// Watch opens a Watch on the runtime; call.InvocationID is its watch ID.
func (p *packageProvider) Watch(ctx context.Context, pc dispatch.PackageCall, input protocol.Payload) (*pkgruntime.Watch, error) {
	call, err := p.call(pc, pc.InvocationID, input)
	if err != nil {
		return nil, err
	}
	w, err := p.r.Conn().Watch(ctx, call)
	if err != nil {
		return nil, runtimeCallError(err)
	}
	return w, nil
}
