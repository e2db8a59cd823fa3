package survivor

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"iteron.dev/operator/internal/statedir"
)

// peerCred returns the kernel's credentials of the connection's peer.
func peerCred(uc *net.UnixConn) (*unix.Ucred, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// checkLockProof accepts f only if it is the open file description that
// holds the exclusive flock on <stateDir>/lock: the same inode as that
// file, and /proc/self/fdinfo listing an exclusive FLOCK through this very
// descriptor (the kernel lists a flock only on the open file description
// that holds it, and only one can hold it exclusively). The caller closes f
// at once afterwards: holding it would keep the lock after its manager
// died.
func checkLockProof(stateDir string, f *os.File) error {
	path := statedir.Dir(stateDir).Lock()
	var want, got unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return fmt.Errorf("the manager's lock %s: %v", path, err)
	}
	if err := unix.Fstat(int(f.Fd()), &got); err != nil {
		return fmt.Errorf("the descriptor sent as the lock: fstat: %v", err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return fmt.Errorf("the descriptor sent as the lock is not %s (device %d inode %d, want %d %d)", path, got.Dev, got.Ino, want.Dev, want.Ino)
	}
	info, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return fmt.Errorf("reading the lock descriptor's fdinfo: %v", err)
	}
	defer info.Close()
	sc := bufio.NewScanner(info)
	for sc.Scan() {
		// lock:	1: FLOCK  ADVISORY  WRITE 1234 fe:00:9978063 0 EOF
		rest, ok := strings.CutPrefix(sc.Text(), "lock:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) >= 4 && fields[1] == "FLOCK" && fields[3] == "WRITE" {
			return nil
		}
	}
	return fmt.Errorf("the descriptor sent is %s but does not hold its exclusive lock: only the running manager's does", path)
}

// lockOwn takes the survivor's exclusive lock on <stateDir>/survivor.lock,
// or fails at once naming the holder's pid.
func lockOwn(stateDir string) (*os.File, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", stateDir, err)
	}
	path := statedir.Dir(stateDir).SurvivorLock()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (held by pid %s): run one survivor per state directory", ErrLocked, path, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// ErrLocked is returned when another survivor holds the state directory.
var ErrLocked = errors.New("another survivor holds the state directory")
