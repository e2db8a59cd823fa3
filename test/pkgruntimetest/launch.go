// Package pkgruntimetest builds the example package runtimes and starts them
// for tests with what the manager passes a runtime (descriptor 3 its
// executable, 4 a listening unix socket in a private directory, 5 a pipe
// carrying the launch key; an empty environment; a process group of its
// own). It does not seal, verify or change uid: the host's launch does.
package pkgruntimetest

import (
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
)

// The runtimes Build builds, by name.
const (
	// KV is examples/packageruntimes/kv, written with pkg/packageruntime.
	KV = "kv"
	// Seed is test/seedruntime, written from the proto alone.
	Seed = "seedruntime"
)

var packages = map[string]string{
	KV:   "iteron.dev/operator/examples/packageruntimes/kv",
	Seed: "iteron.dev/operator/test/seedruntime",
}

// Build builds every runtime into dir and returns their paths by name.
func Build(dir string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := artifacts.ModuleRoot(ctx)
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for name, pkg := range packages {
		out := filepath.Join(dir, name)
		if err := artifacts.Build(ctx, root, pkg, out, ""); err != nil {
			return nil, err
		}
		paths[name] = out
	}
	return paths, nil
}

// BuildSeedWithFault builds test/seedruntime into dir with -fault=fault as
// its default (for runtimes the manager launches, which get no argv), and
// returns its path.
func BuildSeedWithFault(dir, fault string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := artifacts.ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, Seed+"-"+fault)
	return out, artifacts.Build(ctx, root, packages[Seed], out, "-X main.defaultFault="+fault)
}

// Runtime is one started runtime process.
type Runtime struct {
	// Socket is the path of the socket it serves on.
	Socket string
	// Key is its launch key.
	Key []byte
	// Pid is its pid (and its process group's id).
	Pid    int
	exited chan struct{}
	state  *os.ProcessState
}

// Start starts binary with args; the test's cleanup kills its group and
// reaps it.
func Start(tb testing.TB, binary string, args ...string) *Runtime {
	tb.Helper()
	dir, err := os.MkdirTemp("", "pkgrt-") // t.TempDir() can exceed a socket path's 107 bytes
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	r := &Runtime{Socket: filepath.Join(dir, "runtime.sock"), Key: make([]byte, 32), exited: make(chan struct{})}
	rand.Read(r.Key)
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: r.Socket, Net: "unix"})
	if err != nil {
		tb.Fatal(err)
	}
	lis.SetUnlinkOnClose(false) // the runtime serves on a duplicate of it
	lisFile, err := lis.File()
	lis.Close()
	if err != nil {
		tb.Fatal(err)
	}
	defer lisFile.Close()
	exe, err := os.Open(binary)
	if err != nil {
		tb.Fatal(err)
	}
	defer exe.Close()
	keyR, keyW, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	defer keyR.Close()
	proc, err := os.StartProcess(binary, append([]string{filepath.Base(binary)}, args...), &os.ProcAttr{
		Env:   []string{},
		Files: []*os.File{nil, nil, os.Stderr, exe, lisFile, keyR},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		keyW.Close()
		tb.Fatal(err)
	}
	r.Pid = proc.Pid
	go func() {
		r.state, _ = proc.Wait()
		close(r.exited)
	}()
	tb.Cleanup(func() {
		syscall.Kill(-r.Pid, syscall.SIGKILL)
		<-r.exited
	})
	keyW.Write(r.Key)
	keyW.Close()
	return r
}

// Exited is closed once the process has exited and been reaped.
func (r *Runtime) Exited() <-chan struct{} { return r.exited }

// Kill kills the runtime's group and waits until it is reaped.
func (r *Runtime) Kill() {
	syscall.Kill(-r.Pid, syscall.SIGKILL)
	<-r.exited
}
