package sandbox

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox/cgroups"
)

// hostile lays out the suite's hostile provider in an artifact root of its
// own.
func hostile(tb testing.TB) string {
	tb.Helper()
	return copyExecutable(tb, providertest.Program(tb, "iteron.dev/operator/test/sandbox/hostile"), providertest.Dir(tb))
}

type actResult struct {
	Act    string `json:"act"`
	OK     bool   `json:"ok"`
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

func (r result) act(tb testing.TB) actResult {
	tb.Helper()
	var ar actResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.out)), &ar); err != nil {
		tb.Fatalf("the hostile provider printed %q (stderr %q, %v): %v", r.out, r.errOut, r.exit, err)
	}
	return ar
}

// loopback listens on 127.0.0.1 of the node's network namespace and
// counts the connections that wrote to it.
func loopback(tb testing.TB) (addr string, wrote func() int) {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { lis.Close() })
	got := make(chan struct{}, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				got <- struct{}{}
			}
		}
	}()
	return lis.Addr().String(), func() int {
		time.Sleep(50 * time.Millisecond)
		return len(got)
	}
}

func TestAProviderIsRefusedWhatItWasNotAdmittedAndGetsWhatItWas(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce})
	exe := hostile(t)
	addr, wrote := loopback(t)
	const (
		code     = catalog.CapabilityCodeExecuting
		external = catalog.CapabilityIrreversibleExternal
		local    = catalog.CapabilityReversibleLocal
		readOnly = catalog.CapabilityReadOnly
	)
	for _, c := range []struct {
		name     string
		act, arg string
		caps     []string
		ok       bool
		errHas   string
	}{
		{"it sees only its own processes", "procs", "", nil, true, ""},
		{"loopback is unreachable without irreversible_external", "connect", addr, []string{readOnly}, false, "connect"},
		{"loopback is reachable with irreversible_external", "connect", addr, []string{external}, true, ""},
		{"the node's system files are readable", "read", "/etc/passwd", nil, true, ""},
		{"the state directory is not in its view", "list", "/var/lib/iteron", nil, false, "no such file"},
		{"service-account tokens are not in its view", "list", "/var/run/secrets", nil, false, "no such file"},
		{"the root is read-only", "write", "/x", nil, false, "read-only file system"},
		{"its artifact root is read-only", "write", filepath.Join(filepath.Dir(exe), "x"), nil, false, "read-only file system"},
		{"its /tmp is writable", "write", "/tmp/x", nil, true, ""},
		{"the scratch directory is absent without reversible_local", "write", "/scratch/x", []string{readOnly}, false, "no such file"},
		{"the scratch directory is writable with reversible_local", "write", "/scratch/x", []string{local}, true, ""},
		{"/bin/sh cannot be executed without code_executing", "exec", "/bin/sh", []string{readOnly, local, external}, false, "permission denied"},
		{"/bin/sh can be executed with code_executing", "exec", "/bin/sh", []string{code}, true, ""},
		{"a memfd it wrote cannot be executed without code_executing", "exec-memfd", "", nil, false, "permission denied"},
		{"a memfd it wrote can be executed with code_executing", "exec-memfd", "", []string{code}, true, ""},
		{"a file it wrote cannot be executed without code_executing", "exec-written", "/tmp/h", nil, false, "permission denied"},
		{"a file it wrote can be executed with code_executing", "exec-written", "/tmp/h", []string{code}, true, ""},
		{"it cannot ptrace", "ptrace", "1", []string{code, external, local}, false, "operation not permitted"},
		{"it cannot signal a process outside its namespace", "signal", strconv.Itoa(os.Getpid()), []string{code, external, local}, false, ""},
		{"it cannot mount", "mount", "", []string{code, external, local}, false, "operation not permitted"},
		{"it cannot unshare", "unshare", "", []string{code, external, local}, false, "operation not permitted"},
		{"it cannot use keyctl", "keyctl", "", []string{code, external, local}, false, "operation not permitted"},
		{"it cannot use bpf", "bpf", "", []string{code, external, local}, false, "operation not permitted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := wrote()
			r := run(t, sb, exe, c.caps, Request{}, "", c.act, c.arg)
			ar := r.act(t)
			if ar.OK != c.ok || !strings.Contains(ar.Error, c.errHas) {
				t.Errorf("%s %s with %v: %+v; want ok=%v and an error containing %q", c.act, c.arg, c.caps, ar, c.ok, c.errHas)
			}
			if c.act == "procs" && ar.Detail != "2" {
				t.Errorf("it sees %s processes; want 2 (the launcher, init of its namespace, and itself)", ar.Detail)
			}
			if c.act == "connect" && (wrote()-before > 0) != c.ok {
				t.Errorf("the listener got %d writes; want them only when the connect is allowed", wrote()-before)
			}
			if !r.exit.Success() {
				t.Errorf("the provider ended with %v", r.exit)
			}
		})
	}
	noGroupsLeft(t, sb)
}

