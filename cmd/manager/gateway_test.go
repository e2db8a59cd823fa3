package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/gateway"
)

// handshake polls the gateway at socket until it answers (or 60 s pass).
func handshake(t *testing.T, socket string, p *managerProcess) *gatewayv1.HandshakeResponse {
	t.Helper()
	c, err := gateway.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.Handshake(ctx, &gatewayv1.HandshakeRequest{Nonce: "t"})
		cancel()
		if err == nil {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager's gateway never answered at %s: %v\n%s", socket, err, p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the manager to exit.
func (p *managerProcess) stop(t *testing.T) error {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("the manager did not exit after SIGTERM:\n%s", p.output())
		return nil
	}
}

func TestTheManagerServesTheGatewayUnderItsLockAndANewInstanceAfterARestart(t *testing.T) {
	stateDir := t.TempDir()
	socket := filepath.Join(stateDir, "gw.sock")
	// A stale socket, as a manager killed with SIGKILL leaves behind.
	stale, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	args := []string{"--node-name=node-gw", "--gateway-allow=uid:0=*", "--gateway-group=4242"}

	first := startManager(t, stateDir, args...)
	hs1 := handshake(t, socket, first)
	if hs1.NodeName != "node-gw" || len(hs1.InstanceId) != 32 || hs1.Nonce != "t" {
		t.Fatalf("handshake %+v", hs1)
	}
	fi, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 || st.Gid != 4242 {
		t.Fatalf("socket %v gid %d; want 0660 in group 4242", fi.Mode(), st.Gid)
	}

	// A second manager on the same state dir never gets the lock, so it
	// never touches the first one's socket.
	second := startManager(t, stateDir, args...)
	select {
	case err := <-second.done:
		second.done <- err
		if err == nil || !strings.Contains(second.output(), "another manager holds the state directory") {
			t.Fatalf("second manager: %v\n%s", err, second.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second manager did not exit")
	}
	if hs := handshake(t, socket, first); hs.InstanceId != hs1.InstanceId {
		t.Fatalf("after the second manager exited the socket answers as %s, not the first manager's %s", hs.InstanceId, hs1.InstanceId)
	}

	if err := first.stop(t); err != nil {
		t.Fatalf("first manager exit: %v\n%s", err, first.output())
	}
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived the manager: %v", err)
	}

	third := startManager(t, stateDir, args...)
	hs3 := handshake(t, socket, third)
	if hs3.InstanceId == hs1.InstanceId {
		t.Fatalf("instance id %s survived a restart; a client could not tell its invocation table is gone", hs3.InstanceId)
	}
}

func TestTheManagerRefusesToReplaceAFileThatIsNotASocket(t *testing.T) {
	stateDir := t.TempDir()
	socket := filepath.Join(stateDir, "gw.sock")
	if err := os.WriteFile(socket, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startManager(t, stateDir, "--node-name=node-gw2")
	select {
	case err := <-p.done:
		p.done <- err
		if err == nil || !strings.Contains(p.output(), "exists and is not a socket") {
			t.Fatalf("manager: %v\n%s", err, p.output())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the manager kept running with a file at its socket path:\n%s", p.output())
	}
	if b, err := os.ReadFile(socket); err != nil || string(b) != "not a socket" {
		t.Fatalf("the file at the socket path changed: %q %v", b, err)
	}
}
