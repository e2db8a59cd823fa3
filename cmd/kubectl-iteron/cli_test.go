package main

import (
	"bytes"
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

// runCLI runs the CLI in-process and returns exit code, stdout and stderr.
func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// stack is a real provider tree: one catalog, one executable per
// implementation, and a raw document selecting them.
type stack struct {
	dir     string
	catalog string
	impls   map[string]*catalog.Manifest
	sources []verifier.Source
}

type implSpec struct {
	id, module string
	content    string
	caps       []string
}

func newStack(t *testing.T, specs ...implSpec) *stack {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{dir: dir, catalog: filepath.Join(dir, "catalog.json"), impls: map[string]*catalog.Manifest{}}
	c := catalog.Catalog{SchemaVersion: 1}
	for _, sp := range specs {
		root := filepath.Join(dir, "artifacts", sp.id)
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "provider"), []byte(sp.content), 0o755); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(sp.content))
		caps := sp.caps
		if caps == nil {
			caps = []string{"read_only"}
		}
		m := catalog.Manifest{ImplementationID: sp.id, ImplementationVersion: catalog.Version{1, 0, 0}, Module: sp.module,
			ArtifactSHA256: hex.EncodeToString(sum[:]), Executable: "provider", Argv: []string{}, ProtocolVersion: 2,
			RequestedCapabilities: caps, Dependencies: []catalog.Dependency{}, RuntimeDeadlineMs: 1000, CancellationDeadlineMs: 1000,
			EvidenceLimits: catalog.EvidenceLimits{StdoutBytes: 1024, StderrBytes: 1024, Observations: 4}, FailurePolicy: "fail_closed"}
		c.Implementations = append(c.Implementations, m)
		s.impls[sp.id] = &c.Implementations[len(c.Implementations)-1]
		md, err := catalog.ManifestDigest(m)
		if err != nil {
			t.Fatal(err)
		}
		s.sources = append(s.sources, verifier.Source{Module: sp.module, ImplementationID: sp.id, CatalogPath: s.catalog,
			ArtifactRoot: root, ManifestSHA256: md, ArtifactSHA256: "sha256:" + m.ArtifactSHA256})
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.catalog, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// document writes the raw document of the stack's sources (after edits).
func (s *stack) document(t *testing.T, name string, edit func([]verifier.Source)) string {
	t.Helper()
	sources := append([]verifier.Source(nil), s.sources...)
	if edit != nil {
		edit(sources)
	}
	doc := &verifier.Document{CandidateSHA256: "sha256:" + strings.Repeat("c", 64), Sources: sources}
	data, err := doc.MarshalDocument()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(s.dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func twoModules(t *testing.T) *stack {
	return newStack(t,
		implSpec{id: "prompt-fast", module: "prompt_system", content: "#!/bin/sh\necho prompt\n"},
		implSpec{id: "context-fast", module: "context_assembly", content: "#!/bin/sh\necho context\n", caps: []string{"code_executing", "read_only"}})
}

func TestDigestArtifactPrintsTheVerifiersDigest(t *testing.T) {
	s := twoModules(t)
	exe := filepath.Join(s.dir, "artifacts", "prompt-fast", "provider")
	code, out, errOut := runCLI(t, "", "digest", "artifact", exe)
	if code != 0 || strings.TrimSpace(out) != "sha256:"+s.impls["prompt-fast"].ArtifactSHA256 {
		t.Fatalf("exit %d, out %q, err %q", code, out, errOut)
	}
	code, out, _ = runCLI(t, "", "digest", "artifact", "--bare", exe)
	if code != 0 || strings.TrimSpace(out) != s.impls["prompt-fast"].ArtifactSHA256 {
		t.Fatalf("--bare: exit %d, out %q", code, out)
	}
	link := filepath.Join(s.dir, "link")
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(s.dir, "dir-link")
	if err := os.Symlink(filepath.Dir(exe), dirLink); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"a symlink is invalid, naming its target", []string{"digest", "artifact", link}, 1, link + " is a symlink to " + exe},
		{"a symlinked directory above the file is invalid, as the manager refuses it", []string{"digest", "artifact", filepath.Join(dirLink, filepath.Base(exe))}, 1, dirLink + " is a symlink to " + filepath.Dir(exe)},
		{"a directory is invalid", []string{"digest", "artifact", s.dir}, 1, "not a regular file"},
		{"a missing file is a usage error", []string{"digest", "artifact", exe + ".missing"}, 2, "does not exist"},
		{"no file is a usage error", []string{"digest", "artifact"}, 2, "accepts 1 arg"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tc.args...)
			if code != tc.code || out != "" || !strings.Contains(errOut, tc.err) {
				t.Fatalf("exit %d (want %d), out %q, err %q", code, tc.code, out, errOut)
			}
		})
	}
}

