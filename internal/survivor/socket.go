package survivor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes including the terminating NUL).
const MaxSocketPath = 107

// SocketMode is the gateway socket's permission: owner and group may
// connect, nobody else.
const SocketMode os.FileMode = 0o660

// SocketError is a socket path the gateway cannot listen on.
type SocketError struct {
	// Path is the socket path.
	Path string
	// Why says what is wrong.
	Why string
	// Err is the underlying error, if any.
	Err error
}

func (e *SocketError) Error() string {
	msg := fmt.Sprintf("gateway socket %s: %s", e.Path, e.Why)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *SocketError) Unwrap() error { return e.Err }

// ListenSocket listens on the unix socket at path, mode 0660, owned by the
// caller's uid and group gid (the callers' group; -1 keeps the caller's
// gid). The gateway's socket is made here, by the manager (gateway.Listen)
// or by the survivor that holds it across manager restarts. The socket appears at path only once its mode and group are set: it
// is bound under a temporary name in the same directory and renamed into
// place, so no caller ever sees a more permissive socket. A socket already
// at path is a stale one of an earlier manager and is replaced; anything
// else at path (a file, a directory, a symlink) is refused.
//
// The caller must hold the state-dir lock (or, for the survivor, its own
// lock): only its holder may replace the socket (a second manager would
// otherwise steal the first one's socket). The directory is created (0755)
// when missing; callers must be able to traverse it.
func ListenSocket(path string, gid int) (*SocketListener, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return nil, &SocketError{Path: path, Why: "must be an absolute, clean path"}
	}
	if len(path) > MaxSocketPath {
		return nil, &SocketError{Path: path, Why: fmt.Sprintf("is %d bytes; a unix socket path is at most %d", len(path), MaxSocketPath)}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, &SocketError{Path: path, Why: "cannot create its directory", Err: err}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, &SocketError{Path: path, Why: fmt.Sprintf("exists and is not a socket (%s); refusing to replace it", fi.Mode().Type())}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, &SocketError{Path: path, Why: "cannot inspect it", Err: err}
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".new-"+strconv.Itoa(os.Getpid()))
	if len(tmp) > MaxSocketPath {
		// The temporary name must fit too; fall back to a shorter one.
		tmp = filepath.Join(dir, ".gw-"+strconv.Itoa(os.Getpid()))
		if len(tmp) > MaxSocketPath {
			return nil, &SocketError{Path: path, Why: fmt.Sprintf("its directory leaves no room for a temporary socket name within %d bytes", MaxSocketPath)}
		}
	}
	_ = os.Remove(tmp) // a leftover of an earlier manager with the same pid
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, &SocketError{Path: path, Why: "cannot listen", Err: err}
	}
	// The listener must not unlink the temporary name on Close (it is
	// renamed away); the gateway removes path itself when it stops.
	lis.SetUnlinkOnClose(false)
	fail := func(why string, err error) (*SocketListener, error) {
		lis.Close()
		os.Remove(tmp)
		return nil, &SocketError{Path: path, Why: why, Err: err}
	}
	if err := os.Chmod(tmp, SocketMode); err != nil {
		return fail("cannot set mode 0660", err)
	}
	if err := os.Lchown(tmp, -1, gid); err != nil {
		return fail(fmt.Sprintf("cannot set group %d", gid), err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(tmp, &st); err != nil {
		return fail("cannot inspect the new socket", err)
	}
	if err := unix.Rename(tmp, path); err != nil {
		return fail("cannot move the socket into place", err)
	}
	return &SocketListener{UnixListener: lis, path: path, dev: st.Dev, ino: st.Ino}, nil
}

// SocketListener removes its socket file when closed (unless Detach was
// called: a listener handed to another process keeps its file).
type SocketListener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
	once     sync.Once
	detached bool
}

// Ino is the socket file's inode (with its device, the socket's identity
// on the node).
func (l *SocketListener) Ino() (dev, ino uint64) { return l.dev, l.ino }

// Path is where the socket file is.
func (l *SocketListener) Path() string { return l.path }

// Detach makes Close leave the socket file in place.
func (l *SocketListener) Detach() { l.detached = true }

// Close stops listening and removes the socket file if it is still this
// listener's (same inode), never one a later manager put at the path.
func (l *SocketListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if l.detached {
			return
		}
		var st unix.Stat_t
		if unix.Lstat(l.path, &st) == nil && st.Dev == l.dev && st.Ino == l.ino {
			os.Remove(l.path)
		}
	})
	return err
}
