package procexec

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"

	"iteron.dev/operator/internal/spawn"
)

// A fault case drives a provider until its fault surfaces.
type faultCase struct {
	name   string
	binary string
	argv   []string
	edit   func(*verifier.LaunchPlanFields)
	// drive performs operations on a launched process and returns the
	// error that ended it (nil when no fault is expected).
	drive func(t *testing.T, p *Process) error
	kind  FaultKind // 0: no fault
	op    string
	// reason is the expected ReasonCode.
	reason string
	// check runs extra assertions after the teardown.
	check func(t *testing.T, p *Process, err error)
}

func load(t *testing.T, p *Process) error {
	_, err := p.Load(ctx(t))
	return err
}

func loadThen(next func(t *testing.T, p *Process) error) func(t *testing.T, p *Process) error {
	return func(t *testing.T, p *Process) error {
		if err := load(t, p); err != nil {
			t.Fatalf("Load: %v", err)
		}
		return next(t, p)
	}
}

func startAndWait(input string, deadline time.Duration) func(t *testing.T, p *Process) error {
	return func(t *testing.T, p *Process) error {
		run, err := p.Start(ctx(t), "run-1", []byte(input), deadline)
		if err != nil {
			return err
		}
		_, err = run.Result()
		return err
	}
}

// escapedThen waits for the grandchild faulty forked out of its group (at
// load) and checks it leads a group of its own before going on.
func escapedThen(next func(t *testing.T, p *Process) error) func(t *testing.T, p *Process) error {
	return func(t *testing.T, p *Process) error {
		waitEscapee(t, p)
		return next(t, p)
	}
}

func snapshotThen(next func(t *testing.T, p *Process, s protocol.State) error) func(t *testing.T, p *Process) error {
	return func(t *testing.T, p *Process) error {
		s, err := p.Snapshot(ctx(t), 1, time.Second)
		if err != nil {
			return err
		}
		return next(t, p, s)
	}
}

func shortCancellation(f *verifier.LaunchPlanFields) {
	f.CancellationDeadline = 400 * time.Millisecond
}

var counterInput = `{"key":"a","add":1}`

