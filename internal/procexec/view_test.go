package procexec

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/go-json-experiment/json"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"

	"iteron.dev/operator/internal/spawn"
)

type providerView struct {
	Build      string            `json:"build"`
	Argv       []string          `json:"argv"`
	Env        []string          `json:"env"`
	UID        int               `json:"uid"`
	EUID       int               `json:"euid"`
	GID        int               `json:"gid"`
	EGID       int               `json:"egid"`
	Groups     []int             `json:"groups"`
	Cwd        string            `json:"cwd"`
	NoNewPrivs string            `json:"no_new_privs"`
	Caps       map[string]string `json:"caps"`
}

func introspect(t *testing.T, p *Process) providerView {
	t.Helper()
	run, err := p.Start(ctx(t), "introspect", []byte(`{"text":"","introspect":true}`), 5*time.Second)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	o, err := run.Result()
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var v providerView
	if err := json.Unmarshal(o.Observation, &v); err != nil {
		t.Fatalf("view %s: %v", o.Observation, err)
	}
	return v
}

// fdsOf lists /proc/<pid>/fd as number → link target.
func fdsOf(t *testing.T, pid int) map[int]string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		out[n], _ = os.Readlink(filepath.Join(dir, e.Name()))
	}
	return out
}

func TestAProviderSeesAnEmptyEnvironmentLiteralArgvItsCredentialsAndNoPrivilege(t *testing.T) {
	t.Setenv("ITERON_SECRET", "the manager's environment must not leak")
	ex := newExecutor(t)
	argv := []string{"--flag", "$(id)", "a;b", "*", "'single'", `"double"`, "two words", "$HOME", "`uname`", `back\slash`, "new\nline", ""}
	impl := implement(t, artifacts.Stateless, argv...)
	p := launch(t, ex, impl)

	// Right after the start, from the host: fds 0-2 are the pipes, 3 is the
	// sealed memfd, and no other descriptor is one the host holds (a Go
	// provider opens a few of its own at once, the cgroup files among them).
	checkNothingInherited(t, p)
	if _, err := p.Load(ctx(t)); err != nil {
		t.Fatal(err)
	}

	v := introspect(t, p)
	if want := append([]string{impl.Executable}, argv...); !slices.Equal(v.Argv, want) {
		t.Errorf("argv %q, want %q", v.Argv, want)
	}
	if len(v.Env) != 0 {
		t.Errorf("environment %q, want empty", v.Env)
	}
	if v.UID != DefaultProviderID || v.EUID != DefaultProviderID || v.GID != DefaultProviderID || v.EGID != DefaultProviderID || len(v.Groups) != 0 {
		t.Errorf("credentials uid %d euid %d gid %d egid %d groups %v, want 65534 and no groups", v.UID, v.EUID, v.GID, v.EGID, v.Groups)
	}
	if v.NoNewPrivs != "1" {
		t.Errorf("NoNewPrivs %q, want 1", v.NoNewPrivs)
	}
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd"} {
		if set == "CapBnd" && !spawn.BoundingSetEmptied() {
			continue
		}
		if v.Caps[set] != "0000000000000000" {
			t.Errorf("%s = %q, want none", set, v.Caps[set])
		}
	}
	if v.Cwd != impl.ArtifactRoot {
		t.Errorf("cwd %q, want the artifact root %q", v.Cwd, impl.ArtifactRoot)
	}
}

// script lays out a #! script as a protocol-1 provider called "script".
func script(t *testing.T, body string) artifacts.Implementation {
	t.Helper()
	src := filepath.Join(t.TempDir(), "provider.sh")
	if err := os.WriteFile(src, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return providertest.Implement(t, artifacts.Spec{Binary: src, ImplementationID: "script", Module: "prompt_system", Protocol: 1, Version: [3]uint64{1, 0, 0}})
}

// shellProvider answers load (host-1) and stop (host-2) with builtins only:
// it has no PATH.
const shellProvider = `#!/bin/sh
read line
printf '%s\n' '{"protocol":"iteron-implementation/1","request_id":"host-1","implementation_id":"script","module":"prompt_system","payload":{"result":"loaded","provider_contract":{"id":"iteron/prompt.system/provider@v1","version":1},"observation_schema":{"id":"iteron/prompt.system/observation@v1","version":1}}}'
read line
printf '%s\n' '{"protocol":"iteron-implementation/1","request_id":"host-2","implementation_id":"script","module":"prompt_system","payload":{"result":"stopped"}}'
`

func TestAScriptWithAnAllowlistedInterpreterRuns(t *testing.T) {
	ex := newExecutor(t)
	p := launch(t, ex, script(t, shellProvider))
	if p.Interpreter() != "/bin/sh" {
		t.Fatalf("interpreter %q, want /bin/sh", p.Interpreter())
	}
	checkNothingInherited(t, p)
	if _, err := p.Load(ctx(t)); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := p.Stop(ctx(t), "done"); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if td := p.Teardown(); !td.Exit.Success() {
		t.Fatalf("the script ended with %v", td.Exit)
	}
}

func TestAScriptWithAnotherInterpreterIsRefusedBeforeSpawn(t *testing.T) {
	ex := newExecutor(t)
	for _, tc := range []struct{ name, line string }{
		{"an interpreter off the allowlist", "#!/bin/bash\n"},
		{"env looking the interpreter up", "#!/usr/bin/env sh\n"},
		{"a relative interpreter", "#!sh\n"},
		{"an unclean path to an allowed interpreter", "#!/bin/../bin/sh\n"},
		{"a #! line longer than the kernel reads", "#!/bin/sh " + strings.Repeat("x", 300) + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			impl := script(t, tc.line+"exit 0\n")
			before, beforeMem := openFDs(t), memfds(t)
			p, err := ex.Launch(providertest.Plan(t, impl))
			if newMemfds(t, beforeMem) != 0 {
				t.Fatal("the refused script's memfd was kept open")
			}
			f, ok := AsFault(err)
			if p != nil || !ok || f.Kind != KindRefused || f.Op != OpSpawn || f.ReasonCode() != reasons.VerificationFailed {
				t.Fatalf("Launch of %q: %v, %v", tc.line, p, err)
			}
			if len(ex.Live()) != 0 {
				t.Fatal("a process was started")
			}
			sameFDs(t, before)
		})
	}
}

