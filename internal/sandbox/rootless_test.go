package sandbox

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"iteron.dev/operator/examples/providers/providertest"
)

// The rootless test runs this test binary again as uid 65534 (the
// conformance tool's case without root): the child builds a Sandbox of its
// own, which has no cgroups and puts its launchers in user namespaces.
const rootlessChildEnv = "ITERON_SANDBOX_ROOTLESS_CHILD"

// rootlessCase is one act of the hostile provider the child runs, and what
// it found.
type rootlessCase struct {
	Name, Act, Arg string
	Caps           []string
	OK             bool
	ErrHas         string
	Got            actResult
	Exit           string
}

type rootlessReport struct {
	Capacity Capacity
	Evidence string
	Cases    []rootlessCase
}

func TestWithoutRootTheLauncherUsesAUserNamespaceAndStillConfinesExecAndNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs itself as uid 65534: needs root")
	}
	dir := providertest.Dir(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := copyExecutable(t, self, dir)
	launcher := copyExecutable(t, providertest.SandboxLauncher(t), providertest.Dir(t))
	exe := hostile(t)
	addr, wrote := loopback(t)
	cases := []rootlessCase{
		{Name: "it sees only its own processes", Act: "procs", OK: true},
		{Name: "loopback is unreachable without irreversible_external", Act: "connect", Arg: addr, OK: false, ErrHas: "connect"},
		{Name: "the root is read-only", Act: "write", Arg: "/x", OK: false, ErrHas: "read-only file system"},
		{Name: "its /tmp is writable", Act: "write", Arg: "/tmp/x", OK: true},
		{Name: "/bin/sh cannot be executed without code_executing", Act: "exec", Arg: "/bin/sh", OK: false, ErrHas: "permission denied"},
		{Name: "it cannot mount", Act: "mount", OK: false, ErrHas: "operation not permitted"},
		// What a rootless sandbox cannot do (Capacity.Rootless): raise
		// vm.memfd_noexec, which only the node's root may write.
		{Name: "a memfd it wrote stays executable", Act: "exec-memfd", OK: true},
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(child, "-test.run=^TestRootlessChild$", "-test.count=1")
	cmd.Env = []string{rootlessChildEnv + "=" + string(in), "ITERON_ROOTLESS_LAUNCHER=" + launcher, "ITERON_ROOTLESS_EXE=" + exe,
		"PATH=/usr/bin:/bin", "TMPDIR=" + providertest.Dir(t)}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	i := strings.Index(string(out), "ROOTLESS-REPORT ")
	if err != nil || i < 0 {
		t.Fatalf("the rootless child: %v\n%s", err, out)
	}
	var rep rootlessReport
	line, _, _ := strings.Cut(string(out[i+len("ROOTLESS-REPORT "):]), "\n")
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Capacity.Rootless || rep.Capacity.Level != LevelNone || rep.Capacity.Cgroups != "unavailable" {
		t.Errorf("capacity without root: %+v; want rootless, level none, no cgroups", rep.Capacity)
	}
	if rep.Capacity.Landlock == 0 {
		t.Errorf("no Landlock without root; the kernel has it")
	}
	ev, err := ParseEvidence(rep.Evidence)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(ev.Namespaces, ","), "user") || ev.Seccomp == "off" || ev.Network != NetworkNone {
		t.Errorf("evidence without root: %s; want a user namespace, seccomp, no network", rep.Evidence)
	}
	t.Logf("rootless evidence: %s", rep.Evidence)
	for _, c := range rep.Cases {
		if c.Got.OK != c.OK || !strings.Contains(c.Got.Error, c.ErrHas) {
			t.Errorf("%s: %s %s: %+v (exit %s); want ok=%v and an error containing %q", c.Name, c.Act, c.Arg, c.Got, c.Exit, c.OK, c.ErrHas)
		}
		if c.Act == "procs" && c.Got.Detail != "2" {
			t.Errorf("%s: it sees %s processes; want 2", c.Name, c.Got.Detail)
		}
	}
	if n := wrote(); n != 0 {
		t.Errorf("the node's loopback listener got %d writes from a rootless provider", n)
	}
}

// TestRootlessChild is the child of the test above; it does nothing unless
// that test started it.
func TestRootlessChild(t *testing.T) {
	in := os.Getenv(rootlessChildEnv)
	if in == "" {
		t.Skip("run by TestWithoutRootTheLauncherUsesAUserNamespaceAndStillConfinesExecAndNetwork")
	}
	var cases []rootlessCase
	if err := json.Unmarshal([]byte(in), &cases); err != nil {
		t.Fatal(err)
	}
	sb, err := New(Config{Policy: Policy{Mode: ModeEnforce}, Launcher: os.Getenv("ITERON_ROOTLESS_LAUNCHER")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	exe := os.Getenv("ITERON_ROOTLESS_EXE")
	rep := rootlessReport{Capacity: sb.Capacity()}
	for i, c := range cases {
		r := run(t, sb, exe, c.Caps, Request{}, "", c.Act, c.Arg)
		cases[i].Got, cases[i].Exit = r.act(t), r.exit.String()
		if rep.Evidence == "" {
			rep.Evidence = r.launch.Evidence().String()
		}
	}
	rep.Cases = cases
	b, _ := json.Marshal(rep)
	os.Stdout.Write(append(append([]byte("ROOTLESS-REPORT "), b...), '\n'))
}
