package procexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/activation"
	"iteron.dev/operator/pkg/protocol"
)

// Process is one running provider. It exposes the protocol's operations and
// nothing that activates, promotes, widens capabilities or chooses fallback.
//
// One request is outstanding at a time (calls are serialized); a run, once
// started, proceeds while other requests (cancel, or stop) are made. Every
// fault but KindRefused and KindInvalidRequest kills the process group
// before the call returns: a call that returns a killing fault returns after
// the group is gone. Close is idempotent and safe from any goroutine in any
// state.
type Process struct {
	ex          *Executor
	plan        activation.LaunchPlan
	version     protocol.Version
	contracts   protocol.ModuleContracts
	limits      activation.EvidenceLimits
	group       group
	interpreter string
	startedAt   time.Time

	pidfd  *os.File
	stdin  *os.File
	stdout *os.File
	stderr *os.File
	errs   *ring

	reqMu sync.Mutex // serializes requests
	wbuf  []byte     // the request frame buffer, reused (guarded by reqMu)

	mu         sync.Mutex
	nextID     uint64
	pending    *pending
	run        *Run
	loaded     bool
	stopping   bool // "stopped" answered: exit and EOF are expected
	dying      bool // teardown started
	stdinBytes int64
	stateOps   int
	fault      *Fault

	exited   chan struct{} // the leader exited (not yet reaped)
	exit     Exit
	verified chan struct{} // the re-hash after start finished
	recorded chan struct{} // the durable record is written (or failed)
	record   string
	recErr   error

	stdoutDone, stderrDone, watchDone chan struct{}
	lifetime                          *time.Timer

	teardownOnce sync.Once
	done         chan struct{}
	report       TeardownReport
}

type pending struct {
	req   *protocol.Request
	reply chan *protocol.Response
}

// TeardownReport says how a process ended; valid once Done is closed.
type TeardownReport struct {
	// Exit is how the leader ended.
	Exit Exit
	// LeftBehind are members of the group still alive when the leader had
	// exited after a stop (they were killed).
	LeftBehind []int
	// Unreaped are pids of the group still present when KillTimeout ran out
	// (a process stuck in uninterruptible sleep); empty in any normal case.
	Unreaped []int
	// Duration is from the start of the teardown (the fault, Close or the
	// end of a stop) until the group was reaped and the pipes closed.
	Duration time.Duration
	// Reaped is the part of Duration until the leader was reaped (the
	// group is gone); the rest is draining stdout and stderr.
	Reaped time.Duration
}

func newProcess(e *Executor, plan activation.LaunchPlan, v protocol.Version, g group, pidfd, stdin, stdout, stderr *os.File, interpreter string) *Process {
	return &Process{
		ex: e, plan: plan, version: v, contracts: plan.Contracts(), limits: plan.EvidenceLimits(),
		group: g, interpreter: interpreter, startedAt: time.Now(),
		pidfd: pidfd, stdin: stdin, stdout: stdout, stderr: stderr, errs: newRing(plan.EvidenceLimits().StderrBytes),
		exited: make(chan struct{}), verified: make(chan struct{}), recorded: make(chan struct{}),
		stdoutDone: make(chan struct{}), stderrDone: make(chan struct{}), watchDone: make(chan struct{}), done: make(chan struct{}),
	}
}

