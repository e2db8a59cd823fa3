package doctor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
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
	"iteron.dev/operator/internal/doctor"
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

// tamperedSource lays out counter v2 with a catalog pinning its digest,
// then changes one byte of the executable on disk: what an attacker (or a
// bad copy) does to an artifact root after it was pinned.
func tamperedSource(t *testing.T, module, id string) iteronv1.ActivationSource {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: module, ImplementationID: id})
	s := providertest.Catalog(t, impl)[0]
	b, err := os.ReadFile(impl.Executable)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(impl.Executable, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return iteronv1.ActivationSource{
		Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
	}
}

var nameSeq int

// newActivation creates an activation on the test node and, at the end of
// the test, deletes it and waits until its finalizer let it go.
func newActivation(t *testing.T, prefix string, edit func(*iteronv1.ImplementationActivation), sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
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
		edit(act)
	}
	if err := env.Client.Create(context.Background(), act); err != nil {
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

func moduleStatus(a *iteronv1.ImplementationActivation, module string) iteronv1.ModuleStatus {
	for _, m := range a.Status.Modules {
		if m.Module == module {
			return m
		}
	}
	return iteronv1.ModuleStatus{}
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

// diagnose runs the doctor package on the objects in the API server (and,
// with a state dir, on the node's files), as the CLI does.
func diagnose(t *testing.T, act *iteronv1.ImplementationActivation, stateDir string, grace time.Duration) *doctor.Report {
	t.Helper()
	in, err := doctor.Gather(context.Background(), env.Client, act.Namespace, act.Name, doctor.GatherOptions{NodeView: stateDir != ""})
	if err != nil {
		t.Fatal(err)
	}
	var local *doctor.Local
	if stateDir != "" {
		local = doctor.ReadLocal(stateDir, in.Activation)
	}
	return doctor.Diagnose(in, local, doctor.Options{OrphanGrace: grace})
}

// cli runs the kubectl-iteron binary against the test API server.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(cliBin, append(args, "--kubeconfig", kubeconfig)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatal(err)
	return -1, "", ""
}

// settle bounds how long a test waits for the doctor to see a healthy
// activation. The activation controller and the coordinator requeue each
// other (every reconcile's Apply marks the coordinator busy until its
// worker has run, and the worker's notification requeues the activation),
// so a healthy activation's Ready flaps between True and False
// (Progressing); the doctor reports what status says at the moment it
// reads it.
const settle = 15 * time.Second

// cliUntil runs the CLI until it exits with want (or settle passes) and
// returns the last run and how many runs it took.
func cliUntil(t *testing.T, want int, args ...string) (int, string, int) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for n := 1; ; n++ {
		code, out, _ := cli(t, args...)
		if code == want || time.Now().After(deadline) {
			return code, out, n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// diagnoseUntil diagnoses until cond holds (or settle passes).
func diagnoseUntil(t *testing.T, act *iteronv1.ImplementationActivation, stateDir string, cond func(*doctor.Report) bool) *doctor.Report {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		r := diagnose(t, act, stateDir, 0)
		if cond(r) || time.Now().After(deadline) {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cliJSON runs `doctor -o json` and decodes the report.
func cliJSON(t *testing.T, args ...string) (int, *doctor.Report) {
	t.Helper()
	code, out, stderr := cli(t, append(args, "-o", "json")...)
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor -o json printed no report (exit %d): %v\n%s\n%s", code, err, out, stderr)
	}
	return code, &r
}

// runPrinted runs a command the doctor printed, exactly as printed, in a
// shell: kubectl is the one built beside the control plane, pointed at the
// test API server.
func runPrinted(t *testing.T, command string) string {
	t.Helper()
	if rest, ok := strings.CutPrefix(command, "kubectl "); ok {
		command = env.KubectlPath() + " " + rest + " --kubeconfig " + kubeconfig
	}
	out, err := exec.Command("/bin/sh", "-c", command).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	return string(out)
}

func codes(r *doctor.Report) []string {
	var out []string
	for _, f := range r.Findings {
		s := string(f.Severity) + " " + f.Code
		if f.Module != "" {
			s += " " + f.Module
		}
		out = append(out, s)
	}
	return out
}

func finding(t *testing.T, r *doctor.Report, code, module string) doctor.Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.Code == code && f.Module == module {
			return f
		}
	}
	t.Fatalf("no finding %s for %q; findings: %q", code, module, codes(r))
	return doctor.Finding{}
}

func moduleDiagnosis(t *testing.T, r *doctor.Report, module string) doctor.ModuleDiagnosis {
	t.Helper()
	for _, m := range r.Modules {
		if m.Module == module {
			return m
		}
	}
	t.Fatalf("the report has no entry for module %s", module)
	return doctor.ModuleDiagnosis{}
}