func TestTheBoundsStopAMemoryHogAForkBombAndACPUSpinner(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce})
	exe := hostile(t)
	t.Run("a memory hog is killed and reported with a reason of its own", func(t *testing.T) {
		r := run(t, sb, exe, nil, Request{Limits: Limits{MemoryBytes: 64 << 20}}, "", "memhog")
		if r.exit.Exited || r.exit.Signal != syscall.SIGKILL || r.reason != reasons.MemoryExceeded {
			t.Errorf("the hog ended with %v, reason %q; want killed by SIGKILL with %s (out %q)", r.exit, r.reason, reasons.MemoryExceeded, r.out)
		}
	})
	t.Run("a fork bomb stops at its tasks bound", func(t *testing.T) {
		r := run(t, sb, exe, nil, Request{Limits: Limits{Tasks: 48}}, "", "forkbomb", "1s")
		ar := r.act(t)
		n, _ := strconv.Atoi(ar.Detail)
		if !ar.OK || n < 10 || n > 48 {
			t.Errorf("the bomb reports %+v; want between 10 and 48 processes in its namespace", ar)
		}
		if r.tasksRefused == 0 {
			t.Errorf("the pids bound refused no fork")
		}
	})
	t.Run("a CPU spinner is throttled", func(t *testing.T) {
		r := run(t, sb, exe, nil, Request{Limits: Limits{CPUMillis: 200}}, "", "spin", "1s")
		ar := r.act(t)
		ratio, _ := strconv.ParseFloat(ar.Detail, 64)
		if ratio > 0.3 {
			t.Errorf("the spinner got %.2f CPU per second of wall time under a bound of 0.2", ratio)
		}
		if r.throttled == 0 {
			t.Errorf("the CFS bound throttled nothing")
		}
	})
	t.Run("writing /tmp beyond its bound fails", func(t *testing.T) {
		r := run(t, sb, exe, nil, Request{Limits: Limits{TmpBytes: 4 << 20}}, "", "fill", "/tmp/big")
		ar := r.act(t)
		n, _ := strconv.Atoi(ar.Detail)
		if ar.OK || !strings.Contains(ar.Error, "no space left") || n > 4<<20 {
			t.Errorf("filling /tmp: %+v; want ENOSPC at 4 MiB at most", ar)
		}
	})
	noGroupsLeft(t, sb)
}