func (p *Process) start() {
	p.lifetime = time.AfterFunc(p.plan.RuntimeDeadline(), func() {
		p.fail(&Fault{Kind: KindBudgetExhausted, Op: OpLifetime, Detail: fmt.Sprintf("the process reached its lifetime of %v (runtime_deadline_ms)", p.plan.RuntimeDeadline())})
	})
	go p.readStdout()
	go p.readStderr()
	go p.watchExit()
	go func() {
		defer close(p.verified)
		if beforeRehash != nil {
			beforeRehash(p)
		}
		if err := rehash(p.plan.Executable(), p.plan.ArtifactSHA256()); err != nil {
			p.fail(&Fault{Kind: KindTampered, Op: OpVerify, Reason: ReasonVerificationFailed, Detail: "the artifact changed after verification: " + err.Error(), Err: err})
		}
	}()
	go func() {
		defer close(p.recorded)
		r := Record{PID: p.group.pid, PGID: p.group.pgid, StartTime: p.group.startTime, BootID: bootID(), UID: p.group.uid,
			Module: p.plan.Module(), ImplementationID: p.plan.ImplementationID(), ArtifactSHA256: p.plan.ArtifactSHA256()}
		p.record, p.recErr = writeRecord(p.ex.cfg.RecordDir, r)
		if p.recErr != nil {
			p.fail(&Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "writing the group record: " + p.recErr.Error(), Err: errors.Join(errNotRecorded, p.recErr)})
		}
	}()
}

// Pid is the provider's (the group leader's) pid.
func (p *Process) Pid() int { return p.group.pid }

// Pgid is the provider's process group.
func (p *Process) Pgid() int { return p.group.pgid }

// StartTime is the leader's start time in clock ticks since boot (with Pid,
// the process's identity).
func (p *Process) StartTime() uint64 { return p.group.startTime }

// StartedAt is when the process was spawned.
func (p *Process) StartedAt() time.Time { return p.startedAt }

// Interpreter is the #! interpreter the provider runs under, "" for a binary.
func (p *Process) Interpreter() string { return p.interpreter }

// Plan is the launch plan the process was started from.
func (p *Process) Plan() activation.LaunchPlan { return p.plan }

// Version is the protocol version the process speaks.
func (p *Process) Version() protocol.Version { return p.version }

// Done is closed when the process is gone: its group killed and reaped, its
// pipes closed, its record removed.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the fault that killed the process, or nil while it lives and when
// the host stopped or closed it.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == nil {
		return nil
	}
	return p.fault
}

// Teardown reports how the process ended; valid once Done is closed.
func (p *Process) Teardown() TeardownReport {
	<-p.done
	return p.report
}

// StderrTail is a copy of the newest stderr bytes kept (at most
// evidence_limits.stderr_bytes).
func (p *Process) StderrTail() []byte { return p.errs.Tail() }

// StderrDropped is the number of stderr bytes written but no longer kept.
func (p *Process) StderrDropped() int64 { return p.errs.Dropped() }

// Budget is what remains of the process's per-process bounds.
type Budget struct {
	// Lifetime is what remains of runtime_deadline_ms since the spawn.
	Lifetime time.Duration
	// StdinBytes is what remains of the 8 MiB of stdin.
	StdinBytes int64
	// StateOperations is what remains of the 64 state operations.
	StateOperations int
}

// Fits reports whether a run with deadline, plus margin (the coordinator's
// renewal margin: swap deadline + quiesce timeout), fits the remaining
// lifetime.
func (b Budget) Fits(deadline, margin time.Duration) bool {
	return deadline > 0 && deadline+margin <= b.Lifetime
}

// Budget returns the remaining budget (zero once the process is dead).
func (p *Process) Budget() Budget {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dying {
		return Budget{}
	}
	return Budget{
		Lifetime:        max(0, p.plan.RuntimeDeadline()-time.Since(p.startedAt)),
		StdinBytes:      protocol.MaxStdinBytes - p.stdinBytes,
		StateOperations: protocol.MaxStateOperations - p.stateOps,
	}
}

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
	op := string(protocol.OpStart)
	ms := deadline.Milliseconds()
	if ms <= 0 || deadline > p.plan.RuntimeDeadline() {
		return nil, &Fault{Kind: KindInvalidRequest, Op: op, Reason: ReasonSchemaMismatch, Detail: fmt.Sprintf("run deadline %v must be in (0, %v] (runtime_deadline_ms)", deadline, p.plan.RuntimeDeadline())}
	}
	if left := p.Budget().Lifetime; deadline > left && !p.isDying() {
		return nil, p.kill(&Fault{Kind: KindBudgetExhausted, Op: op, Detail: fmt.Sprintf("run deadline %v exceeds the %v of lifetime left", deadline, left)})
	}
	req := &protocol.StartRequest{
		LifecycleContract: p.contracts.Start, RunID: runID, CandidateSHA256: p.plan.CandidateSHA256(),
		InputSchema: p.contracts.Consumer, Input: input, DeadlineMs: uint64(ms),
	}
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

