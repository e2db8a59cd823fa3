package kubeapi

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const panicChildEnv = "ITERON_KUBEAPI_PANIC_CHILD"

// TestMain lets this test binary be the child that starts a control plane
// and panics.
func TestMain(m *testing.M) {
	if os.Getenv(panicChildEnv) == "1" {
		env, err := Start()
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(2)
		}
		groups, _ := childGroups([]string{"etcd", "kube-apiserver"})
		os.Stdout.WriteString("groups " + strings.Join(groups, " ") + "\n")
		os.Stdout.WriteString("dirs " + env.env.ControlPlane.Etcd.DataDir + " " + env.env.ControlPlane.APIServer.CertDir + " " + env.env.WebhookInstallOptions.LocalServingCertDir + "\n")
		_ = env // no Stop: a panic runs no deferred function
		panic("a test panicked with the control plane running")
	}
	os.Exit(m.Run())
}

func TestAPanickingTestBinaryLeavesNoControlPlaneRunning(t *testing.T) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), panicChildEnv+"=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var groups, dirs []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if g, ok := strings.CutPrefix(sc.Text(), "groups "); ok {
			groups = strings.Fields(g)
		} else if d, ok := strings.CutPrefix(sc.Text(), "dirs "); ok {
			dirs = strings.Fields(d)
		} else {
			t.Log("child: " + sc.Text())
		}
	}
	err = child.Wait()
	if len(groups) != 2 || len(dirs) != 3 {
		t.Fatalf("the child did not report etcd and kube-apiserver (%v; exit %v):\n%s", groups, err, tail(stderr.String(), 2000))
	}
	if !strings.Contains(stderr.String(), "panic: a test panicked") {
		t.Fatalf("the child did not panic (exit %v):\n%s", err, tail(stderr.String(), 2000))
	}
	// The child is gone; its control plane must follow (the watchdog acts
	// on the child's death). Wait for it, bounded, and name what is left.
	deadline := time.Now().Add(30 * time.Second)
	for {
		alive := running(groups)
		for _, d := range dirs {
			if _, err := os.Stat(d); err == nil {
				alive = append(alive, d)
			}
		}
		if len(alive) == 0 {
			t.Logf("after the panic, the control plane %v and its directories %v are gone", groups, dirs)
			return
		}
		if time.Now().After(deadline) {
			for _, g := range alive { // do not leave them to the next test
				if pid, _, ok := strings.Cut(g, ":"); ok {
					if n, err := strconv.Atoi(pid); err == nil {
						_ = syscall.Kill(-n, syscall.SIGKILL)
					}
				} else {
					_ = os.RemoveAll(g)
				}
			}
			t.Fatalf("30 s after the test binary panicked, its control plane still runs: %v (killed now)", alive)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestAStoppedControlPlaneLeavesNoWatchdogProcess(t *testing.T) {
	env, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	// The watchdog's shell and the sleep it waits on ("pid:start"): an
	// orphan sleep lived an hour after each Stop.
	watchdog := strconv.Itoa(env.watchdog.Process.Pid)
	procs := []string{watchdog + ":" + startTime(watchdog)}
	deadline := time.Now().Add(5 * time.Second)
	for len(procs) == 1 && time.Now().Before(deadline) {
		b, _ := os.ReadFile("/proc/" + watchdog + "/task/" + watchdog + "/children")
		for _, c := range strings.Fields(string(b)) {
			procs = append(procs, c+":"+startTime(c))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(procs) == 1 {
		t.Fatalf("the watchdog %s started no sleep within 5 s: the test shows nothing", watchdog)
	}
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := running(procs)
		if len(left) == 0 {
			t.Logf("after Stop, the watchdog and its children %v are gone", procs)
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				pid, _, _ := strings.Cut(p, ":")
				n, _ := strconv.Atoi(pid)
				syscall.Kill(n, syscall.SIGKILL)
			}
			t.Fatalf("2 s after Stop the watchdog's processes %v are still running (killed now)", left)
		}
	}
}

// running are the processes of procs ("pid:start") that still run: the
// pid names the same process (field 22 of its stat, its start time) and it
// is not a zombie. (The names checked hold no space, so fields split on
// spaces.)
func running(procs []string) []string {
	var out []string
	for _, p := range procs {
		pid, start, _ := strings.Cut(p, ":")
		if st, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
			if f := strings.Fields(string(st)); len(f) > 21 && f[21] == start && f[2] != "Z" {
				out = append(out, p)
			}
		}
	}
	return out
}

// startTime is field 22 of /proc/<pid>/stat ("" once it is gone).
func startTime(pid string) string {
	st, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return ""
	}
	s := string(st)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