func TestDigestManifestPrintsEachManifestDigest(t *testing.T) {
	s := twoModules(t)
	code, out, errOut := runCLI(t, "", "digest", "manifest", s.catalog)
	want := s.sources[0].ManifestSHA256 + "  prompt-fast\n" + s.sources[1].ManifestSHA256 + "  context-fast\n"
	if code != 0 || out != want {
		t.Fatalf("exit %d, out %q (want %q), err %q", code, out, want, errOut)
	}
	code, out, _ = runCLI(t, "", "digest", "manifest", s.catalog, "context-fast")
	if code != 0 || out != s.sources[1].ManifestSHA256+"\n" {
		t.Fatalf("one: exit %d, out %q", code, out)
	}
	one, _ := json.Marshal(s.impls["prompt-fast"])
	code, out, _ = runCLI(t, string(one), "digest", "manifest", "--manifest", "-")
	if code != 0 || out != s.sources[0].ManifestSHA256+"  prompt-fast\n" {
		t.Fatalf("--manifest from stdin: exit %d, out %q", code, out)
	}
	code, _, errOut = runCLI(t, "", "digest", "manifest", s.catalog, "absent")
	if code != 1 || !strings.Contains(errOut, `no implementation "absent"`) {
		t.Fatalf("absent ID: exit %d, err %q", code, errOut)
	}
	link := filepath.Join(s.dir, "catalog-link.json")
	if err := os.Symlink(s.catalog, link); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI(t, "", "digest", "manifest", link)
	if code != 1 || out != "" || !strings.Contains(errOut, link+" is a symlink to "+s.catalog) || !strings.Contains(errOut, "the manager reads no file through a symlink") {
		t.Fatalf("a symlinked catalog, which the manager refuses: exit %d, out %q, err %q", code, out, errOut)
	}
	bad := writeFile(t, filepath.Join(s.dir, "bad.json"), `{"schema_version":1,"implementations":[{"implementation_id":"x","argv":[1]}]}`)
	code, _, errOut = runCLI(t, "", "digest", "manifest", bad)
	if code != 1 || !strings.Contains(errOut, "implementations[0].argv[0]: ") {
		t.Fatalf("invalid catalog: exit %d, err %q", code, errOut)
	}
}

func TestValidateAcceptsAValidDocumentInEitherForm(t *testing.T) {
	s := twoModules(t)
	doc := s.document(t, "doc.json", nil)
	code, out, errOut := runCLI(t, "", "validate", "--allowed-roots", s.dir, doc)
	if code != 0 || errOut != "" || !strings.Contains(out, "ok  prompt_system prompt-fast 1.0.0") || !strings.Contains(out, "ok  context_assembly context-fast") {
		t.Fatalf("exit %d, out %q, err %q", code, out, errOut)
	}
	if strings.Index(out, "prompt_system") > strings.Index(out, "context_assembly") {
		t.Fatalf("output not in ModuleId order:\n%s", out)
	}
	code, yamlOut, errOut := runCLI(t, "", "convert", "--name", "stack", "--node-name", "worker-1", doc)
	if code != 0 {
		t.Fatalf("convert: exit %d, err %q", code, errOut)
	}
	code, out2, errOut := runCLI(t, yamlOut, "validate", "--allowed-roots", s.dir, "-")
	if code != 0 || out2 != out {
		t.Fatalf("YAML form: exit %d, out %q, err %q", code, out2, errOut)
	}
	code, jsonOut, _ := runCLI(t, "", "validate", "--allowed-roots", s.dir, "-o", "json", doc)
	var report struct {
		Modules []moduleReport `json:"modules"`
	}
	if err := json.Unmarshal([]byte(jsonOut), &report); err != nil || code != 0 {
		t.Fatalf("-o json: exit %d, %v\n%s", code, err, jsonOut)
	}
	if m := report.Modules[1]; m.Module != "context_assembly" || strings.Join(m.NotAdmitted, ",") != "code_executing" || m.Epoch == "" {
		t.Fatalf("json report = %+v", m)
	}
}

