package graph

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
)

// TestVerifiedFilesFlowIntoAPlan runs real files through verification and
// the graph: two activations of one stack, the second changing one
// executable's bytes and breaking another source.
func TestVerifiedFilesFlowIntoAPlan(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	write := func(path string, data []byte, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	type impl struct{ id, module, content string }
	build := func(name string, impls []impl) []byte {
		t.Helper()
		c := catalog.Catalog{SchemaVersion: 1}
		var doc verifier.Document
		doc.CandidateSHA256 = "sha256:" + strings.Repeat("c", 64)
		for _, im := range impls {
			root := filepath.Join(dir, name, im.id)
			write(filepath.Join(root, "provider"), []byte(im.content), 0o755)
			sum := sha256.Sum256([]byte(im.content))
			m := catalog.Manifest{ImplementationID: im.id, ImplementationVersion: catalog.Version{1, 0, 0}, Module: im.module,
				ArtifactSHA256: hex.EncodeToString(sum[:]), Executable: "provider", ProtocolVersion: 2,
				Argv: []string{}, RequestedCapabilities: []string{}, Dependencies: []catalog.Dependency{},
				RuntimeDeadlineMs: 1000, CancellationDeadlineMs: 1000, FailurePolicy: "fail_closed",
				EvidenceLimits: catalog.EvidenceLimits{StdoutBytes: 1024, StderrBytes: 1024, Observations: 4}}
			c.Implementations = append(c.Implementations, m)
			md, err := catalog.ManifestDigest(m)
			if err != nil {
				t.Fatal(err)
			}
			doc.Sources = append(doc.Sources, verifier.Source{Module: im.module, ImplementationID: im.id,
				CatalogPath: filepath.Join(dir, name, "catalog.json"), ArtifactRoot: root,
				ManifestSHA256: md, ArtifactSHA256: "sha256:" + m.ArtifactSHA256})
		}
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(dir, name, "catalog.json"), data, 0o644)
		out, err := doc.MarshalDocument()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	v, err := verifier.NewVerifier(verifier.Config{AllowedRoots: []string{dir}, Ceiling: []string{"read_only"}})
	if err != nil {
		t.Fatal(err)
	}
	evaluateDoc := func(data []byte) *Evaluation {
		t.Helper()
		res, err := v.VerifyDocument(data)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := Evaluate(FromVerification(v.Graph(), res))
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	old := evaluateDoc(build("old", []impl{{"ps", "prompt_system", "a"}, {"ca", "context_assembly", "b"}, {"mr", "memory_recall", "c"}, {"te", "tool_exposure", "d"}}))
	newDoc := build("new", []impl{{"ps", "prompt_system", "a"}, {"ca", "context_assembly", "b2"}, {"mr", "memory_recall", "c"}, {"te", "tool_exposure", "d"}})
	// Break tool_exposure's executable after its digest was pinned.
	write(filepath.Join(dir, "new", "te", "provider"), []byte("tampered"), 0o755)
	next := evaluateDoc(newDoc)
	p := Plan(old, next)
	if !slices.Equal(p.Reloaded, []string{"context_assembly", "memory_recall"}) || !slices.Equal(p.Unchanged, []string{"prompt_system"}) ||
		!slices.Equal(p.Blocked, []string{"tool_exposure"}) || len(p.Added)+len(p.Removed) != 0 {
		t.Fatalf("plan = %+v", p)
	}
	st, _ := next.Status("tool_exposure")
	if st.Reason != "verification_failed" || !strings.Contains(st.Message, "sources[3].artifact_sha256: executable") {
		t.Fatalf("tool_exposure status = %+v", st)
	}
}