func TestAProvidersCPUBoundHasAStartPeriodAndThenTheSteadyOne(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce})
	exe := hostile(t)
	// The CFS files of the group's CPU hierarchy, as "quota period".
	cpuBound := func(l *Launch) string {
		for _, dir := range l.Group().Dirs() {
			if b, err := os.ReadFile(filepath.Join(dir, "cpu.max")); err == nil {
				return strings.TrimSpace(string(b))
			}
			q, qerr := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
			p, perr := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
			if qerr == nil && perr == nil {
				return strings.TrimSpace(string(q)) + " " + strings.TrimSpace(string(p))
			}
		}
		return "no cpu hierarchy"
	}
	var atStart, settled string
	r := runWith(t, sb, exe, opts{req: Request{Limits: Limits{CPUMillis: 200}}, argv: []string{"spin", "1s"}, while: func(l *Launch, _ int) {
		atStart = cpuBound(l)
		time.Sleep(cgroups.StartPeriod + 100*time.Millisecond)
		settled = cpuBound(l)
	}})
	if atStart != "20000 100000" || settled != "2000 10000" {
		t.Errorf("a 200m bound read %q at the start and %q after %v; want 20000 100000 (the start period), then 2000 10000", atStart, settled, cgroups.StartPeriod+100*time.Millisecond)
	}
	ar := r.act(t)
	if ratio, _ := strconv.ParseFloat(ar.Detail, 64); ratio > 0.3 || r.throttled == 0 {
		t.Errorf("the spinner got %.2f CPU per second of wall time (throttled %d times) under a bound of 0.2", ratio, r.throttled)
	}
	noGroupsLeft(t, sb)
}

func TestAuditModeAppliesTheBoundsAndCountsWhatEnforceWouldRefuse(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeAudit})
	exe := hostile(t)
	addr, wrote := loopback(t)
	r := run(t, sb, exe, []string{catalog.CapabilityReadOnly}, Request{}, "", "connect", addr)
	if ar := r.act(t); !ar.OK || wrote() != 1 {
		t.Errorf("audit refused the connect: %+v", ar)
	}
	if v := r.launch.Violations(); v["socket"] < 1 {
		t.Errorf("violations %v; want the internet socket counted", v)
	}
	r = run(t, sb, exe, nil, Request{}, "", "exec", "/bin/sh")
	if ar := r.act(t); !ar.OK || ar.Detail != "ran" {
		t.Errorf("audit refused the exec: %+v", ar)
	}
	if v := r.launch.Violations(); v["execve"] < 1 {
		t.Errorf("violations %v; want the exec counted (and not the launch's own)", v)
	}
	r = run(t, sb, exe, nil, Request{}, "", "keyctl")
	if v := r.launch.Violations(); v["keyctl"] != 1 {
		t.Errorf("violations %v; want keyctl counted once", v)
	}
	ev := r.launch.Evidence()
	if ev.Mode != ModeAudit || ev.Level != LevelLimits || len(ev.Namespaces) != 0 || ev.Limits.MemoryBytes != DefaultMemoryBytes {
		t.Errorf("audit evidence %s", ev)
	}
	r = run(t, sb, exe, nil, Request{}, "", "ok")
	if v := r.launch.Violations(); len(v) != 0 {
		t.Errorf("a provider that does nothing forbidden has violations %v", v)
	}
	noGroupsLeft(t, sb)
}

func TestAuditCountsEachViolationOnceWhileSignalsInterruptIt(t *testing.T) {
	// A signal that lands while an audited syscall waits for the launcher's
	// answer (a Go provider's threads get SIGURG whenever its runtime
	// preempts them) could make the kernel restart the syscall after the
	// launcher's answer, which notified it again (the listener now waits
	// killable once it received a notification): each of the provider's
	// sockets counts once.
	sb := newSandbox(t, Policy{Mode: ModeAudit})
	exe := hostile(t)
	const n = 300
	stop := make(chan struct{})
	var signals atomic.Int64
	r := runWith(t, sb, exe, opts{caps: []string{catalog.CapabilityReadOnly}, stdin: "go\n", argv: []string{"sockets", strconv.Itoa(n), "after-a-line"}, while: func(l *Launch, leader int) {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// SIGURG: the Go runtime's own preemption signal, which a Go
				// process takes without effect.
				unix.Kill(-leader, unix.SIGURG)
				signals.Add(1)
				time.Sleep(20 * time.Microsecond)
			}
		}()
	}})
	close(stop)
	if ar := r.act(t); !ar.OK {
		t.Fatalf("the provider answered %+v", ar)
	}
	if signals.Load() == 0 {
		t.Fatal("no signal reached the group while it ran: the test shows nothing")
	}
	if v := r.launch.Violations(); v["socket"] != n {
		t.Errorf("violations %v after %d SIGURGs to the group; want socket counted %d times, once per socket", v, signals.Load(), n)
	} else {
		t.Logf("%d sockets counted %d times with %d SIGURGs sent to the group meanwhile", n, v["socket"], signals.Load())
	}
	noGroupsLeft(t, sb)
}

