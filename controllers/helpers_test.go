package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/test/operatortest"
)

// source lays out an example provider as an activation source.
func source(t *testing.T, example, module, id string, argv ...string) iteronv1.ActivationSource {
	t.Helper()
	return operatortest.Source(t, example, module, id, argv...)
}

// sourceWithCapabilities is source for a counter v2 that requests caps.
func sourceWithCapabilities(t *testing.T, module, id string, caps ...string) iteronv1.ActivationSource {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: module, ImplementationID: id, Capabilities: caps})
	s := providertest.Catalog(t, impl)[0]
	return iteronv1.ActivationSource{
		Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
	}
}

// nameSeq numbers activations; parallel subtests take numbers too.
var nameSeq atomic.Int64

// newActivation creates an activation on the test node and, at the end of
// the test, deletes it and waits until its finalizer let it go.
func newActivation(t *testing.T, prefix string, edit func(*iteronv1.ImplementationActivationSpec), sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	seq := nameSeq.Add(1)
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, seq), Namespace: "default"},
		Spec: iteronv1.ImplementationActivationSpec{
			NodeName: testNode, CandidateSHA256: providertest.CandidateSHA256, Sources: sources,
			Swap: iteronv1.SwapPolicy{DeadlineSeconds: 30},
		},
	}
	if edit != nil {
		edit(&act.Spec)
	}
	ctx := context.Background()
	if err := env.Client.Create(ctx, act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, act) })
	return act
}

func deleteAndWait(t *testing.T, act *iteronv1.ImplementationActivation) {
	operatortest.DeleteAndWait(t, env.Client, act)
}

// waitFor polls an activation until cond holds.
func waitFor(t *testing.T, act *iteronv1.ImplementationActivation, what string, cond func(*iteronv1.ImplementationActivation) bool) *iteronv1.ImplementationActivation {
	t.Helper()
	return operatortest.WaitFor(t, env.Client, act, what, cond)
}

func condition(a *iteronv1.ImplementationActivation, typ string) *metav1.Condition {
	return operatortest.Condition(a, typ)
}

func ready(a *iteronv1.ImplementationActivation) bool { return operatortest.Ready(a) }

func stalled(a *iteronv1.ImplementationActivation) bool { return operatortest.Stalled(a) }

func updateSpec(t *testing.T, act *iteronv1.ImplementationActivation, edit func(*iteronv1.ImplementationActivation)) {
	t.Helper()
	operatortest.UpdateSpec(t, env.Client, act, edit)
}

func moduleStatus(a *iteronv1.ImplementationActivation, module string) iteronv1.ModuleStatus {
	return operatortest.ModuleStatus(a, module)
}

func runtimeOf(t *testing.T, a *iteronv1.ImplementationActivation) hotswap.ActivationStatus {
	t.Helper()
	st, ok := coordinator.Status(string(a.UID))
	if !ok {
		t.Fatalf("the coordinator does not know %s", a.Name)
	}
	return st
}

// count calls the counter module through its dispatcher.
func count(t *testing.T, a *iteronv1.ImplementationActivation, module, key string, add int) (map[string]any, string) {
	t.Helper()
	d, ok := coordinator.Dispatcher(a.Namespace, a.Name, module)
	if !ok {
		t.Fatalf("no dispatcher for %s", module)
	}
	r, err := d.Invoke(context.Background(), dispatch.Call{ID: fmt.Sprintf("c-%d", time.Now().UnixNano()), Input: protocol.MustPayload(fmt.Sprintf(`{"key":%q,"add":%d}`, key, add)), Deadline: time.Now().Add(10 * time.Second)})
	if err != nil {
		t.Fatalf("invoke %s: %v", module, err)
	}
	var out map[string]any
	if err := json.Unmarshal(r.Terminal.Body, &out); err != nil {
		t.Fatal(err)
	}
	return out, r.Name
}

func generations(t *testing.T, a *iteronv1.ImplementationActivation) map[string]iteronv1.Generation {
	t.Helper()
	var list iteronv1.GenerationList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(a.Namespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string]iteronv1.Generation{}
	for _, g := range list.Items {
		if metav1.IsControlledBy(&g, a) {
			out[g.Name] = g
		}
	}
	return out
}

