package survivor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/verifier"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(benchServerEnv); dir != "" {
		os.Exit(runBenchServer(dir))
	}
	providertest.Main(m)
}

// node is one state dir with a survivor serving it and the manager's lock
// held by the test (as cmd/manager holds it).
type node struct {
	dir    string
	lock   *os.File
	srv    *Server
	served chan error
	log    *testLog
}

// testLog collects a component's log lines for the failure output.
type testLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *testLog) logger(name string) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, time.Now().Format("15:04:05.000")+" "+name+" "+prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: 1})
}

func (l *testLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// shortDir is a directory with a path short enough for unix sockets.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// managerLock takes the manager's state-dir lock, as cmd/manager does.
func managerLock(t testing.TB, dir string) *os.File {
	t.Helper()
	f, err := os.OpenFile(statedir.Dir(dir).Lock(), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	return f
}

func startNode(t testing.TB, edit ...func(*ServerConfig)) *node {
	t.Helper()
	n := &node{dir: shortDir(t), served: make(chan error, 1), log: &testLog{}}
	n.lock = managerLock(t, n.dir)
	cfg := ServerConfig{StateDir: n.dir, GatewaySocket: filepath.Join(n.dir, "gw.sock"), GatewayGroup: -1,
		Executor: procexec.DefaultConfig(filepath.Join(n.dir, "procs")), Log: n.log.logger("survivor")}
	for _, e := range edit {
		e(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.srv = srv
	go func() { n.served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if t.Failed() {
			t.Logf("survivor and client log:\n%s", n.log)
		}
	})
	return n
}

func (n *node) socket() string { return statedir.Dir(n.dir).SurvivorSocket() }

// client attaches a manager's client to the node's survivor.
func (n *node) client(t testing.TB, edit ...func(*ClientConfig)) (*Client, *Attachment) {
	t.Helper()
	cfg := ClientConfig{Socket: n.socket(), Lock: n.lock, Log: n.log.logger("client")}
	for _, e := range edit {
		e(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	att, err := c.Attached(ctx)
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, n.log)
	}
	return c, att
}

// counter lays out counter v2 and returns its plan and sealed executable.
func counter(t testing.TB) (verifier.LaunchPlan, *procexec.Sealed) {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2})
	plan := providertest.Plan(t, impl)
	s, err := procexec.SealExecutable(plan.Executable(), plan.ArtifactSHA256())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return plan, s
}

var tagSeq int

func testTag(module string) Tag {
	tagSeq++
	return Tag{ActivationUID: "uid-test", Module: module, Generation: fmt.Sprintf("g%d", tagSeq), Transaction: fmt.Sprintf("uid-test/%s/g1/a%d", module, tagSeq)}
}

// launchLoaded launches and loads a counter through c.
func launchLoaded(t testing.TB, c *Client, plan verifier.LaunchPlan, exe *procexec.Sealed) *RemoteProcess {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rp, err := c.Launch(ctx, plan, exe, testTag(plan.Module()))
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	if err := rp.Load(ctx); err != nil {
		t.Fatalf("load: %v", err)
	}
	return rp
}

// count runs {"key":key,"add":add} and returns the count it answers.
func count(t testing.TB, rp *RemoteProcess, runID, key string, add int, call *Invocation) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, body, err := rp.Run(ctx, runID, []byte(fmt.Sprintf(`{"key":%q,"add":%d}`, key, add)), 10*time.Second, call, nil)
	if err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
	return countOf(t, body)
}

func countOf(t testing.TB, body []byte) float64 {
	t.Helper()
	var obs struct{ Count float64 }
	if err := json.Unmarshal(body, &obs); err != nil {
		t.Fatalf("observation %q: %v", body, err)
	}
	return obs.Count
}

// rawHello opens a control connection and sends hello with files; it
// returns the connection and the survivor's first answer.
func rawHello(t *testing.T, n *node, hello *header, files ...*os.File) (*conn, *frame) {
	t.Helper()
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: n.socket(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	c := newConn(uc)
	t.Cleanup(func() { c.close() })
	if err := c.write(hello, nil, files...); err != nil {
		t.Fatal(err)
	}
	_ = uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := c.read()
	if err != nil {
		t.Fatalf("no answer to hello: %v", err)
	}
	_ = uc.SetReadDeadline(time.Time{})
	return c, f
}
