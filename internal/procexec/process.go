package procexec

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/internal/verifier"
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
	plan        verifier.LaunchPlan
	version     protocol.Version
	contracts   protocol.ModuleContracts
	limits      verifier.EvidenceLimits
	group       spawn.Group
	sandbox     *sandbox.Launch // nil without a sandbox
	interpreter string
	startedAt   time.Time

	pidfd  *os.File
	stdin  *os.File
	stdout *os.File
	stderr *os.File
	errs   *spawn.Ring

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

func newProcess(e *Executor, plan verifier.LaunchPlan, v protocol.Version, g spawn.Group, pidfd, stdin, stdout, stderr *os.File, interpreter string) *Process {
	return &Process{
		ex: e, plan: plan, version: v, contracts: plan.Contracts(), limits: plan.EvidenceLimits(),
		group: g, interpreter: interpreter, startedAt: time.Now(),
		pidfd: pidfd, stdin: stdin, stdout: stdout, stderr: stderr, errs: spawn.NewRing(plan.EvidenceLimits().StderrBytes),
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
		if err := spawn.Rehash(p.plan.Executable(), p.plan.ArtifactSHA256()); err != nil {
			p.fail(&Fault{Kind: KindTampered, Op: OpVerify, Reason: reasons.VerificationFailed, Detail: "the artifact changed after verification: " + err.Error(), Err: err})
		}
	}()
	go func() {
		defer close(p.recorded)
		r := Record{PID: p.group.PID, PGID: p.group.PGID, StartTime: p.group.StartTime, BootID: spawn.BootID(), UID: p.group.UID,
			Module: p.plan.Module(), ImplementationID: p.plan.ImplementationID(), ArtifactSHA256: p.plan.ArtifactSHA256()}
		p.record, p.recErr = spawn.WriteRecord(p.ex.cfg.RecordDir, r)
		if p.recErr != nil {
			p.fail(&Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "writing the group record: " + p.recErr.Error(), Err: errors.Join(errNotRecorded, p.recErr)})
		}
	}()
}

// Pid is the provider's (the group leader's) pid.
func (p *Process) Pid() int { return p.group.PID }

// Pgid is the provider's process group.
func (p *Process) Pgid() int { return p.group.PGID }

// StartTime is the leader's start time in clock ticks since boot (with Pid,
// the process's identity).
func (p *Process) StartTime() uint64 { return p.group.StartTime }

// StartedAt is when the process was spawned.
func (p *Process) StartedAt() time.Time { return p.startedAt }

// Interpreter is the #! interpreter the provider runs under, "" for a binary.
func (p *Process) Interpreter() string { return p.interpreter }

// Plan is the launch plan the process was started from.
func (p *Process) Plan() verifier.LaunchPlan { return p.plan }

// Version is the protocol version the process speaks.
func (p *Process) Version() protocol.Version { return p.version }

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

func (p *Process) isDying() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dying
}

// beforeRehash, when set by a test, runs before the re-hash after start.
var beforeRehash func(*Process)

func (p *Process) readStderr() {
	defer close(p.stderrDone)
	io.CopyBuffer(p.errs, p.stderr, make([]byte, 32<<10))
}

// ActiveRun returns the run in progress, if any.
func (p *Process) ActiveRun() (*Run, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.run, p.run != nil
}

// CheckIdentity reports whether the process is still the one that was
// started: its leader has not exited (its pidfd, which cannot name another
// process, says so) and /proc/<pid>/stat still shows the recorded start
// time and process group. It never trusts a pid number alone.
func (p *Process) CheckIdentity() error {
	select {
	case <-p.exited:
		return fmt.Errorf("process %d has exited", p.group.PID)
	default:
	}
	var err error
	p.control(func(fd int) { err = unix.PidfdSendSignal(fd, 0, nil, 0) })
	if err != nil {
		return fmt.Errorf("process %d: pidfd: %w", p.group.PID, err)
	}
	st, err := spawn.ReadStat(p.group.PID)
	if err != nil {
		return fmt.Errorf("process %d: %w", p.group.PID, err)
	}
	if st.StartTime != p.group.StartTime || st.PGID != p.group.PGID {
		return fmt.Errorf("process %d now has start time %d and group %d; it was started with %d and %d", p.group.PID, st.StartTime, st.PGID, p.group.StartTime, p.group.PGID)
	}
	return nil
}

// BootID identifies this boot of the machine (a start time means nothing
// across boots).
func BootID() string { return spawn.BootID() }
