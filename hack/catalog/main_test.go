package main

import (
	"bytes"
	"encoding/json"
	"io"
	ociartifacts "iteron.dev/operator/internal/artifacts"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/strictjson"
)

func TestTheGeneratorWritesCatalogsWhoseDigestsMatchTheBytes(t *testing.T) {
	out := t.TempDir()
	stdout := filepath.Join(t.TempDir(), "stdout")
	f, err := os.Create(stdout)
	if err != nil {
		t.Fatal(err)
	}
	err = run(f, out, []string{"prompt_system", "tool_exposure"}, true, true, activationOptions{})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(stdout)
	var summary struct{ Sources []Source }
	if err := json.Unmarshal(raw, &summary); err != nil {
		t.Fatalf("summary %s: %v", raw, err)
	}
	if len(summary.Sources) != 8 {
		t.Fatalf("%d sources, want 4 implementations × 2 modules", len(summary.Sources))
	}
	// -oci: each module's provider directory packs, carrying every
	// implementation with the digests printed.
	for _, module := range []string{"prompt_system", "tool_exposure"} {
		pkg, err := ociartifacts.Pack(filepath.Join(out, "oci", module))
		if err != nil {
			t.Fatalf("oci/%s does not pack: %v", module, err)
		}
		if len(pkg.Sources) != 4 {
			t.Fatalf("oci/%s carries %d implementations, want 4", module, len(pkg.Sources))
		}
		for _, ps := range pkg.Sources {
			found := false
			for _, s := range summary.Sources {
				found = found || s.ImplementationID == ps.ImplementationID && s.ManifestSHA256 == ps.ManifestSHA256 && s.ArtifactSHA256 == ps.ArtifactSHA256
			}
			if !found {
				t.Fatalf("oci/%s packs %+v, which the summary does not list", module, ps)
			}
		}
	}
	ids := map[string]bool{}
	for _, s := range summary.Sources {
		if ids[s.ImplementationID] {
			t.Fatalf("implementation ID %s is used twice: an activation filling both modules would be refused", s.ImplementationID)
		}
		ids[s.ImplementationID] = true
		b, err := os.ReadFile(s.CatalogPath)
		if err != nil {
			t.Fatal(err)
		}
		var c catalog.Catalog
		if err := strictjson.Decode(b, &c, 512<<10); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range c.Implementations {
			if m.ImplementationID != s.ImplementationID {
				continue
			}
			found = true
			d, _ := catalog.ManifestDigest(m)
			h, _ := artifacts.FileSHA256(s.Executable)
			if d != s.ManifestSHA256 || "sha256:"+h != s.ArtifactSHA256 || m.ArtifactSHA256 != h || m.Module != s.Module {
				t.Fatalf("source %+v does not match its catalog entry %+v", s, m)
			}
		}
		if !found {
			t.Fatalf("%s is not in %s", s.ImplementationID, s.CatalogPath)
		}
	}
	if err := run(io.Discard, "", nil, false, false, activationOptions{}); err == nil {
		t.Fatal("a missing -out was accepted")
	}
	if err := run(io.Discard, out, []string{"Bad-Module"}, false, false, activationOptions{}); err == nil {
		t.Fatal("a bad module was accepted")
	}
}

