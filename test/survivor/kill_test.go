package survivor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	iteronv1 "iteron.dev/operator/api/v1alpha1"

	"iteron.dev/operator/examples/providers/artifacts"
)

// invocation is one invocation ID of a retrying caller: the failed
// attempts, then the answer that ended it.
type invocation struct {
	id       string
	failures []answer
	final    answer
	// answeredAt is when the final answer arrived.
	answeredAt time.Time
}

// retryingLoop is workers callers calling in a loop, each on its own key,
// each call a run that sleeps sleepMs in the provider; a failed call is
// retried under the same invocation ID (for at most 30 s) as a careful
// client does.
type retryingLoop struct {
	mu      sync.Mutex
	inv     map[string][]*invocation // key → invocations in order
	made    int
	stop    chan struct{}
	wg      sync.WaitGroup
	sleepMs int
}

func startRetryingLoop(c *caller, a *iteronv1.ImplementationActivation, prefix string, keys []string, sleepMs int) *retryingLoop {
	l := &retryingLoop{inv: map[string][]*invocation{}, stop: make(chan struct{}), sleepMs: sleepMs}
	for _, key := range keys {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 1; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				inv := &invocation{id: fmt.Sprintf("%s-%s-%d", prefix, key, i)}
				for begin := time.Now(); ; {
					r := c.callSlow(a, inv.id, key, 1, sleepMs)
					l.mu.Lock()
					l.made++
					l.mu.Unlock()
					// A transport failure (the manager went away) is
					// retried under the same ID; an answer, or a failure
					// the gateway gave (the invocation's outcome), ends it.
					retry := r.code == codes.Unavailable || r.code == codes.DeadlineExceeded
					if r.ok || !retry || time.Since(begin) > 30*time.Second {
						inv.final, inv.answeredAt = r, time.Now()
						break
					}
					inv.failures = append(inv.failures, r)
					time.Sleep(20 * time.Millisecond)
				}
				l.mu.Lock()
				l.inv[key] = append(l.inv[key], inv)
				l.mu.Unlock()
				if !inv.final.ok {
					// A module that cannot serve answers at once: do not
					// spin on it.
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	return l
}

// answered is how many invocations have their final answer.
func (l *retryingLoop) answered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, v := range l.inv {
		n += len(v)
	}
	return n
}

func (l *retryingLoop) waitAnswered(t *testing.T, more int) {
	t.Helper()
	want := l.answered() + more
	for start := time.Now(); l.answered() < want; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("the callers got %d answers in 90 s; want %d", l.answered(), want)
		}
	}
}

func (l *retryingLoop) finish() (map[string][]*invocation, int) {
	close(l.stop)
	l.wg.Wait()
	return l.inv, l.made
}

// retryReport sums up the invocations that failed at least once: how
// many, how many were then answered from the first outcome (replayed: the
// provider had run them before the kill), and whether asking each of them
// once more gives the same answer (the same count, replayed; or the same
// failure): answered once.
func retryReport(t *testing.T, c *caller, a *iteronv1.ImplementationActivation, inv map[string][]*invocation, sleepMs int) (retried, replayed int, once bool, detail []string) {
	t.Helper()
	once = true
	for key, list := range inv {
		for _, v := range list {
			if len(v.failures) == 0 && v.final.ok {
				continue
			}
			retried++
			if v.final.replayed {
				replayed++
			}
			again := c.callSlow(a, v.id, key, 1, sleepMs) // the same call
			first := v.final
			if len(v.failures) > 0 {
				first = v.failures[0]
			}
			detail = append(detail, fmt.Sprintf("%s: failed %d× (first: %v), then %v; asked again: %v", v.id, len(v.failures), first, v.final, again))
			switch {
			case v.final.ok && (!again.ok || !again.replayed || again.count != v.final.count):
				once = false
			case !v.final.ok && again.ok:
				// Refused before it ran (the module could not serve then):
				// no outcome was kept, so asking again ran it — once: a
				// third ask replays that run.
				third := c.callSlow(a, v.id, key, 1, sleepMs)
				if !third.replayed || third.count != again.count {
					once = false
				}
				detail = append(detail, fmt.Sprintf("  %s had never run: asked again it ran (count %v), a third time: %v", v.id, again.count, third))
			case !v.final.ok && (again.code != v.final.code || again.msg != v.final.msg):
				once = false
			}
		}
	}
	sort.Strings(detail)
	return retried, replayed, once, detail
}

