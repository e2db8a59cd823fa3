package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"iteron.dev/operator/internal/statedir"
)

// stateDirLock is an exclusive flock on <state-dir>/lock, held for the
// manager's lifetime. It fences two managers on one node: a Lease is no fence,
// a kernel lock released at process death is.
type stateDirLock struct {
	f *os.File
}

// lockStateDir creates the state directory if needed and takes the lock, or
// fails at once naming the holder.
func lockStateDir(dir string) (*stateDirLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	path := statedir.Dir(dir).Lock()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w %s (lock %s held by pid %s): run one manager per state directory", errLocked, dir, path, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is for the error message of a second manager only; the lock
	// itself is the flock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &stateDirLock{f: f}, nil
}

// Release drops the lock (process exit drops it too).
func (l *stateDirLock) Release() error {
	return l.f.Close()
}
