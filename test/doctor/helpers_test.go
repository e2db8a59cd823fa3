package doctor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/doctor"
	"iteron.dev/operator/test/operatortest"
)

// source lays out an example provider as an activation source.
func source(t *testing.T, example, module, id string, argv ...string) iteronv1.ActivationSource {
	t.Helper()
	return operatortest.Source(t, example, module, id, argv...)
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

// nameSeq numbers activations; parallel subtests take numbers too.
var nameSeq atomic.Int64

// newActivation creates an activation on the test node and, at the end of
// the test, deletes it and waits until its finalizer let it go.
func newActivation(t *testing.T, prefix string, edit func(*iteronv1.ImplementationActivation), sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
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
		edit(act)
	}
	if err := env.Client.Create(context.Background(), act); err != nil {
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

func moduleStatus(a *iteronv1.ImplementationActivation, module string) iteronv1.ModuleStatus {
	return operatortest.ModuleStatus(a, module)
}

func updateSpec(t *testing.T, act *iteronv1.ImplementationActivation, edit func(*iteronv1.ImplementationActivation)) {
	t.Helper()
	operatortest.UpdateSpec(t, env.Client, act, edit)
}

// waitGeneration polls a Generation until cond holds.
func waitGeneration(t *testing.T, ns, name, what string, cond func(*iteronv1.Generation) bool) *iteronv1.Generation {
	t.Helper()
	return operatortest.WaitGeneration(t, env.Client, ns, name, what, cond)
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

// settle bounds how long a test waits for the doctor to see what it
// expects: status (and Generation status, mirrored asynchronously) catches
// up with the coordinator a moment after a transaction, and the doctor
// reports what status says at the moment it reads it.
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