// TestASIGKILLedManagerFailsOnlyTheCallsInFlightAndTheirRetriesAreAnsweredOnce
// kills the manager (SIGKILL) under three callers whose runs take 100 ms in
// the provider, and starts a new one as the kubelet would. Only the calls in
// flight fail; each retried under its invocation ID is answered once: from
// the survivor's outcome when the provider had run it (replayed), else run
// then; every key's count goes on without a gap; the provider keeps its pid
// and start time; no transaction is recorded; the ledger verifies.
func TestASIGKILLedManagerFailsOnlyTheCallsInFlightAndTheirRetriesAreAnsweredOnce(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "mgrkill", 60, source(t, artifacts.CounterV2, "counter"))
	n.startSurvivor(t)
	mgr := n.startManager(t, managerBin)
	a = waitFor(t, a, "Ready", ready("counter"))
	c := newCaller(t, n)
	instance := c.handshake(t)
	before := provider(t, a)
	txnsBefore := n.ledgerTransactions(t, a)

	keys := []string{"a", "b", "c"}
	l := startRetryingLoop(c, a, "kill", keys, 100)
	l.waitAnswered(t, 15)
	mgr.kill(t)
	t.Logf("manager pid %d SIGKILLed under load", mgr.cmd.Process.Pid)
	mgr = n.startManager(t, managerBin)
	l.waitAnswered(t, 30)
	inv, made := l.finish()

	failedCalls := 0
	var gaps []string
	counts := map[string]float64{}
	for _, key := range keys {
		for i, v := range inv[key] {
			failedCalls += len(v.failures)
			if !v.final.ok {
				gaps = append(gaps, fmt.Sprintf("%s never answered: %v", v.id, v.final))
				continue
			}
			if v.final.count != float64(i+1) {
				gaps = append(gaps, fmt.Sprintf("%s (call %d of key %s) answered count %v", v.id, i+1, key, v.final.count))
			}
			counts[key] = v.final.count
		}
	}
	retried, replayed, once, detail := retryReport(t, c, a, inv, 100)
	after := provider(t, a)
	instanceAfter := c.handshake(t)
	txnsAfter := n.ledgerTransactions(t, a)
	verified := n.verifyLedger(t, a)
	t.Logf("calls made %d (invocations %d), failed %d; retried invocations %d, answered from the first outcome (replayed) %d, asked again → same count, replayed: %v",
		made, made-failedCalls, failedCalls, retried, replayed, once)
	for _, d := range detail {
		t.Logf("  %s", d)
	}
	t.Logf("counts per key %v, continuous: %v %v", counts, len(gaps) == 0, gaps)
	t.Logf("provider before %s, after %s; gateway instance %s → %s; ledger transactions before %d, after %d; %s", before, after, instance, instanceAfter, len(txnsBefore), len(txnsAfter), verified)
	if len(gaps) > 0 {
		t.Errorf("counts not continuous (a call lost or counted twice): %v", gaps)
	}
	if !once {
		t.Errorf("a retried invocation was not answered exactly once (see above)")
	}
	// Only calls in flight at the kill may fail: at most one per caller
	// (each caller has one call outstanding), each retried until answered.
	if retried > len(keys) {
		t.Errorf("%d invocations failed at least once; only the %d in flight at the kill may", retried, len(keys))
	}
	if after != before {
		t.Errorf("the provider changed from %s to %s", before, after)
	}
	if instanceAfter != instance {
		t.Errorf("the gateway's instance ID changed from %s to %s", instance, instanceAfter)
	}
	if strings.Join(txnsAfter, ",") != strings.Join(txnsBefore, ",") {
		t.Errorf("the ledger recorded transactions: before %v, after %v", txnsBefore, txnsAfter)
	}
	recordResult(summaryRow{kind: "manager SIGKILL (3 callers, 100 ms runs)", made: made, failed: failedCalls,
		retriedOnce: fmt.Sprintf("%v: %d retried, %d from the first outcome (replayed)", once, retried, replayed),
		lost:        fmt.Sprintf("0 (counts %v continuous)", counts), pids: pidsCell(before, after)})
}

