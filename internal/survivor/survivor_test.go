package survivor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/statedir"
)

func TestAManagerDrivesAProviderThroughTheSurvivor(t *testing.T) {
	n := startNode(t)
	c, att := n.client(t)
	if len(att.Processes) != 0 || len(att.Outcomes) != 0 || att.Session != 1 || att.Instance != n.srv.Instance() {
		t.Fatalf("a fresh survivor's attachment: %+v; want no processes, no outcomes, session 1, instance %s", att, n.srv.Instance())
	}
	plan, exe := counter(t)
	rp := launchLoaded(t, c, plan, exe)
	info := rp.Info()
	listed := n.srv.Processes()
	if len(listed) != 1 || listed[0].Pid != info.Pid || listed[0].StartTime != info.StartTime || listed[0].Tag != info.Tag {
		t.Fatalf("the survivor lists %+v; the manager launched %+v", listed, info)
	}
	if ppid := parentOf(t, info.Pid); ppid != os.Getpid() {
		t.Fatalf("provider %d's parent is %d; want the survivor (this test process, %d)", info.Pid, ppid, os.Getpid())
	}
	before := rp.Budget()
	for i, want := range []float64{2, 5, 6} {
		add := []int{2, 3, 1}[i]
		if got := count(t, rp, fmt.Sprintf("r%d", i), "a", add, nil); got != want {
			t.Fatalf("call %d answered %v; want %v", i, got, want)
		}
	}
	after := rp.Budget()
	// The stdin count is exact; the lifetime crosses the wire in whole
	// milliseconds (lifetime_ms), so three fast calls may leave it within
	// that resolution of where it was: it must not have gone up by more.
	if after.StdinBytes >= before.StdinBytes || after.Lifetime > before.Lifetime+time.Millisecond {
		t.Fatalf("budget before the runs %+v, after %+v: the survivor's counts must reach the manager", before, after)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := rp.Snapshot(ctx, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st.State), `{"count":6,"key":"a"}`) {
		t.Fatalf("snapshot %s; want a=6", st.State)
	}
	if after2 := rp.Budget(); after2.StateOperations != after.StateOperations-1 {
		t.Fatalf("state operations left %d after a snapshot, %d before", after2.StateOperations, after.StateOperations)
	}
	if err := rp.Stop(ctx, "test done"); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case <-rp.Done():
	default:
		t.Fatal("Stop returned before the survivor said the process ended")
	}
	if rp.Err() != nil || rp.OwnerLost() {
		t.Fatalf("a clean stop ended with %v (owner lost %v)", rp.Err(), rp.OwnerLost())
	}
	// The survivor tells the manager first and forgets the process after
	// (never the other way round: an ending nobody was told of is kept for
	// the next manager), so the listing empties just after Stop returns.
	deadline := time.Now().Add(10 * time.Second)
	for left := n.srv.Processes(); len(left) != 0; left = n.srv.Processes() {
		if time.Now().After(deadline) {
			t.Fatalf("the survivor still lists %+v 10s after the stop", left)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("provider pid %d (start time %d) driven through the survivor: counts 2, 5, 6; snapshot %s; budget stdin %d → %d bytes; stopped cleanly",
		info.Pid, info.StartTime, st.StateSHA256, before.StdinBytes, after.StdinBytes)
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// TestOnlyTheManagerHoldingTheStateDirLockIsObeyed: the fence. A peer must
// be the manager's uid, say hello first in the survivor's protocol, and
// present the very open file description that holds <state-dir>/lock.
func TestOnlyTheManagerHoldingTheStateDirLockIsObeyed(t *testing.T) {
	n := startNode(t)
	hello := func() *header { return &header{Op: opHello, Hello: &helloBody{Protocol: ProtocolVersion}} }
	other, err := os.Create(filepath.Join(n.dir, "not-the-lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	unlocked, err := os.Open(statedir.Dir(n.dir).Lock())
	if err != nil {
		t.Fatal(err)
	}
	defer unlocked.Close()
	cases := []struct {
		name  string
		h     *header
		files []*os.File
		want  string
	}{
		{"a first frame other than hello", &header{Op: opRun}, nil, `the first frame is "run"`},
		{"another protocol", &header{Op: opHello, Hello: &helloBody{Protocol: "iteron-survivor/0"}}, []*os.File{n.lock}, `protocol "iteron-survivor/0"`},
		// A /1 peer knows no sandbox: the exact check keeps a /2 manager from
		// a /1 survivor (which would launch unsandboxed) and the reverse.
		{"the protocol before the sandbox", &header{Op: opHello, Hello: &helloBody{Protocol: "iteron-survivor/1"}}, []*os.File{n.lock}, `protocol "iteron-survivor/1"; this survivor speaks iteron-survivor/2`},
		{"no lock descriptor", hello(), nil, "hello carries 0 descriptors"},
		{"another file", hello(), []*os.File{other}, "is not " + statedir.Dir(n.dir).Lock()},
		{"the lock file opened again, without the lock", hello(), []*os.File{unlocked}, "does not hold its exclusive lock"},
	}
	for _, tc := range cases {
		_, f := rawHello(t, n, tc.h, tc.files...)
		if f.h.Op != opRefused || !strings.Contains(f.h.Refused, tc.want) {
			t.Fatalf("%s: the survivor answered %q %q; want refused with %q", tc.name, f.h.Op, f.h.Refused, tc.want)
		}
		t.Logf("%s: refused: %s", tc.name, f.h.Refused)
	}

	// A peer of another uid is refused even when it can reach the socket.
	if err := os.Chmod(n.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(n.socket(), 0o777); err != nil {
		t.Fatal(err)
	}
	refused := dialAsUID(t, n.socket(), 65534)
	if !strings.Contains(refused, "peer uid 65534") {
		t.Fatalf("a peer of uid 65534 got %q; want refused for its uid", refused)
	}
	t.Logf("a peer of uid 65534: refused: %s", refused)

	// The lock holder is accepted; a second proof supersedes it (its
	// manager cannot hold the lock any more), and the first session's next
	// operation is refused.
	first, _ := n.client(t)
	plan, exe := counter(t)
	rp := launchLoaded(t, first, plan, exe)
	second, att := n.client(t)
	// The first client was told it was superseded and does not reconnect.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := first.call(ctx, &header{Op: opStatus, Proc: rp.Info().Proc}, nil, nil); err == nil {
		t.Fatal("the superseded session still had an operation answered")
	} else {
		t.Logf("the superseded session's next operation: %v", err)
	}
	if att.Session != 2 || len(att.Processes) != 1 || att.Processes[0].Pid() != rp.Pid() {
		t.Fatalf("the second session: %+v; want session 2 listing pid %d", att, rp.Pid())
	}
	rp2 := att.Processes[0]
	if got := count(t, rp2, "s2", "a", 1, nil); got != 1 {
		t.Fatalf("the superseding session's call answered %v", got)
	}
	_ = second
	t.Logf("the lock holder is accepted (session 1); a second hello proving the lock supersedes it (session 2) and drives pid %d", rp.Pid())
}

// dialAsUID connects from a thread running as uid (the survivor reads the
// connecting thread's credentials) and returns the refusal it gets.
func dialAsUID(t *testing.T, socket string, uid int) string {
	t.Helper()
	type result struct {
		msg string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// A locked thread that never returns to the pool: it changed uid.
		runtimeLockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			ch <- result{err: e}
			return
		}
		uc, err := dialUnix(socket)
		if err != nil {
			ch <- result{err: err}
			return
		}
		c := newConn(uc)
		defer c.close()
		_ = c.write(&header{Op: opHello, Hello: &helloBody{Protocol: ProtocolVersion}}, nil)
		f, err := c.read()
		if err != nil {
			ch <- result{err: err}
			return
		}
		ch <- result{msg: f.h.Refused}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("dial as uid %d: %v", uid, r.err)
	}
	return r.msg
}

// TestATornControlFrameNeverReachesTheProvider: a manager killed while
// writing a run leaves half a control frame; the survivor drops it with the
// connection, the provider never sees a byte of it, and the next manager
// drives the same process on: its count and request IDs go on.
func TestATornControlFrameNeverReachesTheProvider(t *testing.T) {
	n := startNode(t)
	c, _ := n.client(t)
	plan, exe := counter(t)
	rp := launchLoaded(t, c, plan, exe)
	if got := count(t, rp, "before", "a", 1, nil); got != 1 {
		t.Fatalf("count %v", got)
	}
	before := rp.Budget()

	// A raw session: hello with the lock, then the first 30 bytes of a run
	// frame for the same process, then the connection ends.
	c.Close()
	raw, welcome := rawHello(t, n, &header{Op: opHello, Hello: &helloBody{Protocol: ProtocolVersion}}, n.lock)
	if welcome.h.Op != opWelcome {
		t.Fatalf("raw hello: %q %q", welcome.h.Op, welcome.h.Refused)
	}
	welcome.closeFiles()
	for { // the listing
		f, err := raw.read()
		if err != nil {
			t.Fatal(err)
		}
		if f.h.Op == opListed {
			break
		}
	}
	input := []byte(`{"key":"a","add":100}`)
	hb := []byte(fmt.Sprintf(`{"op":"run","id":1,"proc":%d,"run_id":"torn","run":{"deadline_ms":5000}}`, rp.Info().Proc))
	var whole []byte
	whole = append(whole, byte(len(hb)>>24), byte(len(hb)>>16), byte(len(hb)>>8), byte(len(hb)))
	whole = append(whole, 0, 0, 0, byte(len(input)))
	whole = append(whole, hb...)
	whole = append(whole, input...)
	torn := whole[:len(whole)-len(input)/2]
	if _, err := raw.uc.Write(torn); err != nil {
		t.Fatal(err)
	}
	raw.uc.Close()

	// The next manager drives the same process.
	c.Close()
	_, att := n.client(t)
	var again *RemoteProcess
	for _, p := range att.Processes {
		if p.Pid() == rp.Pid() {
			again = p
		}
	}
	if again == nil {
		t.Fatalf("the next session lists %d processes, not pid %d", len(att.Processes), rp.Pid())
	}
	if got := count(t, again, "after", "a", 1, nil); got != 2 {
		t.Fatalf("after the torn frame the count is %v; want 2 (the torn run of +100 never ran)", got)
	}
	after := again.Budget()
	if before.StdinBytes-after.StdinBytes > 1024 {
		t.Fatalf("stdin budget %d → %d: more than one run's frame was written", before.StdinBytes, after.StdinBytes)
	}
	if err := again.Info().IdentityErr; err != "" {
		t.Fatal(err)
	}
	t.Logf("a torn run frame (%d of %d bytes) died with its connection: pid %d unchanged, count 1 → 2 (the +100 never ran), one run's stdin used (%d bytes)",
		len(torn), len(whole), again.Pid(), before.StdinBytes-after.StdinBytes)
}

// TestTheExecutableIsHandedOverSealedNeverAsAPath: the survivor runs only
// a sealed memfd whose bytes hash to the plan's digest.
func TestTheExecutableIsHandedOverSealedNeverAsAPath(t *testing.T) {
	n := startNode(t)
	c, _ := n.client(t)
	plan, exe := counter(t)
	w, err := planToWire(plan)
	if err != nil {
		t.Fatal(err)
	}
	launch := func(files ...*os.File) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		f, err := c.call(ctx, &header{Op: opLaunch, Launch: &launchBody{Plan: w, Tag: testTag(plan.Module())}}, nil, nil, files...)
		if err != nil {
			return err
		}
		return f.h.Reply.Err.err()
	}
	file, err := os.Open(plan.Executable())
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	mem := os.NewFile(uintptr(unsealed), "unsealed")
	defer mem.Close()
	body, _ := os.ReadFile(plan.Executable())
	mem.Write(body)
	other := providertest.Plan(t, providertest.Implement(t, artifactsSpecStateless()))
	wrong, err := procexec.SealExecutable(other.Executable(), other.ArtifactSHA256())
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	for _, tc := range []struct {
		name  string
		files []*os.File
		want  string
	}{
		{"no descriptor (a path alone)", nil, "launch carries 0 descriptors"},
		{"the file itself", []*os.File{file}, "is not a sealable memfd"},
		{"a memfd without seals", []*os.File{mem}, "without the seals"},
		{"a sealed memfd of other bytes", []*os.File{wrong.File()}, "hashes to " + other.ArtifactSHA256()},
	} {
		err := launch(tc.files...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: launch answered %v; want a refusal with %q", tc.name, err, tc.want)
		}
		t.Logf("%s: refused: %v", tc.name, err)
	}
	if left := n.srv.Processes(); len(left) != 0 {
		t.Fatalf("refused launches left processes %+v", left)
	}
	if err := launch(exe.File()); err != nil {
		t.Fatalf("the sealed executable of the plan: %v", err)
	}
}
