package verifier

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// DefaultAllowedRoot is the manager's default --allowed-roots, and so the
// default of the CLI's validate and plan: a check offline that passes what
// the manager would refuse is no check.
const DefaultAllowedRoot = "/var/lib/iteron/providers"

// Config configures a Verifier.
type Config struct {
	// AllowedRoots are canonical absolute directories every catalog and
	// artifact root must lie under (the manager's --allowed-roots). Empty
	// means no restriction (tests that verify files in a temporary
	// directory); the manager and the CLI default to DefaultAllowedRoot.
	AllowedRoots []string
	// Ceiling is the node's capability ceiling (--capability-ceiling); an
	// activation may only narrow it.
	Ceiling []string
	// Graph is the node's seam graph; nil means the built-in graph.
	Graph *catalog.SeamGraph
	// Artifacts resolves OCI sources into sources laid out in an artifact
	// store (the manager's puller); nil refuses OCI sources.
	Artifacts ArtifactResolver
}

// ArtifactResolver resolves an OCI reference into a source laid out in an
// artifact store (internal/artifacts). token identifies the request (the
// document's sources): a refused pull is not tried again for the same one.
type ArtifactResolver interface {
	Resolve(ref, token string) (*artifacts.Layout, error)
	Store() *artifacts.Store
}

// Verifier verifies activation documents against the files on this node. It
// is the only minter of LaunchPlans. It holds no state between calls and is
// safe for concurrent use.
type Verifier struct {
	roots     []string
	ceiling   []string
	graph     *catalog.SeamGraph
	artifacts ArtifactResolver
	// digests remembers the digests of unchanged executables across
	// verifications (digestcache.go).
	digests *digestCache
}

// NewVerifier checks cfg: every allowed root an absolute canonical path,
// every ceiling entry a capability.
func NewVerifier(cfg Config) (*Verifier, error) {
	v := &Verifier{graph: cfg.Graph, artifacts: cfg.Artifacts, digests: newDigestCache()}
	if v.graph == nil {
		v.graph = catalog.BuiltinSeamGraph()
	}
	for _, r := range cfg.AllowedRoots {
		if reason, ok := checkCanonicalPath(r); !ok {
			return nil, fmt.Errorf("allowed root %q %s: %w", r, reason, ErrNotCanonical)
		}
		v.roots = append(v.roots, r)
	}
	for _, c := range cfg.Ceiling {
		if !catalog.IsCapability(c) {
			return nil, fmt.Errorf("capability ceiling: %q is not a capability: %w", c, ErrInvalidValue)
		}
	}
	v.ceiling = catalog.Admit(cfg.Ceiling, cfg.Ceiling)
	return v, nil
}

// Graph is the seam graph the verifier checks modules against.
func (v *Verifier) Graph() *catalog.SeamGraph { return v.graph }

// VerifiedSource is one source that passed every check of
// docs/reference/activation.md, with what was verified. Its Plan is the only
// way to launch it.
type VerifiedSource struct {
	// Module is the module the source fills.
	Module string
	// ImplementationID is the selected manifest's implementation_id (a
	// package runtime's package_revision_id).
	ImplementationID string
	// Version is the manifest's implementation_version; 0.0.0 for a package
	// runtime, whose manifest has none (its revision ID names it).
	Version catalog.Version
	// CatalogPath is the canonical path of the catalog, or of the
	// package-runtime manifest.
	CatalogPath string
	// ArtifactRoot is the canonical artifact root.
	ArtifactRoot string
	// Executable is the canonical absolute path of the executable.
	Executable string
	// Manifest is the selected catalog manifest, defaults written out; zero
	// for a package runtime (see PackageRuntime).
	Manifest catalog.Manifest
	// PackageRuntime is the verified package-runtime manifest when the source
	// names one (docs/reference/package-runtimes.md), nil for a catalog
	// source.
	PackageRuntime *catalog.PackageRuntimeManifest
	// ManifestSHA256 is the verified canonical manifest digest ("sha256:…").
	ManifestSHA256 string
	// ArtifactSHA256 is the verified executable digest ("sha256:…").
	ArtifactSHA256 string
	// AdmittedCapabilities are requested ∩ ceiling, sorted.
	AdmittedCapabilities []string
	// NotAdmittedCapabilities are the requested capabilities the ceiling dropped.
	NotAdmittedCapabilities []string
	// AuthoritySHA256 is the digest of AdmittedCapabilities.
	AuthoritySHA256 string
	// Sandbox is what the source asks of the node's sandbox.
	Sandbox SandboxRequest
	// Plan is the launch plan minted from exactly these verified values.
	Plan LaunchPlan
	// Files are the catalog (or package-runtime manifest) and the
	// executable, stamped before they were read: while each is Unchanged,
	// verifying the source again reads the same bytes.
	Files []FileStamp
}