func pidsCell(before, after providerIdentity) string {
	if before == after {
		return fmt.Sprintf("%d → %d (unchanged)", before.pid, after.pid)
	}
	return fmt.Sprintf("%d → %d (relaunched)", before.pid, after.pid)
}

// snapshotFile is a stored snapshot as the tests read it.
type snapshotFile struct {
	Kind        string `json:"kind"`
	StateSHA256 string `json:"state_sha256"`
	TakenUnixMs int64  `json:"taken_unix_ms"`
	State       struct {
		Keys []struct {
			Key   string  `json:"key"`
			Count float64 `json:"count"`
		} `json:"keys"`
	} `json:"state"`
}

func (s snapshotFile) count(key string) float64 {
	for _, k := range s.State.Keys {
		if k.Key == key {
			return k.Count
		}
	}
	return 0
}

// snapshots reads the module's stored snapshots.
func (n *nodeState) snapshots(t *testing.T, a *iteronv1.ImplementationActivation) []snapshotFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(n.stateDir, "snapshots", string(a.UID), module, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []snapshotFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // pruned meanwhile
		}
		var s snapshotFile
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("snapshot %s: %v", p, err)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TakenUnixMs < out[j].TakenUnixMs })
	return out
}

// waitCheckpoint waits until a checkpoint newer than after exists.
func (n *nodeState) waitCheckpoint(t *testing.T, a *iteronv1.ImplementationActivation, after int64) snapshotFile {
	t.Helper()
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		for _, s := range n.snapshots(t, a) {
			if s.Kind == "checkpoint" && s.TakenUnixMs > after {
				return s
			}
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("no checkpoint of %s within 60 s: %+v", a.Name, n.snapshots(t, a))
		}
	}
}

var restoredRE = regexp.MustCompile(`state (sha256:[0-9a-f]{64}) restored from its (\w+) snapshot`)

