package verifier

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"k8s.io/apimachinery/pkg/api/resource"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/strictjson"
)

// Bounds of an activation document (docs/reference/activation.md).
const (
	// MaxDocumentBytes bounds a raw activation document (128 KiB).
	MaxDocumentBytes = 128 << 10
	// DocumentSchemaVersion is the only activation document schema version.
	DocumentSchemaVersion = 1
	// MaxSources bounds an activation's sources: one per module of the
	// largest graph (the CRD's maxItems).
	MaxSources = catalog.MaxCustomModules
	// MaxPathBytes bounds catalog_path and artifact_root.
	MaxPathBytes = 512
)

// Form says which spelling a document arrived in; errors name fields in it.
type Form int

const (
	// FormDocument is the raw JSON document of docs/reference/activation.md
	// (snake_case).
	FormDocument Form = iota
	// FormSpec is an ImplementationActivation's spec (camelCase, under "spec.").
	FormSpec
)

// Source selects one module's implementation, pinned by digest.
type Source struct {
	// Module is the snake_case module the source fills.
	Module string
	// ImplementationID selects the manifest in the catalog.
	ImplementationID string
	// CatalogPath is the absolute canonical path of the catalog file.
	CatalogPath string
	// ArtifactRoot is the absolute canonical directory of the executable.
	ArtifactRoot string
	// ManifestSHA256 pins the selected manifest ("sha256:…").
	ManifestSHA256 string
	// ArtifactSHA256 pins the executable's bytes ("sha256:…").
	ArtifactSHA256 string
	// OCIRef, instead of CatalogPath and ArtifactRoot, names the provider
	// artifact to pull by digest (oci_ref, docs/reference/activation.md).
	OCIRef string
	// Sandbox is what the source asks of the node's sandbox (only an
	// ImplementationActivation spec carries it).
	Sandbox SandboxRequest
}

// HasOCI reports whether the source is pulled from a registry.
func (s Source) HasOCI() bool { return s.OCIRef != "" }

// Document is the one internal form of an activation, whichever way it
// arrived: a raw JSON document or an ImplementationActivation spec.
type Document struct {
	// Form is the spelling the document arrived in.
	Form Form
	// CandidateSHA256 is the opaque identity of the candidate selection.
	CandidateSHA256 string
	// Sources are the sources in the order written.
	Sources []Source
	// CapabilityCeiling narrows the node's ceiling (a spec's
	// capabilityCeiling, sorted); nil means the node's ceiling. A raw document
	// has none.
	CapabilityCeiling []string

	// absent[i] has bit k set when source i lacked member k (raw form only),
	// so that its error says "required field missing".
	absent []uint8
	// both lists the sources that gave oci and a path (raw form only: an
	// empty path is indistinguishable from an absent one in a spec).
	both []int
}

type documentWire struct {
	SchemaVersion   *uint32       `json:"schema_version"`
	CandidateSHA256 *string       `json:"candidate_sha256"`
	Sources         *[]sourceWire `json:"sources"`
}

type sourceWire struct {
	Module           *string  `json:"module"`
	ImplementationID *string  `json:"implementation_id"`
	CatalogPath      *string  `json:"catalog_path"`
	ArtifactRoot     *string  `json:"artifact_root"`
	ManifestSHA256   *string  `json:"manifest_sha256"`
	ArtifactSHA256   *string  `json:"artifact_sha256"`
	OCI              *ociWire `json:"oci"`
}

// ociWire is a raw source's "oci" member (our extension).
type ociWire struct {
	Ref *string `json:"ref"`
}

// Member names of a source, by form.
const (
	keyModule = iota
	keyImplementationID
	keyCatalogPath
	keyArtifactRoot
	keyManifestSHA256
	keyArtifactSHA256
	keyOCIRef
)

var sourceKeys = [2][7]string{
	FormDocument: {"module", "implementation_id", "catalog_path", "artifact_root", "manifest_sha256", "artifact_sha256", "oci.ref"},
	FormSpec:     {"module", "implementationID", "catalogPath", "artifactRoot", "manifestSHA256", "artifactSHA256", "oci.ref"},
}

func (d *Document) sourcesField() string {
	if d.Form == FormSpec {
		return "spec.sources"
	}
	return "sources"
}