func faultCases() []faultCase {
	return []faultCase{
		{name: "a crash at load is an exit during load", argv: []string{"--fault", "crash", "--at", "load"},
			drive: load, kind: KindExited, op: "load", reason: reasons.ActivationFailed},
		{name: "a crash at start is an exit during start", argv: []string{"--fault", "crash", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, time.Second)), kind: KindExited, op: "start", reason: reasons.ProviderFailed},
		{name: "a crash at migrate is an exit during migrate", argv: []string{"--fault", "crash", "--at", "migrate"},
			drive: loadThen(snapshotThen(func(t *testing.T, p *Process, s protocol.State) error {
				_, err := p.Migrate(ctx(t), s, time.Second)
				return err
			})), kind: KindExited, op: "migrate", reason: reasons.ProviderFailed},
		{name: "a hang at load times out when the caller gives up", argv: []string{"--fault", "hang", "--at", "load"},
			drive: func(t *testing.T, p *Process) error {
				c, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
				defer cancel()
				_, err := p.Load(c)
				return err
			}, kind: KindTimeout, op: "load", reason: reasons.DeadlineExceeded},
		{name: "a hang at start times out at the run deadline", argv: []string{"--fault", "hang", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, 400*time.Millisecond)), kind: KindTimeout, op: "start", reason: reasons.DeadlineExceeded},
		{name: "a run that never ends times out at its deadline", drive: loadThen(startAndWait(`{"key":"a","add":1,"sleep_ms":60000}`, 400*time.Millisecond)),
			kind: KindTimeout, op: OpRun, reason: reasons.DeadlineExceeded},
		{name: "a hang at cancel times out at the cancellation deadline", argv: []string{"--fault", "hang", "--at", "cancel"}, edit: shortCancellation,
			drive: loadThen(func(t *testing.T, p *Process) error {
				if _, err := p.Start(ctx(t), "slow", []byte(`{"key":"a","add":1,"sleep_ms":60000}`), 30*time.Second); err != nil {
					t.Fatalf("Start: %v", err)
				}
				return p.Cancel(ctx(t), "slow", "test")
			}), kind: KindTimeout, op: "cancel", reason: reasons.DeadlineExceeded},
		{name: "a hang at stop times out at the cancellation deadline", argv: []string{"--fault", "hang", "--at", "stop"}, edit: shortCancellation,
			drive: loadThen(func(t *testing.T, p *Process) error { return p.Stop(ctx(t), "test") }),
			kind:  KindTimeout, op: "stop", reason: reasons.DeadlineExceeded},
		{name: "a hang at snapshot times out at the state operation's deadline", argv: []string{"--fault", "hang", "--at", "snapshot"},
			drive: loadThen(func(t *testing.T, p *Process) error {
				_, err := p.Snapshot(ctx(t), 1, 400*time.Millisecond)
				return err
			}), kind: KindTimeout, op: "snapshot", reason: reasons.DeadlineExceeded},
		{name: "a malformed frame at load is a malformed frame", argv: []string{"--fault", "malformed", "--at", "load"},
			drive: load, kind: KindMalformedFrame, op: "load", reason: reasons.ActivationFailed,
			check: func(t *testing.T, p *Process, err error) {
				if f, _ := AsFault(err); !bytes.Contains(f.Frame, []byte(`"payload":{`)) {
					t.Fatalf("the fault does not carry the offending frame: %q", f.Frame)
				}
			}},
		{name: "a malformed frame at snapshot is a malformed frame", argv: []string{"--fault", "malformed", "--at", "snapshot"},
			drive: loadThen(snapshotThen(func(*testing.T, *Process, protocol.State) error { return nil })), kind: KindMalformedFrame, op: "snapshot", reason: reasons.ProviderFailed},
		{name: "an oversized frame at load is oversized", argv: []string{"--fault", "oversized", "--at", "load"},
			drive: load, kind: KindOversized, op: "load", reason: reasons.ActivationFailed},
		{name: "an oversized frame at start is oversized", argv: []string{"--fault", "oversized", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, time.Second)), kind: KindOversized, op: "start", reason: reasons.ProviderFailed},
		{name: "a mis-correlated response at load is mis-correlated", argv: []string{"--fault", "miscorrelate", "--at", "load"},
			drive: load, kind: KindMiscorrelated, op: "load", reason: reasons.ActivationFailed},
		{name: "a mis-correlated response at restore is mis-correlated", argv: []string{"--fault", "miscorrelate", "--at", "restore"},
			drive: loadThen(snapshotThen(func(t *testing.T, p *Process, s protocol.State) error {
				_, err := p.Restore(ctx(t), s, time.Second)
				return err
			})), kind: KindMiscorrelated, op: "restore", reason: reasons.ProviderFailed},
		{name: "a wrong observation schema is a bad observation", argv: []string{"--fault", "wrong-schema", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, time.Second)), kind: KindBadObservation, op: OpRun, reason: reasons.ProviderFailed},
		{name: "a wrong schema in loaded is mis-correlated", argv: []string{"--fault", "wrong-schema", "--at", "load"},
			drive: load, kind: KindMiscorrelated, op: "load", reason: reasons.ActivationFailed},
		{name: "a wrong state schema in snapshotted is mis-correlated", argv: []string{"--fault", "wrong-schema", "--at", "snapshot"},
			drive: loadThen(snapshotThen(func(*testing.T, *Process, protocol.State) error { return nil })), kind: KindMiscorrelated, op: "snapshot", reason: reasons.ProviderFailed},
		{name: "an observation for another run is a bad observation", argv: []string{"--fault", "wrong-run", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, time.Second)), kind: KindBadObservation, op: OpRun, reason: reasons.ProviderFailed},
		{name: "a sequence regression is a bad observation", argv: []string{"--fault", "sequence-regression", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, time.Second)), kind: KindBadObservation, op: OpRun, reason: reasons.ProviderFailed},
		{name: "an exit while idle is noticed at once", argv: []string{"--fault", "exit", "--at", "snapshot"},
			drive: loadThen(snapshotThen(func(t *testing.T, p *Process, s protocol.State) error {
				select {
				case <-p.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the provider exited but Done was not closed")
				}
				return p.Err()
			})), kind: KindExited, op: OpIdle, reason: reasons.ProviderFailed,
			check: func(t *testing.T, p *Process, err error) {
				if td := p.Teardown(); !td.Exit.Exited || td.Exit.Code != 3 {
					t.Fatalf("exit status %v, want 3", td.Exit)
				}
			}},
		{name: "a non-zero exit after stop is an exit during stop", argv: []string{"--fault", "exit", "--at", "stop"},
			drive: loadThen(func(t *testing.T, p *Process) error { return p.Stop(ctx(t), "test") }),
			kind:  KindExited, op: "stop", reason: reasons.ProviderFailed},
		{name: "a failed result is a provider failure with its code", binary: artifacts.CounterV1,
			drive: loadThen(func(t *testing.T, p *Process) error {
				v2 := protocol.State{Module: "prompt_system", ImplementationID: "counter-v2", RunID: "lineage-prompt_system", Generation: 1,
					StateSchema: protocol.BuiltinContracts("prompt_system").Snapshot, State: []byte(`{"keys":[],"layout":2,"recent":[],"runs":0,"total":0}`)}
				v2.StateSHA256, _ = protocol.StateDigest(v2.State)
				_, err := p.Migrate(ctx(t), v2, time.Second)
				return err
			}), kind: KindProviderFailed, op: "migrate", reason: reasons.ProviderFailed,
			check: func(t *testing.T, p *Process, err error) {
				if f, _ := AsFault(err); f.Code != "unsupported_layout" || !strings.Contains(f.Message, "layout 2") {
					t.Fatalf("failed result: code %q message %q", f.Code, f.Message)
				}
			}},
		{name: "more observations than the limit overflow the run", binary: artifacts.CounterV2,
			edit:  func(f *verifier.LaunchPlanFields) { f.EvidenceLimits.Observations = 3 },
			drive: loadThen(startAndWait(`{"key":"a","add":1,"progress":5}`, time.Second)), kind: KindOutputOverflow, op: OpRun, reason: reasons.ProviderFailed},
		{name: "more stdout bytes than the limit overflow the run", binary: artifacts.CounterV2,
			edit:  func(f *verifier.LaunchPlanFields) { f.EvidenceLimits.StdoutBytes = 512 },
			drive: loadThen(startAndWait(`{"key":"a","add":1,"pad":600}`, time.Second)), kind: KindOutputOverflow, op: OpRun, reason: reasons.ProviderFailed},
		{name: "an idle process past its lifetime exhausts its budget", binary: artifacts.CounterV2,
			edit: func(f *verifier.LaunchPlanFields) { f.RuntimeDeadline = 600 * time.Millisecond },
			drive: loadThen(func(t *testing.T, p *Process) error {
				<-p.Done()
				return p.Err()
			}), kind: KindBudgetExhausted, op: OpLifetime, reason: reasons.ProviderFailed},
		{name: "three grandchildren holding stdout die with a hung provider", argv: []string{"--fault", "fork-grandchild", "--at", "load", "--children", "3", "--fault", "hang", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, 400*time.Millisecond)), kind: KindTimeout, op: "start", reason: reasons.DeadlineExceeded,
			check: func(t *testing.T, p *Process, err error) {
				if n := len(grandchildren(p.StderrTail())); n != 3 {
					t.Fatalf("faulty reported %d grandchildren, want 3", n)
				}
			}},
		{name: "a grandchild ignoring SIGTERM dies with a crashing provider", argv: []string{"--fault", "fork-grandchild", "--at", "load", "--fault", "crash", "--at", "start"},
			drive: loadThen(startAndWait(counterInput, time.Second)), kind: KindExited, op: "start", reason: reasons.ProviderFailed},
		{name: "a grandchild left behind by a clean stop is reported and killed", argv: []string{"--fault", "fork-grandchild", "--at", "load"},
			drive: loadThen(func(t *testing.T, p *Process) error { return p.Stop(ctx(t), "test") }),
			check: func(t *testing.T, p *Process, err error) {
				gc := grandchildren(p.StderrTail())
				if td := p.Teardown(); len(gc) != 1 || len(td.LeftBehind) != 1 || td.LeftBehind[0] != gc[0] {
					t.Fatalf("left behind %v, faulty's grandchildren %v", td.LeftBehind, gc)
				}
			}},
		// A grandchild that left the group (setsid) survives the group
		// kill: the subreaper, which inherits it when the provider dies,
		// kills it.
		{name: "an escaped grandchild holding no pipe dies with a crashing provider", argv: []string{"--fault", "escape", "--at", "load", "--fault", "crash", "--at", "start"},
			drive: loadThen(escapedThen(startAndWait(counterInput, time.Second))), kind: KindExited, op: "start", reason: reasons.ProviderFailed},
		{name: "an escaped grandchild holding stdout and stderr dies with a hung provider", argv: []string{"--fault", "escape", "--at", "load", "--hold-pipes", "--fault", "hang", "--at", "start"},
			drive: loadThen(escapedThen(startAndWait(counterInput, 400*time.Millisecond))), kind: KindTimeout, op: "start", reason: reasons.DeadlineExceeded},
		{name: "an escaped grandchild holding stdout and stderr is killed after a clean stop", argv: []string{"--fault", "escape", "--at", "load", "--hold-pipes"},
			drive: loadThen(escapedThen(func(t *testing.T, p *Process) error { return p.Stop(ctx(t), "test") })),
			check: func(t *testing.T, p *Process, err error) {
				// Not of the group, so not reported as left in it.
				if td := p.Teardown(); len(td.LeftBehind) != 0 {
					t.Fatalf("left behind %v: the escapee is not in the group", td.LeftBehind)
				}
			}},
		{name: "a stderr flood is kept to its newest bytes and never a fault", argv: []string{"--fault", "stderr-flood", "--at", "start", "--size", "300000"},
			drive: loadThen(func(t *testing.T, p *Process) error {
				if err := startAndWait(counterInput, 5*time.Second)(t, p); err != nil {
					return err
				}
				return p.Stop(ctx(t), "done") // drains stderr to its end
			}),
			check: func(t *testing.T, p *Process, err error) {
				// faulty wrote exactly these 300000 bytes; the ring keeps the
				// newest 64 KiB of them and counts the rest as dropped.
				flood := bytes.Repeat([]byte("faulty: stderr flood\n"), 300000/21+1)[:300000]
				tail := p.StderrTail()
				if !bytes.Equal(tail, flood[300000-64<<10:]) || p.StderrDropped() != 300000-64<<10 {
					t.Fatalf("stderr ring kept %d bytes (newest %q) and dropped %d", len(tail), tail[max(0, len(tail)-40):], p.StderrDropped())
				}
			}},
	}
}