// waitGeneration polls a Generation until cond holds.
func waitGeneration(t *testing.T, ns, name, what string, cond func(*iteronv1.Generation) bool) *iteronv1.Generation {
	t.Helper()
	return operatortest.WaitGeneration(t, env.Client, ns, name, what, cond, func() string {
		var g iteronv1.Generation
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &g); err != nil {
			return err.Error()
		}
		owner := metav1.GetControllerOf(&g)
		if owner == nil {
			return "the Generation has no controller owner"
		}
		st, ok := coordinator.Status(string(owner.UID))
		if !ok {
			return fmt.Sprintf("the coordinator does not know activation %s", owner.UID)
		}
		gs, ok := st.Generations[name]
		var list iteronv1.GenerationList
		_ = env.Client.List(context.Background(), &list, client.InNamespace(ns))
		var siblings []string
		for _, o := range list.Items {
			if c := metav1.GetControllerOf(&o); c != nil && c.UID == owner.UID {
				siblings = append(siblings, fmt.Sprintf("%s (%s, activation generation %s, created %s)", o.Name, o.Status.Phase,
					o.Annotations[iteronv1.AnnotationActivationGeneration], o.CreationTimestamp.Format(time.RFC3339)))
			}
		}
		return fmt.Sprintf("coordinator: knows %s: %v, status %+v; module %+v; failures %+v; Generations of the activation: %v",
			name, ok, gs, st.Modules[g.Spec.Module], st.Failures, siblings)
	})
}

// ledgerDir is the activation's ledger directory (<state-dir>/ledgers/<uid>:
// the layout docs/operations.md documents).
func ledgerDir(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	return filepath.Join(stateDir, "ledgers", string(a.UID))
}

// verifyLedger runs `kubectl iteron ledger verify` on the activation's
// ledger and returns its records as module:phase:outcome.
func verifyLedger(t *testing.T, a *iteronv1.ImplementationActivation) []string {
	t.Helper()
	var recs []string
	for _, r := range ledgerRecords(t, a) {
		recs = append(recs, fmt.Sprintf("%s:%s:%s", r.Module, r.Phase, r.Outcome))
	}
	return recs
}

// ledgerRecord is what the tests read of a ledger record.
type ledgerRecord struct {
	Module, Phase, Outcome string
	// BlockKind and Reason are set on blocked records and the rolled_back
	// (or rollback_failed) record that repeats them.
	BlockKind *string `json:"block_kind"`
	Reason    *string
}

// ledgerRecords runs `kubectl iteron ledger verify` on the activation's
// ledger and returns its records.
func ledgerRecords(t *testing.T, a *iteronv1.ImplementationActivation) []ledgerRecord {
	t.Helper()
	dir := ledgerDir(t, a)
	out, err := exec.Command(cliBin, "ledger", "verify", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl iteron ledger verify %s: %v\n%s", dir, err, out)
	}
	// Verified: its records can be read as plain JSON lines, segment by
	// segment (the manager never reads them any other way than verified).
	segments, err := filepath.Glob(filepath.Join(dir, "ledger-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(segments)
	var recs []ledgerRecord
	for _, seg := range segments {
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			var r ledgerRecord
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("%s: %v", seg, err)
			}
			recs = append(recs, r)
		}
	}
	return recs
}

// transactionsOf keeps one module's records, split into transactions.
func transactionsOf(recs []string, module string) [][]string {
	var txs [][]string
	var cur []string
	for _, r := range recs {
		if !strings.HasPrefix(r, module+":") {
			continue
		}
		cur = append(cur, strings.TrimPrefix(r, module+":"))
		if strings.HasPrefix(strings.TrimPrefix(r, module+":"), "committed:") || strings.HasPrefix(strings.TrimPrefix(r, module+":"), "rolled_back:") {
			txs = append(txs, cur)
			cur = nil
		}
	}
	return txs
}

// processGroup lists the processes of process group pgid (a provider
// leads its own group: its pgid is its pid), zombies included, as
// "pid (comm) state".
func processGroup(t *testing.T, pgid int) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone since the listing
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
		stat := string(data)
		end := strings.LastIndexByte(stat, ')')
		if end < 0 {
			continue
		}
		f := strings.Fields(stat[end+1:])
		if len(f) < 3 {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			out = append(out, fmt.Sprintf("%d %s %s", pid, stat[strings.IndexByte(stat, '('):end+1], f[0]))
		}
	}
	return out
}

func processGone(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", fmt.Sprint(pid)))
	return os.IsNotExist(err)
}

func pids(t *testing.T, a *iteronv1.ImplementationActivation) map[string]int {
	t.Helper()
	out := map[string]int{}
	for m, ms := range runtimeOf(t, a).Modules {
		out[m] = ms.Pid
	}
	return out
}

// waitEvent waits for an event about the activation with reason whose note
// mentions text.
func waitEvent(t *testing.T, a *iteronv1.ImplementationActivation, reason, text string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var list eventsv1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(a.Namespace)); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Regarding.Name == a.Name && e.Reason == reason && strings.Contains(e.Note, text) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event mentioning %q for %s", reason, text, a.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