// Source kinds, as VerifiedSource.Kind reports them.
const (
	// SourceKindCatalog is a line-protocol provider selected from a catalog.
	SourceKindCatalog = "catalog"
	// SourceKindPackageRuntime is a quixos.runtime.PackageRuntime server
	// named by its package-runtime manifest.
	SourceKindPackageRuntime = "package-runtime"
)

// Kind is the source's kind: SourceKindCatalog or SourceKindPackageRuntime.
func (vs *VerifiedSource) Kind() string {
	if vs.PackageRuntime != nil {
		return SourceKindPackageRuntime
	}
	return SourceKindCatalog
}

// SourceResult is the outcome for one source: verified, or an error naming
// the field. One failed source never hides the others' results.
type SourceResult struct {
	// Index is the source's position in the document.
	Index int
	// Module is the module as written (it may be invalid when Err is set).
	Module string
	// ImplementationID is the ID as written.
	ImplementationID string
	// Verified is set when every check passed.
	Verified *VerifiedSource
	// Err is set when a check failed.
	Err *Error
}

// Result is the verification of one document: every source's outcome, in
// ModuleId order (sources whose module is not in the graph last, in document
// order).
type Result struct {
	// CandidateSHA256 is the document's candidate digest.
	CandidateSHA256 string
	// Ceiling is the ceiling the sources were admitted under: the node's,
	// narrowed by the activation's.
	Ceiling []string
	// Sources are the per-source outcomes.
	Sources []SourceResult
}

// Verified returns the verified sources in ModuleId order.
func (r *Result) Verified() []*VerifiedSource {
	var out []*VerifiedSource
	for _, s := range r.Sources {
		if s.Verified != nil {
			out = append(out, s.Verified)
		}
	}
	return out
}

// Failed returns the sources that failed verification, in ModuleId order.
func (r *Result) Failed() []SourceResult {
	var out []SourceResult
	for _, s := range r.Sources {
		if s.Err != nil {
			out = append(out, s)
		}
	}
	return out
}

// Plans returns the launch plans of the verified sources, in ModuleId order.
func (r *Result) Plans() []LaunchPlan {
	var out []LaunchPlan
	for _, s := range r.Verified() {
		out = append(out, s.Plan)
	}
	return out
}

// Err joins every source's error, or nil when all verified.
func (r *Result) Err() error {
	var errs []error
	for _, s := range r.Failed() {
		errs = append(errs, s.Err)
	}
	return errors.Join(errs...)
}

// VerifyDocument parses a raw activation document (ParseDocument) and
// verifies it. The error is a document-level failure; per-source failures
// are in the result.
func (v *Verifier) VerifyDocument(data []byte) (*Result, error) {
	doc, err := ParseDocument(data)
	if err != nil {
		return nil, err
	}
	return v.Verify(doc)
}

// VerifySpec verifies an ImplementationActivation spec; errors name
// spec.sources[i].… fields.
func (v *Verifier) VerifySpec(spec *v1alpha1.ImplementationActivationSpec) (*Result, error) {
	doc, err := DocumentFromSpec(spec)
	if err != nil {
		return nil, err
	}
	return v.Verify(doc)
}

