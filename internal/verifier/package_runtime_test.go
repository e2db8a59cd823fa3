package verifier

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/protocol"
)

func TestAPackageRuntimeSourceVerifiesAndItsPlanCarriesTheManifest(t *testing.T) {
	f := newFixture(t)
	prompt := f.addProvider("prompt-fast", "prompt_system")
	f.writeCatalog("c.json", prompt)
	kv := f.addPackageRuntime("kv-1.0.0", "context_assembly")
	src := kv.source(t)
	res, err := newVerifier(t, f.root).VerifyDocument(rawDocument(t, src, prompt.source(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	verified := res.Verified()
	if len(verified) != 2 || verified[0].Module != "prompt_system" || verified[1].Module != "context_assembly" {
		t.Fatalf("verified sources not in ModuleId order: %+v", verified)
	}
	vs := verified[1]
	p := vs.Plan
	m, ok := p.PackageRuntime()
	if !ok {
		t.Fatal("the plan of a package-runtime source carries no package-runtime manifest")
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"source kind", vs.Kind(), SourceKindPackageRuntime},
		{"verified manifest", *vs.PackageRuntime, kv.manifest},
		{"catalog manifest left zero", vs.Manifest.ImplementationID, ""},
		{"version (a package runtime has none)", vs.Version, catalog.Version{}},
		{"catalog path is the manifest", vs.CatalogPath, kv.manifestPath},
		{"not admitted", vs.NotAdmittedCapabilities, []string{"code_executing"}},
		{"plan's manifest", m, kv.manifest},
		{"exports", m.ExportIDs, []string{"get", "put", "watch"}},
		{"implementation ID is the revision", p.ImplementationID(), "kv-1.0.0"},
		{"plan version", p.Version(), [3]uint64{0, 0, 0}},
		{"protocol version (cold replace)", p.ProtocolVersion(), 1},
		{"manifest digest", p.ManifestSHA256(), src.ManifestSHA256},
		{"artifact digest", p.ArtifactSHA256(), src.ArtifactSHA256},
		{"artifact root", p.ArtifactRoot(), kv.root},
		{"executable", p.Executable(), filepath.Join(kv.root, "bin", "runtime")},
		{"argv", p.Argv(), []string(nil)},
		{"candidate", p.CandidateSHA256(), candidate},
		{"admitted capabilities", p.AdmittedCapabilities(), []string{"read_only"}},
		{"authority digest", p.AuthoritySHA256(), catalog.AuthorityDigest([]string{"read_only"})},
		{"runtime deadline is invoke_ms", p.RuntimeDeadline(), 10 * time.Second},
		{"cancellation deadline is cancel_ms", p.CancellationDeadline(), 2 * time.Second},
		{"evidence limits", p.EvidenceLimits(), EvidenceLimits{StderrBytes: PackageRuntimeStderrBytes}},
		{"contracts", p.Contracts(), protocol.BuiltinContracts("context_assembly")},
		{"failure policy", p.FailurePolicy(), "fail_closed"},
	}
	for _, c := range checks {
		if !equalAny(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// The plan's manifest is a copy: changing it changes no plan.
	m.ExportIDs[0] = "changed"
	if again, _ := p.PackageRuntime(); again.ExportIDs[0] != "get" {
		t.Errorf("the plan shares its export IDs with its callers: %v", again.ExportIDs)
	}

	// The catalog source beside it verified exactly as before.
	cs := verified[0]
	if cs.Kind() != SourceKindCatalog || cs.PackageRuntime != nil || cs.Manifest.ImplementationID != "prompt-fast" {
		t.Errorf("the catalog source changed kind or lost its manifest: %+v", cs)
	}
	if _, ok := cs.Plan.PackageRuntime(); ok || cs.Plan.ProtocolVersion() != 2 || strings.Join(cs.Plan.Argv(), " ") != "--id prompt-fast" {
		t.Errorf("the catalog source's plan changed: protocol %d, argv %v", cs.Plan.ProtocolVersion(), cs.Plan.Argv())
	}
}

func TestAPackageRuntimeManifestWrittenInAnotherOrderHasTheSameDigestAndVerifies(t *testing.T) {
	f := newFixture(t)
	kv := f.addPackageRuntime("kv-1.0.0", "prompt_system")
	src := kv.source(t)
	// Members in reverse order, indented, the default capability list left
	// out: the digest is over the canonical bytes, not the file's.
	kv2 := f.addPackageRuntime("kv-2.0.0", "prompt_system", func(m *catalog.PackageRuntimeManifest) { m.RequestedCapabilities = nil })
	var members map[string]json.RawMessage
	if err := json.Unmarshal(mustReadFile(t, kv2.manifestPath), &members); err != nil {
		t.Fatal(err)
	}
	delete(members, "requested_capabilities")
	var b strings.Builder
	b.WriteString("{\n")
	keys := slices.Sorted(maps.Keys(members))
	slices.Reverse(keys)
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",\n")
		}
		b.WriteString("  \"" + k + "\": " + string(members[k]))
	}
	b.WriteString("\n}\n")
	mustWrite(t, kv2.manifestPath, b.String())
	src2 := kv2.source(t)
	if src2.ManifestSHA256 == src.ManifestSHA256 {
		t.Fatal("two revisions share a digest")
	}
	res, err := newVerifier(t, f.root).VerifyDocument(rawDocument(t, src2))
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("a reordered, indented manifest did not verify: %v", err)
	}
	if got := res.Verified()[0].PackageRuntime.RequestedCapabilities; got == nil || len(got) != 0 {
		t.Errorf("requested_capabilities left out = %#v, want []", got)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestPackageRuntimeSourceRejections has one row per check of a
// package-runtime source (docs/reference/package-runtimes.md). Each row edits
// a valid two-source fixture (a: a catalog source for prompt_system, b: a
// package runtime for context_assembly) and expects source 1 (b) to fail with
// the named field while source 0 still verifies.
func TestPackageRuntimeSourceRejections(t *testing.T) {
	type env struct {
		f *fixture
		a *provider
		b *packageRuntime
	}
	// rewrite replaces b's manifest file with raw bytes.
	rewrite := func(t *testing.T, e *env, text string) { t.Helper(); mustWrite(t, e.b.manifestPath, text) }
	manifestJSON := func(t *testing.T, e *env) string {
		t.Helper()
		data, err := json.Marshal(e.b.manifest)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	tests := []struct {
		name     string
		edit     func(t *testing.T, e *env, s *Source)
		field    string
		code     string
		sentinel error
		detail   string
	}{
		{name: "an implementation ID other than the package revision is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ImplementationID = "kv-2.0.0" },
			field: "sources[1].implementation_id", code: "verification_failed", sentinel: ErrManifestNotFound,
			detail: `is revision "kv-1.0.0", not "kv-2.0.0"`},
		{name: "a module other than the manifest's is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.Module = "memory_recall" },
			field: "sources[1].module", code: "verification_failed", sentinel: ErrModuleMismatch,
			detail: `package runtime "kv-1.0.0" fills module "context_assembly", not "memory_recall"`},
		{name: "a manifest digest that pins another manifest is refused",
			edit:  func(_ *testing.T, e *env, s *Source) { s.ManifestSHA256 = e.a.source(t).ManifestSHA256 },
			field: "sources[1].manifest_sha256", code: "verification_failed", sentinel: ErrDigestMismatch, detail: "digests to"},
		{name: "a manifest changed after it was pinned is refused",
			edit: func(t *testing.T, e *env, _ *Source) {
				e.b.manifest.Deadlines.InvokeMs++
				rewrite(t, e, manifestJSON(t, e))
			},
			field: "sources[1].manifest_sha256", code: "verification_failed", sentinel: ErrDigestMismatch, detail: "the package-runtime manifest"},
		{name: "a source pinning another artifact than the manifest is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ArtifactSHA256 = "sha256:" + strings.Repeat("ab", 32) },
			field: "sources[1].artifact_sha256", code: "verification_failed", sentinel: ErrDigestMismatch, detail: "pins artifact"},
		{name: "an executable whose bytes differ from the manifest's digest is refused",
			edit: func(t *testing.T, e *env, _ *Source) {
				mustWrite(t, filepath.Join(e.b.root, "bin", "runtime"), "#!/bin/sh\nexec true\n")
			},
			field: "sources[1].artifact_sha256", code: "verification_failed", sentinel: ErrDigestMismatch, detail: "hashes to"},
		{name: "a missing executable is refused naming the artifact root",
			edit: func(t *testing.T, e *env, _ *Source) {
				if err := os.Remove(filepath.Join(e.b.root, "bin", "runtime")); err != nil {
					t.Fatal(err)
				}
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrNotFound},
		{name: "a manifest reached through a symlink is refused",
			edit: func(t *testing.T, _ *env, s *Source) {
				link := filepath.Join(filepath.Dir(s.CatalogPath), "kv-link.json")
				mustSymlink(t, s.CatalogPath, link)
				s.CatalogPath = link
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrSymlink, detail: "kv-link.json is a symlink"},
		{name: "a manifest over 64 KiB is refused before it is parsed",
			edit: func(t *testing.T, e *env, _ *Source) {
				text := manifestJSON(t, e)
				rewrite(t, e, text[:len(text)-1]+strings.Repeat(" ", catalog.MaxPackageRuntimeManifestBytes)+"}")
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrTooLarge, detail: "over the 64 KiB bound"},
		{name: "a manifest outside the allowed roots is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				outside := filepath.Join(filepath.Dir(e.f.root), "elsewhere")
				if err := os.Mkdir(outside, 0o755); err != nil {
					t.Fatal(err)
				}
				s.CatalogPath = filepath.Join(outside, "kv.json")
				mustWrite(t, s.CatalogPath, manifestJSON(t, e))
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrOutsideAllowedRoots, detail: PhraseOutsideAllowedRoots},
		{name: "a manifest with an unknown member is refused as a schema mismatch naming it",
			edit: func(t *testing.T, e *env, _ *Source) {
				text := manifestJSON(t, e)
				rewrite(t, e, text[:len(text)-1]+`,"color":"red"}`)
			},
			field: "sources[1].catalog_path", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "color"},
		{name: "a manifest breaking a value rule is refused naming the inner field",
			edit: func(t *testing.T, e *env, _ *Source) {
				e.b.manifest.ExportIDs = []string{"put", "get"}
				rewrite(t, e, manifestJSON(t, e))
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: catalog.ErrInvalidValue, detail: "export_ids[1]"},
		{name: "a manifest of another protocol is refused as an unsupported version",
			edit: func(t *testing.T, e *env, _ *Source) {
				e.b.manifest.RuntimeProtocolVersion = "quixos.runtime/2"
				rewrite(t, e, manifestJSON(t, e))
			},
			field: "sources[1].catalog_path", code: "unsupported_version", sentinel: catalog.ErrUnsupportedVersion, detail: "runtime_protocol_version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			e := &env{f: f, a: f.addProvider("a", "prompt_system"), b: f.addPackageRuntime("kv-1.0.0", "context_assembly")}
			f.writeCatalog("c.json", e.a)
			sb := e.b.source(t)
			tc.edit(t, e, &sb)
			res, err := newVerifier(t, f.root).VerifyDocument(rawDocument(t, e.a.source(t), sb))
			if err != nil {
				t.Fatalf("document-level error for a per-source rule: %v", err)
			}
			var ares, bres *SourceResult
			for i := range res.Sources {
				switch res.Sources[i].Index {
				case 0:
					ares = &res.Sources[i]
				case 1:
					bres = &res.Sources[i]
				}
			}
			if ares.Verified == nil {
				t.Errorf("source 0 failed too, hidden behind source 1's rule: %v", ares.Err)
			}
			if bres.Verified != nil {
				t.Fatalf("source 1 verified; want %s to fail", tc.field)
			}
			expectVerifyError(t, bres.Err, tc.field, tc.code, tc.sentinel, tc.detail)
		})
	}
}

// oneLayout resolves every reference to one source laid out in a real
// artifact store directory.
type oneLayout struct {
	store  *artifacts.Store
	layout *artifacts.Layout
}

func (o oneLayout) Resolve(string, string) (*artifacts.Layout, error) { return o.layout, nil }
func (o oneLayout) Store() *artifacts.Store                           { return o.store }

func TestAnOCISourceCarryingAPackageRuntimeManifestIsRefusedNamingTheReference(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store, err := artifacts.OpenStore(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A source directory as the store lays one out, but holding a
	// package-runtime manifest where the catalog would be.
	f := &fixture{t: t, root: filepath.Join(store.SourcesDir(), strings.Repeat("d", 64))}
	for _, d := range []string{"catalogs", "artifacts"} {
		if err := os.MkdirAll(filepath.Join(f.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	kv := f.addPackageRuntime("kv-1.0.0", "prompt_system")
	src := kv.source(t)
	const ref = "registry.example/kv@sha256:" + "e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5"
	src.CatalogPath, src.ArtifactRoot, src.OCIRef = "", "", ref
	v, err := NewVerifier(Config{Artifacts: oneLayout{store: store, layout: &artifacts.Layout{
		CatalogPath: kv.manifestPath, Roots: map[string]string{"kv-1.0.0": kv.root}}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.Verify(&Document{CandidateSHA256: candidate, Sources: []Source{src}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed()) != 1 {
		t.Fatalf("an OCI source carrying a package runtime verified: %+v", res.Sources)
	}
	fail := res.Failed()[0].Err
	expectVerifyError(t, fail, "sources[0].oci.ref", "verification_failed", ErrSourceKind, "not by oci")
	if !errors.Is(fail, ErrSourceKind) {
		t.Fatalf("wrong sentinel: %v", fail)
	}
}
