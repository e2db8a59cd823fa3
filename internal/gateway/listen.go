package gateway

import (
	"net"

	"iteron.dev/operator/internal/survivor"
)

// MaxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes including the terminating NUL).
const MaxSocketPath = survivor.MaxSocketPath

// SocketMode is the gateway socket's permission: owner and group may
// connect, nobody else.
const SocketMode = survivor.SocketMode

// SocketError is a socket path the gateway cannot listen on.
type SocketError = survivor.SocketError

// Listen listens on the unix socket at path, mode 0660, owned by the
// manager's uid and group gid (the callers' group; -1 keeps the manager's
// gid). The socket appears at path only once its mode and group are set: it
// is bound under a temporary name in the same directory and renamed into
// place, so no caller ever sees a more permissive socket. A socket already
// at path is a stale one of an earlier manager and is replaced; anything
// else at path (a file, a directory, a symlink) is refused. Closing the
// listener removes the socket file if it is still this listener's.
//
// The caller must hold the state-dir lock: only the manager that holds it
// may replace the socket. With a survivor (docs/survivor.md) the survivor
// makes the socket (survivor.ListenSocket) and the manager serves the
// listener it hands over instead.
func Listen(path string, gid int) (net.Listener, error) {
	l, err := survivor.ListenSocket(path, gid)
	if err != nil {
		return nil, err
	}
	return l, nil
}