// Verify checks every source of doc against the files on this node
// (docs/reference/activation.md) and mints a LaunchPlan for each one that
// passes.
func (v *Verifier) Verify(doc *Document) (*Result, error) {
	if err := doc.Check(); err != nil {
		return nil, err
	}
	res := &Result{CandidateSHA256: doc.CandidateSHA256, Ceiling: catalog.NarrowCeiling(v.ceiling, doc.CapabilityCeiling)}
	token := doc.token()
	for i, s := range doc.Sources {
		sr := SourceResult{Index: i, Module: s.Module, ImplementationID: s.ImplementationID}
		sr.Verified, sr.Err = v.verifySource(doc, i, res.Ceiling, token)
		res.Sources = append(res.Sources, sr)
	}
	slices.SortStableFunc(res.Sources, func(a, b SourceResult) int {
		ia, okA := v.graph.Order(a.Module)
		ib, okB := v.graph.Order(b.Module)
		switch {
		case okA && okB:
			return cmp.Compare(ia, ib)
		case okA != okB:
			if okA {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Index, b.Index)
	})
	return res, nil
}

// inArtifactStore reports whether a path source's path lies in a source the
// manager laid out in its artifact store (an allowed root by construction):
// a Generation made from an OCI source records such paths, and recovery
// verifies them again to relaunch it. The store is looked at only for a
// path outside the allowed roots.
func (v *Verifier) inArtifactStore(s Source, p string) bool {
	if s.HasOCI() || v.artifacts == nil {
		return false
	}
	st := v.artifacts.Store()
	return st != nil && underRoots(p, []string{st.SourcesDir()})
}

func (v *Verifier) verifySource(doc *Document, i int, ceiling []string, token string) (*VerifiedSource, *Error) {
	s := doc.Sources[i]
	field := func(key int) string { return doc.sourceField(i, key) }
	if key, ok := doc.missingMember(i); ok {
		return nil, &Error{Field: field(key), Code: reasons.SchemaMismatch, Detail: "required field missing", Err: catalog.ErrMissingField}
	}
	if slices.Contains(doc.both, i) {
		return nil, &Error{Field: catalog.Field(doc.sourceItem(i), "oci"), Code: reasons.SchemaMismatch, Err: ErrSourceKind,
			Detail: "give either " + sourceKeys[doc.Form][keyCatalogPath] + " and " + sourceKeys[doc.Form][keyArtifactRoot] + ", or oci, not both"}
	}
	// Paths checks name the member the user wrote: the paths, or oci.ref
	// for a source laid out in the artifact store.
	pathField := field
	roots := v.roots
	if s.HasOCI() {
		pathField = func(int) string { return field(keyOCIRef) }
		if _, err := artifacts.ParseRef(s.OCIRef); err != nil {
			return nil, failf(field(keyOCIRef), ErrInvalidValue, "%v", err)
		}
		if !catalog.IsImplementationID(s.ImplementationID) || !catalog.IsModuleID(s.Module) {
			// Reported below, before anything is pulled.
		} else if v.artifacts == nil {
			return nil, failf(field(keyOCIRef), ErrNoArtifactStore, "%s cannot be verified here: nothing pulls it (the manager does; offline, pull it with `kubectl iteron pull %s --to DIR` and verify with --artifact-store DIR)", s.OCIRef, s.OCIRef)
		} else {
			layout, err := v.artifacts.Resolve(s.OCIRef, token)
			if err != nil {
				var ae *artifacts.Error
				if errors.As(err, &ae) {
					return nil, &Error{Field: field(keyOCIRef), Code: ae.Code, Detail: ae.Detail, Err: err}
				}
				return nil, &Error{Field: field(keyOCIRef), Code: reasons.ArtifactUnavailable, Detail: err.Error(), Err: err}
			}
			root, ok := layout.Root(s.ImplementationID)
			if !ok {
				return nil, failf(field(keyImplementationID), ErrManifestNotFound, "artifact %s carries no executable for implementation %q (it carries %s)", s.OCIRef, s.ImplementationID, strings.Join(slices.Sorted(maps.Keys(layout.Roots)), ", "))
			}
			s.CatalogPath, s.ArtifactRoot = layout.CatalogPath, root
			roots = []string{v.artifacts.Store().SourcesDir()}
		}
	}

	// The values as written.
	if !catalog.IsModuleID(s.Module) {
		return nil, failf(field(keyModule), ErrInvalidValue, "%q is not a module ID (^[a-z][a-z0-9_]{0,47}$)", s.Module)
	}
	if !v.graph.Has(s.Module) {
		return nil, failf(field(keyModule), ErrUnknownModule, "%q is not a module of the seam graph", s.Module)
	}
	if !catalog.IsImplementationID(s.ImplementationID) {
		return nil, failf(field(keyImplementationID), ErrInvalidValue, "%q is not 1–96 bytes of [A-Za-z0-9._-]", s.ImplementationID)
	}
	for _, p := range []struct {
		key   int
		value string
	}{{keyCatalogPath, s.CatalogPath}, {keyArtifactRoot, s.ArtifactRoot}} {
		if reason, ok := checkCanonicalPath(p.value); !ok {
			return nil, failf(pathField(p.key), ErrNotCanonical, "%q %s: paths must be absolute and canonical", p.value, reason)
		}
		if !underRoots(p.value, roots) && !v.inArtifactStore(s, p.value) {
			return nil, failf(pathField(p.key), ErrOutsideAllowedRoots, "%s %s (%s)", p.value, PhraseOutsideAllowedRoots, strings.Join(roots, ", "))
		}
	}
	for _, d := range []struct {
		key   int
		value string
	}{{keyManifestSHA256, s.ManifestSHA256}, {keyArtifactSHA256, s.ArtifactSHA256}} {
		if !catalog.IsDigest(d.value) {
			return nil, failf(field(d.key), ErrInvalidValue, "%q is not sha256: and 64 lowercase hex digits", d.value)
		}
	}

	// The file at catalog_path: a regular file, reached through no symlink,
	// bounded. A catalog, or a package-runtime manifest (told apart by its
	// schema_id, docs/reference/package-runtimes.md).
	data, catalogStamp, ferr := readSourceFile(s.CatalogPath)
	if ferr != nil {
		return nil, ferr.at(pathField(keyCatalogPath))
	}
	var pin pinned
	var pr *catalog.PackageRuntimeManifest
	var m catalog.Manifest
	if catalog.IsPackageRuntimeManifest(data) {
		if s.HasOCI() {
			// The artifact store lays out catalogs only (internal/artifacts
			// parses the layer as one); say so rather than half-support it.
			return nil, failf(field(keyOCIRef), ErrSourceKind, "%s carries a package-runtime manifest: package runtimes are named by catalog_path and artifact_root, not by oci", s.OCIRef)
		}
		man, ferr := parsePackageRuntimeFile(s.CatalogPath, data)
		if ferr != nil {
			return nil, ferr.at(pathField(keyCatalogPath))
		}
		if man.PackageRevisionID != s.ImplementationID {
			return nil, failf(field(keyImplementationID), ErrManifestNotFound, "package-runtime manifest %s is revision %q, not %q (a package runtime's implementation_id is its package_revision_id)", s.CatalogPath, man.PackageRevisionID, s.ImplementationID)
		}
		digest, derr := catalog.PackageRuntimeManifestDigest(man)
		if derr != nil {
			return nil, fromCatalog(field(keyManifestSHA256), "digest of package-runtime manifest "+s.CatalogPath, derr)
		}
		pr = &man
		pin = pinned{who: fmt.Sprintf("package runtime %q", man.PackageRevisionID), what: "the package-runtime manifest " + s.CatalogPath,
			module: man.Module, manifestDigest: digest, artifactHex: man.ArtifactSHA256, executable: man.Executable, requested: man.RequestedCapabilities}
	} else {
		cat, ferr := parseCatalogFile(s.CatalogPath, data)
		if ferr != nil {
			return nil, ferr.at(pathField(keyCatalogPath))
		}
		var ok bool
		if m, ok = cat.Lookup(s.ImplementationID); !ok {
			return nil, failf(field(keyImplementationID), ErrManifestNotFound, "catalog %s has no implementation %q", s.CatalogPath, s.ImplementationID)
		}
		digest, derr := catalog.ManifestDigest(m)
		if derr != nil {
			return nil, fromCatalog(field(keyManifestSHA256), "digest of manifest "+s.ImplementationID, derr)
		}
		pin = pinned{who: fmt.Sprintf("implementation %q", s.ImplementationID), what: fmt.Sprintf("the manifest of %q in %s", s.ImplementationID, s.CatalogPath),
			module: m.Module, manifestDigest: digest, artifactHex: m.ArtifactSHA256, executable: m.Executable, requested: m.RequestedCapabilities}
	}

	// What the manifest pins, whichever kind it is, against the source.
	if pin.module != s.Module {
		return nil, failf(field(keyModule), ErrModuleMismatch, "%s fills module %q, not %q", pin.who, pin.module, s.Module)
	}
	if pin.manifestDigest != s.ManifestSHA256 {
		return nil, failf(field(keyManifestSHA256), ErrDigestMismatch, "%s digests to %s, not %s", pin.what, pin.manifestDigest, s.ManifestSHA256)
	}
	if "sha256:"+pin.artifactHex != s.ArtifactSHA256 {
		return nil, failf(field(keyArtifactSHA256), ErrDigestMismatch, "%s pins artifact sha256:%s, not %s", pin.what, pin.artifactHex, s.ArtifactSHA256)
	}

	// The executable: a canonical regular file under the root, hashed.
	executable, artifactDigest, exeStamp, ferr := hashExecutableWith(s.ArtifactRoot, pin.executable, v.digests)
	if ferr != nil {
		return nil, ferr.at(pathField(keyArtifactRoot))
	}
	if artifactDigest != s.ArtifactSHA256 {
		return nil, failf(field(keyArtifactSHA256), ErrDigestMismatch, "executable %s hashes to %s, not %s", executable, artifactDigest, s.ArtifactSHA256)
	}

	contracts, _ := v.graph.Contracts(s.Module)
	admitted := catalog.Admit(pin.requested, ceiling)
	vs := &VerifiedSource{
		Module: s.Module, ImplementationID: s.ImplementationID, Version: m.ImplementationVersion,
		CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot, Executable: executable,
		Manifest: m, PackageRuntime: pr, ManifestSHA256: pin.manifestDigest, ArtifactSHA256: artifactDigest,
		AdmittedCapabilities:    admitted,
		NotAdmittedCapabilities: catalog.NotAdmitted(pin.requested, admitted),
		AuthoritySHA256:         catalog.AuthorityDigest(admitted),
		Sandbox:                 s.Sandbox,
		Files:                   []FileStamp{catalogStamp, exeStamp},
	}
	if pr != nil {
		vs.Plan = mintPackageRuntime(vs, doc.CandidateSHA256, contracts)
	} else {
		vs.Plan = mint(vs, doc.CandidateSHA256, contracts)
	}
	return vs, nil
}

// pinned is what a source's file pins for the source, whichever kind the
// file is: the checks after the parse are the same for a catalog's manifest
// and a package-runtime manifest, and are written once.
type pinned struct {
	// who and what name the manifest in errors: `implementation "x"` and
	// `the manifest of "x" in /p/catalog.json`.
	who, what      string
	module         string
	manifestDigest string
	// artifactHex is the manifest's artifact_sha256 (bare hex).
	artifactHex string
	executable  string
	requested   []string
}

// mint is the one place a real LaunchPlan is made: from values that were
// just verified, never from the document as written.
func mint(vs *VerifiedSource, candidate string, contracts protocol.ModuleContracts) LaunchPlan {
	m := vs.Manifest
	return newLaunchPlan(LaunchPlanFields{
		Module: vs.Module, ImplementationID: vs.ImplementationID, Version: vs.Version,
		ProtocolVersion: int(m.ProtocolVersion), ManifestSHA256: vs.ManifestSHA256, ArtifactSHA256: vs.ArtifactSHA256,
		ArtifactRoot: vs.ArtifactRoot, Executable: vs.Executable, Argv: m.Argv,
		CandidateSHA256: candidate, AdmittedCapabilities: vs.AdmittedCapabilities, AuthoritySHA256: vs.AuthoritySHA256,
		RuntimeDeadline:      time.Duration(m.RuntimeDeadlineMs) * time.Millisecond,
		CancellationDeadline: time.Duration(m.CancellationDeadlineMs) * time.Millisecond,
		EvidenceLimits: EvidenceLimits{
			StdoutBytes: int64(m.EvidenceLimits.StdoutBytes), StderrBytes: int64(m.EvidenceLimits.StderrBytes),
			Observations: int(m.EvidenceLimits.Observations),
		},
		Contracts: contracts, FailurePolicy: m.FailurePolicy, Sandbox: vs.Sandbox,
	})
}

// PackageRuntimeStderrBytes is the stderr ring of a package runtime: its
// manifest has no evidence limits (it produces no line-protocol evidence),
// so the plan carries the size the package-runtime launcher defaults to.
const PackageRuntimeStderrBytes = 64 << 10

// mintPackageRuntime is mint for a package runtime: the one place its plan
// is made, from the manifest that was just verified. A package runtime holds
// no state the host migrates (the seed's service has no state operations),
// so its plan is protocol version 1: a version change is a cold replace,
// never a state transfer. It has no version (the revision ID is its
// identity), no argv (its inputs are descriptors 3–5), and one deadline per
// call: invoke_ms bounds a run, cancel_ms a cancel or stop.
func mintPackageRuntime(vs *VerifiedSource, candidate string, contracts protocol.ModuleContracts) LaunchPlan {
	m := vs.PackageRuntime
	return newLaunchPlan(LaunchPlanFields{
		Module: vs.Module, ImplementationID: m.PackageRevisionID, ProtocolVersion: 1,
		ManifestSHA256: vs.ManifestSHA256, ArtifactSHA256: vs.ArtifactSHA256,
		ArtifactRoot: vs.ArtifactRoot, Executable: vs.Executable,
		CandidateSHA256: candidate, AdmittedCapabilities: vs.AdmittedCapabilities, AuthoritySHA256: vs.AuthoritySHA256,
		RuntimeDeadline:      time.Duration(m.Deadlines.InvokeMs) * time.Millisecond,
		CancellationDeadline: time.Duration(m.Deadlines.CancelMs) * time.Millisecond,
		EvidenceLimits:       EvidenceLimits{StderrBytes: PackageRuntimeStderrBytes},
		Contracts:            contracts, FailurePolicy: "fail_closed",
		PackageRuntime: m, Sandbox: vs.Sandbox,
	})
}

// fileError is a failed file check before it is given its field.
type fileError struct {
	code     string
	sentinel error
	detail   string
	cause    error
}

func (e *fileError) at(field string) *Error {
	err := e.sentinel
	if e.cause != nil {
		err = errors.Join(e.sentinel, e.cause)
	}
	return &Error{Field: field, Code: e.code, Detail: e.detail, Err: err}
}

func pathFailure(pe *pathError) *fileError {
	return &fileError{code: reasons.VerificationFailed, sentinel: pe.sentinel, detail: pe.detail}
}

func openFailure(path string, err error) *fileError {
	sentinel, detail := openErrorDetail(path, err)
	return &fileError{code: reasons.VerificationFailed, sentinel: sentinel, detail: detail, cause: err}
}

// readSourceFile reads the file at a source's canonical catalog_path: a
// regular file reached through no symlink, within the catalog bound (the
// larger of the two kinds'; a package-runtime manifest is held to its own
// bound once it is told apart). The stamp is the file's before it was read.
func readSourceFile(p string) ([]byte, FileStamp, *fileError) {
	if _, pe := walkComponents(p, "/"); pe != nil {
		return nil, FileStamp{}, pathFailure(pe)
	}
	if pe := checkEvalSymlinks(p); pe != nil {
		return nil, FileStamp{}, pathFailure(pe)
	}
	f, err := openNoSymlinks(unix.AT_FDCWD, p, 0, false)
	if err != nil {
		return nil, FileStamp{}, openFailure(p, err)
	}
	defer f.Close()
	stamp := stampOf(f, p)
	info, err := f.Stat()
	if err != nil {
		return nil, FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: err, detail: "cannot stat " + p + ": " + err.Error()}
	}
	if !info.Mode().IsRegular() {
		return nil, FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: ErrNotRegularFile, detail: fmt.Sprintf("%s is not a regular file (%s)", p, info.Mode().Type())}
	}
	if info.Size() > catalog.MaxCatalogBytes {
		return nil, FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: ErrTooLarge, detail: fmt.Sprintf("catalog %s is %d bytes, over the 512 KiB bound", p, info.Size())}
	}
	data, err := io.ReadAll(io.LimitReader(f, catalog.MaxCatalogBytes+1))
	if err != nil {
		return nil, FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: err, detail: "cannot read " + p + ": " + err.Error()}
	}
	return data, stamp, nil
}

