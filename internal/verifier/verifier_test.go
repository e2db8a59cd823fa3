package verifier

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/protocol"
)

func TestAValidDocumentVerifiesAndMintsPlansInModuleIdOrder(t *testing.T) {
	f := newFixture(t)
	ctx := f.addProvider("context-fast", "context_assembly", func(m *catalog.Manifest) {
		m.RequestedCapabilities = []string{"code_executing", "read_only"}
		m.Dependencies = []catalog.Dependency{{ImplementationID: "prompt-fast", MinimumVersion: catalog.Version{1, 0, 0}}}
	})
	prompt := f.addProvider("prompt-fast", "prompt_system", func(m *catalog.Manifest) { m.ProtocolVersion = 1 })
	f.writeCatalog("stack.json", ctx, prompt)
	// Written in reverse ModuleId order: the result must not be.
	res, err := newVerifier(t, f.root).VerifyDocument(rawDocument(t, ctx.source(t), prompt.source(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	plans := res.Plans()
	if len(plans) != 2 || plans[0].Module() != "prompt_system" || plans[1].Module() != "context_assembly" {
		t.Fatalf("plans not in ModuleId order: %v", plans)
	}
	if res.Sources[0].Index != 1 || res.Sources[1].Index != 0 {
		t.Fatalf("document indexes lost: %+v", res.Sources)
	}
	p := plans[1]
	src := ctx.source(t)
	checks := []struct {
		what      string
		got, want any
	}{
		{"implementation ID", p.ImplementationID(), "context-fast"},
		{"version", p.Version(), [3]uint64{1, 0, 0}},
		{"protocol version", p.ProtocolVersion(), 2},
		{"manifest digest", p.ManifestSHA256(), src.ManifestSHA256},
		{"artifact digest", p.ArtifactSHA256(), src.ArtifactSHA256},
		{"artifact root", p.ArtifactRoot(), ctx.root},
		{"executable", p.Executable(), filepath.Join(ctx.root, "bin", "provider")},
		{"argv", strings.Join(p.Argv(), " "), "--id context-fast"},
		{"candidate", p.CandidateSHA256(), candidate},
		{"admitted capabilities", strings.Join(p.AdmittedCapabilities(), ","), "read_only"},
		{"authority digest", p.AuthoritySHA256(), catalog.AuthorityDigest([]string{"read_only"})},
		{"runtime deadline", p.RuntimeDeadline(), time.Minute},
		{"cancellation deadline", p.CancellationDeadline(), 5 * time.Second},
		{"evidence limits", p.EvidenceLimits(), EvidenceLimits{StdoutBytes: 1 << 20, StderrBytes: 4096, Observations: 64}},
		{"contracts", p.Contracts(), protocol.BuiltinContracts("context_assembly")},
		{"failure policy", p.FailurePolicy(), "fail_closed"},
		{"v1 protocol of the other plan", plans[0].ProtocolVersion(), 1},
	}
	for _, c := range checks {
		if !equalAny(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	vs := res.Verified()[1]
	if !slices.Equal(vs.NotAdmittedCapabilities, []string{"code_executing"}) {
		t.Errorf("not admitted = %v", vs.NotAdmittedCapabilities)
	}
	if vs.CatalogPath != ctx.catalogPath || vs.Manifest.Dependencies[0].ImplementationID != "prompt-fast" {
		t.Errorf("verified source lost the catalog path or manifest: %+v", vs)
	}
}

func equalAny(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func TestASpecIsVerifiedLikeTheDocumentAndNamesSpecFields(t *testing.T) {
	f := newFixture(t)
	a := f.addProvider("a", "prompt_system", func(m *catalog.Manifest) { m.RequestedCapabilities = []string{"read_only", "reversible_local"} })
	b := f.addProvider("b", "prompt_planner")
	f.writeCatalog("c.json", a, b)
	sb := b.source(t)
	sb.ArtifactRoot = sb.ArtifactRoot + "/../b"
	spec := (&Document{CandidateSHA256: candidate, Sources: []Source{a.source(t), sb}}).Spec("node-1")
	spec.CapabilityCeiling = []v1alpha1.Capability{"read_only"}
	res, err := newVerifier(t, f.root).VerifySpec(&spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Verified()[0].AdmittedCapabilities; !slices.Equal(got, []string{"read_only"}) {
		t.Fatalf("the activation's ceiling did not narrow the node's: admitted %v", got)
	}
	failed := res.Failed()
	if len(failed) != 1 || failed[0].Err.Field != "spec.sources[1].artifactRoot" {
		t.Fatalf("want one failure at spec.sources[1].artifactRoot, got %+v", failed)
	}
	if !errors.Is(failed[0].Err, ErrNotCanonical) {
		t.Fatalf("wrong sentinel: %v", failed[0].Err)
	}

	spec.Sources = append(spec.Sources, spec.Sources[0])
	_, err = newVerifier(t).VerifySpec(&spec)
	expectVerifyError(t, err, "spec.sources[2].module", "verification_failed", ErrDuplicate, "at most one source per module")

	spec.Sources = spec.Sources[:2]
	spec.CapabilityCeiling = []v1alpha1.Capability{"root"}
	_, err = newVerifier(t).VerifySpec(&spec)
	expectVerifyError(t, err, "spec.capabilityCeiling[0]", "verification_failed", ErrInvalidValue, "root")
}

func TestTheActivationCeilingNeverWidensTheNodes(t *testing.T) {
	f := newFixture(t)
	a := f.addProvider("a", "prompt_system", func(m *catalog.Manifest) { m.RequestedCapabilities = []string{"code_executing", "read_only"} })
	f.writeCatalog("c.json", a)
	spec := (&Document{CandidateSHA256: candidate, Sources: []Source{a.source(t)}}).Spec("n")
	spec.CapabilityCeiling = []v1alpha1.Capability{"code_executing", "read_only"}
	res, err := newVerifier(t).VerifySpec(&spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Verified()[0].AdmittedCapabilities; !slices.Equal(got, []string{"read_only"}) {
		t.Fatalf("code_executing admitted past the node's ceiling: %v", got)
	}
	if !slices.Equal(res.Ceiling, []string{"read_only"}) {
		t.Fatalf("effective ceiling = %v", res.Ceiling)
	}
}

func TestOneFailedSourceDoesNotHideTheOthers(t *testing.T) {
	f := newFixture(t)
	a := f.addProvider("a", "prompt_system")
	b := f.addProvider("b", "context_assembly")
	c := f.addProvider("c", "memory_recall")
	f.writeCatalog("c.json", a, b, c)
	sb := b.source(t)
	sb.ManifestSHA256 = "sha256:" + strings.Repeat("0", 64)
	res, err := newVerifier(t, f.root).VerifyDocument(rawDocument(t, a.source(t), sb, c.source(t)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Verified()) != 2 || len(res.Failed()) != 1 {
		t.Fatalf("verified %d, failed %d", len(res.Verified()), len(res.Failed()))
	}
	fail := res.Failed()[0]
	if fail.Module != "context_assembly" || fail.Index != 1 {
		t.Fatalf("failed source = %+v", fail)
	}
	expectVerifyError(t, fail.Err, "sources[1].manifest_sha256", "verification_failed", ErrDigestMismatch, "digests to")
	if len(res.Plans()) != 2 {
		t.Fatalf("plans of the good sources missing")
	}
}

func expectVerifyError(t *testing.T, err error, field, code string, sentinel error, detail string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *activation.Error naming %q, got %T %v", field, err, err)
	}
	if e.Field != field {
		t.Errorf("field = %q, want %q (error: %v)", e.Field, field, err)
	}
	if e.ReasonCode() != code {
		t.Errorf("reason code = %q, want %q (error: %v)", e.ReasonCode(), code, err)
	}
	if sentinel != nil && !errors.Is(err, sentinel) {
		t.Errorf("error does not wrap %v: %v", sentinel, err)
	}
	if !strings.Contains(err.Error(), detail) {
		t.Errorf("error %q does not say %q", err, detail)
	}
	if field != "" && !strings.HasPrefix(err.Error(), field+": ") {
		t.Errorf("error %q does not start with its field", err)
	}
}

// TestSourceRejections has one row per per-source rule of
// docs/reference/activation.md. Each row edits a valid two-source fixture (a:
// prompt_system, b: context_assembly) and expects source 1 (b) to fail with
// the named field, while source 0 still verifies.
func TestSourceRejections(t *testing.T) {
	type env struct {
		f    *fixture
		a, b *provider
	}
	tests := []struct {
		name     string
		roots    func(e *env) []string
		edit     func(t *testing.T, e *env, s *Source)
		field    string
		code     string
		sentinel error
		detail   string
		// bothFail: the edit (a root set) also rules out source 0.
		bothFail bool
	}{
		{name: "a module ID outside the pattern is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.Module = "Context" },
			field: "sources[1].module", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a module outside the seam graph is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.Module = "context_unknown" },
			field: "sources[1].module", code: "schema_mismatch", sentinel: ErrUnknownModule},
		{name: "an implementation ID outside the pattern is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ImplementationID = "b/1" },
			field: "sources[1].implementation_id", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a relative catalog path is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.CatalogPath = "catalogs/c.json" },
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrNotCanonical, detail: "not absolute"},
		{name: "a catalog path with a dot-dot segment is refused",
			edit: func(_ *testing.T, _ *env, s *Source) {
				s.CatalogPath = filepath.Dir(s.CatalogPath) + "/../catalogs/c.json"
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrNotCanonical, detail: "not canonical"},
		{name: "an artifact root with a trailing slash is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ArtifactRoot += "/" },
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrNotCanonical},
		{name: "a catalog path over 512 bytes is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.CatalogPath = "/" + strings.Repeat("a", 512) },
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrNotCanonical, detail: "512"},
		{name: "a catalog outside the allowed roots is refused",
			roots: func(e *env) []string { return []string{filepath.Join(e.f.root, "artifacts")} },
			edit:  func(*testing.T, *env, *Source) {},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrOutsideAllowedRoots, bothFail: true},
		{name: "an artifact root outside the allowed roots is refused",
			roots: func(e *env) []string { return []string{filepath.Join(e.f.root, "catalogs"), e.a.root} },
			edit:  func(*testing.T, *env, *Source) {},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrOutsideAllowedRoots},
		{name: "a root that is only a string prefix does not contain a path",
			roots: func(e *env) []string {
				return []string{filepath.Join(e.f.root, "catalogs"), e.a.root, filepath.Join(e.f.root, "art")}
			},
			edit:  func(*testing.T, *env, *Source) {},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrOutsideAllowedRoots},
		{name: "a malformed manifest digest is refused",
			edit: func(_ *testing.T, _ *env, s *Source) {
				s.ManifestSHA256 = strings.TrimPrefix(s.ManifestSHA256, "sha256:")
			},
			field: "sources[1].manifest_sha256", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "an uppercase artifact digest is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ArtifactSHA256 = strings.ToUpper(s.ArtifactSHA256) },
			field: "sources[1].artifact_sha256", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a catalog that is a symlink is refused",
			edit: func(t *testing.T, _ *env, s *Source) {
				link := filepath.Join(filepath.Dir(s.CatalogPath), "link.json")
				mustSymlink(t, s.CatalogPath, link)
				s.CatalogPath = link
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrSymlink, detail: "link.json is a symlink"},
		{name: "a symlinked directory above the catalog is refused, naming that component",
			edit: func(t *testing.T, e *env, s *Source) {
				link := filepath.Join(e.f.root, "cats")
				mustSymlink(t, filepath.Join(e.f.root, "catalogs"), link)
				s.CatalogPath = filepath.Join(link, "c.json")
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrSymlink, detail: "/providers/cats is a symlink"},
		{name: "a missing catalog is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.CatalogPath += ".missing" },
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrNotFound, detail: "does not exist"},
		{name: "a catalog that is a directory is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.CatalogPath = filepath.Dir(s.CatalogPath) },
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrNotRegularFile},
		{name: "a catalog that is a FIFO is refused without blocking",
			edit: func(t *testing.T, e *env, s *Source) {
				fifo := filepath.Join(e.f.root, "catalogs", "fifo.json")
				if err := syscall.Mkfifo(fifo, 0o644); err != nil {
					t.Fatal(err)
				}
				s.CatalogPath = fifo
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrNotRegularFile},
		{name: "a catalog over 512 KiB is refused before it is read",
			edit: func(t *testing.T, e *env, s *Source) {
				big := filepath.Join(e.f.root, "catalogs", "big.json")
				mustTruncate(t, big, catalog.MaxCatalogBytes+1)
				s.CatalogPath = big
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: ErrTooLarge, detail: "512 KiB"},
		{name: "a catalog that is not dependency-closed is refused whole, naming the inner field",
			edit: func(t *testing.T, e *env, s *Source) {
				broken := *e.b
				broken.manifest.Dependencies = []catalog.Dependency{{ImplementationID: "absent", MinimumVersion: catalog.Version{1, 0, 0}}}
				s.CatalogPath = e.f.writeCatalog("broken.json", &broken)
			},
			field: "sources[1].catalog_path", code: "verification_failed", sentinel: catalog.ErrNotDependencyClosed,
			detail: "implementations[0].dependencies[0].implementation_id"},
		{name: "a catalog with a duplicate key is refused as a schema mismatch",
			edit: func(t *testing.T, e *env, s *Source) {
				path := filepath.Join(e.f.root, "catalogs", "dup.json")
				mustWrite(t, path, `{"schema_version":1,"schema_version":1,"implementations":[]}`)
				s.CatalogPath = path
			},
			field: "sources[1].catalog_path", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "duplicate"},
		{name: "an implementation the catalog lacks is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ImplementationID = "c" },
			field: "sources[1].implementation_id", code: "verification_failed", sentinel: ErrManifestNotFound},
		{name: "a manifest of another module is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.Module = "memory_recall" },
			field: "sources[1].module", code: "verification_failed", sentinel: ErrModuleMismatch, detail: `fills module "context_assembly"`},
		{name: "a manifest whose digest differs is refused",
			edit:  func(_ *testing.T, e *env, s *Source) { s.ManifestSHA256 = e.a.source(t).ManifestSHA256 },
			field: "sources[1].manifest_sha256", code: "verification_failed", sentinel: ErrDigestMismatch},
		{name: "a manifest pinning another artifact is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ArtifactSHA256 = "sha256:" + strings.Repeat("ab", 32) },
			field: "sources[1].artifact_sha256", code: "verification_failed", sentinel: ErrDigestMismatch, detail: "pins artifact"},
		{name: "an artifact root that is a symlink is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				link := filepath.Join(e.f.root, "artifacts", "b-link")
				mustSymlink(t, s.ArtifactRoot, link)
				s.ArtifactRoot = link
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrSymlink, detail: "b-link is a symlink"},
		{name: "an artifact root that is a file is refused",
			edit: func(_ *testing.T, _ *env, s *Source) {
				s.ArtifactRoot = filepath.Join(s.ArtifactRoot, "bin", "provider")
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrNotDirectory},
		{name: "a missing artifact root is refused",
			edit:  func(_ *testing.T, _ *env, s *Source) { s.ArtifactRoot += "-gone" },
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrNotFound},
		{name: "an executable that is a symlink is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				exe := filepath.Join(s.ArtifactRoot, "bin", "provider")
				mustRename(t, exe, exe+".real")
				mustSymlink(t, "provider.real", exe)
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrSymlink, detail: "bin/provider is a symlink"},
		{name: "an executable directory symlinked out of the root is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				bin := filepath.Join(s.ArtifactRoot, "bin")
				mustRename(t, bin, filepath.Join(e.f.root, "elsewhere"))
				mustSymlink(t, filepath.Join(e.f.root, "elsewhere"), bin)
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrSymlink, detail: "/bin is a symlink"},
		{name: "an executable that is a directory is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				exe := filepath.Join(s.ArtifactRoot, "bin", "provider")
				mustRename(t, exe, exe+".real")
				if err := os.Mkdir(exe, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrNotRegularFile},
		{name: "a missing executable is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				if err := os.Remove(filepath.Join(s.ArtifactRoot, "bin", "provider")); err != nil {
					t.Fatal(err)
				}
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrNotFound},
		{name: "an executable over 256 MiB is refused before it is hashed",
			edit: func(t *testing.T, e *env, s *Source) {
				mustTruncate(t, filepath.Join(s.ArtifactRoot, "bin", "provider"), MaxArtifactBytes+1)
			},
			field: "sources[1].artifact_root", code: "verification_failed", sentinel: ErrTooLarge, detail: "256 MiB"},
		{name: "an executable with one byte tampered is refused",
			edit: func(t *testing.T, e *env, s *Source) {
				exe := filepath.Join(s.ArtifactRoot, "bin", "provider")
				data, err := os.ReadFile(exe)
				if err != nil {
					t.Fatal(err)
				}
				data[len(data)-2] ^= 1
				mustWrite(t, exe, string(data))
			},
			field: "sources[1].artifact_sha256", code: "verification_failed", sentinel: ErrDigestMismatch, detail: "hashes to"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			e := &env{f: f, a: f.addProvider("a", "prompt_system"), b: f.addProvider("b", "context_assembly")}
			f.writeCatalog("c.json", e.a, e.b)
			sb := e.b.source(t)
			tc.edit(t, e, &sb)
			roots := []string{f.root}
			if tc.roots != nil {
				roots = tc.roots(e)
			}
			res, err := newVerifier(t, roots...).VerifyDocument(rawDocument(t, e.a.source(t), sb))
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
			if !tc.bothFail && ares.Verified == nil {
				t.Errorf("source 0 failed too, hidden behind source 1's rule: %v", ares.Err)
			}
			if bres.Verified != nil {
				t.Fatalf("source 1 verified; want %s to fail", tc.field)
			}
			expectVerifyError(t, bres.Err, tc.field, tc.code, tc.sentinel, tc.detail)
		})
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mustRename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustTruncate(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}
