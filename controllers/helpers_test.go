package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/ledger"
)

// source lays out an example provider and returns it as an activation source.
func source(t *testing.T, example, module, id string, argv ...string) iteronv1.ActivationSource {
	t.Helper()
	s := providertest.Example(t, example, module, id, argv...)
	return iteronv1.ActivationSource{
		Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
	}
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

var nameSeq int

// newActivation creates an activation on the test node and, at the end of
// the test, deletes it and waits until its finalizer let it go.
func newActivation(t *testing.T, prefix string, edit func(*iteronv1.ImplementationActivationSpec), sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	nameSeq++
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, nameSeq), Namespace: "default"},
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
	ctx := context.Background()
	if err := env.Client.Delete(ctx, act); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %s: %v", act.Name, err)
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(act), &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("activation %s was not released by its finalizer: %v", act.Name, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFor polls an activation until cond holds.
func waitFor(t *testing.T, act *iteronv1.ImplementationActivation, what string, cond func(*iteronv1.ImplementationActivation) bool) *iteronv1.ImplementationActivation {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var got iteronv1.ImplementationActivation
	for {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &got); err != nil {
			t.Fatal(err)
		}
		if cond(&got) {
			return &got
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(got.Status, "", "  ")
			t.Fatalf("%s never became %s; status:\n%s", act.Name, what, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func condition(a *iteronv1.ImplementationActivation, typ string) *metav1.Condition {
	return meta.FindStatusCondition(a.Status.Conditions, typ)
}

// ready: Ready=True, Reconciling=False, for the current spec.
func ready(a *iteronv1.ImplementationActivation) bool {
	r, rec := condition(a, iteronv1.ConditionReady), condition(a, iteronv1.ConditionReconciling)
	return a.Status.ObservedGeneration == a.Generation && r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == a.Generation &&
		rec != nil && rec.Status == metav1.ConditionFalse
}

// stalled: Stalled=True for the current spec.
func stalled(a *iteronv1.ImplementationActivation) bool {
	s := condition(a, iteronv1.ConditionStalled)
	return a.Status.ObservedGeneration == a.Generation && s != nil && s.Status == metav1.ConditionTrue && s.ObservedGeneration == a.Generation
}

func updateSpec(t *testing.T, act *iteronv1.ImplementationActivation, edit func(*iteronv1.ImplementationActivation)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur iteronv1.ImplementationActivation
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &cur); err != nil {
			return err
		}
		edit(&cur)
		return env.Client.Update(context.Background(), &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func moduleStatus(a *iteronv1.ImplementationActivation, module string) iteronv1.ModuleStatus {
	for _, m := range a.Status.Modules {
		if m.Module == module {
			return m
		}
	}
	return iteronv1.ModuleStatus{}
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
	r, err := d.Invoke(context.Background(), hotswap.Call{ID: fmt.Sprintf("c-%d", time.Now().UnixNano()), Input: []byte(fmt.Sprintf(`{"key":%q,"add":%d}`, key, add)), Deadline: time.Now().Add(10 * time.Second)})
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
	deadline := time.Now().Add(60 * time.Second)
	var g iteronv1.Generation
	for {
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &g)
		if err == nil && cond(&g) {
			return &g
		}
		if time.Now().After(deadline) {
			t.Fatalf("Generation %s never became %s (%v): %+v", name, what, err, g.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ledgerDir is the activation's ledger directory.
func ledgerDir(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	dir, err := ledger.ActivationDir(stateDir, string(a.UID))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// verifyLedger runs `kubectl iteron ledger verify` on the activation's
// ledger and returns its records as module:phase:outcome.
func verifyLedger(t *testing.T, a *iteronv1.ImplementationActivation) []string {
	t.Helper()
	dir := ledgerDir(t, a)
	out, err := exec.Command(cliBin, "ledger", "verify", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl iteron ledger verify %s: %v\n%s", dir, err, out)
	}
	var recs []string
	if _, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		recs = append(recs, fmt.Sprintf("%s:%s:%s", r.Module, r.Phase, r.Outcome))
		return nil
	}); err != nil {
		t.Fatal(err)
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

var _ = slices.Equal[[]string]
