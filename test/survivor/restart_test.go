package survivor

import (
	"crypto/sha256"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

// loop is a caller calling in a loop, sequentially, each call under its
// own invocation ID, until stopped; it never retries: every error is a
// failed call.
type loop struct {
	mu      sync.Mutex
	answers []answer
	stop    chan struct{}
	done    chan struct{}
}

func startLoop(c *caller, a *iteronv1.ImplementationActivation, prefix, key string) *loop {
	l := &loop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 1; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			r := c.call(a, fmt.Sprintf("%s-%d", prefix, i), key, 1)
			l.mu.Lock()
			l.answers = append(l.answers, r)
			l.mu.Unlock()
			if !r.ok {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	return l
}

func (l *loop) made() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers)
}

// waitCalls waits until the loop made n more calls than it had.
func (l *loop) waitCalls(t *testing.T, more int) {
	t.Helper()
	want := l.made() + more
	for start := time.Now(); l.made() < want; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("the caller made %d calls in 60 s; want %d", l.made(), want)
		}
	}
}

func (l *loop) finish() []answer {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers
}

// checkContinuous reports the failed calls and whether every answered
// count is the previous one plus one, starting after from.
func checkContinuous(answers []answer, from float64) (failed []answer, gaps []string, last float64) {
	last = from
	for i, r := range answers {
		if !r.ok {
			failed = append(failed, r)
			continue
		}
		if r.count != last+1 {
			gaps = append(gaps, fmt.Sprintf("call %d answered %v after %v", i+1, r.count, last))
		}
		last = r.count
	}
	return failed, gaps, last
}

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b))[:19]
}

// TestAManagerRestartAndUpgradeUnderCallsFailNoCallAndKeepTheProvider is
// the DaemonSet rollout of the manager, twice, with a caller calling
// throughout: the old manager gets SIGTERM and exits, a new one starts
// (first the same build: `kubectl rollout restart`; then another build: an
// image change). No call fails, the count goes on without a gap, the
// provider keeps its pid and start time, the gateway's instance ID stays
// (its invocations survived), no transaction is recorded for the module,
// and the ledger verifies.
func TestAManagerRestartAndUpgradeUnderCallsFailNoCallAndKeepTheProvider(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "rollout", 60, source(t, artifacts.CounterV2, "counter"))
	n.startSurvivor(t)
	mgr := n.startManager(t, managerBin)
	a = waitFor(t, a, "Ready", ready("counter"))
	c := newCaller(t, n)
	instance := c.handshake(t)
	before := provider(t, a)
	txnsBefore := n.ledgerTransactions(t, a)
	t.Logf("before: provider %s, gateway instance %s, ledger %v", before, instance, txnsBefore)

	l := startLoop(c, a, "rollout", "k")
	for i, step := range []struct{ what, bin string }{
		{"rollout restart (the same build)", managerBin},
		{"image change (another build of the manager)", upgradedBin},
	} {
		l.waitCalls(t, 40)
		madeAt := l.made()
		old := mgr
		begin := time.Now()
		if err := old.stop(t); err != nil {
			t.Fatalf("%s: the old manager's exit after SIGTERM: %v", step.what, err)
		}
		stopped := time.Since(begin)
		mgr = n.startManager(t, step.bin)
		l.waitCalls(t, 40)
		t.Logf("%d. %s: old manager pid %d stopped in %v, new manager pid %d (%s %s); the caller made %d calls meanwhile and goes on",
			i+1, step.what, old.cmd.Process.Pid, stopped.Round(time.Millisecond), mgr.cmd.Process.Pid, step.bin[strings.LastIndex(step.bin, "/")+1:], fileDigest(t, step.bin), l.made()-madeAt)
	}
	answers := l.finish()
	failed, gaps, last := checkContinuous(answers, 0)
	after := provider(t, a)
	instanceAfter := c.handshake(t)
	txnsAfter := n.ledgerTransactions(t, a)
	verified := n.verifyLedger(t, a)
	var slowest time.Duration
	for _, r := range answers {
		slowest = max(slowest, r.took)
	}
	t.Logf("calls made %d, failed %d; counts 1..%v continuous: %v (gaps %v); slowest call %v", len(answers), len(failed), last, len(gaps) == 0, gaps, slowest.Round(time.Millisecond))
	t.Logf("provider before %s, after %s; gateway instance %s → %s; ledger transactions before %d, after %d; %s", before, after, instance, instanceAfter, len(txnsBefore), len(txnsAfter), verified)
	switch {
	case len(failed) > 0:
		t.Errorf("%d calls failed, e.g. %v", len(failed), failed[:min(len(failed), 5)])
	case len(gaps) > 0:
		t.Errorf("the count is not continuous: %v", gaps)
	case last != float64(len(answers)):
		t.Errorf("%d calls answered, the count is %v", len(answers), last)
	}
	if after != before {
		t.Errorf("the provider changed from %s to %s: the restart relaunched it", before, after)
	}
	if instanceAfter != instance {
		t.Errorf("the gateway's instance ID changed from %s to %s: its invocations did not survive", instance, instanceAfter)
	}
	if strings.Join(txnsAfter, ",") != strings.Join(txnsBefore, ",") {
		t.Errorf("the ledger recorded transactions across the restarts: before %v, after %v", txnsBefore, txnsAfter)
	}
	recordResult(summaryRow{kind: "manager rollout restart + image change (SIGTERM)", made: len(answers), failed: len(failed), retriedOnce: "no retry needed",
		lost: fmt.Sprintf("0 (count 1..%v continuous)", last), pids: fmt.Sprintf("%s → %s (unchanged)", before, after)})
}
