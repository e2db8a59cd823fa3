package sandbox_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"iteron.dev/operator/internal/sandbox/cgroups"
	"iteron.dev/operator/internal/sandbox/sandboxtest"
	"iteron.dev/operator/test/operatortest"
)

var buildManager struct {
	sync.Once
	path string
	err  error
}

// managerBinary builds cmd/manager beside the launcher (once).
func managerBinary(t *testing.T) string {
	t.Helper()
	buildManager.Do(func() {
		buildManager.path = filepath.Join(filepath.Dir(launcher), "manager")
		out, err := exec.Command("go", "build", "-o", buildManager.path, filepath.Join(suite.Env.RepoRoot, "cmd", "manager")).CombinedOutput()
		if err != nil {
			buildManager.err = fmt.Errorf("build the manager: %v\n%s", err, out)
		}
	})
	if buildManager.err != nil {
		t.Fatal(buildManager.err)
	}
	return buildManager.path
}

// binaryManager is a manager binary the test started.
type binaryManager struct {
	socket, metricsAddr string
	log                 *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startManagerBinary runs the manager binary for node with extra flags,
// inside a guard cgroup of the test's own (joined before the manager's
// first instruction, by the shell that execs it), and stops it after the
// test.
func startManagerBinary(t *testing.T, node string, flags ...string) *binaryManager {
	t.Helper()
	bin := managerBinary(t)
	guard := sandboxtest.Guard(t)
	// Outside the allowed root (the suite's TMPDIR is): the manager refuses
	// a state directory a provider could read.
	work := filepath.Join(suite.Base, node)
	state := filepath.Join(work, "state")
	os.MkdirAll(state, 0o700)
	t.Cleanup(func() { os.RemoveAll(work) })
	sock := filepath.Join(filepath.Dir(socket), node+".sock")
	port := freePort(t)
	m := &binaryManager{socket: sock, metricsAddr: "127.0.0.1:" + port, log: &syncBuffer{}}
	kubeconfig := managerKubeconfig(t, work)
	args := append([]string{"--kubeconfig=" + kubeconfig, "--node-name=" + node, "--state-dir=" + state,
		"--allowed-roots=" + suite.ProvidersDir, "--gateway-socket=" + sock, fmt.Sprintf("--gateway-allow=uid:%d=*", os.Getuid()),
		"--capability-ceiling=code_executing,irreversible_external,read_only,reversible_local,trust_mutating",
		"--metrics-bind-address=" + m.metricsAddr, "--health-probe-bind-address=0", "--artifact-store=" + filepath.Join(work, "store")}, flags...)
	var join strings.Builder
	for _, procs := range guardProcs(guard) {
		fmt.Fprintf(&join, "echo $$ > %s && ", procs)
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", join.String() + `exec "$0" "$@"`, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = m.log, m.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("the manager did not stop within 60s:\n%s", m.log.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return m
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the manager exited (%v):\n%s", err, m.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager never listened on %s:\n%s", sock, m.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// guardProcs are the cgroup.procs files of a guard layout.
func guardProcs(l *cgroups.Layout) []string {
	var out []string
	for _, h := range l.Hierarchies {
		out = append(out, filepath.Join(h.Dir, "cgroup.procs"))
	}
	return out
}

func (m *binaryManager) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + m.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// managerKubeconfig is a kubeconfig as the manager's service account (the
// Generation admission policy lets only it write Generations).
func managerKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	path, err := suite.Env.Kubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = operatortest.ManagerUser
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:iteron-system", "system:authenticated"}
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
