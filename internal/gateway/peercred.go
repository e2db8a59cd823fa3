package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Peer is the process at the other end of a connection, as the kernel
// reported it when the connection was made (SO_PEERCRED): it cannot be
// forged by the caller.
type Peer struct {
	// PID, UID and GID of the connecting process (GID is its effective
	// gid; supplementary groups are not reported).
	PID      int32
	UID, GID uint32
}

// PeerAuthInfo is the credentials.AuthInfo of a gateway connection.
type PeerAuthInfo struct {
	credentials.CommonAuthInfo
	// Peer is the connecting process.
	Peer Peer
}

// AuthType names the mechanism.
func (PeerAuthInfo) AuthType() string { return "so_peercred" }

// PeerCredentials returns the server-side transport credentials of the
// gateway: no encryption (the socket never leaves the node), and each
// connection's peer credentials read with SO_PEERCRED at the handshake. A
// connection that is not a unix socket is refused: there is no other way
// to learn who the caller is.
func PeerCredentials() credentials.TransportCredentials { return peerCreds{} }

type peerCreds struct{}

// ErrNotUnix is returned for a connection that is not a unix socket.
var ErrNotUnix = errors.New("gateway: not a unix socket connection: peer credentials unavailable")

func (peerCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	p, err := readPeer(conn)
	if err != nil {
		return nil, nil, err
	}
	return conn, PeerAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, Peer: p}, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, PeerAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "so_peercred"}
}

func (c peerCreds) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in grpc and meaningless here.
func (peerCreds) OverrideServerName(string) error { return nil }

// readPeer reads SO_PEERCRED from a unix connection.
func readPeer(conn net.Conn) (Peer, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return Peer{}, fmt.Errorf("%w (%T)", ErrNotUnix, conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, fmt.Errorf("gateway: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, fmt.Errorf("gateway: peer credentials: %w", err)
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("gateway: SO_PEERCRED: %w", credErr)
	}
	return Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}, nil
}

// PeerFromContext returns the caller of an RPC, and false when the
// connection carried no peer credentials.
func PeerFromContext(ctx context.Context) (Peer, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Peer{}, false
	}
	info, ok := p.AuthInfo.(PeerAuthInfo)
	if !ok {
		return Peer{}, false
	}
	return info.Peer, true
}