// parseCatalogFile parses the bytes read from catalog p.
func parseCatalogFile(p string, data []byte) (*catalog.Catalog, *fileError) {
	cat, err := catalog.ParseCatalog(data)
	if err != nil {
		ce := fromCatalog("", "catalog "+p, err)
		return nil, &fileError{code: ce.Code, sentinel: ce.Err, detail: ce.Detail}
	}
	return cat, nil
}

// parsePackageRuntimeFile parses the bytes read from package-runtime
// manifest p, holding them to the manifest's own 64 KiB bound first.
func parsePackageRuntimeFile(p string, data []byte) (catalog.PackageRuntimeManifest, *fileError) {
	if len(data) > catalog.MaxPackageRuntimeManifestBytes {
		return catalog.PackageRuntimeManifest{}, &fileError{code: reasons.VerificationFailed, sentinel: ErrTooLarge,
			detail: fmt.Sprintf("package-runtime manifest %s is %d bytes, over the 64 KiB bound", p, len(data))}
	}
	m, err := catalog.ParsePackageRuntimeManifest(data)
	if err != nil {
		ce := fromCatalog("", "package-runtime manifest "+p, err)
		return catalog.PackageRuntimeManifest{}, &fileError{code: ce.Code, sentinel: ce.Err, detail: ce.Detail}
	}
	return m, nil
}

