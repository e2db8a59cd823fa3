package providertest

import (
	"os"
	"path/filepath"
	"testing"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/strictjson"
)

func TestMain(m *testing.M) { Main(m) }

func TestALaidOutExampleHasACatalogWithTheDigestsOfItsBytes(t *testing.T) {
	src := Example(t, artifacts.CounterV2, "tool_exposure", "counter-two", "--flag")
	raw, err := os.ReadFile(src.CatalogPath)
	if err != nil {
		t.Fatal(err)
	}
	var c catalog.Catalog
	if err := strictjson.Decode(raw, &c, 512<<10); err != nil {
		t.Fatalf("the catalog is not strict JSON of the catalog schema: %v", err)
	}
	if len(c.Implementations) != 1 {
		t.Fatalf("catalog lists %d implementations", len(c.Implementations))
	}
	m := c.Implementations[0]
	if m.ImplementationID != "counter-two" || m.Module != "tool_exposure" || m.ProtocolVersion != 2 || m.ImplementationVersion != (catalog.Version{2, 0, 0}) || len(m.Argv) != 1 {
		t.Fatalf("manifest %+v", m)
	}
	if d, err := catalog.ManifestDigest(m); err != nil || d != src.ManifestSHA256 {
		t.Fatalf("manifest digest %s, the catalog's manifest hashes to %s (%v)", src.ManifestSHA256, d, err)
	}
	hexDigest, err := artifacts.FileSHA256(filepath.Join(src.ArtifactRoot, m.Executable))
	if err != nil || "sha256:"+hexDigest != src.ArtifactSHA256 || m.ArtifactSHA256 != hexDigest {
		t.Fatalf("artifact digest %s / manifest %s, the executable hashes to %s (%v)", src.ArtifactSHA256, m.ArtifactSHA256, hexDigest, err)
	}
	// Every directory from the executable up to / is traversable by others.
	for d := filepath.Dir(src.Executable); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o005 != 0o005 {
			t.Fatalf("%s is not traversable by the provider uid: %v %v", d, fi.Mode(), err)
		}
		if d == "/" {
			break
		}
	}
	plan := Plan(t, src.Implementation)
	if plan.ArtifactSHA256() != src.ArtifactSHA256 || plan.Executable() != src.Executable || plan.Contracts().Load.ID != "iteron/tool.exposure/lifecycle/load@v1" {
		t.Fatalf("plan %+v", plan)
	}
}