// Stop asks the provider to stop, waits for stopped and then for the process
// to exit, all within cancellation_deadline_ms, then kills and reaps the
// group (anything left in it is reported in Teardown().LeftBehind). It
// returns nil for a clean stop (exit status 0 in time), a KindTimeout fault
// when the provider had to be killed, KindExited for a non-zero exit. The
// process is gone when Stop returns, whatever it returns. An active run ends
// with ErrRunCancelled.
func (p *Process) Stop(ctx context.Context, reason string) error {
	deadline := time.Now().Add(p.plan.CancellationDeadline())
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req := &protocol.StopRequest{LifecycleContract: p.contracts.Stop, Reason: reason}
	if _, err := p.exchange(ctx, req, time.Until(deadline), nil); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil
		}
		return err
	}
	select {
	case <-p.exited:
		p.beginTeardown(nil, true)
	case <-p.done:
	case <-time.After(time.Until(deadline)):
		p.beginTeardown(&Fault{Kind: KindTimeout, Op: string(protocol.OpStop), Detail: fmt.Sprintf("answered stopped but did not exit within %v", p.plan.CancellationDeadline())}, false)
	case <-ctx.Done():
		p.beginTeardown(&Fault{Kind: KindTimeout, Op: string(protocol.OpStop), Detail: "the caller gave up waiting for the exit: " + ctx.Err().Error(), Err: ctx.Err()}, false)
	}
	<-p.done
	return p.Err()
}

// Close kills the process group (if it lives), reaps it, closes the pipes
// and removes the record. It is idempotent and safe from any goroutine in
// any state; it returns once the process is gone. An active run ends with
// ErrClosed.
func (p *Process) Close() error {
	p.beginTeardown(nil, false)
	<-p.done
	return nil
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

func (p *Process) isDying() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dying
}

// refuse checks, under p.mu, that op may be sent now.
func (p *Process) refuse(op protocol.Operation) error {
	if p.dying {
		return errDead
	}
	switch {
	case !op.SupportedBy(p.version):
		return &Fault{Kind: KindRefused, Op: string(op), Reason: ReasonUnsupportedVersion, Detail: fmt.Sprintf("%s is a state operation; a protocol-%d provider gets none", op, int(p.version))}
	case !p.loaded && op != protocol.OpLoad && op != protocol.OpStop:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: fmt.Sprintf("%s before load", op)}
	case p.loaded && op == protocol.OpLoad:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: "the provider is already loaded"}
	case op == protocol.OpStart && p.run != nil:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: fmt.Sprintf("run %q is active: one run at a time", p.run.ID)}
	case op.IsStateOperation() && p.run != nil:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: fmt.Sprintf("run %q is active: quiesce before %s", p.run.ID, op)}
	}
	return nil
}

var errDead = errors.New("dead")

// beforeRehash, when set by a test, runs before the re-hash after start.
var beforeRehash func(*Process)

// deadErr is what a request to a dead process returns: its fault, or
// ErrClosed.
func (p *Process) deadErr() error {
	<-p.done
	if err := p.Err(); err != nil {
		return err
	}
	return ErrClosed
}

