package procexec

import (
	"context"
	"fmt"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// Load sends load (binding the verified digest, the module's contracts and
// the admitted capabilities) and waits for loaded, the durable group record
// and the re-hash of the executable. It is bounded by ctx and the process's
// lifetime.
func (p *Process) Load(ctx context.Context) (*protocol.Loaded, error) {
	c := p.contracts
	req := &protocol.LoadRequest{
		LifecycleContract: c.Load, DefinitionContract: c.Definition, ProviderContract: c.Provider,
		ConsumerContract: c.Consumer, ObservationSchema: c.Observation,
		ArtifactSHA256: p.plan.ArtifactSHA256(), AdmittedCapabilities: p.plan.AdmittedCapabilities(),
	}
	if req.AdmittedCapabilities == nil {
		req.AdmittedCapabilities = []string{}
	}
	resp, err := p.exchange(ctx, req, p.Budget().Lifetime, nil)
	if err != nil {
		return nil, err
	}
	for _, ch := range []chan struct{}{p.verified, p.recorded} {
		select {
		case <-ch:
		case <-p.done:
			return nil, p.deadErr()
		case <-ctx.Done():
			return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(protocol.OpLoad), Detail: "the caller gave up: " + ctx.Err().Error(), Err: ctx.Err()})
		}
	}
	if err := p.Err(); err != nil {
		<-p.done
		return nil, err
	}
	return resp.Payload.(*protocol.Loaded), nil
}

// Start starts a run: it validates input (strict JSON, at most 512 KiB),
// sends start with the plan's candidate digest and the module's consumer
// contract, and returns once the provider answered started. deadline bounds
// the run until its terminal observation; it may not exceed the manifest's
// runtime_deadline_ms (KindInvalidRequest) nor the remaining lifetime
// (KindBudgetExhausted, which kills: renew before).
func (p *Process) Start(ctx context.Context, runID string, input jsontext.Value, deadline time.Duration) (*Run, error) {
	payload, err := protocol.NewPayload(input)
	if err != nil {
		if pe, ok := err.(*protocol.Error); ok && pe.Pointer == "" {
			pe.Pointer = "/payload/input"
		}
		return nil, &Fault{Kind: KindInvalidRequest, Op: string(protocol.OpStart), Reason: invalidReason(err), Detail: "request refused before writing: " + err.Error(), Err: err}
	}
	return p.StartPayload(ctx, runID, payload, deadline)
}

// StartPayload is Start for an input checked already (by the gateway, once
// per call): it is written as it is, not checked again.
func (p *Process) StartPayload(ctx context.Context, runID string, input protocol.Payload, deadline time.Duration) (*Run, error) {
	op := string(protocol.OpStart)
	ms := deadline.Milliseconds()
	if ms <= 0 || deadline > p.plan.RuntimeDeadline() {
		return nil, &Fault{Kind: KindInvalidRequest, Op: op, Reason: reasons.SchemaMismatch, Detail: fmt.Sprintf("run deadline %v must be in (0, %v] (runtime_deadline_ms)", deadline, p.plan.RuntimeDeadline())}
	}
	if left := p.Budget().Lifetime; deadline > left && !p.isDying() {
		return nil, p.kill(&Fault{Kind: KindBudgetExhausted, Op: op, Detail: fmt.Sprintf("run deadline %v exceeds the %v of lifetime left", deadline, left)})
	}
	req := &protocol.StartRequest{
		LifecycleContract: p.contracts.Start, RunID: runID, CandidateSHA256: p.plan.CandidateSHA256(),
		InputSchema: p.contracts.Consumer, DeadlineMs: uint64(ms),
	}
	req.SetInput(input)
	run := newRun(runID, p.limits.Observations)
	if _, err := p.exchange(ctx, req, deadline, run); err != nil {
		return nil, err
	}
	return run, nil
}

// Cancel asks the provider to cancel run runID and waits for cancelled,
// bounded by cancellation_deadline_ms. If the run was still active it ends
// with ErrRunCancelled. Cancelling a finished run is answered too.
func (p *Process) Cancel(ctx context.Context, runID, reason string) error {
	req := &protocol.CancelRequest{LifecycleContract: p.contracts.Cancel, RunID: runID, Reason: reason}
	_, err := p.exchange(ctx, req, p.plan.CancellationDeadline(), nil)
	return err
}

// Snapshot asks for the state at lineage generation and returns it, its
// digest recomputed and checked against the claim.
func (p *Process) Snapshot(ctx context.Context, generation uint64, deadline time.Duration) (protocol.State, error) {
	req := &protocol.SnapshotRequest{LifecycleContract: p.contracts.Snapshot, RunID: protocol.LineageRunID(p.plan.Module()),
		Generation: generation, StateSchema: p.contracts.Snapshot, DeadlineMs: deadlineMs(deadline)}
	resp, err := p.exchange(ctx, req, deadline, nil)
	if err != nil {
		return protocol.State{}, err
	}
	return resp.Payload.(*protocol.Snapshotted).State, nil
}

// Migrate asks this (new) provider to convert source, typically another
// implementation's snapshot, to lineage source.Generation+1. The result
// carries this implementation's ID; its digest is recomputed and checked.
func (p *Process) Migrate(ctx context.Context, source protocol.State, deadline time.Duration) (protocol.State, error) {
	req := &protocol.MigrateRequest{LifecycleContract: p.contracts.Migrate, Source: source,
		TargetGeneration: source.Generation + 1, DeadlineMs: deadlineMs(deadline)}
	resp, err := p.exchange(ctx, req, deadline, nil)
	if err != nil {
		return protocol.State{}, err
	}
	return resp.Payload.(*protocol.Migrated).State, nil
}

// Restore imports state (this implementation's, digest checked before it is
// sent) and checks that the answer repeats its identity.
func (p *Process) Restore(ctx context.Context, state protocol.State, deadline time.Duration) (*protocol.Restored, error) {
	req := &protocol.RestoreRequest{LifecycleContract: p.contracts.Restore, State: state, DeadlineMs: deadlineMs(deadline)}
	resp, err := p.exchange(ctx, req, deadline, nil)
	if err != nil {
		return nil, err
	}
	return resp.Payload.(*protocol.Restored), nil
}

// Readiness asks the provider to prove it holds the state with stateSHA256
// at lineage generation.
func (p *Process) Readiness(ctx context.Context, generation uint64, stateSHA256 string, deadline time.Duration) (*protocol.Ready, error) {
	req := &protocol.ReadinessRequest{LifecycleContract: p.contracts.Readiness, RunID: protocol.LineageRunID(p.plan.Module()),
		Generation: generation, StateSchema: p.contracts.Snapshot, StateSHA256: stateSHA256, DeadlineMs: deadlineMs(deadline)}
	resp, err := p.exchange(ctx, req, deadline, nil)
	if err != nil {
		return nil, err
	}
	return resp.Payload.(*protocol.Ready), nil
}

func deadlineMs(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(d.Milliseconds())
}
