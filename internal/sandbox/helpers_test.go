package sandbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/sandbox/cgroups"
	"iteron.dev/operator/internal/spawn"
)

func TestMain(m *testing.M) { providertest.Main(m) }

// guard makes a cgroup of the test's own below this process's cgroups, with
// bounds no sandbox bug can get past (memory, tasks), and returns the
// layout whose trees go below it. It is removed after the test.
func guard(tb testing.TB) *cgroups.Layout {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (cgroups, namespaces)")
	}
	own, err := cgroups.Detect()
	if err != nil {
		tb.Fatal(err)
	}
	if missing := own.Missing(); len(missing) > 0 {
		tb.Skipf("this machine's cgroups lack %v", missing)
	}
	l, remove, err := own.Below("iteron-test-guard-"+strconv.Itoa(os.Getpid()), filepathSafe(tb.Name()), cgroups.Limits{MemoryBytes: 2 << 30, Tasks: 2048})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := remove(); err != nil {
			tb.Errorf("removing the guard cgroup: %v", err)
		}
	})
	return l
}

func filepathSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '/' || c == ' ' {
			b[i] = '_'
		}
	}
	return string(b)
}

// newSandbox makes a Sandbox with the launcher built for the tests, below a
// guard cgroup.
func newSandbox(tb testing.TB, p Policy) *Sandbox {
	tb.Helper()
	sb, err := New(Config{Policy: p, Launcher: providertest.SandboxLauncher(tb), Cgroups: guard(tb), ScratchDir: providertest.Dir(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sb.Close() })
	return sb
}

// result is what a provider run by run did.
type result struct {
	out, errOut string
	exit        spawn.Exit
	reason      string
	launch      *Launch
	// tasksRefused and throttled are its cgroup's counters, read before
	// the cgroup was removed.
	tasksRefused, throttled int64
}

// opts are run's options.
type opts struct {
	caps  []string
	req   Request
	stdin string
	argv  []string
	// while runs once the provider started, before its stdin is written.
	while func(l *Launch, leader int)
}

// run starts the executable at exe (in its own artifact root) in sb with
// caps and req, feeds it stdin, and returns what it wrote and how it ended.
// Nothing of it is left when run returns.
func run(tb testing.TB, sb *Sandbox, exe string, caps []string, req Request, stdin string, argv ...string) result {
	tb.Helper()
	return runWith(tb, sb, exe, opts{caps: caps, req: req, stdin: stdin, argv: argv})
}

func runWith(tb testing.TB, sb *Sandbox, exe string, o opts) result {
	tb.Helper()
	caps, req, stdin, argv := o.caps, o.req, o.stdin, o.argv
	want, err := digest(exe)
	if err != nil {
		tb.Fatal(err)
	}
	sealed, err := spawn.SealExecutable(exe, want)
	if err != nil {
		tb.Fatal(err)
	}
	defer sealed.Close()
	interp, serr := spawn.CheckInterpreter(sealed.Head(), []string{"/bin/sh"})
	if serr != nil {
		tb.Fatal(serr)
	}
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	attr := &syscall.ProcAttr{
		Dir: filepath.Dir(exe), Env: []string{},
		Files: []uintptr{inR.Fd(), outW.Fd(), errW.Fd(), sealed.File().Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}},
	}
	st := Start{Name: "t", Capabilities: caps, Request: req, ArtifactRoot: filepath.Dir(exe), Exe: sealed.File(), Interpreter: interp,
		Scratch: "act/gen", Argv: append([]string{exe}, argv...)}
	g, pidfd, l, err := sb.Spawn(st, attr, 65534)
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		tb.Fatalf("Spawn: %v", err)
	}
	if o.while != nil {
		o.while(l, g.PID)
	}
	go func() {
		io.WriteString(inW, stdin)
		inW.Close()
	}()
	var out, errOut bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errOut, errR); close(done) }()
	io.Copy(&out, outR)
	outR.Close()
	exited := make(chan struct{})
	go func() {
		spawn.WaitPidfd(pidfd, unix.WEXITED|unix.WNOWAIT)
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		tb.Errorf("the provider did not exit within 60s")
	}
	pf := os.NewFile(uintptr(pidfd), "pidfd")
	exit, unreaped := spawn.KillGroup(g, pf, exited, 5*time.Second)
	pf.Close()
	if len(unreaped) > 0 {
		tb.Errorf("unreaped after the kill: %v", unreaped)
	}
	<-done
	errR.Close()
	var refused, throttled int64
	if g := l.Group(); g != nil {
		refused, throttled = g.TasksRefused(), g.Throttled()
	}
	exit, reason := l.Finish(exit)
	return result{out: out.String(), errOut: errOut.String(), exit: exit, reason: reason, launch: l, tasksRefused: refused, throttled: throttled}
}

func digest(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// script writes a #!/bin/sh provider into a fresh artifact root.
func script(tb testing.TB, body string) string {
	tb.Helper()
	dir := providertest.Dir(tb)
	p := filepath.Join(dir, "provider.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		tb.Fatal(err)
	}
	return p
}

// copyExecutable copies the executable src into dir and returns its path.
func copyExecutable(tb testing.TB, src, dir string) string {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(p, b, 0o755); err != nil {
		tb.Fatal(err)
	}
	return p
}

// noGroupsLeft fails unless sb's cgroup tree holds no group.
func noGroupsLeft(tb testing.TB, sb *Sandbox) {
	tb.Helper()
	// A launcher the pool is starting has its group before it is ready
	// (it is counted once it has prepared): wait until none is starting.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		sb.mu.Lock()
		filling := sb.filling
		sb.mu.Unlock()
		if filling == 0 {
			break
		}
	}
	c := sb.Capacity()
	for _, dir := range c.Tree {
		entries, err := os.ReadDir(dir)
		if err != nil {
			tb.Errorf("reading the tree %s: %v", dir, err)
			continue
		}
		for _, e := range entries {
			if e.IsDir() && !slices.Contains(c.Ready, e.Name()) {
				tb.Errorf("a provider's cgroup was left: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
}