// exchange writes one request and waits for its correlated response. The
// response has been correlated (and its states' digests recomputed) by the
// reader; a failed result, a timeout or the caller giving up kill the group.
// run, for a start, becomes the active run as the request is written.
func (p *Process) exchange(ctx context.Context, payload protocol.RequestPayload, timeout time.Duration, run *Run) (*protocol.Response, error) {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	op := payload.Operation()
	p.mu.Lock()
	if err := p.refuse(op); err != nil {
		p.mu.Unlock()
		if err == errDead {
			return nil, p.deadErr()
		}
		return nil, err
	}
	p.nextID++
	req := &protocol.Request{
		Envelope: protocol.Envelope{Protocol: p.version.String(), RequestID: "host-" + strconv.FormatUint(p.nextID, 10),
			ImplementationID: p.plan.ImplementationID(), Module: p.plan.Module()},
		Payload: payload,
	}
	p.mu.Unlock()

	if err := req.Validate(p.version, &p.contracts); err != nil {
		return nil, &Fault{Kind: KindInvalidRequest, Op: string(op), Reason: invalidReason(err), Detail: "request refused before writing: " + err.Error(), Err: err}
	}
	// Encode into the process's buffer (requests are serialized by reqMu):
	// a 500 KiB input is not copied into a fresh allocation every time.
	line, err := protocol.AppendRequest(p.wbuf[:0], req)
	if err == nil && len(line) > protocol.MaxFrameBytes {
		err = fmt.Errorf("frame of %d bytes exceeds %d", len(line), protocol.MaxFrameBytes)
	}
	if err != nil {
		return nil, &Fault{Kind: KindInvalidRequest, Op: string(op), Reason: invalidReason(err), Detail: "request refused before writing: " + err.Error(), Err: err}
	}
	line = append(line, '\n')
	p.wbuf = line

	p.mu.Lock()
	if p.dying {
		p.mu.Unlock()
		return nil, p.deadErr()
	}
	if p.stdinBytes+int64(len(line)) > protocol.MaxStdinBytes {
		left := protocol.MaxStdinBytes - p.stdinBytes
		p.mu.Unlock()
		return nil, p.kill(&Fault{Kind: KindBudgetExhausted, Op: string(op), Detail: fmt.Sprintf("a %d-byte request exceeds the %d bytes of stdin left (8 MiB per process)", len(line), left)})
	}
	if op.IsStateOperation() {
		if p.stateOps >= protocol.MaxStateOperations {
			p.mu.Unlock()
			return nil, p.kill(&Fault{Kind: KindBudgetExhausted, Op: string(op), Detail: fmt.Sprintf("the process has had its %d state operations", protocol.MaxStateOperations)})
		}
		p.stateOps++
	}
	p.stdinBytes += int64(len(line))
	pend := &pending{req: req, reply: make(chan *protocol.Response, 1)}
	p.pending = pend
	if run != nil {
		run.deadline = time.Now().Add(timeout)
		p.run = run
	}
	p.mu.Unlock()

	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p.stdin.SetWriteDeadline(deadline)
	if trace := p.ex.cfg.Trace; trace != nil {
		trace(true, line[:len(line)-1])
	}
	if _, err := p.stdin.Write(line); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(op), Detail: fmt.Sprintf("the provider did not read the request within %v", timeout), Err: err})
		}
		if p.isDying() {
			return nil, p.deadErr()
		}
		return nil, p.kill(&Fault{Kind: KindExited, Op: string(op), Detail: "writing the request: " + err.Error(), Err: err})
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case resp := <-pend.reply:
		if run != nil {
			p.armRun(run)
		}
		return resp, nil
	case <-p.done:
		select {
		case resp := <-pend.reply:
			return resp, nil // answered, then died: the answer stands
		default:
		}
		return nil, p.deadErr()
	case <-timer.C:
		return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(op), Detail: fmt.Sprintf("no %s response within %v", op.Success(), timeout)})
	case <-ctx.Done():
		return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(op), Detail: "the caller gave up waiting for the response: " + ctx.Err().Error(), Err: ctx.Err()})
	}
}

func invalidReason(err error) string {
	if protocol.KindOf(err) == protocol.ErrMismatch {
		return ReasonVerificationFailed
	}
	return ReasonSchemaMismatch
}

// armRun starts the run's deadline timer once the provider has answered
// started.
func (p *Process) armRun(run *Run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.run != run {
		return // already over
	}
	run.timer = time.AfterFunc(time.Until(run.deadline), func() {
		p.mu.Lock()
		active := p.run == run
		p.mu.Unlock()
		if active {
			p.fail(&Fault{Kind: KindTimeout, Op: OpRun, Detail: fmt.Sprintf("run %q: no terminal observation within its deadline", run.ID)})
		}
	})
}

