package crash

import (
	"encoding/json"
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
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// TestSIGKILLAtEachPhaseOfASwapRecovers kills the manager right after each
// phase record of a hot swap is durable (and right after the old process
// stopped, before the drain record), reads the ledger at the kill to show
// which transaction and phase the kill landed in, restarts the manager, and
// checks the end state: one Active generation per module, a verifying
// ledger whose swap transaction is closed as the recovery rule says, the
// counter continuing from the state recovery must restore, no process of
// any group the killed manager started left.
//
// The state check tells rollback from forward recovery: a=3 is
// checkpointed, periodic checkpoints are then turned off and one more call
// makes a=4, known only to the process, before the swap. A kill before the
// switch is durable rolls back: the old generation is relaunched from its
// newest durable snapshot — the checkpoint (a=3) when the kill came before
// the swap's snapshot record, the swap's rollback snapshot (a=4) after it
// — and the controller retries the swap as attempt 2. A kill after the
// durable atomic_switch goes forward: attempt 1 of the new generation is
// relaunched from its durable restored state (a=4).
func TestSIGKILLAtEachPhaseOfASwapRecovers(t *testing.T) {
	// The occurrence of each point in the first manager's run: the first
	// activation writes verify, shadow_load, atomic_switch and committed.
	points := []struct {
		point string
		nth   int
		// last is the ledger's last record at the kill.
		last ledger.Phase
		// forward: recovery keeps the swap (switch durable).
		forward bool
		// count is a after one more call once recovered.
		count int
	}{
		{"verify", 2, ledger.PhaseVerify, false, 4},
		{"shadow_load", 2, ledger.PhaseShadowLoad, false, 4},
		{"quiesce", 1, ledger.PhaseQuiesce, false, 4},
		{"snapshot", 1, ledger.PhaseSnapshot, false, 5},
		{"migrate", 1, ledger.PhaseMigrate, false, 5},
		{"restore", 1, ledger.PhaseRestore, false, 5},
		{"readiness", 1, ledger.PhaseReadiness, false, 5},
		{"atomic_switch", 2, ledger.PhaseAtomicSwitch, true, 5},
		{hotswap.OldStopped, 1, ledger.PhaseAtomicSwitch, true, 5},
		{"drain", 1, ledger.PhaseDrain, true, 5},
		{"committed", 2, ledger.PhaseCommitted, true, 5},
	}
	for _, p := range points {
		t.Run(p.point, func(t *testing.T) {
			n := newNode(t)
			groups := lfWatchGroups(t, filepath.Join(n.stateDir, "procs"))
			v1 := source(t, artifacts.CounterV1, "prompt_system", "counter-v1")
			v2 := source(t, artifacts.CounterV2, "prompt_system", "counter-v2")
			name := "kill-" + strings.ReplaceAll(p.point, "_", "-")
			a := newActivation(t, name, func(s *iteronv1.ImplementationActivationSpec) {
				s.Checkpoint.IntervalSeconds = ptr.To[int32](1)
			}, v1)
			first := n.start(t, fmt.Sprintf("prompt_system:%s:%d", p.point, p.nth))
			waitFor(t, a, "Ready with v1", readyWith("prompt_system", "counter-v1"))
			if c := n.mustCount(t, a, "a", 3); c != 3 {
				t.Fatalf("count %v", c)
			}
			waitCheckpointed(t, a, 3)
			// No more checkpoints: once the controller applied that
			// (observedGeneration), the next call is known to the process
			// alone until the swap snapshots it.
			lfUpdate(t, a, func(s *iteronv1.ImplementationActivationSpec) { s.Checkpoint.IntervalSeconds = ptr.To[int32](0) })
			waitFor(t, a, "Ready with checkpoints off", func(got *iteronv1.ImplementationActivation) bool {
				return readyWith("prompt_system", "counter-v1")(got) && got.Status.ObservedGeneration == got.Generation
			})
			if c := n.mustCount(t, a, "a", 1); c != 4 {
				t.Fatalf("count %v; want 4", c)
			}
			lfUpdate(t, a, func(s *iteronv1.ImplementationActivationSpec) { s.Sources[0] = v2 })
			first.waitKilled(t)

			// Where the kill landed: the ledger's last record.
			swapTxn := lfTxn(t, a, 2, 1, 0)
			all := lfRecords(t, n, a, "")
			if len(all) == 0 {
				t.Fatal("the ledger is empty at the kill")
			}
			last := all[len(all)-1]
			if last.txn != swapTxn || last.phase != p.last {
				t.Fatalf("killed after %s: the ledger ends with %s %v; want the swap %s at %s", p.point, last.txn, last, swapTxn, p.last)
			}
			killedGroups := groups.all(t)
			leftover := n.providerPids(t)
			// The providers die with their manager (Pdeathsig); anything in
			// their groups is swept by the next manager.
			second := n.start(t, "")
			wantGen := iteronv1.GenerationName(name, "prompt_system", 2, 2)
			if p.forward {
				wantGen = iteronv1.GenerationName(name, "prompt_system", 2, 1)
			}
			got := waitFor(t, a, "Ready with v2 after the restart", func(got *iteronv1.ImplementationActivation) bool {
				return readyWith("prompt_system", "counter-v2")(got) && got.Status.Modules[0].GenerationName == wantGen
			})
			if c := n.mustCount(t, got, "a", 1); c != float64(p.count) {
				t.Fatalf("after the restart a=%v; want %d", c, p.count)
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
			verified := n.verifyLedger(t, got)
			tx := lfRecords(t, n, got, swapTxn)
			k := len(tx)
			switch {
			case p.forward && (tx[k-1].phase != ledger.PhaseCommitted || lfHasBlock(tx)):
				t.Fatalf("the swap past its durable switch must be closed forward: %v", tx)
			case !p.forward && (k < 2 || tx[k-1].phase != ledger.PhaseRolledBack || tx[k-2].outcome != ledger.OutcomeBlocked ||
				tx[k-2].reason != reasons.ProviderFailed+": "+ledger.RecoveryMessage):
				t.Fatalf("the swap killed before its durable switch must be closed blocked(…, %s: %s) + rolled_back: %v", reasons.ProviderFailed, ledger.RecoveryMessage, tx)
			}
			for _, g := range killedGroups {
				if m := groupMembers(g.pgid); len(m) > 0 {
					t.Fatalf("group %s of the killed manager still has processes %v", g, m)
				}
			}
			for _, pid := range leftover {
				if m := groupMembers(pid); len(m) > 0 {
					t.Fatalf("group %d recorded by the killed manager still has processes %v", pid, m)
				}
			}
			recovery := "rolled back, swap retried as attempt 2"
			if p.forward {
				recovery = "forward, attempt 1 kept"
			}
			t.Logf("killed after %s (#%d): the ledger ended at %s %v; %d provider group(s) of the killed manager (%d live at the kill) all gone; restarted → %s: %s, a=%d; swap closed %s; %s",
				p.point, p.nth, last.txn, last, len(killedGroups), len(leftover), recovery, wantGen, p.count, lfTail(tx, 2), verified)
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
	// A positive signal before the SIGTERM: calls are being answered.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		answered := lastOK
		mu.Unlock()
		if answered >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %v calls answered in 30 s before the SIGTERM", answered)
		}
	}
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
	// A checkpoint taken after the call: the state the relaunch restores.
	waitCheckpointed(t, got, 5)
	pid := int64(lfGenerationPid(t, name))
	if err := syscall.Kill(-int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
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
	groups := lfWatchGroups(t, filepath.Join(n.stateDir, "procs"))
	n.start(t, "")
	// The positive signal first: this manager replayed the ledger, found it
	// corrupt and settled (Stalled is a resting state: observedGeneration
	// follows). Then a window in which nothing may start.
	got = waitFor(t, a, "Stalled with ledger_corrupt", func(a *iteronv1.ImplementationActivation) bool {
		return stalledWith(reasons.LedgerCorrupt)(a) && a.Status.ObservedGeneration == a.Generation
	})
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		cur := get(t, a)
		if seen := groups.all(t); cur.Status.ActiveCount != 0 || len(seen) != 0 {
			t.Fatalf("a provider was started for an activation with a corrupt ledger: active=%d groups=%v", cur.Status.ActiveCount, seen)
		}
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

// waitCheckpointed waits until the newest checkpoint of a's (only) module
// holds a=want: its Generation's status.lastCheckpoint names a durable
// snapshot, by state digest, whose state counts want for key "a".
func waitCheckpointed(t *testing.T, a *iteronv1.ImplementationActivation, want int) {
	t.Helper()
	cur := get(t, a)
	name := cur.Status.Modules[0].GenerationName
	deadline := time.Now().Add(30 * time.Second)
	last := "no checkpoint"
	for {
		var g iteronv1.Generation
		if err := env.Client.Get(t.Context(), keyOf(ns, name), &g); err == nil && g.Status.LastCheckpoint != nil {
			cp := g.Status.LastCheckpoint
			got, err := snapshotCount(string(cur.UID), g.Spec.Module, cp.StateSHA256, "a")
			if err == nil && got == want {
				return
			}
			last = fmt.Sprintf("the last, %s at %s, holds a=%d (%v)", cp.StateSHA256, cp.At, got, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint of %s holds a=%d: %s", name, want, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// snapshotCount reads the durable snapshot with the state digest from a
// node's snapshot store (any node of this package: the activation's UID is
// unique) and returns the counter's count for key, in either state layout.
func snapshotCount(uid, module, digest, key string) (int, error) {
	hex := strings.TrimPrefix(digest, "sha256:")
	files, _ := filepath.Glob(filepath.Join(base, "*", "snapshots", uid, module, hex+"-*.json"))
	if len(files) == 0 {
		return -1, fmt.Errorf("no snapshot file %s-*.json", hex)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		return -1, err
	}
	var snap struct {
		State struct {
			Counts map[string]int `json:"counts"` // layout 1
			Keys   []struct {
				Count int    `json:"count"`
				Key   string `json:"key"`
			} `json:"keys"` // layout 2
		} `json:"state"`
	}
	if err := json.Unmarshal(data, &snap); err != nil {
		return -1, fmt.Errorf("%s: %w", files[0], err)
	}
	if c, ok := snap.State.Counts[key]; ok {
		return c, nil
	}
	for _, k := range snap.State.Keys {
		if k.Key == key {
			return k.Count, nil
		}
	}
	return 0, nil
}