func TestValidateNamesTheFieldOfEveryFailure(t *testing.T) {
	s := twoModules(t)
	link := filepath.Join(s.dir, "link.json")
	if err := os.Symlink(s.catalog, link); err != nil {
		t.Fatal(err)
	}
	symlinked := s.document(t, "symlinked.json", func(src []verifier.Source) { src[1].CatalogPath = link })
	_, yamlOut, _ := runCLI(t, "", "convert", "--name", "stack", "--node-name", "n", symlinked)
	yamlDoc := writeFile(t, filepath.Join(s.dir, "symlinked.yaml"), yamlOut)
	tests := []struct {
		name   string
		stdin  string
		args   []string
		code   int
		stderr []string
	}{
		{name: "a symlinked catalog fails its source, naming the raw field",
			args: []string{"validate", "--allowed-roots", s.dir, symlinked}, code: 1,
			stderr: []string{"context_assembly: verification_failed: sources[1].catalog_path: " + link + " is a symlink", "1 of 2 modules not admitted"}},
		{name: "the same failure in YAML names the spec field",
			args: []string{"validate", "--allowed-roots", s.dir, yamlDoc}, code: 1,
			stderr: []string{"spec.sources[1].catalogPath: " + link + " is a symlink"}},
		{name: "a path outside --allowed-roots fails",
			args: []string{"validate", "--allowed-roots", filepath.Join(s.dir, "artifacts"), s.document(t, "d.json", nil)}, code: 1,
			stderr: []string{"sources[0].catalog_path: " + s.catalog + " is outside the allowed roots"}},
		{name: "a failed dependency gates its consumer, naming the chain",
			args: []string{"validate", "--allowed-roots", s.dir, s.document(t, "gated.json", func(src []verifier.Source) { src[0].ManifestSHA256 = src[1].ManifestSHA256 })}, code: 1,
			stderr: []string{"prompt_system: verification_failed: sources[0].manifest_sha256:", "context_assembly: dependency_unsatisfied: context_assembly needs prompt_system (not admitted: verification_failed: sources[0].manifest_sha256"}},
		{name: "a duplicate key fails the whole document",
			stdin: `{"schema_version":1,"schema_version":1}`, args: []string{"validate", "-"}, code: 1,
			stderr: []string{"error: schema_version: duplicate object member name"}},
		{name: "a capability ceiling that names no capability is a usage error",
			args: []string{"validate", "--capability-ceiling", "root", symlinked}, code: 2, stderr: []string{`"root" is not a capability`}},
		{name: "a relative allowed root is a usage error",
			args: []string{"validate", "--allowed-roots", "rel", symlinked}, code: 2, stderr: []string{"--allowed-roots"}},
		{name: "a missing document is a usage error",
			args: []string{"validate", filepath.Join(s.dir, "absent.json")}, code: 2, stderr: []string{"no such file"}},
		{name: "no document is a usage error", args: []string{"validate"}, code: 2, stderr: []string{"accepts 1 arg"}},
		{name: "an unknown output format is a usage error", args: []string{"validate", "-o", "xml", symlinked}, code: 2, stderr: []string{"--output"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.stdin, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, errOut)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr does not say %q:\n%s", want, errOut)
				}
			}
		})
	}
}

func TestValidateDefaultsToTheManagersAllowedRoots(t *testing.T) {
	s := twoModules(t)
	doc := s.document(t, "doc.json", nil)
	code, _, errOut := runCLI(t, "", "validate", doc)
	if code != 1 || !strings.Contains(errOut, "sources[0].catalog_path: "+s.catalog+" is outside the allowed roots (/var/lib/iteron/providers)") {
		t.Fatalf("without --allowed-roots: exit %d, err %q", code, errOut)
	}
	cmd := newValidateCmd()
	if got := cmd.Flags().Lookup("allowed-roots").DefValue; got != "["+verifier.DefaultAllowedRoot+"]" {
		t.Fatalf("--allowed-roots defaults to %s, the manager to %s", got, verifier.DefaultAllowedRoot)
	}
	if !strings.Contains(cmd.Long, verifier.DefaultAllowedRoot) {
		t.Fatalf("validate's help does not name its default allowed root:\n%s", cmd.Long)
	}
}

