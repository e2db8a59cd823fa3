package procexec

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"

	"iteron.dev/operator/internal/spawn"
)

// helperUID is the provider uid of the helper processes: not the uid this
// test process runs providers as, so that this process's reaper does not
// take the helper's orphans for its own providers' escaped descendants (the
// test wants to see what Pdeathsig and Sweep do, not what the reaper does).
const helperUID = 65533

// The helper is this test binary run with PROCEXEC_HELPER set: it launches
// the provider described by the environment, prints its pid and pgid, ends
// other goroutines and their threads, proves the provider still answers, and
// then waits to be killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("PROCEXEC_HELPER") == "" {
		t.Skip("only runs as a helper process")
	}
	cfg := DefaultConfig(os.Getenv("HELPER_RECORDS"))
	cfg.ProviderUID, cfg.ProviderGID = helperUID, helperUID
	ex, err := NewExecutor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var argv []string
	if a := os.Getenv("HELPER_ARGV"); a != "" {
		argv = strings.Split(a, " ")
	}
	plan := verifier.NewLaunchPlanForTest(t, verifier.LaunchPlanFields{
		Module: "prompt_system", ImplementationID: "helper", Version: [3]uint64{1, 0, 0}, ProtocolVersion: 2,
		ArtifactSHA256: os.Getenv("HELPER_SHA"), ArtifactRoot: os.Getenv("HELPER_ROOT"), Executable: os.Getenv("HELPER_EXE"),
		Argv: argv, CandidateSHA256: providertest.CandidateSHA256, AdmittedCapabilities: []string{},
		RuntimeDeadline: time.Hour, CancellationDeadline: 5 * time.Second,
		EvidenceLimits: verifier.EvidenceLimits{StdoutBytes: 1 << 20, StderrBytes: 64 << 10, Observations: 100},
		Contracts:      protocol.BuiltinContracts("prompt_system"),
	})
	p, err := ex.Launch(plan)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Load(c); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PROVIDER %d %d\n", p.Pid(), p.Pgid())
	// End goroutines locked to their threads: their threads exit with them.
	for range 16 {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(done)
		}()
		<-done
	}
	time.Sleep(100 * time.Millisecond)
	run, err := p.Start(c, "after-threads", []byte(`{"key":"a","add":1}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Result(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("SERVED-AFTER-THREADS-EXITED")
	time.Sleep(time.Hour)
}

type helper struct {
	cmd      *exec.Cmd
	pid      int
	pgid     int
	provider artifacts.Implementation
}

func startHelper(t *testing.T, records string, impl artifacts.Implementation, argv ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "PROCEXEC_HELPER=1", "HELPER_RECORDS="+records,
		"HELPER_EXE="+impl.Executable, "HELPER_ROOT="+impl.ArtifactRoot, "HELPER_SHA="+impl.ArtifactSHA256,
		"HELPER_ARGV="+strings.Join(argv, " "))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, provider: impl}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the helper ended before serving")
			}
			if f := strings.Fields(line); len(f) == 3 && f[0] == "PROVIDER" {
				h.pid, _ = strconv.Atoi(f[1])
				h.pgid, _ = strconv.Atoi(f[2])
			}
			if line == "SERVED-AFTER-THREADS-EXITED" {
				go func() {
					for range lines {
					}
				}()
				return h
			}
		case <-timeout:
			t.Fatal("the helper did not serve in time")
		}
	}
}

// kill SIGKILLs the helper and waits for it.
func (h *helper) kill() {
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
}

// reapIfOurs reaps pid if it has become a zombie child of this process
// (orphans are re-parented to this process, a subreaper); it reports
// whether pid is gone or dead.
func reapIfOurs(pid int) bool {
	st, err := spawn.ReadStat(pid)
	if err != nil {
		return true
	}
	if st.State != 'Z' {
		return false
	}
	if st.PPID == os.Getpid() {
		var info unix.Siginfo
		unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil)
	}
	return true
}

func waitDead(t *testing.T, within time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, pid := range pids {
		for !reapIfOurs(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs after %v", pid, within)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func TestAProviderOutlivesExitingThreadsButNotItsManager(t *testing.T) {
	newExecutor(t) // this process is a subreaper too, as a manager is
	impl := implement(t, artifacts.CounterV2)
	h := startHelper(t, t.TempDir(), impl)
	// The helper ended 16 threads after spawning, and the provider served a
	// run afterwards; it is still running now.
	if st, err := spawn.ReadStat(h.pid); err != nil || st.State == 'Z' {
		t.Fatalf("the provider %d died with the helper's other threads: %+v, %v", h.pid, st, err)
	}
	h.kill()
	waitDead(t, 5*time.Second, h.pid)
}

func TestSweepKillsTheGroupsOfADeadManagerAndNeverAReusedPid(t *testing.T) {
	newExecutor(t)
	records := t.TempDir()
	impl := implement(t, artifacts.Faulty)
	h := startHelper(t, records, impl, "--fault", "fork-grandchild", "--at", "load")
	members, err := spawn.GroupMembers(h.pgid)
	if err != nil || len(members) != 2 {
		t.Fatalf("the helper's provider group: %+v, %v", members, err)
	}
	var grandchild int
	for _, m := range members {
		if m.PID != h.pid {
			grandchild = m.PID
		}
	}
	// The manager dies: Pdeathsig kills its provider, but not the
	// grandchild, which keeps the group (and its record) alive.
	h.kill()
	waitDead(t, 5*time.Second, h.pid)
	if reapIfOurs(grandchild) {
		t.Fatalf("the grandchild %d died with the helper: nothing left to sweep", grandchild)
	}
	// A record naming a live process with another start time (a reused
	// pid) must not be killed.
	self, _ := spawn.ReadStat(os.Getpid())
	reused := Record{PID: os.Getpid(), PGID: self.PGID, StartTime: self.StartTime + 1, BootID: spawn.BootID(), UID: 0}
	if _, err := spawn.WriteRecord(records, reused); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig(records)
	cfg.ProviderUID, cfg.ProviderGID = helperUID, helperUID
	ex, err := NewExecutor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ex.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Killed) != 1 || rep.Killed[0].PID != h.pid || rep.Killed[0].PGID != h.pgid || rep.Stale != 1 {
		t.Fatalf("sweep report %+v, want the helper's group killed and the reused pid left alone", rep)
	}
	waitDead(t, 5*time.Second, grandchild)
	if ents, _ := os.ReadDir(records); len(ents) != 0 {
		t.Fatalf("records left after the sweep: %v", ents)
	}
}

func TestALiveProcessIsRecordedDurablyUntilItIsGone(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	ents, err := os.ReadDir(ex.Config().RecordDir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("records: %v, %v", ents, err)
	}
	r, err := spawn.ReadRecord(ex.Config().RecordDir + "/" + ents[0].Name())
	if err != nil {
		t.Fatal(err)
	}
	st, _ := spawn.ReadStat(p.Pid())
	if r.PID != p.Pid() || r.PGID != p.Pgid() || r.StartTime != st.StartTime || r.BootID != spawn.BootID() || r.UID != DefaultProviderID {
		t.Fatalf("record %+v does not name the process (pid %d pgid %d start %d)", r, p.Pid(), p.Pgid(), st.StartTime)
	}
	// Sweeping while the process lives leaves it alone.
	if rep, err := ex.Sweep(); err != nil || len(rep.Killed) != 0 || rep.Stale != 0 {
		t.Fatalf("sweep with a live process: %+v, %v", rep, err)
	}
	p.Close()
	if ents, _ := os.ReadDir(ex.Config().RecordDir); len(ents) != 0 {
		t.Fatalf("records after Close: %v", ents)
	}
}
