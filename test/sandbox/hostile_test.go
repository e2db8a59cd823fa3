package sandbox_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/test/operatortest"
)

// full runs the whole table (make test-sandbox); without it only the
// subset marked quick runs (make test).
var full = os.Getenv("ITERON_SANDBOX_FULL") != ""

// row is one thing a hostile provider tries.
type row struct {
	name      string
	act       string
	arg       func(*env) string
	denied    variant // admitted this, it is refused or contained
	allowed   *variant
	errHas    string
	quick     bool
	sameWrite bool // allowed means the listener saw the bytes
}

// env is what the rows aim at.
type env struct {
	loopback, netns *listener
	artifactRoot    string
	token           string
	neighbourPid    int
}

func TestAHostileProviderIsRefusedWhatItWasNotAdmittedAndGetsWhatItWas(t *testing.T) {
	e := &env{loopback: loopbackListener(t)}
	if full {
		e.netns = netnsListener(t)
	}
	// A service-account token as the pods have one, readable by anyone:
	// the provider's uid could read it without the sandbox.
	tokenDir := filepath.Join(suite.Base, "serviceaccount")
	os.MkdirAll(tokenDir, 0o755)
	e.token = filepath.Join(tokenDir, "token")
	os.WriteFile(e.token, []byte("eyJhbGciOi.secret"), 0o644)

	deployments := map[string]deployed{}
	dep := func(v variant) deployed {
		if d, ok := deployments[v.name]; ok {
			return d
		}
		d := deploy(t, v, &iteronv1.SourceSandbox{Require: iteronv1.SandboxLevelIsolated})
		deployments[v.name] = d
		return d
	}
	neighbour := dep(variant{"neighbour", none.caps})
	e.neighbourPid = int(neighbour.gen.Status.Pid)
	// What its sandbox applied: the ledger's note (TestAForkBomb…), its
	// Generation's status and the doctor.
	if text := doctorText(t, neighbour.act); !strings.Contains(text, "prompt_system: "+neighbour.gen.Name+": mode=enforce level=isolated ns=cgroup,ipc,mnt,net,pid,uts network=none exec=no") {
		t.Errorf("the doctor does not show the neighbour's sandbox:\n%s", text)
	} else {
		t.Logf("kubectl iteron doctor: %s", strings.TrimSpace(grepLines(text, neighbour.gen.Name+": mode=")))
	}
	e.artifactRoot = neighbour.gen.Spec.Implementation.ArtifactRoot
	ledgers := filepath.Join(suite.StateDir, "ledgers")

	rows := []row{
		{name: "connect to loopback", act: "connect", arg: func(e *env) string { return e.loopback.addr }, denied: none, allowed: &external, errHas: "connect", quick: true, sameWrite: true},
		{name: "connect to a listener in a network namespace the test made", act: "connect", arg: func(e *env) string {
			if e.netns == nil {
				return ""
			}
			return e.netns.addr
		}, denied: none, allowed: &external, errHas: "connect", sameWrite: true},
		{name: "read the state directory", act: "list", arg: func(*env) string { return suite.StateDir }, denied: all, errHas: "no such file", quick: true},
		{name: "read a ledger", act: "list", arg: func(*env) string { return ledgers }, denied: all, errHas: "no such file"},
		{name: "read a service-account token", act: "read", arg: func(e *env) string { return e.token }, denied: all, errHas: "no such file", quick: true},
		{name: "write into its artifact root", act: "write", arg: func(*env) string { return filepath.Join(dep(all).gen.Spec.Implementation.ArtifactRoot, "x") }, denied: all, errHas: "read-only file system", quick: true},
		{name: "read another provider's files", act: "list", arg: func(e *env) string { return e.artifactRoot }, denied: all, errHas: "no such file"},
		{name: "write into /", act: "write", arg: func(*env) string { return "/x" }, denied: all, errHas: "read-only file system"},
		{name: "write /tmp beyond its bound", act: "fill", arg: func(*env) string { return "/tmp/fill" }, denied: all, errHas: "no space left on device"},
		{name: "write its scratch directory", act: "write", arg: func(*env) string { return "/scratch/x" }, denied: none, allowed: &local, errHas: "no such file"},
		{name: "exec /bin/sh", act: "exec", arg: func(*env) string { return "/bin/sh" }, denied: none, allowed: &execV, errHas: "permission denied", quick: true},
		{name: "exec a memfd it wrote", act: "exec-memfd", arg: func(*env) string { return "" }, denied: none, allowed: &execV, errHas: "permission denied"},
		{name: "exec a file it wrote", act: "exec-written", arg: func(*env) string { return "/tmp/h" }, denied: none, allowed: &execV, errHas: "permission denied"},
		{name: "ptrace a sibling", act: "ptrace", arg: func(e *env) string { return strconv.Itoa(e.neighbourPid) }, denied: all, errHas: "operation not permitted", quick: true},
		{name: "signal another provider", act: "signal", arg: func(e *env) string { return strconv.Itoa(e.neighbourPid) }, denied: all, errHas: "no such process", quick: true},
		{name: "mount", act: "mount", arg: func(*env) string { return "" }, denied: all, errHas: "operation not permitted"},
		{name: "unshare", act: "unshare", arg: func(*env) string { return "" }, denied: all, errHas: "operation not permitted", quick: true},
		{name: "keyctl", act: "keyctl", arg: func(*env) string { return "" }, denied: all, errHas: "operation not permitted"},
		{name: "bpf", act: "bpf", arg: func(*env) string { return "" }, denied: all, errHas: "operation not permitted"},
	}
	var table []string
	for _, r := range rows {
		if !full && !r.quick {
			continue
		}
		arg := r.arg(e)
		if arg == "" && (r.act == "connect") {
			continue
		}
		t.Run(r.name, func(t *testing.T) {
			var before int64
			if r.sameWrite {
				before = writes(e, arg)
			}
			a := call(t, dep(r.denied), r.act, arg, 30*time.Second)
			outcome := "refused: " + a.Error
			if a.OK || !strings.Contains(a.Error, r.errHas) || a.Reason != "" {
				t.Errorf("admitted %s, %s %s: %+v; want refused with %q", r.denied.name, r.act, arg, a, r.errHas)
				outcome = fmt.Sprintf("NOT REFUSED: %+v", a)
			}
			if r.sameWrite && writes(e, arg) != before {
				t.Errorf("the listener got bytes from a provider that was refused")
			}
			allowedOutcome := "— (no capability allows it)"
			if r.allowed != nil {
				before = writes(e, arg)
				b := call(t, dep(*r.allowed), r.act, arg, 30*time.Second)
				allowedOutcome = "allowed"
				if !b.OK {
					t.Errorf("admitted %s, %s %s: %+v; want it allowed", r.allowed.name, r.act, arg, b)
					allowedOutcome = "NOT ALLOWED: " + b.Error
				}
				if r.sameWrite && writes(e, arg) != before+1 {
					t.Errorf("the listener did not get the bytes of the allowed connect")
				}
				allowedOutcome += " (" + r.allowed.name + ")"
			}
			table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", r.name, r.denied.name, outcome, allowedOutcome))
		})
	}
	// The neighbour served throughout.
	if a := call(t, neighbour, "ok", "", 10*time.Second); !a.OK {
		t.Errorf("the neighbour no longer answers: %+v", a)
	}
	t.Logf("\n| row | admitted | refused or contained | with the capability that allows it |\n|---|---|---|---|\n%s", strings.Join(table, "\n"))
	// What is left once they are gone: nothing.
	pids := map[string]int{}
	for n, d := range deployments {
		pids[n] = int(d.gen.Status.Pid)
	}
	for _, d := range deployments {
		deleteNow(t, d)
	}
	nothingLeft(t, pids)
}