func TestValidateUsesACustomGraph(t *testing.T) {
	s := newStack(t, implSpec{id: "a", module: "alpha", content: "a"})
	doc := s.document(t, "doc.json", nil)
	code, _, errOut := runCLI(t, "", "validate", "--allowed-roots", s.dir, doc)
	if code != 1 || !strings.Contains(errOut, `sources[0].module: "alpha" is not a module of the seam graph`) {
		t.Fatalf("built-in graph: exit %d, err %q", code, errOut)
	}
	entry := map[string]any{"module": "alpha", "dependencies": []string{}, "contracts": map[string]any{},
		"failure_semantics": catalog.FailureSemantics(), "host_invariants": catalog.HostInvariants()}
	contracts := entry["contracts"].(map[string]any)
	for _, role := range []string{"definition", "provider", "consumer", "observation", "load", "start", "cancel", "stop", "snapshot", "restore", "migrate", "readiness"} {
		contracts[role] = map[string]any{"id": "custom/alpha/" + role + "@v1", "version": 1}
	}
	g, _ := json.Marshal(map[string]any{"schema_version": 2, "modules": []any{entry}})
	graphFile := writeFile(t, filepath.Join(s.dir, "graph.json"), string(g))
	code, out, errOut := runCLI(t, "", "validate", "--allowed-roots", s.dir, "--graph", graphFile, doc)
	if code != 0 || !strings.Contains(out, "ok  alpha a") {
		t.Fatalf("custom graph: exit %d, out %q, err %q", code, out, errOut)
	}
	// Schema version 3: alpha requires beta optionally; the document has no
	// source for beta, so alpha is admitted with a note.
	beta := map[string]any{"module": "beta", "dependencies": []string{}, "contracts": map[string]any{},
		"failure_semantics": catalog.FailureSemantics(), "host_invariants": catalog.HostInvariants()}
	for _, role := range []string{"definition", "provider", "consumer", "observation", "load", "start", "cancel", "stop", "snapshot", "restore", "migrate", "readiness"} {
		beta["contracts"].(map[string]any)[role] = map[string]any{"id": "custom/beta/" + role + "@v1", "version": 1}
	}
	entry["dependencies"] = []any{map[string]any{"module": "beta", "optional": true, "version_range": map[string]any{"minimum": []int{2, 0, 0}}}}
	g3, _ := json.Marshal(map[string]any{"schema_version": 3, "modules": []any{beta, entry}})
	graph3 := writeFile(t, filepath.Join(s.dir, "graph3.json"), string(g3))
	code, out, errOut = runCLI(t, "", "validate", "--allowed-roots", s.dir, "--graph", graph3, doc)
	if code != 0 || !strings.Contains(out, "ok  alpha a") || !strings.Contains(errOut, "note: alpha: optional dependency beta ≥ 2.0.0, which has no source in the activation; activated without it") {
		t.Fatalf("typed requirements: exit %d, out %q, err %q", code, out, errOut)
	}
	bad := writeFile(t, filepath.Join(s.dir, "bad-graph.json"), `{"schema_version":4,"modules":[]}`)
	code, _, errOut = runCLI(t, "", "validate", "--allowed-roots", s.dir, "--graph", bad, doc)
	if code != 1 || !strings.Contains(errOut, "schema_version: seam graph schema version 4 is not supported") {
		t.Fatalf("bad graph: exit %d, err %q", code, errOut)
	}
}

