package artifacts

import (
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/strictjson"
)

// Media types and annotations of the provider artifact format
// (docs/reference/oci-artifact.md).
const (
	// ArtifactType is the image manifest's artifactType.
	ArtifactType = "application/vnd.iteron.provider.v1"
	// MediaTypeCatalog is the catalog layer: the catalog JSON of
	// docs/reference/catalog.md, byte for byte.
	MediaTypeCatalog = "application/vnd.iteron.provider.catalog.v1+json"
	// MediaTypeExecutable is an executable layer: one implementation's
	// executable, byte for byte (its digest is the manifest's
	// artifact_sha256).
	MediaTypeExecutable = "application/vnd.iteron.provider.executable.v1"

	// MediaTypeImageManifest and MediaTypeImageIndex are the OCI types.
	MediaTypeImageManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeImageIndex    = "application/vnd.oci.image.index.v1+json"
	// MediaTypeEmpty is the OCI empty descriptor's type (the config).
	MediaTypeEmpty = "application/vnd.oci.empty.v1+json"

	// AnnotationTitle is the file name a layer is laid out as (a plain
	// name: no '/', not '.' or '..').
	AnnotationTitle = "org.opencontainers.image.title"
	// AnnotationModule is an executable layer's module.
	AnnotationModule = "dev.iteron.provider.module"
	// AnnotationImplementationID is an executable layer's implementation_id.
	AnnotationImplementationID = "dev.iteron.provider.implementation-id"
	// AnnotationFileMode is an executable layer's file mode, octal ("0755").
	AnnotationFileMode = "dev.iteron.provider.file-mode"
)

// Bounds of the format.
const (
	// MaxManifestBytes bounds an artifact manifest or an image index.
	MaxManifestBytes = 256 << 10
	// MaxCatalogBytes bounds the catalog layer (the catalog's own bound).
	MaxCatalogBytes = catalog.MaxCatalogBytes
	// MaxExecutableBytes bounds an executable layer (the verifier's bound).
	MaxExecutableBytes = 256 << 20
	// MaxExecutables bounds the executable layers of one artifact (the
	// catalog's bound on manifests).
	MaxExecutables = 256
	// maxEmptyConfigBytes bounds the config blob (the empty JSON "{}").
	maxEmptyConfigBytes = 2
	// maxRefBytes bounds a reference.
	maxRefBytes = 512
)

// emptyConfigDigest is the digest of "{}", the OCI empty descriptor.
const emptyConfigDigest = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

// Ref is a parsed reference that pins a digest:
// <registry>/<repository>[:<tag>]@sha256:<64 hex>.
type Ref struct {
	// Registry is the host[:port].
	Registry string
	// Repository is the repository path.
	Repository string
	// Tag is an optional tag written before the digest; it is ignored for
	// pulling (the digest decides) and kept only to print the reference.
	Tag string
	// Digest is "sha256:<64 hex>".
	Digest string
}

// String is the reference as <registry>/<repository>@<digest>.
func (r Ref) String() string { return r.Registry + "/" + r.Repository + "@" + r.Digest }