// hashExecutable checks the artifact root (a directory reached through no
// symlink) and the executable (a regular file of at most 256 MiB, reached
// from the root through no symlink and not escaping it), then hashes the
// executable through the fixed 64 KiB buffer. It returns the executable's
// absolute path and digest.
func hashExecutable(root, rel string) (string, string, *fileError) {
	executable, digest, _, ferr := hashExecutableWith(root, rel, nil)
	return executable, digest, ferr
}

// hashExecutableWith is hashExecutable taking the digest of an unchanged
// file from cache (nil: always hashed), and returning the executable's
// stamp from before it was hashed.
func hashExecutableWith(root, rel string, cache *digestCache) (string, string, FileStamp, *fileError) {
	info, pe := walkComponents(root, "/")
	if pe != nil {
		return "", "", FileStamp{}, pathFailure(pe)
	}
	if !info.IsDir() {
		return "", "", FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: ErrNotDirectory, detail: root + " is not a directory"}
	}
	if pe := checkEvalSymlinks(root); pe != nil {
		return "", "", FileStamp{}, pathFailure(pe)
	}
	dir, err := openNoSymlinks(unix.AT_FDCWD, root, unix.O_DIRECTORY, false)
	if err != nil {
		return "", "", FileStamp{}, openFailure(root, err)
	}
	defer dir.Close()

	executable := root + "/" + rel
	if _, pe := walkComponents(executable, root); pe != nil {
		return "", "", FileStamp{}, pathFailure(pe)
	}
	if pe := checkEvalSymlinks(executable); pe != nil {
		return "", "", FileStamp{}, pathFailure(pe)
	}
	f, err := openNoSymlinks(int(dir.Fd()), rel, 0, true)
	if err != nil {
		return "", "", FileStamp{}, openFailure(executable, err)
	}
	defer f.Close()
	stamp := stampOf(f, executable)
	var digest string
	if cache != nil {
		digest, err = cache.digest(f, executable)
	} else {
		digest, _, err = hashRegular(f, executable)
	}
	if err != nil {
		var hf *hashFailure
		if errors.As(err, &hf) {
			return "", "", FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: hf.sentinel, detail: hf.detail}
		}
		return "", "", FileStamp{}, &fileError{code: reasons.VerificationFailed, sentinel: err, detail: err.Error()}
	}
	return executable, digest, stamp, nil
}
