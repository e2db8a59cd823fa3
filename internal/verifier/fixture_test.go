package verifier

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"iteron.dev/operator/internal/catalog"
)

// fixture is a real provider tree on disk under one allowed root:
// <root>/catalogs/*.json and <root>/artifacts/<id>/bin/provider.
type fixture struct {
	t    testing.TB
	root string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	// Resolve the temp dir: it must itself contain no symlink.
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "providers")
	for _, d := range []string{"catalogs", "artifacts"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &fixture{t: t, root: root}
}

// provider is one implementation written to disk.
type provider struct {
	manifest    catalog.Manifest
	root        string
	catalogPath string
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// addProvider writes an executable for id and returns its provider with a
// valid manifest for module; edits apply to the manifest after the digest of
// the executable is filled in.
func (f *fixture) addProvider(id, module string, edits ...func(*catalog.Manifest)) *provider {
	f.t.Helper()
	root := filepath.Join(f.root, "artifacts", id)
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		f.t.Fatal(err)
	}
	content := []byte("#!/bin/sh\n# provider " + id + "\nexec cat\n")
	if err := os.WriteFile(filepath.Join(root, "bin", "provider"), content, 0o755); err != nil {
		f.t.Fatal(err)
	}
	m := catalog.Manifest{
		ImplementationID: id, ImplementationVersion: catalog.Version{1, 0, 0}, Module: module,
		ArtifactSHA256: sha256Hex(content), Executable: "bin/provider", Argv: []string{"--id", id},
		ProtocolVersion: 2, RequestedCapabilities: []string{"read_only"}, Dependencies: []catalog.Dependency{},
		RuntimeDeadlineMs: 60_000, CancellationDeadlineMs: 5_000,
		EvidenceLimits: catalog.EvidenceLimits{StdoutBytes: 1 << 20, StderrBytes: 4096, Observations: 64},
		FailurePolicy:  "fail_closed",
	}
	for _, e := range edits {
		e(&m)
	}
	return &provider{manifest: m, root: root}
}

// writeCatalog writes the providers' manifests into catalogs/<name> and
// records the path in each provider.
func (f *fixture) writeCatalog(name string, ps ...*provider) string {
	f.t.Helper()
	c := catalog.Catalog{SchemaVersion: 1}
	for _, p := range ps {
		c.Implementations = append(c.Implementations, p.manifest)
	}
	data, err := json.Marshal(c)
	if err != nil {
		f.t.Fatal(err)
	}
	path := filepath.Join(f.root, "catalogs", name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		f.t.Fatal(err)
	}
	for _, p := range ps {
		p.catalogPath = path
	}
	return path
}

func (p *provider) source(t testing.TB) Source {
	t.Helper()
	d, err := catalog.ManifestDigest(p.manifest)
	if err != nil {
		t.Fatal(err)
	}
	return Source{
		Module: p.manifest.Module, ImplementationID: p.manifest.ImplementationID,
		CatalogPath: p.catalogPath, ArtifactRoot: p.root,
		ManifestSHA256: d, ArtifactSHA256: "sha256:" + p.manifest.ArtifactSHA256,
	}
}

const candidate = "sha256:c0ffee0000000000000000000000000000000000000000000000000000000001"

func rawDocument(t testing.TB, sources ...Source) []byte {
	t.Helper()
	doc := &Document{CandidateSHA256: candidate, Sources: sources}
	data, err := doc.MarshalDocument()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func newVerifier(t testing.TB, roots ...string) *Verifier {
	t.Helper()
	v, err := NewVerifier(Config{AllowedRoots: roots, Ceiling: []string{"read_only", "reversible_local"}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// packageRuntime is one package runtime written to disk: its executable
// under artifacts/<id>/bin/runtime and its manifest at catalogs/<id>.json.
type packageRuntime struct {
	manifest     catalog.PackageRuntimeManifest
	root         string
	manifestPath string
}

// addPackageRuntime writes an executable and a valid package-runtime
// manifest for id filling module; edits apply to the manifest after the
// digest of the executable is filled in, before it is written.
func (f *fixture) addPackageRuntime(id, module string, edits ...func(*catalog.PackageRuntimeManifest)) *packageRuntime {
	f.t.Helper()
	root := filepath.Join(f.root, "artifacts", id)
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		f.t.Fatal(err)
	}
	content := []byte("#!/bin/sh\n# package runtime " + id + "\nexec sleep 1000\n")
	if err := os.WriteFile(filepath.Join(root, "bin", "runtime"), content, 0o755); err != nil {
		f.t.Fatal(err)
	}
	m := catalog.PackageRuntimeManifest{
		SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: id, RuntimeProtocolVersion: catalog.PackageRuntimeProtocol,
		Module: module, ExportIDs: []string{"get", "put", "watch"}, RequestedCapabilities: []string{"code_executing", "read_only"},
		Executable: "bin/runtime", ArtifactSHA256: sha256Hex(content),
		Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 5_000, InvokeMs: 10_000, CancelMs: 2_000},
		Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 64, MaxWatches: 16},
	}
	for _, e := range edits {
		e(&m)
	}
	pr := &packageRuntime{manifest: m, root: root, manifestPath: filepath.Join(f.root, "catalogs", id+".json")}
	data, err := json.Marshal(m)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(pr.manifestPath, data, 0o644); err != nil {
		f.t.Fatal(err)
	}
	return pr
}

// source names the package runtime as an activation does: catalog_path is
// the manifest, implementation_id its package_revision_id.
func (p *packageRuntime) source(t testing.TB) Source {
	t.Helper()
	d, err := catalog.PackageRuntimeManifestDigest(p.manifest)
	if err != nil {
		t.Fatal(err)
	}
	return Source{
		Module: p.manifest.Module, ImplementationID: p.manifest.PackageRevisionID,
		CatalogPath: p.manifestPath, ArtifactRoot: p.root,
		ManifestSHA256: d, ArtifactSHA256: "sha256:" + p.manifest.ArtifactSHA256,
	}
}