func TestConvertRoundTripsAndRefusesWhatItCannotRead(t *testing.T) {
	s := twoModules(t)
	doc := s.document(t, "doc.json", nil)
	original, _ := os.ReadFile(doc)
	code, yamlOut, errOut := runCLI(t, "", "convert", "--name", "stack", "--namespace", "team-a", "--node-name", "worker-1", doc)
	if code != 0 {
		t.Fatalf("exit %d, err %q", code, errOut)
	}
	for _, want := range []string{"apiVersion: iteron.dev/v1alpha1", "kind: ImplementationActivation", "name: stack", "namespace: team-a",
		"nodeName: worker-1", "catalogPath: " + s.catalog, "implementationID: context-fast"} {
		if !strings.Contains(yamlOut, want) {
			t.Errorf("YAML lacks %q:\n%s", want, yamlOut)
		}
	}
	if strings.Contains(yamlOut, "null") || strings.Contains(yamlOut, "status") {
		t.Errorf("YAML carries empty fields:\n%s", yamlOut)
	}
	code, back, errOut := runCLI(t, yamlOut, "convert", "-")
	if code != 0 || back != string(original) {
		t.Fatalf("round trip: exit %d, err %q\n%s\nwant\n%s", code, errOut, back, original)
	}

	withSwap := yamlOut + "  capabilityCeiling: [read_only]\n  swap:\n    strategy: Cold\n"
	code, _, errOut = runCLI(t, withSwap, "convert", "--to", "json", "-")
	if code != 0 || !strings.Contains(errOut, "note: spec.swap has no place in the raw document") ||
		!strings.Contains(errOut, "note: spec.capabilityCeiling (read_only)") {
		t.Fatalf("dropped fields: exit %d, err %q", code, errOut)
	}

	tests := []struct {
		name  string
		stdin string
		args  []string
		code  int
		err   string
	}{
		{"a raw document without --name is a usage error", "", []string{"convert", doc}, 2, "--name and --node-name"},
		{"an unknown --to is a usage error", "", []string{"convert", "--to", "toml", doc}, 2, "--to"},
		{"an unknown field in the YAML is refused", strings.Replace(yamlOut, "nodeName:", "nodename: x\n  nodeName:", 1), []string{"convert", "-"}, 1, "spec.nodename: unknown field"},
		{"a duplicate key in the YAML is refused", strings.Replace(yamlOut, "  nodeName: worker-1\n", "  nodeName: worker-1\n  nodeName: worker-2\n", 1), []string{"convert", "-"}, 1, "not valid YAML"},
		{"two YAML documents are refused", yamlOut + "---\n" + yamlOut, []string{"convert", "-"}, 1, "exactly one YAML document, found 2"},
		{"another kind is refused", strings.Replace(yamlOut, "kind: ImplementationActivation", "kind: Generation", 1), []string{"convert", "-"}, 1, "apiVersion/kind"},
		{"a spec with two sources for one module is refused", strings.Replace(yamlOut, "module: context_assembly", "module: prompt_system", 1), []string{"convert", "-"}, 1, "spec.sources[1].module: module \"prompt_system\" already has a source"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.stdin, tc.args...)
			if code != tc.code || out != "" || !strings.Contains(errOut, tc.err) {
				t.Fatalf("exit %d (want %d), out %q, err %q", code, tc.code, out, errOut)
			}
		})
	}
}

