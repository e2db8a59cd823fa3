package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/test/kubeapi"
)

var env *kubeapi.Environment

func TestMain(m *testing.M) {
	var err error
	env, err = kubeapi.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		os.Exit(1)
	}
	fmt.Printf("api tests run against kube-apiserver %s\n", env.ServerVersion)
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the local control plane:", err)
	}
	os.Exit(code)
}

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func validActivation(name string) *iteronv1.ImplementationActivation {
	return &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: iteronv1.ImplementationActivationSpec{
			NodeName:        "worker-1",
			CandidateSHA256: digestA,
			Sources: []iteronv1.ActivationSource{
				{Module: "prompt_system", ImplementationID: "counter-v1", CatalogPath: "/var/lib/iteron/providers/c/catalog.json", ArtifactRoot: "/var/lib/iteron/providers/c/v1", ManifestSHA256: digestA, ArtifactSHA256: digestB},
				{Module: "context_assembly", ImplementationID: "counter-v1-ctx", CatalogPath: "/var/lib/iteron/providers/c/catalog.json", ArtifactRoot: "/var/lib/iteron/providers/c/v1", ManifestSHA256: digestB, ArtifactSHA256: digestB},
			},
		},
	}
}

// createDryRun asks the API server to validate and admit obj without storing it.
func createDryRun(t *testing.T, obj client.Object) error {
	t.Helper()
	return env.Client.Create(context.Background(), obj, client.DryRunAll)
}

func expectInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the API server accepted the object; want a rejection naming %s", field)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error = %v; want 422 Invalid naming %s", err, field)
	}
	if !strings.Contains(err.Error(), field) {
		t.Fatalf("error = %v; want it to name %s", err, field)
	}
}

func TestActivationSchemaRejectsBadSpecsNamingTheField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*iteronv1.ImplementationActivation)
		field  string
	}{
		{"a relative catalogPath", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0].CatalogPath = "catalogs/c.json" }, "spec.sources[0].catalogPath"},
		{"a catalogPath with a .. segment", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0].CatalogPath = "/var/lib/../etc/c.json" }, "spec.sources[0].catalogPath"},
		{"a catalogPath with a /./ segment", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0].CatalogPath = "/var/./lib/c.json" }, "spec.sources[0].catalogPath"},
		{"a catalogPath with an empty // segment", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0].CatalogPath = "/var//lib/c.json" }, "spec.sources[0].catalogPath"},
		{"an artifactRoot with a trailing slash", func(a *iteronv1.ImplementationActivation) {
			a.Spec.Sources[1].ArtifactRoot = "/var/lib/iteron/providers/c/v1/"
		}, "spec.sources[1].artifactRoot"},
		{"an artifactRoot that is / alone", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[1].ArtifactRoot = "/" }, "spec.sources[1].artifactRoot"},
		{"an uppercase manifest digest", func(a *iteronv1.ImplementationActivation) {
			a.Spec.Sources[0].ManifestSHA256 = strings.ToUpper(digestA[:7]) + strings.ToUpper(digestA[7:])
		}, "spec.sources[0].manifestSHA256"},
		{"an uppercase hex artifact digest", func(a *iteronv1.ImplementationActivation) {
			a.Spec.Sources[0].ArtifactSHA256 = "sha256:" + strings.ToUpper(digestA[7:])
		}, "spec.sources[0].artifactSHA256"},
		{"an artifact digest without sha256:", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0].ArtifactSHA256 = digestA[7:] }, "spec.sources[0].artifactSHA256"},
		{"a candidate digest without sha256:", func(a *iteronv1.ImplementationActivation) { a.Spec.CandidateSHA256 = digestA[7:] }, "spec.candidateSHA256"},
		{"an uppercase module", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0].Module = "Prompt_system" }, "spec.sources[0].module"},
		{"two sources with the same module", func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[1].Module = a.Spec.Sources[0].Module }, "spec.sources[1]"},
		{"two sources with the same implementationID", func(a *iteronv1.ImplementationActivation) {
			a.Spec.Sources[1].ImplementationID = a.Spec.Sources[0].ImplementationID
		}, "implementationID must be unique"},
		{"an unknown capability in the ceiling", func(a *iteronv1.ImplementationActivation) { a.Spec.CapabilityCeiling = []iteronv1.Capability{"root"} }, "spec.capabilityCeiling[0]"},
		{"an unknown swap strategy", func(a *iteronv1.ImplementationActivation) { a.Spec.Swap.Strategy = "Warm" }, "spec.swap.strategy"},
		{"a name longer than 40 characters", func(a *iteronv1.ImplementationActivation) { a.Name = strings.Repeat("n", 41) }, "metadata.name must be at most 40 characters"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			act := validActivation("reject")
			tc.mutate(act)
			expectInvalid(t, createDryRun(t, act), tc.field)
		})
	}
}