func TestALaunchTheNodeCannotGiveIsRefusedAndLeavesNothing(t *testing.T) {
	audit := newSandbox(t, Policy{Mode: ModeAudit})
	exe := hostile(t)
	for _, c := range []struct {
		name  string
		sb    *Sandbox
		req   Request
		field string
	}{
		{"a required level above the node's", audit, Request{Require: LevelIsolated}, "sandbox.require"},
		{"memory above the node's ceiling", audit, Request{Limits: Limits{MemoryBytes: DefaultMaxMemoryBytes + 1}}, "sandbox.memory"},
		{"tasks above the node's ceiling", audit, Request{Limits: Limits{Tasks: DefaultMaxTasks + 1}}, "sandbox.tasks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, err := c.sb.Spawn(Start{Name: "t", Request: c.req, ArtifactRoot: filepath.Dir(exe), Argv: []string{exe}}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{}}, 65534)
			var se *Error
			if !errors.As(err, &se) || se.Field != c.field {
				t.Fatalf("Spawn: %v; want a refusal naming %s", err, c.field)
			}
			t.Log(err)
			noGroupsLeft(t, c.sb)
		})
	}
}

func TestALauncherThatCannotBuildTheSandboxReportsWhyAndLeavesNothing(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce, ReadOnlyPaths: []string{"/usr"}})
	exe := hostile(t)
	gone := filepath.Join(filepath.Dir(exe), "gone")
	os.Mkdir(gone, 0o755)
	sealedExe := exe
	// The artifact root disappears between the plan and the launch.
	os.Remove(gone)
	_, _, _, err := sb.Spawn(Start{Name: "t", ArtifactRoot: gone, Argv: []string{sealedExe}}, &syscall.ProcAttr{
		Files: []uintptr{0, 1, 2, 0}, Sys: &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}},
	}, 65534)
	if err == nil || !strings.Contains(err.Error(), gone) {
		t.Fatalf("Spawn: %v; want the launcher's reason, naming %s", err, gone)
	}
	noGroupsLeft(t, sb)
}