// kill reports f (if it is the first fault) and returns once the process is
// gone, with the fault that killed it.
func (p *Process) kill(f *Fault) error {
	p.fail(f)
	<-p.done
	return p.Err()
}

// fail records the first fault and starts the teardown.
func (p *Process) fail(f *Fault) {
	if f.At.IsZero() {
		f.At = time.Now()
	}
	p.beginTeardown(f, false)
}

// beginTeardown starts the teardown once: f is the fault (nil for Close or a
// clean stop); graceful means the leader exited after stop.
func (p *Process) beginTeardown(f *Fault, graceful bool) {
	p.mu.Lock()
	if p.dying {
		p.mu.Unlock()
		return
	}
	p.dying = true
	if f != nil {
		p.fault = f
	}
	p.mu.Unlock()
	p.teardownOnce.Do(func() { go p.teardown(graceful) })
}

// teardown kills the group before anything reaps the leader, reaps
// everything, drains and closes the pipes, removes the record, and ends the
// pending request and the active run.
func (p *Process) teardown(graceful bool) {
	t0 := time.Now()
	p.mu.Lock()
	if p.fault != nil && !p.fault.At.IsZero() {
		t0 = p.fault.At
	}
	p.mu.Unlock()
	p.lifetime.Stop()
	p.stdin.Close()

	var rep TeardownReport
	if graceful {
		// The leader exited after stop: whatever is left of its group was
		// left behind.
		if members, err := groupMembers(p.group.pgid); err == nil {
			for _, m := range members {
				if m.pid != p.group.pid && m.state != 'Z' {
					rep.LeftBehind = append(rep.LeftBehind, m.pid)
				}
			}
		}
	}
	// The leader is not reaped (only this goroutine reaps it, below), so
	// the pgid still names this group: kill it.
	syscall.Kill(-p.group.pgid, syscall.SIGKILL)
	killDeadline := time.Now().Add(p.ex.cfg.KillTimeout)
	select {
	case <-p.exited:
	case <-time.After(p.ex.cfg.KillTimeout):
	}
	rep.Unreaped = sweepGroup(p.group.pgid, p.group.pid, killDeadline)
	select {
	case <-p.exited:
		var info siginfo
		p.control(func(fd int) { waitid(unix.P_PIDFD, fd, &info, unix.WEXITED) })
		rep.Exit = exitOf(&info)
	default:
		rep.Unreaped = append(rep.Unreaped, p.group.pid)
	}
	rep.Reaped = time.Since(t0)
	if len(rep.Unreaped) == 0 {
		unregisterGroup(p.group)
	}
	kickReaper() // descendants that left the group are re-parented now

	// Drain the pipes: they close when the last holder dies; a descendant
	// that left the group may hold them, so the wait is bounded.
	drain := time.NewTimer(p.ex.cfg.WaitDelay)
	for _, ch := range []chan struct{}{p.stdoutDone, p.stderrDone} {
		select {
		case <-ch:
		case <-drain.C:
		}
	}
	drain.Stop()
	p.stdout.Close()
	p.stderr.Close()
	<-p.stdoutDone
	<-p.stderrDone
	select {
	case <-p.watchDone:
	case <-time.After(p.ex.cfg.KillTimeout):
		// Only a leader that never exited (Unreaped) keeps the watcher.
	}
	p.pidfd.Close()

	<-p.recorded
	<-p.verified
	if p.record != "" && len(rep.Unreaped) == 0 {
		os.Remove(p.record)
	}
	rep.Duration = time.Since(t0)

	p.mu.Lock()
	p.exit = rep.Exit
	if graceful && p.fault == nil && !rep.Exit.Success() {
		p.fault = &Fault{Kind: KindExited, Op: string(protocol.OpStop), Detail: "after stop: " + rep.Exit.String(), At: time.Now()}
	}
	if p.fault != nil && p.fault.Kind == KindExited && p.fault.Op != string(protocol.OpStop) {
		p.fault.Detail += " (" + rep.Exit.String() + ")"
	}
	runErr := error(ErrClosed)
	if p.fault != nil {
		runErr = p.fault
	} else if graceful {
		runErr = ErrRunCancelled
	}
	run := p.run
	p.run = nil
	p.pending = nil
	p.report = rep
	p.mu.Unlock()
	p.ex.forget(p)
	close(p.done)
	// The run ends after Done: whoever learns of the fault from the run
	// finds the group already gone.
	if run != nil {
		p.mu.Lock()
		run.finish(nil, runErr)
		p.mu.Unlock()
	}
}

