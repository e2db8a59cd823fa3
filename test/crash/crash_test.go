package crash

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/reasons"
)

// TestSIGKILLAtEachPhaseOfASwapRecovers kills the manager right after each
// phase record of a hot swap is durable, restarts it, and checks the end
// state: one Active generation per module, a verifying ledger, the counter
// continuing from the last durable snapshot, no process of the killed
// manager left.
func TestSIGKILLAtEachPhaseOfASwapRecovers(t *testing.T) {
	// The occurrence of each phase record in the module's ledger: the first
	// activation writes verify, shadow_load, atomic_switch and committed.
	phases := []struct {
		phase string
		nth   int
	}{
		{"verify", 2}, {"shadow_load", 2}, {"quiesce", 1}, {"snapshot", 1}, {"migrate", 1},
		{"restore", 1}, {"readiness", 1}, {"atomic_switch", 2}, {"drain", 1},
	}
	for _, p := range phases {
		t.Run(p.phase, func(t *testing.T) {
			n := newNode(t)
			v1 := source(t, artifacts.CounterV1, "prompt_system", "counter-v1")
			v2 := source(t, artifacts.CounterV2, "prompt_system", "counter-v2")
			// Checkpoints every second: the state before the swap (a=3) is
			// durable whatever the phase the manager dies after.
			a := newActivation(t, "kill-"+strings.ReplaceAll(p.phase, "_", "-"), func(s *iteronv1.ImplementationActivationSpec) {
				s.Checkpoint.IntervalSeconds = ptr.To[int32](1)
			}, v1)
			first := n.start(t, fmt.Sprintf("prompt_system:%s:%d", p.phase, p.nth))
			waitFor(t, a, "Ready with v1", readyWith("prompt_system", "counter-v1"))
			if c := n.mustCount(t, a, "a", 3); c != 3 {
				t.Fatalf("count %v", c)
			}
			waitCheckpointed(t, a, 3)
			cur := get(t, a)
			cur.Spec.Sources[0] = v2
			if err := env.Client.Update(t.Context(), cur); err != nil {
				t.Fatal(err)
			}
			first.waitKilled(t)
			leftover := n.providerPids(t)
			// The providers die with their manager (Pdeathsig); anything in
			// their groups is swept by the next manager.
			second := n.start(t, "")
			got := waitFor(t, a, "Ready with v2 after the restart", readyWith("prompt_system", "counter-v2"))
			if c := n.mustCount(t, got, "a", 1); c != 4 {
				t.Fatalf("after the restart a=%v; want 4: the state of the last durable snapshot (3) carried into v2", c)
			}
			// Generation status is mirrored asynchronously: the one the killed
			// manager left Active turns Inactive once the ledger's replay
			// named its successor.
			for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
				act := activeGenerations(t, got, "prompt_system")
				if len(act) == 1 && act[0] == got.Status.Modules[0].GenerationName {
					break
				}
				if time.Since(start) > 30*time.Second {
					t.Fatalf("Active Generations of prompt_system: %v; want exactly %s", act, got.Status.Modules[0].GenerationName)
				}
			}
			if len(got.Status.Modules) != 1 || got.Status.Modules[0].Phase != iteronv1.PhaseActive {
				t.Fatalf("status.modules %+v", got.Status.Modules)
			}
			verified := n.verifyLedger(t, got)
			for _, pid := range leftover {
				if !processGone(pid) {
					t.Fatalf("process %d of the killed manager is still there", pid)
				}
			}
			t.Logf("killed after %s (#%d): %d provider group(s) of the killed manager gone; restarted → v2 Active, a=4; %s", p.phase, p.nth, len(leftover), verified)
			deleteActivation(t, got)
			_ = second.stop(t)
		})
	}
}

// TestSIGTERMUnderCallsCheckpointsAndARestartLosesNothing stops the
// manager while calls run: every Active generation is checkpointed, and the
// restarted manager restores it with nothing lost.
func TestSIGTERMUnderCallsCheckpointsAndARestartLosesNothing(t *testing.T) {
	n := newNode(t)
	// No periodic checkpoint: only the shutdown's can carry the state.
	a := newActivation(t, "sigterm", func(s *iteronv1.ImplementationActivationSpec) {
		s.Checkpoint.IntervalSeconds = ptr.To[int32](0)
	}, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	first := n.start(t, "")
	waitFor(t, a, "Ready", readyWith("prompt_system", "counter"))

	var mu sync.Mutex
	lastOK, attempts := 0.0, 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			attempts++
			mu.Unlock()
			c, err := n.count(t, a, "k", 1)
			if err != nil {
				return // the manager is going away
			}
			mu.Lock()
			lastOK = c
			mu.Unlock()
		}
	}()
	time.Sleep(2 * time.Second)
	if err := first.stop(t); err != nil {
		t.Fatalf("the manager's exit after SIGTERM: %v", err)
	}
	close(stop)
	wg.Wait()
	if lastOK == 0 {
		t.Fatal("no call succeeded before the SIGTERM")
	}
	snaps, _ := os.ReadDir(filepath.Join(n.stateDir, "snapshots", string(get(t, a).UID), "prompt_system"))
	if len(snaps) == 0 {
		t.Fatal("no checkpoint was written at shutdown")
	}
	n.start(t, "")
	got := waitFor(t, a, "Ready after the restart", readyWith("prompt_system", "counter"))
	restored := n.mustCount(t, got, "k", 0)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("SIGTERM under calls: %d calls attempted, last answered count %v, restored count %v", attempts, lastOK, restored)
	if restored < lastOK || restored > float64(attempts) {
		t.Fatalf("restored count %v; want at least the last answered %v (nothing lost) and at most the %d calls made", restored, lastOK, attempts)
	}
	n.verifyLedger(t, got)
	deleteActivation(t, got)
}