func TestADescendantThatLeftTheGroupIsKilledByTheSubreaper(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.Faulty, "--fault", "escape", "--at", "load"))
	escapee := waitEscapee(t, p)
	p.Close()
	waitGone(t, 5*time.Second, escapee, escapee)
}

// TestCloseReturnsAfterWaitDelayWhileAnEscapeeHoldsBothPipes runs the
// provider as the manager's own uid: the subreaper then cannot tell its
// escaped descendant from the manager's own children and leaves it alone
// (internal/spawn), so the escapee keeps stdout and stderr open after the group
// is gone. Draining them is bounded by WaitDelay, both of them: Close
// returns.
func TestCloseReturnsAfterWaitDelayWhileAnEscapeeHoldsBothPipes(t *testing.T) {
	cfg := DefaultConfig(t.TempDir())
	cfg.ProviderUID, cfg.ProviderGID = uint32(os.Geteuid()), uint32(os.Getegid())
	ex, err := NewExecutor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := loaded(t, ex, implement(t, artifacts.Faulty, "--fault", "escape", "--at", "load", "--hold-pipes"))
	escapee := waitEscapee(t, p)
	closed := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		p.Close()
		closed <- time.Since(t0)
	}()
	bound := ex.Config().WaitDelay + 5*time.Second
	select {
	case took := <-closed:
		t.Logf("Close returned after %v (WaitDelay %v); teardown %+v", took, ex.Config().WaitDelay, p.Teardown())
	case <-time.After(bound):
		syscall.Kill(escapee, syscall.SIGKILL) // closes the pipes, which ends the teardown
		t.Fatalf("Close did not return within %v while escapee %d held stdout and stderr (it returned %v after the escapee was killed)", bound, escapee, <-closed)
	}
	if len(alive(escapee, escapee)) == 0 {
		t.Fatalf("the escapee %d was killed: the bound on draining the pipes was not exercised", escapee)
	}
}

// checkNothingInherited checks, from the host, that the provider's fds 0-2
// are the ends of its pipes, fd 3 the memfd, and that none of its other
// descriptors shares an open file description with one of the host's
// (kcmp(2)): nothing was inherited.
func checkNothingInherited(t *testing.T, p *Process) {
	t.Helper()
	fds := fdsOf(t, p.Pid())
	host := fdsOf(t, os.Getpid())
	pipes := map[int]*os.File{0: p.stdin, 1: p.stdout, 2: p.stderr}
	for fd := 0; fd <= 2; fd++ {
		if want, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(rawFD(pipes[fd]))); fds[fd] != want {
			t.Fatalf("the provider's fd %d is %q, want the other end of the host's %q", fd, fds[fd], want)
		}
	}
	if !strings.HasPrefix(fds[3], "/memfd:iteron-provider") {
		t.Fatalf("fd 3 is %q, want the memfd", fds[3])
	}
	if hfd := rawFD(p.stdin); !sameFile(os.Getpid(), hfd, os.Getpid(), hfd) {
		t.Fatal("kcmp cannot compare descriptors here: the check would prove nothing")
	}
	for fd, target := range fds {
		if fd <= 3 {
			continue
		}
		for hfd := range host {
			if sameFile(p.Pid(), fd, os.Getpid(), hfd) {
				t.Fatalf("the provider's fd %d (%s) is the host's fd %d: inherited", fd, target, hfd)
			}
		}
	}
}

// sameFile reports whether fd1 of pid1 and fd2 of pid2 are one open file
// description.
func sameFile(pid1, fd1, pid2, fd2 int) bool {
	const kcmpFile = 0
	r, _, e := syscall.Syscall6(unix.SYS_KCMP, uintptr(pid1), uintptr(pid2), kcmpFile, uintptr(fd1), uintptr(fd2), 0)
	return e == 0 && r == 0
}

// rawFD returns f's descriptor without Fd's side effect of making it
// blocking (which would disable the executor's deadlines).
func rawFD(f *os.File) int {
	fd := -1
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

func TestAPackageRuntimesPlanIsRefusedBeforeSpawn(t *testing.T) {
	ex := newExecutor(t)
	impl := implement(t, artifacts.CounterV2)
	p, err := ex.Launch(providertest.Plan(t, impl, func(f *verifier.LaunchPlanFields) {
		f.PackageRuntime = &catalog.PackageRuntimeManifest{PackageRevisionID: f.ImplementationID}
	}))
	f, ok := AsFault(err)
	if p != nil || !ok || f.Kind != KindRefused || f.ReasonCode() != reasons.UnsupportedVersion || !strings.Contains(f.Detail, "is a package runtime") {
		t.Fatalf("Launch of a package runtime's plan: %v, %v", p, err)
	}
	if len(ex.Live()) != 0 {
		t.Fatal("a process was started")
	}
}