// TestASurvivorStoppedOrKilledRelaunchesItsProvidersFromTheirCheckpoints
// stops the survivor under a caller (SIGTERM: its upgrade; SIGKILL: its
// death) and starts a new one. The provider dies with it and the manager
// relaunches it from its newest durable snapshot: after SIGTERM the
// survivor first has the manager checkpoint (nothing lost); after SIGKILL
// what the provider counted since its newest checkpoint is lost, and the
// Generation's status says what was restored and that the rest is lost.
func TestASurvivorStoppedOrKilledRelaunchesItsProvidersFromTheirCheckpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"SIGTERM", syscall.SIGTERM},
		{"SIGKILL", syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			const interval = 2
			a := newActivation(t, "sv"+strings.ToLower(tc.name), interval, source(t, artifacts.CounterV2, "counter"))
			sv := n.startSurvivor(t)
			mgr := n.startManager(t, managerBin)
			a = waitFor(t, a, "Ready", ready("counter"))
			c := newCaller(t, n)
			before := provider(t, a)
			l := startRetryingLoop(c, a, "sv", []string{"k"}, 0)
			l.waitAnswered(t, 30)
			// The positive signal: a checkpoint taken under the calls.
			cp := n.waitCheckpoint(t, a, time.Now().Add(-time.Hour).UnixMilli())
			l.waitAnswered(t, 30)
			killedAt := time.Now()
			if tc.sig == syscall.SIGKILL {
				sv.kill(t)
			} else if err := sv.stop(t); err != nil {
				t.Fatalf("the survivor's exit after SIGTERM: %v", err)
			}
			// The snapshots that existed when the provider died.
			var newest snapshotFile
			for _, s := range n.snapshots(t, a) {
				if s.TakenUnixMs <= time.Now().UnixMilli() {
					newest = s
				}
			}
			n.startSurvivor(t)
			var after providerIdentity
			for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
				if after = provider(t, a); after != before {
					break
				}
				if time.Since(start) > 60*time.Second {
					t.Fatalf("the provider %s was not relaunched within 60 s", before)
				}
			}
			l.waitAnswered(t, 30)
			inv, made := l.finish()

			// What the relaunch restored, as the status names it.
			g := relaunchedGeneration(t, a, killedAt)
			m := restoredRE.FindStringSubmatch(g.Status.Message)
			r, restoredKind := -1.0, ""
			if m != nil {
				for _, s := range n.snapshots(t, a) {
					if s.StateSHA256 == m[1] {
						r, restoredKind = s.count("k"), s.Kind
					}
				}
			}
			// Counts: 1..K by the old provider, then r+1, r+2, … by the
			// relaunched one (K = r when nothing was lost).
			var failedCalls int
			var prev float64
			k := -1.0
			var gaps, unanswered []string
			for i, v := range inv["k"] {
				failedCalls += len(v.failures)
				if !v.final.ok {
					failedCalls++
					unanswered = append(unanswered, fmt.Sprintf("%s: %v", v.id, v.final))
					continue
				}
				switch {
				case v.final.count == prev+1:
				case v.final.count == r+1 && k < 0:
					k = prev // the relaunch restored r, lost k - r
				default:
					gaps = append(gaps, fmt.Sprintf("call %d (%s) answered %v after %v", i+1, v.id, v.final.count, prev))
				}
				prev = v.final.count
			}
			if k < 0 {
				k = r // no drop: the relaunched provider went on from r
			}
			retried, replayed, once, detail := retryReport(t, c, a, inv, 0)
			lost := k - r
			t.Logf("%s of the survivor: calls made %d, failed %d (retried invocations %d, replayed %d, asked again → same count, replayed: %v), unanswered %v",
				tc.name, made, failedCalls, retried, replayed, once, unanswered)
			for _, d := range detail {
				t.Logf("  %s", d)
			}
			t.Logf("count before the relaunch %v, restored %v, lost %v; the newest snapshot at the kill: %s taken %v before it (count %v); the first checkpoint seen: count %v",
				k, r, lost, newest.Kind, killedAt.Sub(time.UnixMilli(newest.TakenUnixMs)).Round(time.Millisecond), newest.count("k"), cp.count("k"))
			t.Logf("provider before %s, after %s; Generation %s status.message: %q; %s", before, after, g.Name, g.Status.Message, n.verifyLedger(t, a))
			for _, s := range n.snapshots(t, a) {
				t.Logf("  snapshot %s count %v taken %v (the survivor's %s at %v)", s.Kind, s.count("k"), time.UnixMilli(s.TakenUnixMs).Format("15:04:05.000"), tc.name, killedAt.Format("15:04:05.000"))
			}
			if len(gaps) > 0 {
				t.Errorf("the count is not continuous apart from the relaunch (restored %v): %v", r, gaps)
			}
			// Only the call in flight when the provider died may fail.
			if len(unanswered) > 1 || (tc.sig == syscall.SIGTERM && len(unanswered) > 0) {
				t.Errorf("calls failed: %v", unanswered)
			}
			if m == nil || r < 0 {
				t.Errorf("the Generation's status.message does not name a stored snapshot it restored: %q", g.Status.Message)
			}
			// Bounded by the checkpoint interval: the relaunch restored the
			// newest snapshot that existed when the provider died.
			if r != newest.count("k") {
				t.Errorf("restored count %v, but the newest snapshot when the provider died held %v", r, newest.count("k"))
			}
			if !strings.Contains(g.Status.Message, "is lost") {
				t.Errorf("the status does not say what may be lost: %q", g.Status.Message)
			}
			// Not the provider's fault: not counted as its crash.
			if !strings.Contains(g.Status.Message, "the survivor that owned its process went away") {
				t.Errorf("the status does not say the provider went with its survivor: %q", g.Status.Message)
			}
			if tc.sig == syscall.SIGTERM && lost != 0 {
				t.Errorf("a graceful stop of the survivor lost %v increments (the manager should checkpoint first)", lost)
			}
			if !once {
				t.Errorf("a retried invocation was not answered exactly once")
			}
			// The manager stops while its survivor runs: its exit is
			// checked here, not left to the cleanup.
			if err := mgr.stop(t); err != nil {
				t.Errorf("the manager's exit after SIGTERM: %v", err)
			}
			recordResult(summaryRow{kind: "survivor " + tc.name + fmt.Sprintf(" (checkpoint every %d s)", interval), made: made, failed: failedCalls,
				retriedOnce: fmt.Sprintf("%v: %d failed, asked again under the same ID: the same answer (%d replayed)", once, retried, replayed),
				lost:        fmt.Sprintf("%v (count %v → restored %v from its %s snapshot)", lost, k, r, restoredKind), pids: pidsCell(before, after)})
		})
	}
}