// TestEveryFaultEndsInItsTypedErrorAndLeavesNothing drives each fault of
// faulty (and the limits the host enforces) and checks the typed error, that
// no process of the group is left (grandchildren included) nor any
// grandchild that left the group, that no goroutine is left but the
// permanent spawner and reaper, and that the pipes are closed. With -v it
// prints the table of the acceptance criteria.
func TestEveryFaultEndsInItsTypedErrorAndLeavesNothing(t *testing.T) {
	ex := newExecutor(t)
	var table []string
	for _, tc := range faultCases() {
		t.Run(tc.name, func(t *testing.T) {
			binary := tc.binary
			if binary == "" {
				binary = artifacts.Faulty
			}
			impl := providertest.Implement(t, artifacts.Spec{Binary: binary, Argv: tc.argv})
			before := openFDs(t)
			p, err := ex.Launch(providertest.Plan(t, impl, func(f *verifier.LaunchPlanFields) {
				if tc.edit != nil {
					tc.edit(f)
				}
			}))
			if err != nil {
				t.Fatalf("Launch: %v", err)
			}
			leader := p.Pid()
			t.Cleanup(func() {
				// A failing run must not leave the group behind. While it
				// has members, its pgid cannot name another group.
				if len(p.Remaining()) != 0 {
					syscall.Kill(-p.Pgid(), syscall.SIGKILL)
				}
			})
			err = tc.drive(t, p)
			f, isFault := AsFault(err)
			switch {
			case tc.kind == 0 && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.kind != 0 && !isFault:
				t.Fatalf("error %v (%T), want a *Fault", err, err)
			case tc.kind != 0 && (f.Kind != tc.kind || f.Op != tc.op):
				t.Fatalf("fault %s during %s (%v), want %s during %s", f.Kind, f.Op, err, tc.kind, tc.op)
			case tc.kind != 0 && f.ReasonCode() != tc.reason:
				t.Fatalf("reason %s, want %s", f.ReasonCode(), tc.reason)
			}
			if tc.kind != 0 {
				select {
				case <-p.Done():
				default:
					t.Fatal("a killing fault was returned before the process was gone")
				}
			}
			p.Close()
			closed := time.Now()
			group := append([]int{leader}, grandchildren(p.StderrTail())...)
			gone := len(alive(p.Pgid(), group...)) == 0 && len(p.Remaining()) == 0
			if !gone {
				var detail []string
				for _, pid := range p.Remaining() {
					st, err := spawn.ReadStat(pid)
					detail = append(detail, fmt.Sprintf("%d: %+v %v", pid, st, err))
				}
				t.Errorf("processes of the group left: %v (remaining in pgid %d: %v; teardown %+v)", alive(p.Pgid(), group...), p.Pgid(), detail, p.Teardown())
			}
			// The group kill ends the group at once; what the kill timeout
			// bounds is only a process in uninterruptible sleep. A teardown
			// that needed it (the group outlived the kill and was ended by
			// the sweep's later kill, or never) did not kill the group.
			td := p.Teardown()
			if len(td.Unreaped) != 0 || td.Reaped >= ex.Config().KillTimeout {
				gone = false
				t.Errorf("the group was reaped %v after the teardown began (unreaped: %v): not by its kill, which takes milliseconds, but after the %v kill timeout",
					td.Reaped, td.Unreaped, ex.Config().KillTimeout)
			}
			// An escapee is killed by the subreaper once it is re-parented
			// (on the leader's SIGCHLD or the teardown's kick), not by the
			// group kill: wait for it, within less than the reaper's 5 s
			// backstop scan.
			escaped := escapees(p.StderrTail())
			var escapedLeft []int
			for {
				escapedLeft = escapedLeft[:0]
				for _, pid := range escaped {
					escapedLeft = append(escapedLeft, alive(pid, pid)...)
				}
				if len(escapedLeft) == 0 || time.Since(closed) > 2*time.Second {
					break
				}
				time.Sleep(time.Millisecond)
			}
			escapedGone := "-"
			if len(escaped) != 0 {
				escapedGone = fmt.Sprintf("%d, gone %v after Close", len(escaped), time.Since(closed).Round(time.Millisecond))
				if len(escapedLeft) != 0 {
					gone = false
					escapedGone = fmt.Sprintf("%d, %v still there after 2s", len(escaped), escapedLeft)
					t.Errorf("escaped descendants %v still exist 2s after Close", escapedLeft)
				}
			}
			leak := leakedGoroutines()
			if leak != nil {
				t.Errorf("goroutines leaked: %v", leak)
			}
			sameFDs(t, before)
			if tc.check != nil {
				tc.check(t, p, err)
			}
			typed := "none (not a fault)"
			if isFault {
				typed = fmt.Sprintf("%s during %s → %s", f.Kind, f.Op, f.ReasonCode())
			}
			leaked := 0
			if leak != nil {
				leaked = strings.Count(leak.Error(), "Goroutine ")
			}
			table = append(table, fmt.Sprintf("| %s | %s | %d | %v | %s | %s | %d |", tc.name, typed, len(group), td.Reaped.Round(time.Millisecond), escapedGone, yesNo(gone), leaked))
		})
	}
	t.Logf("\n| fault | typed error | group size | group reaped in | escaped | all gone | goroutines leaked |\n|---|---|---|---|---|---|---|\n%s", strings.Join(table, "\n"))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func TestADigestMismatchNeverSpawns(t *testing.T) {
	ex := newExecutor(t)
	impl := implement(t, artifacts.CounterV2)
	before, beforeMem := openFDs(t), memfds(t)
	p, err := ex.Launch(providertest.Plan(t, impl, func(f *verifier.LaunchPlanFields) {
		f.ArtifactSHA256 = "sha256:" + strings.Repeat("0", 64)
	}))
	if newMemfds(t, beforeMem) != 0 {
		t.Fatal("the refused copy's memfd was kept open")
	}
	f, ok := AsFault(err)
	if p != nil || !ok || f.Kind != KindRefused || f.Op != OpSpawn || f.ReasonCode() != reasons.VerificationFailed {
		t.Fatalf("Launch with a wrong digest: %v, %v", p, err)
	}
	if !strings.Contains(f.Detail, "digest mismatch") {
		t.Fatalf("detail %q does not say why", f.Detail)
	}
	if len(ex.Live()) != 0 {
		t.Fatalf("a process was started: %v", ex.Live())
	}
	if ents, _ := os.ReadDir(ex.Config().RecordDir); len(ents) != 0 {
		t.Fatalf("a group was recorded: %v", ents)
	}
	sameFDs(t, before)
}

func TestAnArtifactRewrittenAfterStartIsTamperingAndKillsTheGroup(t *testing.T) {
	ex := newExecutor(t)
	impl := implement(t, artifacts.CounterV2)
	beforeRehash = func(p *Process) {
		f, err := os.OpenFile(p.Plan().Executable(), os.O_WRONLY, 0)
		if err != nil {
			t.Errorf("open: %v", err)
			return
		}
		f.WriteAt([]byte("tampered"), 100)
		f.Close()
	}
	defer func() { beforeRehash = nil }()
	p := launch(t, ex, impl)
	_, err := p.Load(ctx(t))
	f, ok := AsFault(err)
	if !ok || f.Kind != KindTampered || f.ReasonCode() != reasons.VerificationFailed {
		t.Fatalf("Load after the artifact was rewritten: %v", err)
	}
	if len(alive(p.Pgid(), p.Pid())) != 0 {
		t.Fatalf("the provider still runs")
	}
}
