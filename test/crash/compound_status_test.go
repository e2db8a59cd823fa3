package crash

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/reasons"
)

// TestARelaunchRefusedAfterAFailedSwapIsWhatStatusDoctorAndCallsSay: a hot
// swap v2 → v1 fails at migrate (v1 cannot read layout 2) and v2 keeps
// serving; then v2's executable changes on disk and its process is killed.
// The relaunch is refused at once (verification_failed, not retried as a
// crash), and that — not the earlier swap failure — is what the conditions,
// status.modules, the doctor's headline and a call say. Restoring the bytes
// and requesting a retry relaunches v2.
func TestARelaunchRefusedAfterAFailedSwapIsWhatStatusDoctorAndCallsSay(t *testing.T) {
	n := newNode(t)
	v2 := providertest.Example(t, artifacts.CounterV2, "prompt_system", "counter-v2")
	v1 := source(t, artifacts.CounterV1, "prompt_system", "counter-v1")
	a := newActivation(t, "cf-refused", nil, iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: "counter-v2",
		CatalogPath: v2.CatalogPath, ArtifactRoot: v2.ArtifactRoot, ManifestSHA256: v2.ManifestSHA256, ArtifactSHA256: v2.ArtifactSHA256})
	mgr := n.start(t, "")
	n.cfDump(t, a)
	got := waitFor(t, a, "Ready with v2", readyWith("prompt_system", "counter-v2"))
	v2Gen := got.Status.Modules[0].GenerationName
	if r := n.cfCall(t, got, "a", 2, 10*time.Second); !r.ok || r.count != 2 {
		t.Fatalf("first call: %v", r)
	}

	// 1. The swap to v1 fails at migrate; v2 keeps serving.
	cur := get(t, a)
	cur.Spec.Sources[0] = v1
	if err := env.Client.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	swapFailed := waitFor(t, a, "Stalled by the failed swap, v2 still serving", func(x *iteronv1.ImplementationActivation) bool {
		s := cfCondition(x, iteronv1.ConditionStalled)
		return x.Status.ObservedGeneration == x.Generation && s.Status == metav1.ConditionTrue &&
			len(x.Status.Modules) == 1 && x.Status.Modules[0].Phase == iteronv1.PhaseActive && x.Status.Modules[0].GenerationName == v2Gen
	})
	swapReason := swapFailed.Status.Modules[0].Reason
	blockedMigrate := false
	for _, r := range n.cfLedger(t, a) {
		blockedMigrate = blockedMigrate || (r.Phase == "migrate" && r.Outcome == "blocked")
	}
	if !blockedMigrate {
		t.Fatalf("the swap to v1 did not fail at migrate: %s", cfConditions(swapFailed))
	}
	if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok || r.count != 3 {
		t.Fatalf("after the failed swap v2 should still serve: %v", r)
	}
	if text, rep := cfDoctor(t, swapFailed); !strings.Contains(cfHeadline(text), "every module serves, 0 of 1 its desired implementation") || rep.ServingCount != 1 {
		t.Fatalf("after the failed swap v2 still serves, and the doctor's headline should say so:\n%s", text)
	}
	t.Logf("after the failed swap: %s", cfState(t, swapFailed))

	// 2. v2's executable changes on disk; its process is killed.
	orig, err := os.ReadFile(v2.Executable)
	if err != nil {
		t.Fatal(err)
	}
	changed := append([]byte(nil), orig...)
	changed[len(changed)/2] ^= 0xff
	if err := os.WriteFile(v2.Executable, changed, 0o755); err != nil {
		t.Fatal(err)
	}
	pid := cfGeneration(t, v2Gen).Status.Pid
	if pid <= 0 {
		t.Fatalf("Generation %s shows no pid", v2Gen)
	}
	killed := time.Now()
	if err := syscall.Kill(-int(pid), syscall.SIGKILL); err != nil {
		t.Fatalf("kill the provider's group %d: %v", pid, err)
	}
	refused := waitFor(t, a, "Stalled with verification_failed", stalledWith(reasons.VerificationFailed))
	t.Logf("refusal shown in status %v after the kill", time.Since(killed).Round(time.Millisecond))

	// Not retried as a crash: watch a window longer than the first three
	// backoffs (0.5 + 1 + 2 s) after the refusal was shown.
	relaunches := func() []string {
		return cfTransactions(n.cfLedger(t, a), func(r cfRecord) bool {
			return strings.Contains(r.TransactionID, "/g1/") && strings.Contains(r.TransactionID, "/r")
		})
	}
	first := relaunches()
	window := time.Now().Add(4 * time.Second)
	for time.Now().Before(window) {
		if r := n.cfCall(t, refused, "a", 1, 10*time.Second); r.ok || !r.gateway || r.reason != reasons.VerificationFailed ||
			r.code != codes.FailedPrecondition || r.elapsed > 2*time.Second {
			t.Fatalf("a call while v2's relaunch is refused: %v; want verification_failed (gRPC FailedPrecondition) at once", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if again := relaunches(); len(again) != len(first) || len(first) != 1 {
		t.Fatalf("relaunch transactions of %s: %v at the refusal, %v 4 s later; want exactly one (refused, not retried as a crash)", v2Gen, first, again)
	}
	var refusal []string
	for _, r := range n.cfLedger(t, a) {
		if r.TransactionID == first[0] {
			refusal = append(refusal, r.String())
		}
	}
	if !strings.Contains(strings.Join(refusal, "\n"), "shadow_load blocked: verification_failed") {
		t.Fatalf("the relaunch transaction does not record the refusal at shadow_load:\n%s", strings.Join(refusal, "\n"))
	}
	out := mgr.out.String()
	if c, r := strings.Count(out, `"provider crashed"`), strings.Count(out, `"relaunch refused"`); c != 1 || r != 1 {
		t.Fatalf("the manager logged %d crash(es) and %d refusal(s); want the kill as one crash and one refusal", c, r)
	}

	cur = get(t, a)
	for _, ct := range []string{iteronv1.ConditionReady, iteronv1.ConditionStalled, iteronv1.ConditionDegraded} {
		c := cfCondition(cur, ct)
		wantStatus := metav1.ConditionTrue
		if ct == iteronv1.ConditionReady {
			wantStatus = metav1.ConditionFalse
		}
		if c.Status != wantStatus || c.Reason != iteronv1.ReasonVerificationFailed {
			t.Fatalf("%s is %s/%s (%s); want %s/%s, not the earlier %s", ct, c.Status, c.Reason, c.Message, wantStatus, iteronv1.ReasonVerificationFailed, swapReason)
		}
	}
	if ms := cur.Status.Modules[0]; ms.Reason != reasons.VerificationFailed || ms.Phase == iteronv1.PhaseActive {
		t.Fatalf("status.modules: %s; want reason verification_failed, not Active", cfModules(cur))
	}
	if g := cfGeneration(t, v2Gen); g.Status.Phase != iteronv1.PhaseFailed || g.Status.Reason != reasons.VerificationFailed {
		t.Fatalf("Generation %s is %s (%s); want Failed with verification_failed", v2Gen, g.Status.Phase, g.Status.Reason)
	}
	if ms := cur.Status.Modules[0]; !strings.Contains(ms.Message, "relaunch of "+v2Gen+" refused") {
		t.Fatalf("status.modules[0].message %q does not explain the refusal", ms.Message)
	}
	text, rep := cfDoctor(t, cur)
	head := cfHeadline(text)
	if !strings.Contains(head, "nothing serves prompt_system (verification_failed)") || strings.Contains(text, "serving counter-v2") {
		t.Fatalf("the doctor's headline %q; want nothing serves prompt_system (verification_failed), and no line claiming counter-v2 serves:\n%s", head, text)
	}
	if rep.Healthy || rep.ServingCount != 0 || len(rep.Modules) != 1 || rep.Modules[0].Reason != reasons.VerificationFailed || rep.Modules[0].ImplementationID != "" {
		t.Fatalf("doctor report: healthy %t serving %d modules %+v", rep.Healthy, rep.ServingCount, rep.Modules)
	}
	r := n.cfCall(t, cur, "a", 1, 15*time.Second)
	if r.ok || r.reason != reasons.VerificationFailed || r.elapsed > 2*time.Second {
		t.Fatalf("a call with a 15 s budget: %v; want verification_failed well before its deadline", r)
	}
	t.Logf("refused relaunch: %s | modules: %s | doctor: %q | call: %v", cfConditions(cur), cfModules(cur), head, r)

	// 3. The bytes restored and a retry requested: v2 is relaunched.
	if err := os.WriteFile(v2.Executable, orig, 0o755); err != nil {
		t.Fatal(err)
	}
	cur = get(t, a)
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[iteronv1.AnnotationRetry] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := env.Client.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	back := waitFor(t, a, "v2 serving again", func(x *iteronv1.ImplementationActivation) bool {
		return x.Status.LastHandledRetryAt == cur.Annotations[iteronv1.AnnotationRetry] && len(x.Status.Modules) == 1 &&
			x.Status.Modules[0].Phase == iteronv1.PhaseActive && x.Status.Modules[0].GenerationName == v2Gen &&
			x.Status.ObservedGeneration == x.Generation && cfCondition(x, iteronv1.ConditionReconciling).Status == metav1.ConditionFalse
	})
	waitGeneration(t, v2Gen, "Active again", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && g.Status.Pid != pid
	})
	r = n.cfCall(t, back, "a", 1, 10*time.Second)
	if !r.ok {
		t.Fatalf("after the retry the call failed: %v", r)
	}
	text, _ = cfDoctor(t, back)
	t.Logf("after the retry: %s | modules: %s | doctor: %q | call: %v", cfConditions(back), cfModules(back), cfHeadline(text), r)
	deleteActivation(t, back)
}

// cfState is the conditions, modules and doctor headline in one
// line, for the log.
func cfState(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	text, _ := cfDoctor(t, a)
	return cfConditions(a) + " | modules: " + cfModules(a) + " | doctor: " + cfHeadline(text)
}

// TestACorruptLedgerIsWhatStatusDoctorAndCallsSay: the ledger is corrupted
// while the manager is down. The next manager starts no process for the
// activation, and every view says ledger_corrupt: Stalled and Degraded
// (not "every module serves"), status.modules, the doctor's headline
// (nothing serves), and a call, which fails at once.
func TestACorruptLedgerIsWhatStatusDoctorAndCallsSay(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "cf-corrupt", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	first := n.start(t, "")
	got := waitFor(t, a, "Ready", readyWith("prompt_system", "counter"))
	if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok {
		t.Fatalf("first call: %v", r)
	}
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(n.stateDir, "ledgers", string(got.UID), "ledger-000001.jsonl")
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
	n.cfDump(t, a)
	got = waitFor(t, a, "Stalled with ledger_corrupt, observed", func(x *iteronv1.ImplementationActivation) bool {
		return stalledWith(reasons.LedgerCorrupt)(x) && x.Status.ObservedGeneration == x.Generation
	})
	for _, ct := range []string{iteronv1.ConditionReady, iteronv1.ConditionStalled, iteronv1.ConditionDegraded} {
		c := cfCondition(got, ct)
		wantStatus := metav1.ConditionTrue
		if ct == iteronv1.ConditionReady {
			wantStatus = metav1.ConditionFalse
		}
		if c.Status != wantStatus || c.Reason != iteronv1.ReasonLedgerCorrupt {
			t.Fatalf("%s is %s/%s (%s); want %s/%s", ct, c.Status, c.Reason, c.Message, wantStatus, iteronv1.ReasonLedgerCorrupt)
		}
	}
	if len(got.Status.Modules) != 1 || got.Status.Modules[0].Reason != reasons.LedgerCorrupt || got.Status.Modules[0].Phase == iteronv1.PhaseActive || got.Status.ActiveCount != 0 {
		t.Fatalf("status.modules: %s (active %d); want ledger_corrupt and nothing Active", cfModules(got), got.Status.ActiveCount)
	}
	text, rep := cfDoctor(t, got)
	head := cfHeadline(text)
	if !strings.Contains(head, "nothing serves prompt_system (ledger_corrupt)") || rep.Healthy || rep.ServingCount != 0 {
		t.Fatalf("the doctor's headline %q (serving %d); want it to say nothing serves prompt_system (ledger_corrupt):\n%s", head, rep.ServingCount, text)
	}
	r := n.cfCall(t, got, "a", 1, 15*time.Second)
	if r.ok || !r.gateway || r.reason != reasons.LedgerCorrupt || r.code != codes.Unavailable || r.elapsed > 2*time.Second {
		t.Fatalf("a call with the ledger corrupt: %v; want ledger_corrupt (gRPC Unavailable) at once", r)
	}
	if pids := n.providerPids(t); len(pids) != 0 {
		t.Fatalf("a provider was started for an activation with a corrupt ledger: %v", pids)
	}
	t.Logf("corrupt ledger: %s | modules: %s | doctor: %q | call: %v", cfConditions(got), cfModules(got), head, r)
	deleteActivation(t, got)
}

// TestCallsRightAfterARestartAreNeverToldTheModuleDoesNotExist calls a
// module in a loop from before the manager starts until it serves again,
// over several restarts: the gateway answers recovering (UNAVAILABLE, retry)
// or serves the call, never not_found. Connection errors before the socket
// is up are the gRPC library's, not the gateway's answer, and are counted
// apart.
func TestCallsRightAfterARestartAreNeverToldTheModuleDoesNotExist(t *testing.T) {
	n := newNode(t)
	a := newActivation(t, "cf-recover", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	mgr := n.start(t, "")
	n.cfDump(t, a)
	waitFor(t, a, "Ready", readyWith("prompt_system", "counter"))
	const restarts = 3
	tally := map[string]int{}
	example := map[string]string{} // one answer of each kind, for the log
	for i := 0; i < restarts; i++ {
		if err := mgr.stop(t); err != nil {
			t.Fatalf("restart %d: the manager's exit after SIGTERM: %v", i+1, err)
		}
		// The caller starts before the manager does, and stops once 3 calls
		// were served; it writes answers only before done is closed.
		var answers []cfAnswer
		done := make(chan struct{})
		go func() {
			defer close(done)
			for oks, start := 0, time.Now(); oks < 3 && time.Since(start) < 90*time.Second; {
				r := n.cfCall(t, a, "k", 1, 15*time.Second)
				answers = append(answers, r)
				if r.ok {
					oks++
				} else {
					time.Sleep(5 * time.Millisecond) // keep the loop from hogging the CPUs it shares
				}
			}
		}()
		mgr = n.start(t, "")
		started := time.Now()
		<-done
		seen := map[string]int{}
		oks := 0
		for _, r := range answers {
			key := "ok"
			switch {
			case r.gateway:
				key = fmt.Sprintf("%s/%s", r.reason, r.code)
				switch {
				case strings.Contains(r.message, "is not known yet"):
					key += " (activation not known yet)"
				case strings.Contains(r.message, "not relaunched yet"):
					key += " (replayed, not relaunched yet)"
				}
			case !r.ok:
				key = "transport " + r.code.String()
			default:
				oks++
			}
			seen[key]++
			tally[key]++
			if _, ok := example[key]; !ok {
				example[key] = r.String()
			}
			if r.gateway && (r.reason != reasons.Recovering || r.code != codes.Unavailable) {
				t.Errorf("restart %d: the gateway answered %v; want only recovering (UNAVAILABLE: retry) or the call served", i+1, r)
			}
		}
		if oks < 3 {
			t.Fatalf("restart %d: the module served %d calls within 90 s of the start; answers %v", i+1, oks, seen)
		}
		t.Logf("restart %d: served 3 calls %v after the start; answers %v", i+1, time.Since(started).Round(time.Millisecond), seen)
	}
	t.Logf("over %d restarts: %v", restarts, tally)
	for k, v := range example {
		t.Logf("  %s, e.g. %s", k, v)
	}
	deleteActivation(t, get(t, a))
}