var (
	registryPattern   = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?$`)
	repositoryPattern = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)
	tagPattern        = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	// RefPattern is the CRD's pattern of oci.ref: anything, then a pinned
	// sha256 digest at the end (ParseRef checks the rest).
	RefPattern = `^[^@\s]+@sha256:[0-9a-f]{64}$`
)

// ParseRef parses a reference that pins a digest. A tag alone, another
// digest algorithm, or an upper-case digest is refused with the reason.
func ParseRef(s string) (Ref, error) {
	if len(s) > maxRefBytes {
		return Ref{}, fmt.Errorf("%d bytes exceed the bound of %d", len(s), maxRefBytes)
	}
	name, digest, ok := strings.Cut(s, "@")
	if !ok {
		return Ref{}, fmt.Errorf("%q names no digest: pin one (<registry>/<repository>@sha256:<64 hex>); a tag alone is refused", s)
	}
	if !catalog.IsDigest(digest) {
		return Ref{}, fmt.Errorf("%q: the digest %q is not sha256: and 64 lowercase hex digits", s, digest)
	}
	reg, repo, ok := strings.Cut(name, "/")
	if !ok || reg == "" || repo == "" {
		return Ref{}, fmt.Errorf("%q: a reference is <registry>/<repository>@sha256:<hex> (the registry is required: there is no default registry)", s)
	}
	if !strings.ContainsAny(reg, ".:[") && reg != "localhost" {
		return Ref{}, fmt.Errorf("%q: %q is not a registry host (write it in full, e.g. registry.example.com/%s)", s, reg, name)
	}
	if !registryPattern.MatchString(reg) {
		return Ref{}, fmt.Errorf("%q: %q is not a registry host[:port]", s, reg)
	}
	var tag string
	if i := strings.LastIndex(repo, ":"); i >= 0 {
		repo, tag = repo[:i], repo[i+1:]
		if !tagPattern.MatchString(tag) {
			return Ref{}, fmt.Errorf("%q: %q is not a tag", s, tag)
		}
	}
	if len(repo) > 255 || !repositoryPattern.MatchString(repo) {
		return Ref{}, fmt.Errorf("%q: %q is not a repository name (lowercase path components)", s, repo)
	}
	return Ref{Registry: reg, Repository: repo, Tag: tag, Digest: digest}, nil
}

// Descriptor is an OCI content descriptor, every member the image spec
// defines (unknown members are refused).
type Descriptor struct {
	MediaType    string            `json:"mediaType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	URLs         []string          `json:"urls,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	Data         []byte            `json:"data,omitempty"`
	Platform     *Platform         `json:"platform,omitempty"`
	ArtifactType string            `json:"artifactType,omitempty"`
}

