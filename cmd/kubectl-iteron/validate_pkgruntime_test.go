package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
)

// addPackageRuntime writes a package runtime into the stack (its executable
// under artifacts/<revision>/, its manifest at <revision>.json) and appends
// the source that names it.
func (s *stack) addPackageRuntime(t *testing.T, revision, module string) verifier.Source {
	t.Helper()
	root := filepath.Join(s.dir, "artifacts", revision)
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	content := "#!/bin/sh\n# " + revision + "\nexec sleep 1000\n"
	writeFile(t, filepath.Join(root, "kv"), content)
	sum := sha256.Sum256([]byte(content))
	m := catalog.PackageRuntimeManifest{SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: revision,
		RuntimeProtocolVersion: catalog.PackageRuntimeProtocol, Module: module, ExportIDs: []string{"get", "put", "watch"},
		RequestedCapabilities: []string{"code_executing", "read_only"}, Executable: "kv", ArtifactSHA256: hex.EncodeToString(sum[:]),
		Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 5000, InvokeMs: 10000, CancelMs: 2000},
		Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 64, MaxWatches: 16}}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, filepath.Join(s.dir, revision+".json"), string(data))
	digest, err := catalog.PackageRuntimeManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	src := verifier.Source{Module: module, ImplementationID: revision, CatalogPath: path, ArtifactRoot: root,
		ManifestSHA256: digest, ArtifactSHA256: "sha256:" + m.ArtifactSHA256}
	s.sources = append(s.sources, src)
	return src
}

func TestValidateShowsAPackageRuntimeSourceWithItsKindAndExports(t *testing.T) {
	s := newStack(t, implSpec{id: "prompt-fast", module: "prompt_system", content: "#!/bin/sh\necho prompt\n"})
	kv := s.addPackageRuntime(t, "kv-1.0.0", "context_assembly")
	doc := s.document(t, "doc.json", nil)

	code, out, errOut := runCLI(t, "", "validate", "--allowed-roots", s.dir, doc)
	wantKV := "ok  context_assembly kv-1.0.0 package-runtime exports=[get,put,watch] manifest=" + kv.ManifestSHA256 +
		" artifact=" + kv.ArtifactSHA256 + " admitted=[read_only]\n"
	if code != 0 || errOut != "" || !strings.Contains(out, wantKV) || !strings.HasPrefix(out, "ok  prompt_system prompt-fast 1.0.0 manifest=") {
		t.Fatalf("exit %d, err %q, out:\n%s\nwant the line:\n%s", code, errOut, out, wantKV)
	}

	code, jsonOut, _ := runCLI(t, "", "validate", "--allowed-roots", s.dir, "-o", "json", doc)
	var report struct {
		Modules []moduleReport `json:"modules"`
	}
	if err := json.Unmarshal([]byte(jsonOut), &report); err != nil || code != 0 || len(report.Modules) != 2 {
		t.Fatalf("-o json: exit %d, %v\n%s", code, err, jsonOut)
	}
	cat, pr := report.Modules[0], report.Modules[1]
	if cat.Kind != "catalog" || cat.Version != "1.0.0" || cat.Exports != nil {
		t.Errorf("the catalog source's report = %+v", cat)
	}
	if pr.Kind != "package-runtime" || pr.Version != "" || strings.Join(pr.Exports, ",") != "get,put,watch" ||
		strings.Join(pr.NotAdmitted, ",") != "code_executing" || pr.ManifestSHA256 != kv.ManifestSHA256 || pr.Epoch == "" {
		t.Errorf("the package runtime's report = %+v", pr)
	}
	if strings.Contains(jsonOut, `"version": "0.0.0"`) {
		t.Errorf("the report invents a version for the package runtime:\n%s", jsonOut)
	}

	wrongRevision := s.document(t, "wrong.json", func(src []verifier.Source) { src[1].ImplementationID = "kv-2.0.0" })
	code, _, errOut = runCLI(t, "", "validate", "--allowed-roots", s.dir, wrongRevision)
	if code != 1 || !strings.Contains(errOut, `context_assembly: verification_failed: sources[1].implementation_id: package-runtime manifest `+kv.CatalogPath+` is revision "kv-1.0.0", not "kv-2.0.0"`) {
		t.Fatalf("wrong revision: exit %d, err %q", code, errOut)
	}
}

func TestConvertRoundTripsADocumentWithAPackageRuntimeSource(t *testing.T) {
	s := newStack(t, implSpec{id: "prompt-fast", module: "prompt_system", content: "#!/bin/sh\necho prompt\n"})
	kv := s.addPackageRuntime(t, "kv-1.0.0", "context_assembly")
	doc := s.document(t, "doc.json", nil)
	original, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	code, yamlOut, errOut := runCLI(t, "", "convert", "--name", "kv", "--node-name", "worker-1", doc)
	if code != 0 {
		t.Fatalf("convert: exit %d, err %q", code, errOut)
	}
	for _, want := range []string{"implementationID: kv-1.0.0", "catalogPath: " + kv.CatalogPath, "manifestSHA256: " + kv.ManifestSHA256} {
		if !strings.Contains(yamlOut, want) {
			t.Errorf("YAML lacks %q:\n%s", want, yamlOut)
		}
	}
	code, back, errOut := runCLI(t, yamlOut, "convert", "-")
	if code != 0 || back != string(original) {
		t.Fatalf("round trip: exit %d, err %q\n%s\nwant\n%s", code, errOut, back, original)
	}
	_, fromJSON, _ := runCLI(t, "", "validate", "--allowed-roots", s.dir, doc)
	code, fromYAML, errOut := runCLI(t, yamlOut, "validate", "--allowed-roots", s.dir, "-")
	if code != 0 || fromYAML != fromJSON || !strings.Contains(fromYAML, "package-runtime exports=[get,put,watch]") {
		t.Fatalf("the YAML form validates differently: exit %d, err %q\n%s\nwant\n%s", code, errOut, fromYAML, fromJSON)
	}
}

func TestPlanReloadsAModuleWhosePackageRuntimeRevisionChanges(t *testing.T) {
	s := newStack(t, implSpec{id: "prompt-fast", module: "prompt_system", content: "#!/bin/sh\necho prompt\n"})
	s.addPackageRuntime(t, "kv-1.0.0", "context_assembly")
	old := s.document(t, "old.json", nil)
	kv2 := s.addPackageRuntime(t, "kv-2.0.0", "context_assembly")
	s.sources = []verifier.Source{s.sources[0], kv2}
	next := s.document(t, "next.json", nil)
	code, out, errOut := runCLI(t, "", "plan", "--allowed-roots", s.dir, "-o", "json", "--from", old, "--to", next)
	var report planReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if code != 0 || strings.Join(report.Reloaded, ",") != "context_assembly" || strings.Join(report.Unchanged, ",") != "prompt_system" {
		t.Fatalf("exit %d, report %+v, err %q", code, report, errOut)
	}
}
