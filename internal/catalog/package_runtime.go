package catalog

import (
	"bytes"
	"slices"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/strictjson"
)

// A package runtime is a provider that serves the quixos.runtime.PackageRuntime
// gRPC service instead of speaking the line protocol on stdin/stdout. Its
// manifest is a document of its own, told apart from a catalog by schema_id
// (docs/reference/package-runtimes.md).
const (
	// PackageRuntimeSchemaID is the schema_id of a package-runtime manifest.
	PackageRuntimeSchemaID = "iteron-package-runtime/1"
	// PackageRuntimeProtocol is the only runtime_protocol_version a manifest may
	// pin, and the orch_protocol_version the host sends in the handshake.
	PackageRuntimeProtocol = "quixos.runtime/1"
	// MaxPackageRuntimeManifestBytes bounds a package-runtime manifest file.
	MaxPackageRuntimeManifestBytes = 64 << 10
	// MaxExportIDs bounds a manifest's export_ids.
	MaxExportIDs = 64
	// MaxHandshakeMs bounds deadlines.handshake_ms (five minutes).
	MaxHandshakeMs = 300_000
	// MinMessageBytes is the least limits.max_message_bytes (1 KiB): below
	// it a handshake response with 64 export IDs would not fit.
	MinMessageBytes = 1 << 10
	// MaxMessageBytes is the most limits.max_message_bytes (16 MiB), the
	// bound of every gRPC message either way.
	MaxMessageBytes = 16 << 20
	// MaxConcurrentInvocations bounds limits.max_concurrent_invocations.
	MaxConcurrentInvocations = 1024
	// MaxWatches bounds limits.max_watches.
	MaxWatches = 1024
)

// PackageRuntimeDeadlines are a package-runtime manifest's deadlines.
type PackageRuntimeDeadlines struct {
	// HandshakeMs bounds the Handshake call after the launch: 1..300,000.
	HandshakeMs uint64 `json:"handshake_ms"`
	// InvokeMs bounds each Invoke (and GetInvocationStatus): 1..3,600,000.
	InvokeMs uint64 `json:"invoke_ms"`
	// CancelMs bounds CancelInvocation, and a cancelled call's and Watch's
	// end: 1..300,000.
	CancelMs uint64 `json:"cancel_ms"`
}

// PackageRuntimeLimits are a package-runtime manifest's limits.
type PackageRuntimeLimits struct {
	// MaxMessageBytes bounds every gRPC message either way: 1 KiB..16 MiB.
	MaxMessageBytes uint64 `json:"max_message_bytes"`
	// MaxConcurrentInvocations bounds the Invokes in flight on the runtime: 1..1024.
	MaxConcurrentInvocations uint64 `json:"max_concurrent_invocations"`
	// MaxWatches bounds the Watch streams open on the runtime: 1..1024.
	MaxWatches uint64 `json:"max_watches"`
}

// PackageRuntimeManifest is a package runtime's manifest. The field order is
// the canonical order of its digest: do not reorder.
type PackageRuntimeManifest struct {
	// SchemaID is "iteron-package-runtime/1".
	SchemaID string `json:"schema_id"`
	// PackageRevisionID is the revision the runtime's handshake must name;
	// an activation source's implementation_id is this value. ≤ 96 bytes of
	// [A-Za-z0-9._-].
	PackageRevisionID string `json:"package_revision_id"`
	// RuntimeProtocolVersion is "quixos.runtime/1".
	RuntimeProtocolVersion string `json:"runtime_protocol_version"`
	// Module is the snake_case module the runtime fills.
	Module string `json:"module"`
	// ExportIDs are the exports the handshake must name, as a set: sorted,
	// unique, 1..64 IDs of [A-Za-z0-9._-].
	ExportIDs []string `json:"export_ids"`
	// RequestedCapabilities is the runtime's capability request, as in
	// catalogs (sorted, unique, known capabilities); default [].
	RequestedCapabilities []string `json:"requested_capabilities"`
	// Executable is a local, clean path relative to the artifact root.
	Executable string `json:"executable"`
	// ArtifactSHA256 is the executable's digest as 64 lowercase hex digits.
	ArtifactSHA256 string `json:"artifact_sha256"`
	// Deadlines bound the handshake and each call.
	Deadlines PackageRuntimeDeadlines `json:"deadlines"`
	// Limits bound messages, invocations and watches.
	Limits PackageRuntimeLimits `json:"limits"`
}

