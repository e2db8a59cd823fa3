package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/test/pkgruntimetest"
)

// runtimeSource lays the runtime binary out under the manager's allowed
// root with its package-runtime manifest, and returns the source.
func (c *cluster) runtimeSource(t *testing.T, name, binary, revision, module string) source {
	t.Helper()
	root := filepath.Join(c.work, "providers", "runtimes", name)
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	digest := pkgruntimetest.Install(t, root, binary)
	m := catalog.PackageRuntimeManifest{
		SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: revision, RuntimeProtocolVersion: catalog.PackageRuntimeProtocol,
		Module: module, ExportIDs: []string{"get", "put", "watch"}, RequestedCapabilities: []string{"read_only"},
		Executable: "runtime", ArtifactSHA256: digest,
		Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 10_000, InvokeMs: 10_000, CancelMs: 1000},
		Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 8, MaxWatches: 8},
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(root, "manifest.json")
	if err := os.WriteFile(manifest, data, 0o644); err != nil {
		t.Fatal(err)
	}
	manifestDigest, err := catalog.PackageRuntimeManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	return source{Module: module, ImplementationID: revision, CatalogPath: manifest, ArtifactRoot: root, ManifestSHA256: manifestDigest, ArtifactSHA256: "sha256:" + digest}
}

func (c *cluster) runtimeActivationYAML(t *testing.T, name string, s source) string {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: iteron.dev/v1alpha1\nkind: ImplementationActivation\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  nodeName: %s\n  candidateSHA256: sha256:%064x\n  sources:\n"+
		"  - module: %s\n    implementationID: %s\n    catalogPath: %s\n    artifactRoot: %s\n    manifestSHA256: %s\n    artifactSHA256: %s\n",
		name, ns, c.node, 9, s.Module, s.ImplementationID, s.CatalogPath, s.ArtifactRoot, s.ManifestSHA256, s.ArtifactSHA256)
	path := filepath.Join(c.work, name+".yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runtimeCall runs kubectl iteron invoke against a package runtime and
// returns what it printed.
func (c *cluster) runtimeCall(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.nodeCommand(ctx, "kubectl-iteron", append([]string{"invoke", "--socket", c.socket, "--namespace", ns, "--activation", name, "--module", "prompt_system"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl iteron invoke %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestAPackageRuntimeIsAppliedCalledCutOverAndDeleted drives a package
// runtime the way a user does: kubectl apply of an activation whose source is
// a package-runtime manifest, calls and a watch through kubectl iteron invoke,
// a cutover to another implementation by editing the source, deletion.
func TestAPackageRuntimeIsAppliedCalledCutOverAndDeleted(t *testing.T) {
	if !c.local {
		t.Skip("the package runtimes are laid out by this test on this machine; against a cluster they would have to be on the node")
	}
	bins, err := pkgruntimetest.Build(filepath.Join(c.work, "runtime-builds"))
	if err != nil {
		t.Fatal(err)
	}
	kv := c.runtimeSource(t, "kv", bins[pkgruntimetest.KV], "kv-1.0.0", "prompt_system")
	seed := c.runtimeSource(t, "seed", bins[pkgruntimetest.Seed], "seed-kv-1", "prompt_system")
	const name = "runtimes"

	c.kubectlRun(t, "apply", "--server-side", "-f", c.runtimeActivationYAML(t, name, kv))
	a := c.waitActivation(t, name, "Ready with the kv runtime", readyWith("prompt_system", "kv-1.0.0"))
	if got := c.runtimeCall(t, name, "--export", "put", "--input", `{"key":"k","value":{"n":1}}`); got != `{"n":1}` {
		t.Fatalf("put printed %q", got)
	}
	if got := c.runtimeCall(t, name, "--export", "get", "--input", `{"key":"k"}`); got != `{"n":1}` {
		t.Fatalf("get printed %q", got)
	}

	// A watch through the CLI, read line by line while the source changes.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	watch := c.nodeCommand(ctx, "kubectl-iteron", "invoke", "--socket", c.socket, "--namespace", ns, "--activation", name, "--module", "prompt_system",
		"--watch", "--export", "watch", "--input", `{"key":"k"}`, "--timeout", "2m")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	watch.Stderr = &stderr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer watch.Process.Signal(syscall.SIGKILL) // ended by then, unless the test failed first
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(what string) string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("%s: the watch ended: %s", what, stderr.String())
			}
			return l
		case <-time.After(time.Minute):
			t.Fatalf("%s: nothing within a minute", what)
		}
		return ""
	}
	if l := next("the initial value"); l != `{"n":1}` {
		t.Fatalf("the watch's first line: %q", l)
	}
	pidsBefore := c.generationPids(t, a)

	// The cutover: the source now names the proto-only runtime.
	c.kubectlRun(t, "apply", "--server-side", "-f", c.runtimeActivationYAML(t, name, seed))
	a = c.waitActivation(t, name, "Ready with the seed runtime", readyWith("prompt_system", "seed-kv-1"))
	if l := next("the moved watch's initial value"); l != "null" {
		t.Fatalf("after the cutover the watch printed %q; want the new runtime's initial value, null", l)
	}
	if got := c.runtimeCall(t, name, "--export", "put", "--input", `{"key":"k","value":"after"}`); got != `"after"` {
		t.Fatalf("put on the new runtime printed %q", got)
	}
	if l := next("the change on the new runtime"); l != `"after"` {
		t.Fatalf("the moved watch printed %q; want the put's value", l)
	}
	gen := moduleGen(a, "prompt_system")
	if !strings.HasSuffix(gen, "-g2-1") {
		t.Fatalf("prompt_system serves %s after the cutover; want generation 2", gen)
	}
	var old iteronv1.Generation
	if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name + "-prompt-system-g1-1"}, &old); err != nil {
		t.Fatal(err)
	}
	var current iteronv1.Generation
	if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: gen}, &current); err != nil {
		t.Fatal(err)
	}
	if pr := current.Spec.Implementation.PackageRuntime; pr == nil || strings.Join(pr.Exports, ",") != "get,put,watch" || current.Spec.Implementation.ID != "seed-kv-1" {
		t.Fatalf("%s's implementation: %+v; want the seed runtime's revision and exports", gen, current.Spec.Implementation)
	}
	t.Logf("cutover: %v → %s; old Generation %s phase %s step %s", pidsBefore, gen, old.Name, old.Status.Phase, old.Status.Step)

	pids := c.generationPids(t, a)
	if err := c.client.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		err := c.client.Get(context.Background(), client.ObjectKeyFromObject(a), &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the activation was not released: %v", err)
		}
	}
	for g, pid := range pids {
		if !c.processGone(t, pid) {
			t.Fatalf("%s's runtime %d survived the deletion", g, pid)
		}
	}
	// The watch ends with the module: nothing serves it any more.
	if l, ok := <-lines; ok {
		t.Fatalf("the watch printed %q after the deletion", l)
	}
	if err := watch.Wait(); err == nil || !strings.Contains(stderr.String(), "stale_generation") {
		t.Fatalf("the watch of a deleted activation ended with %v: %s; want stale_generation", err, stderr.String())
	}
	t.Logf("the watch ended with the activation: %s", strings.TrimSpace(stderr.String()))
}