// TestTheActivationItPrintsVerifiesAsIs: -activation prints YAML that the
// CLI's strict parser reads and the manager's verifier admits, with the
// allowed root being the layout directory — ready to apply.
func TestTheActivationItPrintsVerifiesAsIs(t *testing.T) {
	out := t.TempDir()
	var buf bytes.Buffer
	act := activationOptions{Name: "stack", Namespace: "default", Node: "worker-1", Use: "prompt_system=counter-v2,context_assembly=stateless"}
	if err := run(&buf, out, []string{"prompt_system", "context_assembly"}, false, false, act); err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict(buf.Bytes())
	if err != nil {
		t.Fatalf("not strict YAML: %v\n%s", err, buf.String())
	}
	var obj v1alpha1.ImplementationActivation
	if err := catalog.DecodeStrict(j, &obj, 1<<20, ""); err != nil {
		t.Fatalf("not an ImplementationActivation: %v\n%s", err, buf.String())
	}
	if obj.Name != "stack" || obj.Namespace != "default" || obj.Spec.NodeName != "worker-1" || len(obj.Spec.Sources) != 2 ||
		obj.Spec.Sources[0].ImplementationID != "counter-v2.prompt_system" || obj.Spec.Sources[1].ImplementationID != "stateless.context_assembly" {
		t.Fatalf("unexpected activation:\n%s", buf.String())
	}
	doc, err := verifier.DocumentFromSpec(&obj.Spec)
	if err != nil {
		t.Fatal(err)
	}
	v, err := verifier.NewVerifier(verifier.Config{AllowedRoots: []string{out}, Ceiling: []string{"read_only"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.Verify(doc)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Verified()); got != 2 {
		t.Fatalf("%d of 2 sources verified", got)
	}

	for _, tc := range []struct{ name, use string }{
		{"an unknown example", "counter-v9"},
		{"the faulty example without -faulty", "faulty"},
		{"a module not laid out", "prompt_system=counter-v1,memory_recall=counter-v1"},
		{"a module left without an example", "prompt_system=counter-v1"},
		{"a pair without =", "prompt_system=counter-v1,stateless"},
	} {
		t.Run(tc.name+" is refused before anything is built", func(t *testing.T) {
			bad := act
			bad.Use = tc.use
			err := run(io.Discard, t.TempDir(), []string{"prompt_system", "context_assembly"}, false, false, bad)
			if err == nil || !strings.Contains(err.Error(), "-use") {
				t.Fatalf("got %v, want an error naming -use", err)
			}
		})
	}
}

func TestYAMLScalarsReadBackAsTheSameString(t *testing.T) {
	for _, s := range []string{"worker-1", "/var/lib/iteron/providers", "true", "1234", "a b", "no", "x:y", ""} {
		var back string
		if err := yaml.Unmarshal([]byte("v: "+yamlScalar(s)), &struct {
			V *string `json:"v"`
		}{&back}); err != nil || back != s {
			t.Errorf("%q written as %s reads back as %q (%v)", s, yamlScalar(s), back, err)
		}
	}
}

// TestTheSetItPrintsDecodesAsAnActivationSet: -activation with -set prints
// YAML the strict parser reads as an ActivationSet over -selector, whose
// template names the sources just laid out; a bad selector is refused.
func TestTheSetItPrintsDecodesAsAnActivationSet(t *testing.T) {
	out := t.TempDir()
	var buf bytes.Buffer
	act := activationOptions{Name: "counters", Namespace: "default", Set: true, Selector: "iteron.dev/pool=demo", Use: "counter-v2"}
	if err := run(&buf, out, []string{"prompt_system"}, false, false, act); err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict(buf.Bytes())
	if err != nil {
		t.Fatalf("not strict YAML: %v\n%s", err, buf.String())
	}
	var set v1alpha1.ActivationSet
	if err := catalog.DecodeStrict(j, &set, 1<<20, ""); err != nil {
		t.Fatalf("not an ActivationSet: %v\n%s", err, buf.String())
	}
	if set.Name != "counters" || set.Spec.NodeSelector.MatchLabels["iteron.dev/pool"] != "demo" || len(set.Spec.Template.Sources) != 1 ||
		set.Spec.Template.Sources[0].ImplementationID != "counter-v2.prompt_system" || set.Spec.Strategy.Canary == nil {
		t.Fatalf("unexpected set:\n%s", buf.String())
	}
	act.Selector = "pool"
	if err := run(io.Discard, t.TempDir(), []string{"prompt_system"}, false, false, act); err == nil || !strings.Contains(err.Error(), "-selector") {
		t.Fatalf("a selector without = gave %v; want an error naming -selector", err)
	}
}
