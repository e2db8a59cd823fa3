package survivor

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/test/restarttable"
)

var restartRows []restarttable.Row

// printRestartTable prints the restart table after the tests.
func printRestartTable() {
	if len(restartRows) > 0 {
		fmt.Print(restarttable.Table("restart table (the local control plane, the survivor and manager binaries; a caller retrying each failed call under its invocation ID)", restartRows))
	}
}

// tableCall is one attempt of the table's caller: add 1 to key k, the run
// sleeping 20 ms in the provider (so a kill finds one in flight).
func tableCall(c *caller, a *iteronv1.ImplementationActivation) restarttable.Call {
	return func(id string) restarttable.Answer {
		r := c.callSlow(a, id, "k", 1, 20)
		return restarttable.Answer{OK: r.ok, Count: r.count, Replayed: r.replayed, Code: r.code, Msg: r.msg, Took: r.took}
	}
}

// TestRetriedCallsAcrossSwapsRestartsCrashesAndARefusedRelaunchGetOnlyTrueReasons
// runs a caller that retries each failed call under its invocation ID
// against the real manager and survivor binaries, through five cases: a
// hot swap, a SIGTERM restart of the manager, a SIGKILL restart, a provider
// crash and its relaunch, and a relaunch refused because the artifact's
// bytes changed (then allowed again: the bytes restored, a retry
// requested). Each row: the attempts and the reasons the failed ones got,
// whether every retried call was answered once, whether the count went on,
// and the provider's pid. No attempt gets activation_failed; only calls in
// flight at the SIGKILL or the crash fail; the refused relaunch answers
// verification_failed at once.
func TestRetriedCallsAcrossSwapsRestartsCrashesAndARefusedRelaunchGetOnlyTrueReasons(t *testing.T) {
	n := newNode(t)
	src := providertest.Example(t, artifacts.CounterV2, module, "counter")
	next := providertest.Example(t, artifacts.CounterV2, module, "counter-b")
	toSource := func(s artifacts.Source) iteronv1.ActivationSource {
		return iteronv1.ActivationSource{Module: module, ImplementationID: s.Manifest.ImplementationID, CatalogPath: s.CatalogPath,
			ArtifactRoot: s.ArtifactRoot, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
	}
	a := newActivation(t, "table", 1, toSource(src))
	n.startSurvivor(t)
	mgr := n.startManager(t, managerBin)
	a = waitFor(t, a, "Ready", ready("counter"))
	c := newCaller(t, n)
	call := tableCall(c, a)
	l := restarttable.Start(call, "table")
	defer l.Finish()
	l.WaitAnswered(t, 10, 90*time.Second)

	type step struct {
		restarttable.Case
		// act does the case and returns once it is done (the manager
		// back, the provider relaunched …).
		act func(t *testing.T)
	}
	var refusedAt time.Time
	top := t // the processes outlive each case: started under the test, not the case
	steps := []step{
		{Case: restarttable.Case{Kind: "hot swap (counter → counter-b, state migrated)"}, act: func(t *testing.T) {
			update(t, a, func(s *iteronv1.ImplementationActivationSpec) {
				s.Sources = []iteronv1.ActivationSource{toSource(next)}
			})
			waitFor(t, a, "Ready on counter-b", ready("counter-b"))
		}},
		{Case: restarttable.Case{Kind: "manager SIGTERM, new manager", MayFail: []string{"recovering", "no gateway answered (Unavailable)"}}, act: func(t *testing.T) {
			if err := mgr.stop(t); err != nil {
				t.Fatalf("the manager's exit after SIGTERM: %v", err)
			}
			mgr = n.startManager(top, managerBin)
		}},
		{Case: restarttable.Case{Kind: "manager SIGKILL, new manager", MayFail: []string{"recovering", "no gateway answered (Unavailable)", "interrupted"}}, act: func(t *testing.T) {
			mgr.kill(t)
			mgr = n.startManager(top, managerBin)
		}},
		{Case: restarttable.Case{Kind: "provider SIGKILL, relaunched from its checkpoint", Resumes: true, MayFail: []string{"provider_failed", "recovering"}}, act: func(t *testing.T) {
			// A checkpoint taken under the calls first: the relaunch
			// restores it (a manager restart starts the interval anew).
			cp := n.waitCheckpoint(t, a, time.Now().UnixMilli())
			before := provider(t, a)
			if err := syscall.Kill(before.pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			t.Logf("killed the provider %s; the newest checkpoint before it counted %v", before, cp.count("k"))
			for start := time.Now(); provider(t, a) == before; time.Sleep(50 * time.Millisecond) {
				if time.Since(start) > 60*time.Second {
					t.Fatalf("the provider %s was not relaunched", before)
				}
			}
		}},
		{Case: restarttable.Case{Kind: "relaunch refused (artifact bytes changed), then the bytes restored and a retry requested", Resumes: true,
			MayFail: []string{"provider_failed", "recovering", "verification_failed"}}, act: func(t *testing.T) {
			// counter-b serves now; its bytes change on disk, then it crashes.
			exe := next.Executable
			orig, err := os.ReadFile(exe)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(exe, append(slices.Clone(orig), 0), 0o755); err != nil {
				t.Fatal(err)
			}
			before := provider(t, a)
			if err := syscall.Kill(before.pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			refusedAt = time.Now()
			waitFor(t, a, "the relaunch refused", func(a *iteronv1.ImplementationActivation) bool {
				for _, ms := range a.Status.Modules {
					if ms.Module == module && ms.Reason == "verification_failed" {
						return true
					}
				}
				return false
			})
			l.WaitAnswered(t, 5, 90*time.Second) // calls answered while it is refused
			if err := os.WriteFile(exe, orig, 0o755); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				cur := get(t, a)
				if cur.Annotations == nil {
					cur.Annotations = map[string]string{}
				}
				cur.Annotations[iteronv1.AnnotationRetry] = time.Now().UTC().Format(time.RFC3339Nano)
				err := env.Client.Update(context.Background(), cur)
				if err == nil {
					break
				}
				if i == 10 {
					t.Fatal(err)
				}
			}
			for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
				g := generationNow(t, a)
				if g.Status.Phase == iteronv1.PhaseActive && int(g.Status.Pid) != before.pid && g.Status.Pid != 0 {
					break
				}
				if time.Since(start) > 60*time.Second {
					t.Fatalf("not relaunched after the retry: %+v", g.Status)
				}
			}
		}},
	}
	for _, s := range steps {
		t.Run(s.Kind, func(t *testing.T) {
			from := l.Ended()
			startCount := l.LastCount()
			before := provider(t, a)
			s.act(t)
			l.WaitAnswered(t, 10, 90*time.Second)
			after := provider(t, a)
			restartRows = append(restartRows, restarttable.Analyse(t, s.Case, l.Window(from), startCount, call,
				fmt.Sprint(before.pid), fmt.Sprint(after.pid)))
		})
	}
	if !refusedAt.IsZero() {
		// The refused relaunch answered at once: no attempt waited out its
		// 20 s deadline for verification_failed.
		for _, v := range l.Window(0) {
			for _, f := range append(slices.Clone(v.Failures), v.Final) {
				if !f.OK && f.Reason() == "verification_failed" && f.Took > 10*time.Second {
					t.Errorf("%s got verification_failed after %v: it waited instead of failing at once", v.ID, f.Took)
				}
			}
		}
	}
}