// TestAProviderKilledFromOutsideIsRelaunchedFromItsCheckpoint kills the
// provider process itself: the manager relaunches the generation and
// restores its newest checkpoint.
func TestAProviderKilledFromOutsideIsRelaunchedFromItsCheckpoint(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "killprov", func(s *iteronv1.ImplementationActivationSpec) {
		s.Checkpoint.IntervalSeconds = ptr.To[int32](1)
	}, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	n.start(t, "")
	got := waitFor(t, a, "Ready", readyWith("prompt_system", "counter"))
	n.mustCount(t, got, "a", 5)
	name := got.Status.Modules[0].GenerationName
	var pid int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		var g iteronv1.Generation
		if err := env.Client.Get(t.Context(), keyOf(ns, name), &g); err == nil && g.Status.Pid > 0 && g.Status.LastCheckpoint != nil {
			pid = g.Status.Pid
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the generation never showed a pid and a checkpoint")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // a checkpoint after the call
	if err := syscall.Kill(-int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		var g iteronv1.Generation
		if err := env.Client.Get(t.Context(), keyOf(ns, name), &g); err == nil && g.Status.Pid > 0 && g.Status.Pid != pid && g.Status.Phase == iteronv1.PhaseActive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the generation was not relaunched")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c := n.mustCount(t, got, "a", 1); c != 6 {
		t.Fatalf("after the relaunch a=%v; want 6 (restored from the checkpoint)", c)
	}
	if !strings.Contains(n.verifyLedger(t, got), "ok:") {
		t.Fatal("ledger")
	}
	deleteActivation(t, got)
}

// TestACorruptLedgerStopsTheManagerActingAndDeletionArchivesIt corrupts a
// ledger while no manager runs: the next manager starts nothing for that
// activation and says ledger_corrupt; deleting it archives the ledger.
func TestACorruptLedgerStopsTheManagerActingAndDeletionArchivesIt(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "corrupt", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	first := n.start(t, "")
	got := waitFor(t, a, "Ready", readyWith("prompt_system", "counter"))
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.stateDir, "ledgers", string(got.UID))
	seg := filepath.Join(dir, "ledger-000001.jsonl")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(data), `"elapsed_ms":`) + len(`"elapsed_ms":`)
	data[i] ^= 1 // a digit changes: the record's hash no longer matches
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	n.start(t, "")
	got = waitFor(t, a, "Stalled with ledger_corrupt", stalledWith(reasons.LedgerCorrupt))
	if got.Status.ActiveCount != 0 || len(n.providerPids(t)) != 0 {
		t.Fatalf("a provider was started for an activation with a corrupt ledger: active=%d records=%v", got.Status.ActiveCount, n.providerPids(t))
	}
	deleteActivation(t, got)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the corrupt ledger was not archived: %v", err)
	}
	archives, _ := os.ReadDir(filepath.Join(n.stateDir, "ledgers", "archive"))
	if len(archives) != 1 || !strings.HasPrefix(archives[0].Name(), string(got.UID)) {
		t.Fatalf("archives %v", archives)
	}
}

// waitCheckpointed waits until the module's newest checkpoint holds a=want.
func waitCheckpointed(t *testing.T, a *iteronv1.ImplementationActivation, want int) {
	t.Helper()
	name := get(t, a).Status.Modules[0].GenerationName
	deadline := time.Now().Add(30 * time.Second)
	var first *iteronv1.Checkpoint
	for {
		var g iteronv1.Generation
		if err := env.Client.Get(t.Context(), keyOf(ns, name), &g); err == nil && g.Status.LastCheckpoint != nil {
			if first == nil {
				cp := *g.Status.LastCheckpoint
				first = &cp
			} else if g.Status.LastCheckpoint.At.After(first.At.Time) {
				return // a checkpoint taken after the call
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint after a=%d", want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