func TestTheLauncherJoinsItsV1AndV2Groups(t *testing.T) {
	// This machine's cgroups are hybrid: the controllers are on v1 and the
	// v2 hierarchy has none. The layout under test has both: the v1
	// hierarchies of a guard cgroup (which bound the provider) and a v2
	// cgroup the test made on a cgroup2 mount of its own (which the
	// launcher joins as well).
	v1 := guard(t)
	mnt := t.TempDir()
	if err := syscall.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		t.Skipf("cannot mount cgroup2: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, 0) })
	v2 := filepath.Join(mnt, "iteron-test-v2-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(v2, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Rmdir(v2) })
	layout := &cgroups.Layout{Hierarchies: append(v1.Hierarchies, cgroups.Hierarchy{Version: 2, Dir: v2})}
	sb, err := New(Config{Policy: Policy{Mode: ModeEnforce}, Launcher: providertest.SandboxLauncher(t), Cgroups: layout})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	exe := script(t, "read x\necho done\n")
	r := runWith(t, sb, exe, opts{stdin: "go\n", while: func(l *Launch, leader int) {
		for i, dir := range l.Group().Dirs() {
			procs := func(d string) []string {
				b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				return strings.Fields(string(b))
			}
			group, child := procs(dir), procs(filepath.Join(dir, "provider"))
			all := append(slices.Clone(group), child...)
			slices.Sort(all)
			all = slices.Compact(all)
			if !slices.Contains(group, strconv.Itoa(leader)) || len(all) != 2 {
				t.Errorf("hierarchy %d (%s) holds %v and %v in its provider child; want the launcher %d and the provider", i, dir, group, child, leader)
			}
			// v1 lists a process in each cgroup one of its threads is in: the
			// launcher's starting thread may not have ended yet.
			if strings.Contains(dir, "/pids/") && !slices.ContainsFunc(child, func(p string) bool { return p != strconv.Itoa(leader) }) {
				t.Errorf("the pids hierarchy's provider child holds %v; want the provider in it", child)
			}
		}
	}})
	if strings.TrimSpace(r.out) != "done" || !r.exit.Success() {
		t.Errorf("the provider wrote %q and ended with %v (stderr %q)", r.out, r.exit, r.errOut)
	}
	noGroupsLeft(t, sb)
}

func TestSIGTERMReachesTheProviderAndWhatItLeftDiesWithIt(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce})
	// The shell leaves a background subshell that outlives it; SIGTERM's
	// default effect ends the shell (not PID 1 of its namespace: the
	// launcher is, and forwards it).
	exe := script(t, "( while :; do :; done ) &\necho started\nwhile :; do read x || true; done\n")
	r := runWith(t, sb, exe, opts{stdin: "", while: func(l *Launch, leader int) {
		time.Sleep(300 * time.Millisecond)
		syscall.Kill(leader, syscall.SIGTERM)
	}})
	if r.exit.Exited || r.exit.Signal != syscall.SIGTERM {
		t.Errorf("the provider ended with %v; want killed by SIGTERM", r.exit)
	}
	noGroupsLeft(t, sb)
}

// TestAfterALaunchThePoolHoldsTwoReadyLaunchersAndTheNextLaunchTakesOne
// launches one provider into a sandbox with no launcher ready: the launch
// starts its own, and the pool then fills to its size (it used to start one
// per launch and stay a launcher short for good).
func TestAfterALaunchThePoolHoldsTwoReadyLaunchersAndTheNextLaunchTakesOne(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce})
	exe := hostile(t)
	first := run(t, sb, exe, nil, Request{}, "", "ok")
	if !first.act(t).OK {
		t.Fatalf("the first provider: %+v", first)
	}
	if !sb.AwaitReady(20 * time.Second) {
		t.Fatalf("20 s after a launch the pool holds %d ready launchers; want %d", len(sb.readyGroups()), poolSize)
	}
	ready := sb.readyGroups()
	second := run(t, sb, exe, nil, Request{}, "", "ok")
	if !second.act(t).OK {
		t.Fatalf("the second provider: %+v", second)
	}
	took := false
	for _, s := range second.launch.Steps() {
		took = took || strings.HasPrefix(s.Name, "host: take a ready launcher")
	}
	t.Logf("ready after the first launch: %v; the second launch took a ready one: %v", ready, took)
	if !took {
		t.Errorf("the second launch started its own launcher while %d were ready", len(ready))
	}
	if !sb.AwaitReady(20 * time.Second) {
		t.Errorf("after the second launch the pool holds %d ready launchers; want %d", len(sb.readyGroups()), poolSize)
	}
	// Ready means prepared: the launcher runs inside its cgroup already
	// (it joins it first thing after its runtime starts), so a launch
	// never shares the CPU with a launcher's own start.
	sb.mu.Lock()
	for _, l := range sb.ready {
		for _, procs := range l.group.Procs() {
			if b, err := os.ReadFile(procs); err != nil || len(strings.Fields(string(b))) == 0 {
				t.Errorf("a ready launcher (pid %d) is not in %s yet (%q, %v): it was counted ready before it prepared", l.g.PID, procs, b, err)
			}
		}
	}
	sb.mu.Unlock()
	noGroupsLeft(t, sb)
}
