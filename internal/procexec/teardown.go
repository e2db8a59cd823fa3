package procexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/pkg/protocol"
)

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

// Done is closed when the process is gone: its group killed and reaped, its
// pipes closed, its record removed.
func (p *Process) Done() <-chan struct{} { return p.done }

// Teardown reports how the process ended; valid once Done is closed.
func (p *Process) Teardown() TeardownReport {
	<-p.done
	return p.report
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
		if members, err := spawn.GroupMembers(p.group.PGID); err == nil {
			for _, m := range members {
				if m.PID != p.group.PID && m.State != 'Z' {
					rep.LeftBehind = append(rep.LeftBehind, m.PID)
				}
			}
		}
	}
	// Only this goroutine reaps the leader (in KillGroup), so the pgid
	// still names this group when it is killed.
	rep.Exit, rep.Unreaped = spawn.KillGroup(p.group, p.pidfd, p.exited, p.ex.cfg.KillTimeout)
	rep.Reaped = time.Since(t0)
	// The group is gone: the sandbox reads why the kernel killed it (a
	// memory bound) and removes its cgroup.
	var memory bool
	if p.sandbox != nil && len(rep.Unreaped) == 0 {
		var why string
		rep.Exit, why = p.sandbox.Finish(rep.Exit)
		memory = why == reasons.MemoryExceeded
	}

	// Drain the pipes: they close when the last holder dies; a descendant
	// that left the group may hold them, so the wait is bounded. One bound
	// for both, on a channel that stays closed: a timer's channel fires
	// once, and the wait for the second pipe would never end.
	drained := make(chan struct{})
	drain := time.AfterFunc(p.ex.cfg.WaitDelay, func() { close(drained) })
	for _, ch := range []chan struct{}{p.stdoutDone, p.stderrDone} {
		select {
		case <-ch:
		case <-drained:
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
	if memory && p.fault != nil {
		p.fault.Reason = reasons.MemoryExceeded
		p.fault.Detail += fmt.Sprintf("; the kernel killed it for exceeding its memory bound of %d bytes", p.sandbox.Evidence().Limits.MemoryBytes)
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
	exit := spawn.AwaitExit(p.pidfd)
	if p.sandbox != nil {
		exit = sandbox.ProviderExit(exit) // the launcher's status says the provider's
	}
	p.mu.Lock()
	p.exit = exit
	p.mu.Unlock()
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
	exit = p.exit
	p.mu.Unlock()
	if !expected {
		p.fail(&Fault{Kind: KindExited, Op: p.currentOp(), Detail: "the provider exited: " + exit.String()})
	}
}

// Remaining returns the pids of the processes still in the provider's group
// (zombies included): empty once Done is closed, whatever the provider did.
func (p *Process) Remaining() []int {
	members, err := spawn.GroupMembers(p.group.PGID)
	if err != nil {
		return nil
	}
	var pids []int
	for _, m := range members {
		pids = append(pids, m.PID)
	}
	return pids
}