type packageRuntimeWire struct {
	SchemaID               *string   `json:"schema_id"`
	PackageRevisionID      *string   `json:"package_revision_id"`
	RuntimeProtocolVersion *string   `json:"runtime_protocol_version"`
	Module                 *string   `json:"module"`
	ExportIDs              *[]string `json:"export_ids"`
	RequestedCapabilities  []string  `json:"requested_capabilities"`
	Executable             *string   `json:"executable"`
	ArtifactSHA256         *string   `json:"artifact_sha256"`
	Deadlines              *struct {
		HandshakeMs *uint64 `json:"handshake_ms"`
		InvokeMs    *uint64 `json:"invoke_ms"`
		CancelMs    *uint64 `json:"cancel_ms"`
	} `json:"deadlines"`
	Limits *struct {
		MaxMessageBytes          *uint64 `json:"max_message_bytes"`
		MaxConcurrentInvocations *uint64 `json:"max_concurrent_invocations"`
		MaxWatches               *uint64 `json:"max_watches"`
	} `json:"limits"`
}

// IsPackageRuntimeManifest reports whether data is an object whose top level
// has a schema_id member: that is how a source's file is told to be a
// package-runtime manifest rather than a catalog (which has none). It does
// not validate anything else; ParsePackageRuntimeManifest does.
func IsPackageRuntimeManifest(data []byte) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return false
	}
	for dec.PeekKind() == '"' {
		name, err := dec.ReadToken()
		if err != nil {
			return false
		}
		if name.String() == "schema_id" {
			return true
		}
		if err := dec.SkipValue(); err != nil {
			return false
		}
	}
	return false
}

// ParsePackageRuntimeManifest parses a package-runtime manifest strictly
// (the 64 KiB bound first, then strict JSON with no null, every member
// required but requested_capabilities) and checks every value rule.
func ParsePackageRuntimeManifest(data []byte) (PackageRuntimeManifest, error) {
	if len(data) > MaxPackageRuntimeManifestBytes {
		return PackageRuntimeManifest{}, invalidf("", ErrTooLarge, "%d bytes exceed the bound of %d bytes", len(data), MaxPackageRuntimeManifestBytes)
	}
	var w packageRuntimeWire
	if err := DecodeStrict(data, &w, MaxPackageRuntimeManifestBytes, ""); err != nil {
		return PackageRuntimeManifest{}, err
	}
	m, err := w.manifest()
	if err != nil {
		return PackageRuntimeManifest{}, err
	}
	return m, nil
}

func (w *packageRuntimeWire) manifest() (PackageRuntimeManifest, *Error) {
	var m PackageRuntimeManifest
	var err *Error
	str := func(dst *string, name string, p *string) {
		if err == nil {
			*dst, err = required(name, p)
		}
	}
	num := func(dst *uint64, name string, p *uint64) {
		if err == nil {
			*dst, err = required(name, p)
		}
	}
	str(&m.SchemaID, "schema_id", w.SchemaID)
	str(&m.PackageRevisionID, "package_revision_id", w.PackageRevisionID)
	str(&m.RuntimeProtocolVersion, "runtime_protocol_version", w.RuntimeProtocolVersion)
	str(&m.Module, "module", w.Module)
	if err == nil {
		m.ExportIDs, err = required("export_ids", w.ExportIDs)
	}
	str(&m.Executable, "executable", w.Executable)
	str(&m.ArtifactSHA256, "artifact_sha256", w.ArtifactSHA256)
	if err == nil && w.Deadlines == nil {
		err = invalidf("deadlines", ErrMissingField, "required field missing")
	}
	if err == nil {
		num(&m.Deadlines.HandshakeMs, "deadlines.handshake_ms", w.Deadlines.HandshakeMs)
		num(&m.Deadlines.InvokeMs, "deadlines.invoke_ms", w.Deadlines.InvokeMs)
		num(&m.Deadlines.CancelMs, "deadlines.cancel_ms", w.Deadlines.CancelMs)
	}
	if err == nil && w.Limits == nil {
		err = invalidf("limits", ErrMissingField, "required field missing")
	}
	if err == nil {
		num(&m.Limits.MaxMessageBytes, "limits.max_message_bytes", w.Limits.MaxMessageBytes)
		num(&m.Limits.MaxConcurrentInvocations, "limits.max_concurrent_invocations", w.Limits.MaxConcurrentInvocations)
		num(&m.Limits.MaxWatches, "limits.max_watches", w.Limits.MaxWatches)
	}
	if err != nil {
		return PackageRuntimeManifest{}, err
	}
	m.RequestedCapabilities = nonNil(w.RequestedCapabilities)
	return m, validatePackageRuntimeManifest(m)
}