type pathVector struct {
	Path  string `json:"path"`
	Valid bool   `json:"valid"`
	Why   string `json:"why"`
}

// TestPathRuleMatchesTheSharedVectors runs the table the Go path check also
// runs (testdata/path-vectors.json), so the CEL rule and the controller agree.
func TestPathRuleMatchesTheSharedVectors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(env.RepoRoot, "testdata", "path-vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Vectors []pathVector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Vectors) < 10 {
		t.Fatalf("only %d path vectors", len(table.Vectors))
	}
	for _, v := range table.Vectors {
		t.Run(fmt.Sprintf("%q (%s)", v.Path, v.Why), func(t *testing.T) {
			act := validActivation("paths")
			act.Spec.Sources[0].CatalogPath = v.Path
			err := createDryRun(t, act)
			if v.Valid && err != nil {
				t.Fatalf("valid path %q refused: %v", v.Path, err)
			}
			switch {
			case !v.Valid && v.Path == "":
				// An empty path is an absent one (omitempty): the source
				// then gives neither paths nor oci.
				expectInvalid(t, err, "spec.sources[0]: Invalid value: give either catalogPath and artifactRoot, or oci")
			case !v.Valid:
				expectInvalid(t, err, "spec.sources[0].catalogPath")
			}
		})
	}
}

func TestAnOCISourceMustPinADigestAndReplacesBothPaths(t *testing.T) {
	pinned := "127.0.0.1:5000/providers/counter@" + digestA
	oci := func(ref string) func(*iteronv1.ActivationSource) {
		return func(s *iteronv1.ActivationSource) {
			s.CatalogPath, s.ArtifactRoot, s.OCI = "", "", &iteronv1.OCISource{Ref: ref}
		}
	}
	for _, tc := range []struct {
		name   string
		edit   func(*iteronv1.ActivationSource)
		refuse string // "" accepted
	}{
		{"a pinned digest", oci(pinned), ""},
		{"a tag before the pinned digest", oci("127.0.0.1:5000/providers/counter:v1@" + digestA), ""},
		{"a tag alone", oci("127.0.0.1:5000/providers/counter:v1"), "spec.sources[0].oci.ref: Invalid value"},
		{"an upper-case digest", oci("127.0.0.1:5000/providers/counter@sha256:" + strings.ToUpper(digestA[7:])), "spec.sources[0].oci.ref"},
		{"a sha512 digest", oci("127.0.0.1:5000/providers/counter@sha512:" + digestA[7:]), "spec.sources[0].oci.ref"},
		{"oci and a catalogPath", func(s *iteronv1.ActivationSource) {
			oci(pinned)(s)
			s.CatalogPath = "/var/lib/iteron/providers/c/catalog.json"
		}, "spec.sources[0]: Invalid value: give either"},
		{"only a catalogPath", func(s *iteronv1.ActivationSource) { s.ArtifactRoot = "" }, "spec.sources[0]: Invalid value: give either"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act := validActivation("oci")
			tc.edit(&act.Spec.Sources[0])
			err := createDryRun(t, act)
			t.Logf("%+v: %v", act.Spec.Sources[0], err)
			if tc.refuse == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			expectInvalid(t, err, tc.refuse)
			if strings.Contains(tc.name, "tag alone") && !strings.Contains(err.Error(), "a tag alone is refused") {
				t.Fatalf("the refusal does not say why: %v", err)
			}
		})
	}
}