// TestAProviderThatExitsWhileNoManagerRunsIsRelaunchedAtReattach stops the
// manager, kills the provider (SIGKILL) while no manager runs, and starts a
// manager: it sees the process gone, relaunches it from its newest durable
// snapshot (a checkpoint taken under the calls, then 5 calls more: those
// are lost) and serves the count from there.
func TestAProviderThatExitsWhileNoManagerRunsIsRelaunchedAtReattach(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "exitdown", 2, source(t, artifacts.CounterV2, "counter"))
	n.startSurvivor(t)
	mgr := n.startManager(t, managerBin)
	a = waitFor(t, a, "Ready", ready("counter"))
	c := newCaller(t, n)
	before := provider(t, a)
	var last answer
	calls := 0
	callN := func(k int) {
		for range k {
			calls++
			if last = c.call(a, fmt.Sprintf("down-%d", calls), "k", 1); !last.ok {
				t.Fatalf("call %d: %v", calls, last)
			}
		}
	}
	callN(20)
	// The positive signal: a checkpoint that holds the 20 calls.
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		s := n.snapshots(t, a)
		if len(s) > 0 && s[len(s)-1].count("k") == 20 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no checkpoint holds the 20 calls within 30 s: %+v", s)
		}
	}
	callN(5)
	if err := mgr.stop(t); err != nil {
		t.Fatalf("the manager's exit after SIGTERM: %v", err)
	}
	killedAt := time.Now()
	if err := syscall.Kill(before.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the provider %s: %v", before, err)
	}
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if st, err := startTime(before.pid); err != nil || st != before.startTime {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the provider %s did not exit within 10 s of SIGKILL", before)
		}
	}
	snaps := n.snapshots(t, a)
	newest := snaps[len(snaps)-1]
	n.startManager(t, managerBin)
	next := c.call(a, "down-next", "k", 1)
	after := provider(t, a)
	g := relaunchedGeneration(t, a, killedAt)
	t.Logf("provider %s killed while no manager ran (count %v; the newest snapshot then: %s count %v); the next manager: provider %s, next call %v; Generation %s status.message %q; %s",
		before, last.count, newest.Kind, newest.count("k"), after, next, g.Name, g.Status.Message, n.verifyLedger(t, a))
	if after == before {
		t.Fatalf("the provider is still %s", before)
	}
	if !next.ok {
		t.Fatalf("the first call after the re-attach failed: %v", next)
	}
	if next.count != newest.count("k")+1 {
		t.Errorf("the first call after the relaunch counted %v; the newest snapshot held %v", next.count, newest.count("k"))
	}
	if !strings.Contains(g.Status.Message, "was not re-attached") || !strings.Contains(g.Status.Message, "restored from its") {
		t.Errorf("the Generation's status does not say why it was relaunched and what it restored: %q", g.Status.Message)
	}
	recordResult(summaryRow{kind: "provider SIGKILLed while no manager runs (checkpoint every 2 s)", made: calls + 1, failed: 0, retriedOnce: "no retry needed",
		lost: fmt.Sprintf("%v (count %v → restored %v from its %s snapshot)", last.count-newest.count("k"), last.count, newest.count("k"), newest.Kind), pids: pidsCell(before, after)})
}