// writes is how many connections wrote to the listener at addr.
func writes(e *env, addr string) int64 {
	for _, l := range []*listener{e.loopback, e.netns} {
		if l != nil && l.addr == addr {
			time.Sleep(50 * time.Millisecond)
			return l.wrote.Load()
		}
	}
	return 0
}

// deleteNow deletes d's activation and waits for it to be gone.
func deleteNow(t *testing.T, d deployed) {
	t.Helper()
	operatortest.DeleteAndWait(t, suite.Env.Client, d.act)
}

// nothingLeft checks that the providers' process groups are gone, that no
// provider cgroup is left in the manager's tree, and that no scratch
// directory is left.
func nothingLeft(t *testing.T, leaders map[string]int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for name, pid := range leaders {
		for {
			members, _ := spawn.GroupMembers(pid)
			if len(members) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("the group of %s (%d) still holds %d processes", name, pid, len(members))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if c := suite.Manager.App.Sandbox(); c != nil {
		for _, dir := range c.Tree {
			for {
				entries, _ := os.ReadDir(dir)
				left := 0
				for _, en := range entries {
					// The launchers started ahead of their launch have theirs.
					if en.IsDir() && !slices.Contains(suite.Manager.App.Sandbox().Ready, en.Name()) {
						left++
					}
				}
				if left == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%d provider cgroups are left in %s", left, dir)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(suite.StateDir, "scratch")); len(entries) != 0 {
		t.Errorf("scratch directories left: %d", len(entries))
	}
	if !t.Failed() {
		t.Logf("left once they are gone: no process in the group of any of the %d providers, no provider cgroup, no scratch directory", len(leaders))
	}
}
