// Command localcluster runs the local control plane for the demo and the
// docs: etcd and kube-apiserver (built into bin/k8s by
// hack/build-controlplane.sh), bound to 127.0.0.1, with this repository's
// CRDs installed and a Node object for the local node (the local control
// plane has no kubelet and no kube-controller-manager). It writes an
// administrator kubeconfig and runs until SIGINT or SIGTERM, then stops both
// servers and removes their data.
//
//	go build -o bin/localcluster ./hack/localcluster
//	bin/localcluster -write-kubeconfig /tmp/iteron/kubeconfig -node "$(hostname)" &
//	kill $!     # SIGTERM: stops etcd and kube-apiserver, removes their data
//
// etcd and kube-apiserver run in process groups of their own, so killing
// this process alone could leave them running. It therefore runs as two
// processes: a supervisor (the pid a shell reports) and a worker that owns
// the servers. The worker gets SIGTERM when the supervisor dies, however it
// dies (SIGKILL included), and the supervisor gets SIGTERM when its own
// parent dies (killing `go run ./hack/localcluster` kills only go's pid).
// The supervisor is a child subreaper: should the worker itself be killed,
// the servers it leaves are re-parented to the supervisor, which stops
// them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/test/kubeapi"
)

// workerEnv marks the worker process: the same binary and arguments, run by
// the supervisor.
const workerEnv = "ITERON_LOCALCLUSTER_WORKER"

func main() {
	kubeconfig := flag.String("write-kubeconfig", "", "where to write the administrator kubeconfig (required)")
	node := flag.String("node", "", "the Node object to create (required)")
	flag.Parse()
	if *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "localcluster: -write-kubeconfig and -node are required")
		os.Exit(2)
	}
	if os.Getenv(workerEnv) == "1" {
		if err := runWorker(*kubeconfig, *node); err != nil {
			fmt.Fprintln(os.Stderr, "localcluster:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(supervise())
}

// supervise runs the worker and outlives it: it relays SIGINT, SIGTERM and
// SIGHUP to the worker as SIGTERM, and once the worker has exited stops
// whatever it left behind. It returns the worker's exit status.
func supervise() int {
	parent := os.Getppid()
	// Our parent's death (a killed `go run`, a closed terminal) is a
	// SIGTERM to us. Set it first, then check that the parent did not die
	// before it was set.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster: PR_SET_PDEATHSIG:", err)
		return 1
	}
	if os.Getppid() != parent {
		return 1
	}
	// Orphans of the worker (etcd, kube-apiserver) are re-parented to us,
	// not to init, so that we can stop them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster: PR_SET_CHILD_SUBREAPER:", err)
		return 1
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	// Pdeathsig fires when the thread that forked the child exits, not the
	// process (golang/go#27505): fork from this goroutine, locked to its
	// thread for the rest of the process's life.
	runtime.LockOSThread()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		return 1
	}
	// The worker's temporary files (etcd's data, certificates) go under a
	// directory of ours, so that they are removed even when the worker is
	// killed before it can remove them.
	tmp, err := os.MkdirTemp("", "localcluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	worker := exec.Command(self, os.Args[1:]...)
	worker.Env = append(os.Environ(), workerEnv+"=1", "TMPDIR="+tmp)
	worker.Stdin, worker.Stdout, worker.Stderr = nil, os.Stdout, os.Stderr
	worker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := worker.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster: start the worker:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- worker.Wait() }()
	var waitErr error
wait:
	for {
		select {
		case <-signals:
			_ = worker.Process.Signal(syscall.SIGTERM)
		case waitErr = <-done:
			break wait
		}
	}
	if left := stopOrphans(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "localcluster: the worker left processes %v; they were stopped\n", left)
	}
	var exit *exec.ExitError
	switch {
	case waitErr == nil:
		return 0
	case errors.As(waitErr, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	}
	return 1
}

// stopOrphans stops the processes re-parented to us (we are a subreaper):
// SIGTERM, up to 10 s to exit, then SIGKILL, each reaped by its pid. They
// are our children until reaped, so their pids cannot have been reused.
func stopOrphans() []int {
	orphans := children()
	for _, pid := range orphans {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range orphans {
		for {
			var status syscall.WaitStatus
			got, err := syscall.Wait4(pid, &status, syscall.WNOHANG, nil)
			if got == pid || err != nil {
				break
			}
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				_, _ = syscall.Wait4(pid, &status, 0, nil)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return orphans
}

// children lists the processes whose parent is this one, from /proc.
func children() []int {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name, in parentheses, may hold spaces: the fields
		// after its closing parenthesis are state, then ppid.
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(self) {
			out = append(out, pid)
		}
	}
	return out
}

// runWorker starts the control plane and holds it until SIGINT or SIGTERM
// (the supervisor's SIGTERM when it exits or dies).
func runWorker(kubeconfigPath, node string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Everything temporary is under the supervisor's TMPDIR, which the
	// supervisor removes; the worker removes it too, last, for the case
	// where the supervisor was killed.
	if tmp := os.Getenv("TMPDIR"); tmp != "" {
		defer os.RemoveAll(tmp)
	}
	env, err := kubeapi.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	if err := kubeapi.EnsureNode(ctx, env.Client, node); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "localcluster-kubeconfig-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src, err := env.Kubeconfig(dir)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfigPath), 0o755); err != nil {
		return err
	}
	// Written whole, then renamed: a reader that waits for the file never
	// reads half of it.
	tmp := kubeconfigPath + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, kubeconfigPath); err != nil {
		return err
	}
	fmt.Printf("localcluster: kube-apiserver %s at %s; kubeconfig %s; node %s; stop with: kill %d\n",
		env.ServerVersion, env.Config.Host, kubeconfigPath, node, os.Getppid())
	<-ctx.Done()
	_ = os.Remove(kubeconfigPath)
	return nil
}