// Platform is an index entry's platform.
type Platform struct {
	Architecture string   `json:"architecture"`
	OS           string   `json:"os"`
	OSVersion    string   `json:"os.version,omitempty"`
	OSFeatures   []string `json:"os.features,omitempty"`
	Variant      string   `json:"variant,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// manifestWire is an OCI image manifest, every member the spec defines.
type manifestWire struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        *Descriptor       `json:"config"`
	Layers        []Descriptor      `json:"layers"`
	Subject       *Descriptor       `json:"subject,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// indexWire is an OCI image index.
type indexWire struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Manifests     []Descriptor      `json:"manifests"`
	Subject       *Descriptor       `json:"subject,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Executable is one executable layer, checked.
type Executable struct {
	// Layer is its descriptor.
	Layer Descriptor
	// Module and ImplementationID name the implementation it serves.
	Module, ImplementationID string
	// Name is the plain file name it is laid out as.
	Name string
	// Mode is its file mode (permission bits only).
	Mode uint32
}

// Manifest is a provider artifact manifest that passed every rule of the
// format.
type Manifest struct {
	// Config is the config descriptor (the empty descriptor).
	Config Descriptor
	// Catalog is the catalog layer.
	Catalog Descriptor
	// Executables are the executable layers, in manifest order.
	Executables []Executable
	// Annotations are the manifest's own annotations.
	Annotations map[string]string
}

// Blobs are the digests of every blob the manifest names.
func (m *Manifest) Blobs() []string {
	out := []string{m.Config.Digest, m.Catalog.Digest}
	for _, e := range m.Executables {
		out = append(out, e.Layer.Digest)
	}
	return out
}

// FormatError is a manifest or index that breaks the format; its Field is
// a JSON path in the manifest.
type FormatError struct {
	Field, Detail string
}

func (e *FormatError) Error() string {
	if e.Field == "" {
		return e.Detail
	}
	return e.Field + ": " + e.Detail
}

func formatf(field, format string, args ...any) *FormatError {
	return &FormatError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// ParseManifest parses a provider artifact manifest strictly: at most
// MaxManifestBytes, no duplicate or unknown members, schemaVersion 2, the
// image-manifest media type (when given), artifactType ArtifactType, the
// empty config, exactly one catalog layer within its bound, one to
// MaxExecutables executable layers within theirs, each annotated with a
// module, an implementation ID (unique), a plain file name and a mode,
// sha256 digests only, no foreign URLs.
func ParseManifest(data []byte) (*Manifest, error) {
	var w manifestWire
	if err := decode(data, &w); err != nil {
		return nil, err
	}
	if w.SchemaVersion != 2 {
		return nil, formatf("schemaVersion", "%d is not 2", w.SchemaVersion)
	}
	if w.MediaType != "" && w.MediaType != MediaTypeImageManifest {
		return nil, formatf("mediaType", "%q is not %s", w.MediaType, MediaTypeImageManifest)
	}
	if w.ArtifactType != ArtifactType {
		return nil, formatf("artifactType", "%q is not %s: not a provider artifact", w.ArtifactType, ArtifactType)
	}
	if w.Config == nil {
		return nil, formatf("config", "required member missing")
	}
	if err := checkDescriptor("config", *w.Config); err != nil {
		return nil, err
	}
	if w.Config.MediaType != MediaTypeEmpty || w.Config.Digest != emptyConfigDigest || w.Config.Size != maxEmptyConfigBytes {
		return nil, formatf("config", "must be the empty descriptor (%s, %s, size 2)", MediaTypeEmpty, emptyConfigDigest)
	}
	m := &Manifest{Config: *w.Config, Annotations: w.Annotations}
	ids := map[string]int{}
	names := map[string]int{}
	catalogs := 0
	for i, l := range w.Layers {
		field := fmt.Sprintf("layers[%d]", i)
		if err := checkDescriptor(field, l); err != nil {
			return nil, err
		}
		switch l.MediaType {
		case MediaTypeCatalog:
			catalogs++
			if catalogs > 1 {
				return nil, formatf(field, "a second catalog layer: an artifact carries exactly one catalog")
			}
			if l.Size > MaxCatalogBytes {
				return nil, formatf(field+".size", "%d bytes exceed the catalog bound of %d", l.Size, MaxCatalogBytes)
			}
			m.Catalog = l
		case MediaTypeExecutable:
			if l.Size > MaxExecutableBytes {
				return nil, formatf(field+".size", "%d bytes exceed the executable bound of %d (256 MiB)", l.Size, MaxExecutableBytes)
			}
			e, err := executableOf(field, l)
			if err != nil {
				return nil, err
			}
			if j, dup := ids[e.ImplementationID]; dup {
				return nil, formatf(field+".annotations", "implementation %q already has layers[%d]", e.ImplementationID, j)
			}
			ids[e.ImplementationID] = i
			names[e.Name] = i
			m.Executables = append(m.Executables, e)
		default:
			return nil, formatf(field+".mediaType", "%q is neither %s nor %s", l.MediaType, MediaTypeCatalog, MediaTypeExecutable)
		}
	}
	if catalogs == 0 {
		return nil, formatf("layers", "no catalog layer (%s)", MediaTypeCatalog)
	}
	if len(m.Executables) == 0 {
		return nil, formatf("layers", "no executable layer (%s)", MediaTypeExecutable)
	}
	if len(m.Executables) > MaxExecutables {
		return nil, formatf("layers", "%d executable layers exceed %d", len(m.Executables), MaxExecutables)
	}
	return m, nil
}

func executableOf(field string, l Descriptor) (Executable, error) {
	a := l.Annotations
	e := Executable{Layer: l, Module: a[AnnotationModule], ImplementationID: a[AnnotationImplementationID], Name: a[AnnotationTitle]}
	af := field + ".annotations"
	if !catalog.IsModuleID(e.Module) {
		return e, formatf(af+"["+AnnotationModule+"]", "%q is not a module ID", e.Module)
	}
	if !catalog.IsImplementationID(e.ImplementationID) {
		return e, formatf(af+"["+AnnotationImplementationID+"]", "%q is not 1–96 bytes of [A-Za-z0-9._-]", e.ImplementationID)
	}
	if err := PlainName(e.Name); err != nil {
		return e, formatf(af+"["+AnnotationTitle+"]", "%v", err)
	}
	mode, err := parseMode(a[AnnotationFileMode])
	if err != nil {
		return e, formatf(af+"["+AnnotationFileMode+"]", "%v", err)
	}
	e.Mode = mode
	return e, nil
}

// PlainName checks a file name from an annotation: 1–255 bytes, no '/',
// no NUL, no '\', not '.' or '..'.
func PlainName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("a file name is required")
	case len(name) > 255:
		return fmt.Errorf("%d bytes exceed 255", len(name))
	case name == "." || name == "..":
		return fmt.Errorf("%q is not a plain file name", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("%q is not a plain file name (no '/', '\\' or NUL)", name)
	}
	return nil
}

func parseMode(s string) (uint32, error) {
	if s == "" {
		return 0, fmt.Errorf("a file mode is required (octal, e.g. 0755)")
	}
	if len(s) > 4 {
		return 0, fmt.Errorf("%q is not an octal mode of at most 4 digits", s)
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return 0, fmt.Errorf("%q is not an octal permission mode (0000–0777)", s)
	}
	return uint32(v), nil
}

func checkDescriptor(field string, d Descriptor) error {
	if !catalog.IsDigest(d.Digest) {
		return formatf(field+".digest", "%q is not sha256: and 64 lowercase hex digits", d.Digest)
	}
	if d.Size < 0 {
		return formatf(field+".size", "%d is negative", d.Size)
	}
	if len(d.URLs) > 0 {
		return formatf(field+".urls", "foreign URLs are not fetched: every blob comes from the registry of the reference")
	}
	if d.Data != nil {
		if int64(len(d.Data)) != d.Size || strictjson.Digest(d.Data) != d.Digest {
			return formatf(field+".data", "the embedded data does not match the descriptor's size and digest")
		}
	}
	return nil
}

// ParseIndex parses an image index strictly and selects the one manifest
// for platform (os/architecture[/variant]); none or several is refused.
func ParseIndex(data []byte, platform Platform) (Descriptor, error) {
	var w indexWire
	if err := decode(data, &w); err != nil {
		return Descriptor{}, err
	}
	if w.SchemaVersion != 2 {
		return Descriptor{}, formatf("schemaVersion", "%d is not 2", w.SchemaVersion)
	}
	if w.MediaType != "" && w.MediaType != MediaTypeImageIndex {
		return Descriptor{}, formatf("mediaType", "%q is not %s", w.MediaType, MediaTypeImageIndex)
	}
	var match []int
	for i, d := range w.Manifests {
		field := fmt.Sprintf("manifests[%d]", i)
		if err := checkDescriptor(field, d); err != nil {
			return Descriptor{}, err
		}
		if d.Platform != nil && d.Platform.OS == platform.OS && d.Platform.Architecture == platform.Architecture &&
			(platform.Variant == "" || d.Platform.Variant == "" || d.Platform.Variant == platform.Variant) {
			match = append(match, i)
		}
	}
	want := platform.OS + "/" + platform.Architecture
	switch len(match) {
	case 0:
		return Descriptor{}, formatf("manifests", "no manifest for this node's platform %s (an index must hold exactly one)", want)
	case 1:
	default:
		return Descriptor{}, formatf("manifests", "%d manifests for this node's platform %s (manifests%v): an index must hold exactly one", len(match), want, match)
	}
	d := w.Manifests[match[0]]
	if d.MediaType != MediaTypeImageManifest {
		return Descriptor{}, formatf(fmt.Sprintf("manifests[%d].mediaType", match[0]), "%q is not %s", d.MediaType, MediaTypeImageManifest)
	}
	if d.Size > MaxManifestBytes {
		return Descriptor{}, formatf(fmt.Sprintf("manifests[%d].size", match[0]), "%d bytes exceed %d", d.Size, MaxManifestBytes)
	}
	return d, nil
}

// NodePlatform is this process's platform.
func NodePlatform() Platform {
	return Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
}

func decode(data []byte, v any) error {
	if len(data) > MaxManifestBytes {
		return formatf("", "%d bytes exceed the bound of %d", len(data), MaxManifestBytes)
	}
	if err := strictjson.Decode(data, v, MaxManifestBytes); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) {
			return &FormatError{Field: strings.TrimPrefix(strings.ReplaceAll(se.Pointer, "/", "."), "."), Detail: se.Error()}
		}
		return &FormatError{Detail: err.Error()}
	}
	return nil
}

// mediaTypeOf peeks at a manifest's mediaType to tell an index from an
// image manifest (members other than these two are ignored here; the
// parsers are strict).
func mediaTypeOf(data []byte) string {
	var w struct {
		MediaType string           `json:"mediaType"`
		Manifests []jsontext.Value `json:"manifests"`
	}
	if err := json.Unmarshal(data, &w); err != nil || w.MediaType != "" {
		return w.MediaType
	}
	if w.Manifests != nil {
		return MediaTypeImageIndex
	}
	return MediaTypeImageManifest
}
