package sandbox_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// listener accepts connections and counts those that wrote something.
type listener struct {
	addr  string
	wrote atomic.Int64
}

func serve(l net.Listener) *listener {
	ln := &listener{addr: l.Addr().String()}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				ln.wrote.Add(1)
			}
		}
	}()
	return ln
}

// loopbackListener listens on 127.0.0.1 of the node's network namespace.
func loopbackListener(t *testing.T) *listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return serve(l)
}

// netnsListener makes a network namespace of the test's own, joined to
// the node's by a veth pair (10.251.N.1 on the node's side, 10.251.N.2 in
// the namespace), and listens on 10.251.N.2 inside it. Everything is
// removed after the test: the pair, the listener and the namespace (held
// by a thread of this process, which ends with it).
func netnsListener(t *testing.T) *listener {
	t.Helper()
	n := os.Getpid()%200 + 20
	host, peer := fmt.Sprintf("itsbh%d", n), fmt.Sprintf("itsbp%d", n)
	hostIP, nsIP := fmt.Sprintf("10.251.%d.1", n), fmt.Sprintf("10.251.%d.2", n)
	type made struct {
		path string
		l    net.Listener
		err  error
	}
	ready, done := make(chan made, 1), make(chan struct{})
	go func() {
		// This thread holds the namespace and is never given back: it ends
		// when the goroutine returns, still locked.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- made{err: err}
			return
		}
		path := "/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
		l, err := net.Listen("tcp", "0.0.0.0:0") // in the namespace: its socket belongs to it
		ready <- made{path, l, err}
		<-done
	}()
	m := <-ready
	if m.err != nil {
		close(done)
		t.Fatalf("a network namespace of the test's own: %v", m.err)
	}
	ipIn := func(args ...string) {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + m.path, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("nsenter --net ip %v: %v\n%s", args, err, out)
		}
	}
	ipHost := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", host).Run() // takes the peer with it
		m.l.Close()
		close(done)
	})
	ipIn("link", "add", peer, "type", "veth", "peer", "name", host, "netns", "1")
	ipIn("addr", "add", nsIP+"/30", "dev", peer)
	ipIn("link", "set", peer, "up")
	ipIn("link", "set", "lo", "up")
	ipHost("addr", "add", hostIP+"/30", "dev", host)
	ipHost("link", "set", host, "up")
	ln := serve(m.l)
	_, port, _ := net.SplitHostPort(ln.addr)
	ln.addr = net.JoinHostPort(nsIP, port)
	// The namespace answers from the node before any provider tries.
	c, err := net.Dial("tcp", ln.addr)
	if err != nil {
		t.Fatalf("the test's own namespace does not answer from the node: %v", err)
	}
	c.Close()
	return ln
}