// sourceField names member key of source i as the user wrote it.
func (d *Document) sourceField(i, key int) string {
	return catalog.Field(catalog.Index(d.sourcesField(), i), sourceKeys[d.Form][key])
}

func (d *Document) sourceItem(i int) string { return catalog.Index(d.sourcesField(), i) }

func (d *Document) candidateField() string {
	if d.Form == FormSpec {
		return "spec.candidateSHA256"
	}
	return "candidate_sha256"
}

// ParseDocument parses a raw activation document strictly
// (docs/reference/activation.md) and applies the document-level rules: at most
// 128 KiB (checked first), no duplicate names, unknown members, trailing data
// or null, schema version 1, a candidate digest, at most 64 sources, at most
// one source per module and unique implementation IDs. Per-source rules
// (paths, patterns, files, digests) are the verifier's, so that one bad source
// does not hide the others.
func ParseDocument(data []byte) (*Document, error) {
	var w documentWire
	if cerr := catalog.DecodeStrict(data, &w, MaxDocumentBytes, ""); cerr != nil {
		return nil, &Error{Field: cerr.Field, Code: cerr.Code, Detail: cerr.Detail, Err: cerr}
	}
	doc := &Document{Form: FormDocument}
	if w.SchemaVersion == nil {
		return nil, missing("schema_version")
	}
	if *w.SchemaVersion != DocumentSchemaVersion {
		return nil, failf("schema_version", ErrUnsupportedVersion, "activation document schema version %d is not supported (1)", *w.SchemaVersion)
	}
	if w.CandidateSHA256 == nil {
		return nil, missing("candidate_sha256")
	}
	if w.Sources == nil {
		return nil, missing("sources")
	}
	doc.CandidateSHA256 = *w.CandidateSHA256
	doc.Sources = make([]Source, len(*w.Sources))
	doc.absent = make([]uint8, len(*w.Sources))
	for i, s := range *w.Sources {
		// A missing member fails that source alone, naming the member. A
		// source with "oci" has no paths (and one with paths no "oci"); one
		// with both, or "oci" without its ref, fails the same way.
		var ref *string
		if s.OCI != nil {
			ref = s.OCI.Ref
			if ref == nil {
				ref = new(string)
				doc.absent[i] |= 1 << keyOCIRef
			}
		}
		for k, p := range []*string{s.Module, s.ImplementationID, s.CatalogPath, s.ArtifactRoot, s.ManifestSHA256, s.ArtifactSHA256} {
			if p == nil && (s.OCI == nil || (k != keyCatalogPath && k != keyArtifactRoot)) {
				doc.absent[i] |= 1 << k
			}
		}
		doc.Sources[i] = Source{
			Module: deref(s.Module), ImplementationID: deref(s.ImplementationID),
			CatalogPath: deref(s.CatalogPath), ArtifactRoot: deref(s.ArtifactRoot),
			ManifestSHA256: deref(s.ManifestSHA256), ArtifactSHA256: deref(s.ArtifactSHA256),
			OCIRef: deref(ref),
		}
		if s.OCI != nil && (s.CatalogPath != nil || s.ArtifactRoot != nil) {
			doc.both = append(doc.both, i)
		}
	}
	if err := doc.Check(); err != nil {
		return nil, err
	}
	return doc, nil
}