func TestPlanShowsWhatAnApplyWouldDo(t *testing.T) {
	s := newStack(t,
		implSpec{id: "ps", module: "prompt_system", content: "ps"},
		implSpec{id: "ca", module: "context_assembly", content: "ca", caps: []string{"irreversible_external", "read_only"}},
		implSpec{id: "mr", module: "memory_recall", content: "mr"},
		implSpec{id: "te", module: "tool_exposure", content: "te"},
		implSpec{id: "ca2", module: "context_assembly", content: "ca2"},
	)
	all := s.sources
	write := func(name string, ids ...string) string {
		sources := []verifier.Source{}
		for _, id := range ids {
			for _, x := range all {
				if x.ImplementationID == id {
					sources = append(sources, x)
				}
			}
		}
		doc := &verifier.Document{CandidateSHA256: "sha256:" + strings.Repeat("c", 64), Sources: sources}
		data, err := doc.MarshalDocument()
		if err != nil {
			t.Fatal(err)
		}
		return writeFile(t, filepath.Join(s.dir, name), string(data))
	}
	old := write("old.json", "ps", "ca", "mr", "te")
	next := write("new.json", "ps", "ca2", "mr")

	code, out, errOut := runCLI(t, "", "plan", "--allowed-roots", s.dir, "--from", old, "--to", next)
	want := `added:          []
removed:        [tool_exposure]
reloaded:       [context_assembly memory_recall]
unchanged:      [prompt_system]
blocked:        []
activate order: [context_assembly memory_recall]
drain order:    [tool_exposure]
capabilities not admitted:
  (none)
`
	if code != 0 || out != want || errOut != "" {
		t.Fatalf("exit %d, err %q, out:\n%s\nwant:\n%s", code, errOut, out, want)
	}

	code, out, _ = runCLI(t, "", "plan", "--allowed-roots", s.dir, "--to", old)
	if code != 0 || !strings.Contains(out, "added:          [prompt_system context_assembly memory_recall tool_exposure]") ||
		!strings.Contains(out, "  context_assembly: irreversible_external") {
		t.Fatalf("first activation: exit %d, out:\n%s", code, out)
	}

	code, out, _ = runCLI(t, "", "plan", "--allowed-roots", s.dir, "--from", old, "--to", old)
	if code != 0 || !strings.Contains(out, "activate order: []") || !strings.Contains(out, "unchanged:      [prompt_system context_assembly memory_recall tool_exposure]") {
		t.Fatalf("no-op: exit %d, out:\n%s", code, out)
	}

	// A tampered executable in NEW blocks its module and its consumer.
	if err := os.WriteFile(filepath.Join(s.dir, "artifacts", "ca2", "provider"), []byte("tampered"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI(t, "", "plan", "--allowed-roots", s.dir, "-o", "json", "--from", old, "--to", next)
	var report planReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if code != 1 || strings.Join(report.Blocked, ",") != "context_assembly,memory_recall" ||
		!strings.Contains(errOut, "context_assembly: verification_failed: sources[1].artifact_sha256: executable") ||
		!strings.Contains(errOut, "memory_recall: dependency_unsatisfied: memory_recall needs context_assembly") {
		t.Fatalf("blocked: exit %d, report %+v, err %q", code, report, errOut)
	}

	code, _, errOut = runCLI(t, "", "plan", "--allowed-roots", s.dir, "--from", old)
	if code != 2 || !strings.Contains(errOut, "--to is required") {
		t.Fatalf("missing --to: exit %d, err %q", code, errOut)
	}
	code, _, errOut = runCLI(t, `{"schema_version":1,"extra":1}`, "plan", "--allowed-roots", s.dir, "--from", "-", "--to", next)
	if code != 1 || !strings.Contains(errOut, "--from -: extra: unknown field") {
		t.Fatalf("bad --from: exit %d, err %q", code, errOut)
	}
}

func TestDigestManifestKnowsAPackageRuntimeManifest(t *testing.T) {
	dir := t.TempDir()
	manifest := `{"schema_id":"iteron-package-runtime/1","package_revision_id":"kv-1.0.0","runtime_protocol_version":"quixos.runtime/1",` +
		`"module":"prompt_system","export_ids":["get","put","watch"],"executable":"bin/kv","artifact_sha256":"` + strings.Repeat("ab", 32) + `",` +
		`"deadlines":{"handshake_ms":5000,"invoke_ms":10000,"cancel_ms":2000},` +
		`"limits":{"max_message_bytes":1048576,"max_concurrent_invocations":64,"max_watches":16}}`
	m, err := catalog.ParsePackageRuntimeManifest([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := catalog.PackageRuntimeManifestDigest(m)
	path := writeFile(t, filepath.Join(dir, "kv.json"), manifest)
	code, out, errOut := runCLI(t, "", "digest", "manifest", path)
	if code != 0 || out != want+"  kv-1.0.0\n" {
		t.Fatalf("exit %d, out %q (want %q), err %q", code, out, want+"  kv-1.0.0\n", errOut)
	}
	code, out, _ = runCLI(t, manifest, "digest", "manifest", "-", "kv-1.0.0")
	if code != 0 || out != want+"\n" {
		t.Fatalf("from stdin, naming its revision: exit %d, out %q", code, out)
	}
	code, _, errOut = runCLI(t, "", "digest", "manifest", path, "kv-2.0.0")
	if code != 1 || !strings.Contains(errOut, `is the package runtime "kv-1.0.0", not "kv-2.0.0"`) {
		t.Fatalf("another revision: exit %d, err %q", code, errOut)
	}
	bad := writeFile(t, filepath.Join(dir, "bad.json"), strings.Replace(manifest, `["get","put","watch"]`, `["put","get"]`, 1))
	code, out, errOut = runCLI(t, "", "digest", "manifest", bad)
	if code != 1 || out != "" || !strings.Contains(errOut, "(a package-runtime manifest): export_ids[1]: ") {
		t.Fatalf("unsorted export_ids: exit %d, out %q, err %q", code, out, errOut)
	}
}