// control runs fn with the pidfd.
func (p *Process) control(fn func(fd int)) {
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { fn(int(fd)) })
}

// watchExit waits (without reaping) for the leader to exit. An exit nobody
// asked for is a fault at once, even while idle.
func (p *Process) watchExit() {
	defer close(p.watchDone)
	rc, err := p.pidfd.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool {
			var info siginfo
			werr := waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG)
			if werr == syscall.EAGAIN {
				return false
			}
			if werr != nil {
				return true
			}
			if info.Pid == 0 {
				return false
			}
			p.mu.Lock()
			p.exit = exitOf(&info)
			p.mu.Unlock()
			return true
		})
	}
	close(p.exited)
	// The provider may have written frames just before it exited (a
	// "stopped" answer among them): let the reader get to them, and to the
	// end of stdout, before judging the exit.
	select {
	case <-p.stdoutDone:
	case <-time.After(p.ex.cfg.WaitDelay):
	}
	p.mu.Lock()
	expected := p.stopping || p.dying
	exit := p.exit
	p.mu.Unlock()
	if !expected {
		p.fail(&Fault{Kind: KindExited, Op: p.currentOp(), Detail: "the provider exited: " + exit.String()})
	}
}

// currentOp names what the process was doing, for faults found by the
// reader and the exit watcher.
func (p *Process) currentOp() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pending != nil:
		return string(p.pending.req.Payload.Operation())
	case p.run != nil:
		return OpRun
	default:
		return OpIdle
	}
}

func (p *Process) readStderr() {
	defer close(p.stderrDone)
	io.CopyBuffer(p.errs, p.stderr, make([]byte, 32<<10))
}

// readStdout reads frames until EOF or the first fault.
func (p *Process) readStdout() {
	defer close(p.stdoutDone)
	lr := protocol.NewLineReader(p.stdout, protocol.MaxFrameBytes)
	for {
		line, err := lr.Next()
		if err != nil {
			p.mu.Lock()
			expected := p.stopping || p.dying
			p.mu.Unlock()
			switch {
			case expected:
			case errors.Is(err, io.EOF):
				p.fail(&Fault{Kind: KindExited, Op: p.currentOp(), Detail: "the provider closed stdout"})
			case protocol.KindOf(err) == protocol.ErrTooLarge:
				p.fail(&Fault{Kind: KindOversized, Op: p.currentOp(), Detail: err.Error(), Err: err})
			case protocol.KindOf(err) == protocol.ErrMalformed:
				p.fail(&Fault{Kind: KindMalformedFrame, Op: p.currentOp(), Detail: err.Error(), Err: err})
			case errors.Is(err, os.ErrClosed):
			default:
				p.fail(&Fault{Kind: KindExited, Op: p.currentOp(), Detail: "reading stdout: " + err.Error(), Err: err})
			}
			return
		}
		if trace := p.ex.cfg.Trace; trace != nil {
			trace(false, line)
		}
		if f := p.handleLine(line); f != nil {
			if f.At.IsZero() {
				f.At = time.Now()
			}
			p.fail(f)
			return
		}
	}
}