func TestSchemaAppliesDefaults(t *testing.T) {
	act := validActivation("defaults")
	if err := env.Client.Create(context.Background(), act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), act) })
	if act.Spec.Swap.DeadlineSeconds != 30 || ptr.Deref(act.Spec.Swap.QuiesceTimeoutSeconds, -1) != 10 ||
		act.Spec.Swap.Strategy != iteronv1.SwapStrategyHot || act.Spec.Swap.StateDisposition != iteronv1.StateDispositionMigrate ||
		ptr.Deref(act.Spec.Checkpoint.IntervalSeconds, -1) != 60 || ptr.Deref(act.Spec.GenerationHistoryLimit, -1) != 10 {
		t.Fatalf("defaults not applied: swap=%+v checkpoint=%+v historyLimit=%v", act.Spec.Swap, act.Spec.Checkpoint, act.Spec.GenerationHistoryLimit)
	}
}

func TestNodeNameIsImmutable(t *testing.T) {
	ctx := context.Background()
	act := validActivation("immutable-node")
	if err := env.Client.Create(ctx, act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, act) })
	act.Spec.NodeName = "worker-2"
	expectInvalid(t, env.Client.Update(ctx, act), "spec.nodeName")
}

// TestMaximalActivationFitsTheCELCostBudget stores the largest object the
// schema allows: 64 sources with every string at its maximum length.
func TestMaximalActivationFitsTheCELCostBudget(t *testing.T) {
	act := validActivation(strings.Repeat("m", 40))
	act.Spec.NodeName = strings.Repeat("n", 253)
	act.Spec.CapabilityCeiling = []iteronv1.Capability{iteronv1.CapabilityReadOnly, iteronv1.CapabilityReversibleLocal, iteronv1.CapabilityCodeExecuting, iteronv1.CapabilityTrustMutating, iteronv1.CapabilityIrreversibleExternal}
	longPath := func(i int, leaf string) string {
		p := fmt.Sprintf("/var/lib/iteron/providers/%02d/%s/", i, leaf)
		return p + strings.Repeat("p", 512-len(p))
	}
	act.Spec.Sources = nil
	for i := range 64 {
		module := fmt.Sprintf("m%02d", i)
		module += strings.Repeat("x", 48-len(module))
		id := fmt.Sprintf("impl-%02d-", i)
		id += strings.Repeat("i", 96-len(id))
		act.Spec.Sources = append(act.Spec.Sources, iteronv1.ActivationSource{
			Module: module, ImplementationID: id,
			CatalogPath: longPath(i, "c"), ArtifactRoot: longPath(i, "r"),
			ManifestSHA256: digestA, ArtifactSHA256: digestB,
		})
	}
	ctx := context.Background()
	if err := env.Client.Create(ctx, act); err != nil {
		t.Fatalf("maximal activation refused: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, act) })
	act.Spec.Paused = true
	if err := env.Client.Update(ctx, act); err != nil {
		t.Fatalf("update of the maximal activation (CEL transition rules run) refused: %v", err)
	}
}

func TestSampleActivationIsAccepted(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(env.RepoRoot, "config", "samples", "iteron_v1alpha1_implementationactivation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sample iteronv1.ImplementationActivation
	if err := utilyaml.Unmarshal(data, &sample); err != nil {
		t.Fatal(err)
	}
	if len(sample.Spec.Sources) != 2 {
		t.Fatalf("the sample has %d sources, want 2", len(sample.Spec.Sources))
	}
	if err := createDryRun(t, &sample); err != nil {
		t.Fatalf("the sample activation was refused: %v", err)
	}
}

func validGeneration(name string) *iteronv1.Generation {
	return &iteronv1.Generation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: iteronv1.GenerationSpec{
			ActivationName: "stack", NodeName: "worker-1", Module: "prompt_system", Generation: 1, Attempt: 1,
			CandidateSHA256: digestA,
			Implementation: iteronv1.Implementation{
				ID: "counter-v1", Version: "1.0.0", ManifestSHA256: digestA, ArtifactSHA256: digestB,
				ArtifactRoot: "/var/lib/iteron/providers/c/v1", Executable: "/var/lib/iteron/providers/c/v1/counter", ProtocolVersion: 2,
			},
			AuthoritySHA256: digestA,
			Deadlines:       iteronv1.Deadlines{RuntimeMs: 60000, CancellationMs: 1000},
			EvidenceLimits:  iteronv1.EvidenceLimits{StdoutBytes: 1 << 20, StderrBytes: 2048, Observations: 64},
		},
	}
}

const managerUser = "system:serviceaccount:iteron-system:iteron-manager"

// impersonating returns a client acting as user, with the groups an API
// server gives a service account or an authenticated user.
func impersonating(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// applyFile creates every object of a multi-document YAML file.
func applyFile(t *testing.T, rel string) {
	t.Helper()
	f, err := os.Open(filepath.Join(env.RepoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if err.Error() == "EOF" {
				return
			}
			t.Fatalf("%s: %v", rel, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := env.Client.Create(context.Background(), &u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: create %s %s: %v", rel, u.GetKind(), u.GetName(), err)
		}
	}
}

// TestGenerationsAreWrittenOnlyByTheManager installs config/rbac and
// config/admission as shipped and writes Generations as three identities.
func TestGenerationsAreWrittenOnlyByTheManager(t *testing.T) {
	ctx := context.Background()
	applyFile(t, "config/rbac/role.yaml")
	applyFile(t, "config/rbac/role_binding.yaml")
	applyFile(t, "config/rbac/activation_editor_role.yaml")
	applyFile(t, "config/admission/generation_writers.yaml")
	manager := impersonating(t, managerUser, "system:serviceaccounts", "system:serviceaccounts:iteron-system")
	admin := impersonating(t, "jane", "system:masters")

	// The policy takes effect once the API server has loaded it: wait until
	// the administrator is refused (bounded), then check every identity.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := admin.Create(ctx, validGeneration("by-admin"), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "written only by "+managerUser) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission policy never refused an administrator; last result: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	t.Run("the manager's service account creates a Generation", func(t *testing.T) {
		gen := validGeneration("by-manager")
		if err := manager.Create(ctx, gen); err != nil {
			t.Fatalf("manager refused: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, gen) })

		t.Run("and its spec cannot change, even by the manager", func(t *testing.T) {
			gen.Spec.Attempt = 2
			expectInvalid(t, manager.Update(ctx, gen), "Generation spec is immutable")
		})
	})
	t.Run("a cluster administrator impersonated as another user is refused", func(t *testing.T) {
		err := admin.Create(ctx, validGeneration("by-admin"))
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "not by jane") {
			t.Fatalf("error = %v; want a denial naming jane", err)
		}
	})
	t.Run("a user bound to the activation editor role is refused by RBAC", func(t *testing.T) {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "ed-edits-activations"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "iteron-activation-editor"},
			Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "ed"}},
		}
		if err := env.Client.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, binding) })
		editor := impersonating(t, "ed")
		// RBAC is served from an informer: wait (bounded) for the binding.
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			err := editor.Create(ctx, validActivation("by-editor"), client.DryRunAll)
			if err == nil {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("the editor cannot create an activation: %v", err)
			}
		}
		err := editor.Create(ctx, validGeneration("by-editor"))
		if !apierrors.IsForbidden(err) {
			t.Fatalf("error = %v; want Forbidden", err)
		}
	})
}