// ValidatePackageRuntimeManifest checks every value rule on a manifest built
// in memory.
func ValidatePackageRuntimeManifest(m PackageRuntimeManifest) error {
	if err := validatePackageRuntimeManifest(m); err != nil {
		return err
	}
	return nil
}

func validatePackageRuntimeManifest(m PackageRuntimeManifest) *Error {
	if m.SchemaID != PackageRuntimeSchemaID {
		return invalidf("schema_id", ErrUnsupportedVersion, "%q is not %q", m.SchemaID, PackageRuntimeSchemaID)
	}
	if !IsImplementationID(m.PackageRevisionID) {
		return invalidf("package_revision_id", ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-]", m.PackageRevisionID, MaxImplementationIDBytes)
	}
	if m.RuntimeProtocolVersion != PackageRuntimeProtocol {
		return invalidf("runtime_protocol_version", ErrUnsupportedVersion, "%q is not supported (%q)", m.RuntimeProtocolVersion, PackageRuntimeProtocol)
	}
	if !IsModuleID(m.Module) {
		return invalidf("module", ErrInvalidValue, "%q is not a module ID (^[a-z][a-z0-9_]{0,47}$)", m.Module)
	}
	if err := checkExportIDs(m.ExportIDs); err != nil {
		return err
	}
	if err := CheckCapabilitySet("requested_capabilities", m.RequestedCapabilities); err != nil {
		return err.(*Error)
	}
	if err := checkExecutable("executable", m.Executable); err != nil {
		return err
	}
	if !IsBareDigest(m.ArtifactSHA256) {
		return invalidf("artifact_sha256", ErrInvalidValue, "%q is not 64 lowercase hex digits (no sha256: prefix inside a manifest)", m.ArtifactSHA256)
	}
	bounds := []struct {
		field     string
		v, lo, hi uint64
	}{
		{"deadlines.handshake_ms", m.Deadlines.HandshakeMs, 1, MaxHandshakeMs},
		{"deadlines.invoke_ms", m.Deadlines.InvokeMs, 1, MaxRuntimeDeadlineMs},
		{"deadlines.cancel_ms", m.Deadlines.CancelMs, 1, MaxCancellationDeadlineMs},
		{"limits.max_message_bytes", m.Limits.MaxMessageBytes, MinMessageBytes, MaxMessageBytes},
		{"limits.max_concurrent_invocations", m.Limits.MaxConcurrentInvocations, 1, MaxConcurrentInvocations},
		{"limits.max_watches", m.Limits.MaxWatches, 1, MaxWatches},
	}
	for _, b := range bounds {
		if b.v < b.lo || b.v > b.hi {
			return invalidf(b.field, ErrInvalidValue, "%d is outside %d..%d", b.v, b.lo, b.hi)
		}
	}
	return nil
}

// checkExportIDs: 1..64 IDs, sorted and unique, so that the set the
// handshake must name has one spelling (and one digest).
func checkExportIDs(ids []string) *Error {
	if len(ids) == 0 {
		return invalidf("export_ids", ErrInvalidValue, "a runtime exports at least one ID")
	}
	if len(ids) > MaxExportIDs {
		return invalidf("export_ids", ErrTooLarge, "%d IDs exceed %d", len(ids), MaxExportIDs)
	}
	for i, id := range ids {
		if !IsImplementationID(id) {
			return invalidf(Index("export_ids", i), ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-]", id, MaxImplementationIDBytes)
		}
		if i > 0 && ids[i-1] == id {
			return invalidf(Index("export_ids", i), ErrDuplicate, "%q is listed twice", id)
		}
		if i > 0 && ids[i-1] > id {
			return invalidf(Index("export_ids", i), ErrInvalidValue, "%q sorts before %q: export_ids are sorted (byte order)", id, ids[i-1])
		}
	}
	return nil
}

// PackageRuntimeManifestDigest is "sha256:" over the manifest's canonical
// bytes: every member present (requested_capabilities written as [] when
// absent), in the field order of PackageRuntimeManifest.
func PackageRuntimeManifestDigest(m PackageRuntimeManifest) (string, error) {
	if m.RequestedCapabilities == nil {
		m.RequestedCapabilities = []string{}
	}
	return strictjson.DigestOf(m)
}

// HasExport reports whether id is one of the manifest's export_ids.
func (m PackageRuntimeManifest) HasExport(id string) bool {
	_, found := slices.BinarySearch(m.ExportIDs, id)
	return found
}