// handleLine accounts, decodes and dispatches one stdout frame.
func (p *Process) handleLine(line []byte) *Fault {
	p.mu.Lock()
	if run := p.run; run != nil {
		run.stdoutBytes += int64(len(line)) + 1
		if run.stdoutBytes > p.limits.StdoutBytes {
			p.mu.Unlock()
			return &Fault{Kind: KindOutputOverflow, Op: OpRun, Frame: evidence(line),
				Detail: fmt.Sprintf("run %q wrote %d stdout bytes, more than evidence_limits.stdout_bytes %d", run.ID, run.stdoutBytes, p.limits.StdoutBytes)}
		}
	}
	p.mu.Unlock()
	frame, err := protocol.DecodeFrame(line)
	if err != nil {
		kind := KindMalformedFrame
		if protocol.KindOf(err) == protocol.ErrTooLarge {
			kind = KindOversized
		}
		return &Fault{Kind: kind, Op: p.currentOp(), Frame: evidence(line), Detail: err.Error(), Err: err}
	}
	if frame.Response != nil {
		return p.onResponse(frame.Response, line)
	}
	return p.onObservation(frame.Observation, line)
}

func (p *Process) onResponse(resp *protocol.Response, line []byte) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	pend := p.pending
	if pend == nil {
		return &Fault{Kind: KindMiscorrelated, Op: OpIdle, Frame: evidence(line), Detail: "a response while no request is outstanding"}
	}
	op := pend.req.Payload.Operation()
	if err := protocol.Correlate(pend.req, resp, &p.contracts); err != nil {
		kind := KindMiscorrelated
		switch protocol.KindOf(err) {
		case protocol.ErrTooLarge:
			kind = KindOversized
		case protocol.ErrMalformed:
			kind = KindMalformedFrame
		}
		return &Fault{Kind: kind, Op: string(op), Frame: evidence(line), Detail: err.Error(), Err: err}
	}
	if f, ok := resp.Payload.(*protocol.Failed); ok {
		return &Fault{Kind: KindProviderFailed, Op: string(op), Code: f.Code, Message: f.Message, Frame: evidence(line),
			Detail: f.Code + ": " + f.Message}
	}
	p.pending = nil
	switch r := pend.req.Payload.(type) {
	case *protocol.LoadRequest:
		p.loaded = true
	case *protocol.CancelRequest:
		if p.run != nil && p.run.ID == r.RunID {
			p.run.finish(nil, ErrRunCancelled)
			p.run = nil
		}
	case *protocol.StopRequest:
		p.stopping = true
		if p.run != nil {
			p.run.finish(nil, ErrRunCancelled)
			p.run = nil
		}
	}
	pend.reply <- resp
	return nil
}

func (p *Process) onObservation(o *protocol.Observation, line []byte) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	run := p.run
	want := protocol.ObservationExpectation{
		Protocol: p.version.String(), ImplementationID: p.plan.ImplementationID(), Module: p.plan.Module(),
		Schema: p.contracts.Observation,
	}
	if run != nil {
		want.RunID, want.LastSequence, want.HaveLast = run.ID, run.lastSeq, run.count > 0
	}
	if err := protocol.CheckObservation(o, want); err != nil {
		kind := KindBadObservation
		if protocol.KindOf(err) == protocol.ErrTooLarge {
			kind = KindOversized
		}
		return &Fault{Kind: kind, Op: OpRun, Frame: evidence(line), Detail: err.Error(), Err: err}
	}
	run.count++
	if run.count > p.limits.Observations {
		return &Fault{Kind: KindOutputOverflow, Op: OpRun, Frame: evidence(line),
			Detail: fmt.Sprintf("run %q sent %d observations, more than evidence_limits.observations %d", run.ID, run.count, p.limits.Observations)}
	}
	run.lastSeq = o.Sequence
	run.deliver(o)
	if o.Terminal {
		run.finish(o, nil)
		p.run = nil
	}
	return nil
}

// Remaining returns the pids of the processes still in the provider's group
// (zombies included): empty once Done is closed, whatever the provider did.
func (p *Process) Remaining() []int {
	members, err := groupMembers(p.group.pgid)
	if err != nil {
		return nil
	}
	var pids []int
	for _, m := range members {
		pids = append(pids, m.pid)
	}
	return pids
}
