package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/strictjson"
)

func TestTheGeneratorWritesCatalogsWhoseDigestsMatchTheBytes(t *testing.T) {
	out := t.TempDir()
	stdout := filepath.Join(t.TempDir(), "stdout")
	f, err := os.Create(stdout)
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = f
	err = run(out, []string{"prompt_system", "tool_exposure"}, true)
	os.Stdout = saved
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
	if err := run("", nil, false); err == nil {
		t.Fatal("a missing -out was accepted")
	}
	if err := run(out, []string{"Bad-Module"}, false); err == nil {
		t.Fatal("a bad module was accepted")
	}
}
