package fleettest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"iteron.dev/operator/test/childproc"
)

// Proc is a process a fleet suite started (a manager, a fleet controller):
// only these are ever signalled, by their pid.
type Proc struct {
	// Name says what it is, for the failure output.
	Name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Start runs bin with args as a child that dies with this process; its
// output is kept (or printed, when Verbose).
func Start(name, bin string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, cmd: exec.Command(bin, args...), out: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd.Env = os.Environ()
	if Verbose() {
		p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	} else {
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	}
	if err := childproc.Start(p.cmd, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p, nil
}

// Pid is the process's pid.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Alive reports whether the process still runs.
func (p *Proc) Alive() bool {
	select {
	case err := <-p.done:
		p.done <- err
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits (60 s at most, then SIGKILL); idempotent.
func (p *Proc) Stop() {
	if !p.Alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	err := <-p.done
	p.done <- err
}

// Output is the last n bytes of what the process printed.
func (p *Proc) Output(n int) string {
	s := p.out.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
