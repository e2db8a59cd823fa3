// Package childproc starts the processes a test binary runs (managers,
// survivors, watchdogs) so that they end with it. A test that panics, or that
// its -timeout ends, runs no deferred function and no cleanup: without this,
// a manager it started would go on running, with its providers.
package childproc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

var (
	spawnOnce sync.Once
	spawns    chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// Start starts cmd with the parent-death signal sig (keeping the rest of its
// SysProcAttr). It forks from one OS thread that never exits: the signal fires
// when the thread that forked exits, not the process (golang/go#27505), and Go
// ends threads whose goroutine exits locked to them.
func Start(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	spawnOnce.Do(func() {
		spawns = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread()
			for r := range spawns {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawns <- r
	return <-r.done
}