func growAbsent(a []uint8, n int) []uint8 {
	if len(a) < n {
		a = append(a, make([]uint8, n-len(a))...)
	}
	return a
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func missing(field string) *Error {
	return &Error{Field: field, Code: reasons.SchemaMismatch, Detail: "required field missing", Err: catalog.ErrMissingField}
}

// DocumentFromSpec converts an ImplementationActivation spec into the
// internal document, applying the same document-level rules as
// ParseDocument (the API server's CEL rules are not the only way in). Field
// paths in errors are the spec's: spec.sources[2].catalogPath.
func DocumentFromSpec(spec *v1alpha1.ImplementationActivationSpec) (*Document, error) {
	doc := &Document{Form: FormSpec, CandidateSHA256: spec.CandidateSHA256, Sources: make([]Source, len(spec.Sources))}
	for i, s := range spec.Sources {
		doc.Sources[i] = Source{
			Module: s.Module, ImplementationID: s.ImplementationID, CatalogPath: s.CatalogPath,
			ArtifactRoot: s.ArtifactRoot, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
		}
		if s.Sandbox != nil {
			r, err := sandboxRequestOf(s.Sandbox, fmt.Sprintf("spec.sources[%d].sandbox", i))
			if err != nil {
				return nil, err
			}
			doc.Sources[i].Sandbox = r
		}
		if s.OCI != nil {
			doc.Sources[i].OCIRef = s.OCI.Ref
			if s.OCI.Ref == "" {
				doc.absent = growAbsent(doc.absent, len(spec.Sources))
				doc.absent[i] |= 1 << keyOCIRef
			}
			if s.CatalogPath != "" || s.ArtifactRoot != "" {
				doc.both = append(doc.both, i)
			}
		}
	}
	if spec.CapabilityCeiling != nil {
		doc.CapabilityCeiling = make([]string, 0, len(spec.CapabilityCeiling))
		for _, c := range spec.CapabilityCeiling {
			doc.CapabilityCeiling = append(doc.CapabilityCeiling, string(c))
		}
	}
	if err := doc.Check(); err != nil {
		return nil, err
	}
	slices.Sort(doc.CapabilityCeiling)
	return doc, nil
}

// token identifies the document's selection for the artifact resolver: a
// refused pull is not tried again until it changes.
func (d *Document) token() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", d.CandidateSHA256)
	for _, s := range d.Sources {
		fmt.Fprintf(h, "%q %q %q %q %q %q %q\n", s.Module, s.ImplementationID, s.CatalogPath, s.ArtifactRoot, s.ManifestSHA256, s.ArtifactSHA256, s.OCIRef)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// missingMember returns the first member source i lacked in the raw form.
func (d *Document) missingMember(i int) (key int, ok bool) {
	if i >= len(d.absent) || d.absent[i] == 0 {
		return 0, false
	}
	for k := range len(sourceKeys[0]) {
		if d.absent[i]&(1<<k) != 0 {
			return k, true
		}
	}
	return 0, false
}

// Check applies the document-level rules (see ParseDocument) to a document
// however it was built. A failure here fails the whole document.
func (d *Document) Check() error {
	if !catalog.IsDigest(d.CandidateSHA256) {
		return failf(d.candidateField(), ErrInvalidValue, "%q is not sha256: and 64 lowercase hex digits", d.CandidateSHA256)
	}
	if len(d.Sources) > MaxSources {
		return failf(d.sourcesField(), ErrTooLarge, "%d sources exceed %d", len(d.Sources), MaxSources)
	}
	modules := make(map[string]int, len(d.Sources))
	ids := make(map[string]int, len(d.Sources))
	for i, s := range d.Sources {
		// An empty (absent) member is that source's own failure, not a
		// duplicate.
		if j, dup := modules[s.Module]; dup && s.Module != "" {
			return failf(d.sourceField(i, keyModule), ErrDuplicate, "module %q already has a source (%s): at most one source per module", s.Module, d.sourceItem(j))
		}
		modules[s.Module] = i
		if j, dup := ids[s.ImplementationID]; dup && s.ImplementationID != "" {
			return failf(d.sourceField(i, keyImplementationID), ErrDuplicate, "implementation %q is already selected by %s", s.ImplementationID, d.sourceItem(j))
		}
		ids[s.ImplementationID] = i
	}
	for i, c := range d.CapabilityCeiling {
		field := catalog.Index("spec.capabilityCeiling", i)
		if !catalog.IsCapability(c) {
			return failf(field, ErrInvalidValue, "%q is not a capability", c)
		}
		if slices.Index(d.CapabilityCeiling, c) != i {
			return failf(field, ErrDuplicate, "%q is listed twice", c)
		}
	}
	return nil
}

// documentOut is the raw document as written by MarshalDocument, members in
// the order of docs/reference/activation.md.
type documentOut struct {
	SchemaVersion   uint32      `json:"schema_version"`
	CandidateSHA256 string      `json:"candidate_sha256"`
	Sources         []sourceOut `json:"sources"`
}

type sourceOut struct {
	Module           string  `json:"module"`
	ImplementationID string  `json:"implementation_id"`
	CatalogPath      string  `json:"catalog_path,omitempty"`
	ArtifactRoot     string  `json:"artifact_root,omitempty"`
	ManifestSHA256   string  `json:"manifest_sha256"`
	ArtifactSHA256   string  `json:"artifact_sha256"`
	OCI              *ociOut `json:"oci,omitempty"`
}

type ociOut struct {
	Ref string `json:"ref"`
}

// MarshalDocument writes d as a raw activation document
// (docs/reference/activation.md), indented for people; ParseDocument reads it
// back to an equal document. A capability ceiling has no place in the raw form
// and is not written.
func (d *Document) MarshalDocument() ([]byte, error) {
	out := documentOut{SchemaVersion: DocumentSchemaVersion, CandidateSHA256: d.CandidateSHA256, Sources: make([]sourceOut, len(d.Sources))}
	for i, s := range d.Sources {
		out.Sources[i] = sourceOut{
			Module: s.Module, ImplementationID: s.ImplementationID, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
			ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
		}
		if s.OCIRef != "" {
			out.Sources[i].OCI = &ociOut{Ref: s.OCIRef}
		}
	}
	b, err := strictjson.Canonical(out)
	if err != nil {
		return nil, err
	}
	v := jsontext.Value(b)
	if err := v.Indent(jsontext.WithIndent("  ")); err != nil {
		return nil, err
	}
	return append(v, '\n'), nil
}

// Spec returns d as an ImplementationActivation spec for nodeName; fields
// the raw document does not carry (swap, checkpoint, …) are left for the API
// server's defaults.
func (d *Document) Spec(nodeName string) v1alpha1.ImplementationActivationSpec {
	spec := v1alpha1.ImplementationActivationSpec{NodeName: nodeName, CandidateSHA256: d.CandidateSHA256}
	for _, s := range d.Sources {
		src := v1alpha1.ActivationSource{
			Module: s.Module, ImplementationID: s.ImplementationID, CatalogPath: s.CatalogPath,
			ArtifactRoot: s.ArtifactRoot, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
		}
		if s.OCIRef != "" {
			src.OCI = &v1alpha1.OCISource{Ref: s.OCIRef}
		}
		spec.Sources = append(spec.Sources, src)
	}
	for _, c := range d.CapabilityCeiling {
		spec.CapabilityCeiling = append(spec.CapabilityCeiling, v1alpha1.Capability(c))
	}
	return spec
}

// sandboxRequestOf converts a source's sandbox fields, refusing what the
// API server's rules refuse (a spec may arrive another way).
func sandboxRequestOf(sb *v1alpha1.SourceSandbox, field string) (SandboxRequest, error) {
	r := SandboxRequest{Require: strings.ToLower(string(sb.Require))}
	switch sb.Require {
	case "", v1alpha1.SandboxLevelNone, v1alpha1.SandboxLevelLimits, v1alpha1.SandboxLevelIsolated:
	default:
		return r, failf(field+".require", ErrInvalidValue, "%q is not a sandbox level (None, Limits or Isolated)", sb.Require)
	}
	for _, q := range []struct {
		name string
		v    *resource.Quantity
		min  resource.Quantity
	}{{"memory", sb.Memory, resource.MustParse("16Mi")}, {"cpu", sb.CPU, resource.MustParse("10m")}, {"tmp", sb.Tmp, resource.MustParse("1Mi")}} {
		if q.v != nil && q.v.Cmp(q.min) < 0 {
			return r, failf(field+"."+q.name, ErrInvalidValue, "%s is less than the least bound %s", q.v, &q.min)
		}
	}
	if sb.Tasks != nil && *sb.Tasks <= 0 {
		return r, failf(field+".tasks", ErrInvalidValue, "must be positive")
	}
	if sb.Memory != nil {
		r.MemoryBytes = sb.Memory.Value()
	}
	if sb.CPU != nil {
		r.CPUMillis = sb.CPU.MilliValue()
	}
	if sb.Tasks != nil {
		r.Tasks = int64(*sb.Tasks)
	}
	if sb.Tmp != nil {
		r.TmpBytes = sb.Tmp.Value()
	}
	return r, nil
}
