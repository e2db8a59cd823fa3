package controllers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/test/operatortest"
)

// TestAPackageRuntimeSourceResolvesToAGenerationTheAPIServerAccepts follows
// a package-runtime source from the resolver to the Generation the
// activation controller would write for it, and has the real API server
// validate that Generation (a dry run: nothing is stored, nothing runs).
func TestAPackageRuntimeSourceResolvesToAGenerationTheAPIServerAccepts(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "kv-1.0.0")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	content := []byte("#!/bin/sh\n# stands in for a package runtime: only its bytes are verified here\nexec sleep 1000\n")
	if err := os.WriteFile(filepath.Join(root, "kv"), content, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	m := catalog.PackageRuntimeManifest{SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: "kv-1.0.0",
		RuntimeProtocolVersion: catalog.PackageRuntimeProtocol, Module: "prompt_system", ExportIDs: []string{"get", "put", "watch"},
		RequestedCapabilities: []string{"read_only"}, Executable: "kv", ArtifactSHA256: hex.EncodeToString(sum[:]),
		Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 5000, InvokeMs: 10000, CancelMs: 2000},
		Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 64, MaxWatches: 16}}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	manifestPath := filepath.Join(dir, "kv-1.0.0.json")
	if err := os.WriteFile(manifestPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	digest, err := catalog.PackageRuntimeManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: "pkgruntime-probe", Namespace: "default", UID: types.UID("00000000-0000-0000-0000-000000000016")},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: testNode, CandidateSHA256: "sha256:" + hex.EncodeToString(make([]byte, 32)),
			Sources: []iteronv1.ActivationSource{{Module: "prompt_system", ImplementationID: "kv-1.0.0", CatalogPath: manifestPath,
				ArtifactRoot: root, ManifestSHA256: digest, ArtifactSHA256: "sha256:" + m.ArtifactSHA256}}},
	}
	v, err := verifier.NewVerifier(verifier.Config{AllowedRoots: []string{dir}, Ceiling: []string{"read_only"}})
	if err != nil {
		t.Fatal(err)
	}
	res := controllers.NewResolver(v)(context.Background(), &act.Spec)
	if res.DocumentError != nil || len(res.Modules) != 1 || res.Modules[0].Plan == nil {
		t.Fatalf("the package runtime was not resolved to a plan: %+v", res)
	}
	rm := res.Modules[0]
	if pm, ok := rm.Plan.PackageRuntime(); !ok || pm.PackageRevisionID != "kv-1.0.0" || rm.CatalogPath != manifestPath {
		t.Fatalf("the resolved plan lost the manifest: package runtime %v, catalog path %q", ok, rm.CatalogPath)
	}

	gen := controllers.NewGeneration(act, rm, 1, 1, "")
	impl := gen.Spec.Implementation
	checks := []struct {
		what      string
		got, want any
	}{
		{"implementation ID is the revision", impl.ID, "kv-1.0.0"},
		{"version (a package runtime has none)", impl.Version, "0.0.0"},
		{"protocol version (cold replace)", impl.ProtocolVersion, int32(1)},
		{"catalog path is the manifest (a restart re-verifies it)", impl.CatalogPath, manifestPath},
		{"manifest digest", impl.ManifestSHA256, digest},
		{"executable", impl.Executable, filepath.Join(root, "kv")},
		{"argv", len(impl.Argv), 0},
		{"deadlines", gen.Spec.Deadlines, iteronv1.Deadlines{RuntimeMs: 10000, CancellationMs: 2000}},
		{"evidence limits", gen.Spec.EvidenceLimits, iteronv1.EvidenceLimits{StderrBytes: verifier.PackageRuntimeStderrBytes}},
		{"failure policy", gen.Spec.FailurePolicy, "fail_closed"},
		{"it says it is a package runtime", impl.PackageRuntime != nil, true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if pr := impl.PackageRuntime; pr == nil || pr.RuntimeProtocolVersion != catalog.PackageRuntimeProtocol || strings.Join(pr.Exports, ",") != "get,put,watch" {
		t.Errorf("packageRuntime = %+v, want the manifest's protocol and exports", pr)
	}
	// As the manager: the Generation admission policy lets only it write
	// Generations.
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: operatortest.ManagerUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	asManager, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := asManager.Create(context.Background(), gen, client.DryRunAll); err != nil {
		t.Fatalf("the API server refuses the Generation of a package runtime: %v", err)
	}
}
