package procexec

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/verifier"

	"iteron.dev/operator/internal/spawn"
)

func TestMain(m *testing.M) { providertest.Main(m) }

// leakOptions ignore exactly the permanent spawner and reaper goroutines.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("iteron.dev/operator/internal/spawn.(*spawnerThread).loop"),
	goleak.IgnoreTopFunction("iteron.dev/operator/internal/spawn.reaperLoop"),
}

// leakedGoroutines returns the goroutines left besides the permanent ones
// (goleak retries for a while before it reports).
func leakedGoroutines() error { return goleak.Find(leakOptions...) }

func newExecutor(t *testing.T) *Executor {
	t.Helper()
	ex, err := NewExecutor(DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// implement lays out an example provider with argv.
func implement(t *testing.T, name string, argv ...string) artifacts.Implementation {
	t.Helper()
	return providertest.Implement(t, artifacts.Spec{Binary: name, Argv: argv})
}

// launch starts impl with an optionally edited plan and closes it at the
// end of the test.
func launch(t *testing.T, ex *Executor, impl artifacts.Implementation, edit ...func(*verifier.LaunchPlanFields)) *Process {
	t.Helper()
	p, err := ex.Launch(providertest.Plan(t, impl, edit...))
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func loaded(t *testing.T, ex *Executor, impl artifacts.Implementation, edit ...func(*verifier.LaunchPlanFields)) *Process {
	t.Helper()
	p := launch(t, ex, impl, edit...)
	if _, err := p.Load(ctx(t)); err != nil {
		t.Fatalf("Load: %v", err)
	}
	return p
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// openFDs lists this process's open pipes and pidfds: what a process's
// teardown must close. (Other descriptors come and go with the reaper's
// /proc scans; sealed executables stay in the executor's cache.)
func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		if strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, "anon_inode:") {
			out = append(out, e.Name()+" → "+target)
		}
	}
	return out
}

// alive returns which of pids still exist (zombies included) as members of
// process group pgid. A pid number alone proves nothing: a dead process's
// pid is soon reused, by a thread as often as by a process (and
// /proc/<tid> exists for threads too).
func alive(pgid int, pids ...int) []int {
	var out []int
	for _, pid := range pids {
		if st, err := spawn.ReadStat(pid); err == nil && st.PGID == pgid && isProcess(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// isProcess reports whether pid is a thread-group leader, not a thread.
func isProcess(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	return strings.Contains(string(b), "\nTgid:\t"+strconv.Itoa(pid)+"\n")
}

var (
	grandchildRE = regexp.MustCompile(`faulty: grandchild (\d+)`)
	escapeeRE    = regexp.MustCompile(`faulty: escaped grandchild (\d+)`)
)

// grandchildren parses the pids of the grandchildren faulty reports on
// stderr that stayed in its group.
func grandchildren(stderr []byte) []int { return pidsOf(grandchildRE, stderr) }

// escapees parses the pids of the grandchildren faulty reports on stderr
// that left its group (setsid: each leads a session and a group of its own).
func escapees(stderr []byte) []int { return pidsOf(escapeeRE, stderr) }

func pidsOf(re *regexp.Regexp, stderr []byte) []int {
	var pids []int
	for _, m := range re.FindAllSubmatch(stderr, -1) {
		pid, _ := strconv.Atoi(string(m[1]))
		pids = append(pids, pid)
	}
	return pids
}

// waitEscapee waits for faulty to report the grandchild that left its
// group, checks while it lives that it leads a group of its own (so that a
// test that finds it gone after the teardown has something to show), and
// kills it at the end of the test if it is still there.
func waitEscapee(t *testing.T, p *Process) int {
	t.Helper()
	var pid int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if e := escapees(p.StderrTail()); len(e) == 1 {
			pid = e[0]
			break
		}
	}
	if pid == 0 {
		t.Fatalf("faulty reported no escaped grandchild: %q", p.StderrTail())
	}
	st, err := spawn.ReadStat(pid)
	if err != nil || st.PGID != pid || st.PGID == p.Pgid() {
		t.Fatalf("the escapee %d does not lead a group outside %d: %+v, %v", pid, p.Pgid(), st, err)
	}
	t.Cleanup(func() {
		// A failing run must not leave it sleeping forever.
		if len(alive(pid, pid)) != 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pid
}

// waitGone polls until none of pids exists in group pgid, or fails.
func waitGone(t *testing.T, within time.Duration, pgid int, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := alive(pgid, pids...)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v still exist after %v", left, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sameFDs(t *testing.T, before []string) {
	t.Helper()
	after := openFDs(t)
	if !slices.Equal(before, after) {
		var gone, added []string
		for _, fd := range before {
			if !slices.Contains(after, fd) {
				gone = append(gone, fd)
			}
		}
		for _, fd := range after {
			if !slices.Contains(before, fd) {
				added = append(added, fd)
			}
		}
		t.Fatalf("open descriptors changed: closed %q, opened %q", gone, added)
	}
}

// memfds returns the inodes of this process's open memfds (sealed
// executables). Inodes, not a count: an executor an earlier test left
// behind holds cached memfds that its finalizer closes whenever the
// garbage collector runs, so a count can fall during a test that leaked
// nothing; a memfd this test left open is an inode that was not there.
func memfds(t *testing.T) map[uint64]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]bool{}
	for _, e := range ents {
		path := "/proc/self/fd/" + e.Name()
		if target, _ := os.Readlink(path); !strings.HasPrefix(target, "/memfd:iteron-provider") {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil {
			out[st.Ino] = true
		}
	}
	return out
}

// newMemfds returns how many memfds are open now that were not in before.
func newMemfds(t *testing.T, before map[uint64]bool) int {
	t.Helper()
	n := 0
	for ino := range memfds(t) {
		if !before[ino] {
			n++
		}
	}
	return n
}
