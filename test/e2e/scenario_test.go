package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

const ns = "default"

func (c *cluster) activationYAML(t *testing.T, name, system, context string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: iteron.dev/v1alpha1\nkind: ImplementationActivation\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  nodeName: %s\n  candidateSHA256: sha256:%064x\n  sources:\n", name, ns, c.node, 7)
	for _, key := range []string{"prompt_system/" + system, "context_assembly/" + context} {
		s, ok := c.sources[key]
		if !ok {
			t.Fatalf("hack/catalog laid out no %s (have %d sources)", key, len(c.sources))
		}
		fmt.Fprintf(&b, "  - module: %s\n    implementationID: %s\n    catalogPath: %s\n    artifactRoot: %s\n    manifestSHA256: %s\n    artifactSHA256: %s\n",
			s.Module, s.ImplementationID, s.CatalogPath, s.ArtifactRoot, s.ManifestSHA256, s.ArtifactSHA256)
	}
	path := filepath.Join(c.work, name+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// impl finds the implementation ID hack/catalog gave an example in a module.
func (c *cluster) impl(t *testing.T, module, example string) string {
	t.Helper()
	for _, s := range c.sources {
		if s.Module == module && (s.ImplementationID == example || strings.HasPrefix(s.ImplementationID, example+".")) {
			return s.ImplementationID
		}
	}
	t.Fatalf("no %s in %s", example, module)
	return ""
}

func (c *cluster) kubectlRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *cluster) waitActivation(t *testing.T, name, what string, cond func(*iteronv1.ImplementationActivation) bool) *iteronv1.ImplementationActivation {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var a iteronv1.ImplementationActivation
	for {
		err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &a)
		if err == nil && cond(&a) {
			return &a
		}
		select {
		case err := <-c.managerErr:
			c.managerErr <- err
			t.Fatalf("the manager exited (%v):\n%s", err, c.managerOut)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(a.Status, "", "  ")
			t.Fatalf("%s never became %s: %v\n%s", name, what, err, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readyWith(module, impl string) func(*iteronv1.ImplementationActivation) bool {
	return func(a *iteronv1.ImplementationActivation) bool {
		r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
		if a.Status.ObservedGeneration != a.Generation || r == nil || r.Status != metav1.ConditionTrue {
			return false
		}
		for _, m := range a.Status.Modules {
			if m.Module == module {
				return m.ImplementationID == impl && m.Phase == iteronv1.PhaseActive
			}
		}
		return false
	}
}

// invoke calls prompt_system through the gateway with the CLI.
func (c *cluster) invoke(t *testing.T, name, input string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.nodeCommand(ctx, "kubectl-iteron", "invoke", "--socket", c.socket, "--namespace", ns, "--activation", name, "--module", "prompt_system", "--input", input).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl iteron invoke: %v\n%s", err, out)
	}
	var obs map[string]any
	line := strings.TrimSpace(string(out))
	if i := strings.LastIndex(line, "\n"); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal([]byte(line), &obs); err != nil {
		t.Fatalf("invoke printed %q: %v", out, err)
	}
	return obs
}

func (c *cluster) generationPids(t *testing.T, a *iteronv1.ImplementationActivation) map[string]int64 {
	t.Helper()
	var list iteronv1.GenerationList
	if err := c.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	pids := map[string]int64{}
	for _, g := range list.Items {
		if metav1.IsControlledBy(&g, a) && g.Status.Pid > 0 {
			pids[g.Name] = g.Status.Pid
		}
	}
	return pids
}

func (c *cluster) processGone(t *testing.T, pid int64) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.nodeCommand(ctx, "sh", "-c", fmt.Sprintf("test ! -e /proc/%d", pid)).Run() == nil
}

func TestApplyInvokeSwapVerifyDelete(t *testing.T) {
	name := "e2e"
	v1 := c.impl(t, "prompt_system", "counter-v1")
	v2 := c.impl(t, "prompt_system", "counter-v2")
	ctxImpl := c.impl(t, "context_assembly", "counter-v1")

	manifest := c.activationYAML(t, name, v1, ctxImpl)
	c.kubectlRun(t, "apply", "--server-side", "-f", manifest)
	a := c.waitActivation(t, name, "Ready with counter v1", readyWith("prompt_system", v1))
	t.Logf("Ready: %d modules active", a.Status.ActiveCount)

	if out := c.invoke(t, name, `{"key":"a","add":2}`); out["count"] != float64(2) {
		t.Fatalf("first call: %v", out)
	}
	if out := c.invoke(t, name, `{"key":"a","add":3}`); out["count"] != float64(5) {
		t.Fatalf("second call: %v", out)
	}

	// Re-applying the unchanged activation server-side changes nothing: no
	// new Generation, no process restarted.
	// Generation status is mirrored asynchronously: wait until every
	// active module's Generation shows its pid.
	var before map[string]int64
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if before = c.generationPids(t, a); len(before) == len(a.Status.Modules) {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("Generation status never showed every pid: %v", before)
		}
	}
	var gensBefore iteronv1.GenerationList
	_ = c.client.List(context.Background(), &gensBefore, client.InNamespace(ns))
	c.kubectlRun(t, "apply", "--server-side", "-f", manifest)
	time.Sleep(2 * time.Second)
	a = c.waitActivation(t, name, "still Ready", readyWith("prompt_system", v1))
	var gensAfter iteronv1.GenerationList
	_ = c.client.List(context.Background(), &gensAfter, client.InNamespace(ns))
	if len(gensAfter.Items) != len(gensBefore.Items) {
		t.Fatalf("re-applying an unchanged activation created Generations: %d → %d", len(gensBefore.Items), len(gensAfter.Items))
	}
	if after := c.generationPids(t, a); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("re-applying an unchanged activation restarted a process: %v → %v", before, after)
	}

	// v2 of prompt_system: a stateful hot swap.
	manifest = c.activationYAML(t, name, v2, ctxImpl)
	c.kubectlRun(t, "apply", "--server-side", "-f", manifest)
	a = c.waitActivation(t, name, "Ready with counter v2", readyWith("prompt_system", v2))
	out := c.invoke(t, name, `{"key":"a","add":1}`)
	if out["count"] != float64(6) || out["implementation_version"] != "2.0.0" {
		t.Fatalf("after the swap: %v; want a=6 from 2.0.0 (the migrated state)", out)
	}
	// context_assembly is prompt_system's direct consumer: its epoch covers
	// prompt_system's identity, so it was reloaded too (docs/concepts.md,
	// identity, epoch and plan).
	for _, m := range a.Status.Modules {
		if m.Module == "context_assembly" && (m.Generation != 2 || m.Phase != iteronv1.PhaseActive) {
			t.Fatalf("context_assembly after prompt_system's swap: %+v; want generation 2, Active (a direct consumer reloads)", m)
		}
	}

	// The ledger verifies through the CLI.
	ledgerDir := filepath.Join(c.stateDir, "ledgers", string(a.UID))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if verify, err := c.nodeCommand(ctx, "kubectl-iteron", "ledger", "verify", ledgerDir).CombinedOutput(); err != nil {
		t.Fatalf("kubectl iteron ledger verify: %v\n%s", err, verify)
	} else {
		t.Logf("ledger verify: %s", strings.TrimSpace(string(verify)))
	}

	// Delete: every process reaped before the finalizer goes.
	pids := c.generationPids(t, a)
	if err := c.client.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := c.client.Get(context.Background(), client.ObjectKeyFromObject(a), &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the activation was not released: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for gen, pid := range pids {
		if !c.processGone(t, pid) {
			t.Fatalf("%s's process %d survived the deletion", gen, pid)
		}
	}
	var left iteronv1.GenerationList
	_ = c.client.List(context.Background(), &left, client.InNamespace(ns))
	for _, g := range left.Items {
		if g.Spec.ActivationName == name {
			t.Fatalf("Generation %s left after the deletion", g.Name)
		}
	}
}

func moduleGen(a *iteronv1.ImplementationActivation, module string) string {
	for _, m := range a.Status.Modules {
		if m.Module == module {
			return m.GenerationName
		}
	}
	return ""
}
