package catalog

import (
	"cmp"
	"fmt"
	"path/filepath"
	"strings"

	"iteron.dev/operator/pkg/strictjson"
)

// Catalog is a catalog file: {"schema_version":1,"implementations":[…]}
// (docs/reference/catalog.md).
type Catalog struct {
	// SchemaVersion is 1.
	SchemaVersion uint32 `json:"schema_version"`
	// Implementations are the catalog's manifests, unique by implementation_id.
	Implementations []Manifest `json:"implementations"`
}

// Version is an implementation version [major, minor, patch].
type Version [3]uint64

// Dependency is a manifest's dependency on another implementation.
type Dependency struct {
	// ImplementationID names the implementation depended on.
	ImplementationID string `json:"implementation_id"`
	// MinimumVersion is the lowest version that satisfies the dependency.
	MinimumVersion Version `json:"minimum_version"`
}

// EvidenceLimits are a manifest's evidence_limits.
type EvidenceLimits struct {
	// StdoutBytes bounds stdout per run (≤ 4 MiB).
	StdoutBytes uint64 `json:"stdout_bytes"`
	// StderrBytes bounds the stderr ring (≤ 4 MiB).
	StderrBytes uint64 `json:"stderr_bytes"`
	// Observations bounds observations per run (≤ 4096).
	Observations uint64 `json:"observations"`
}

// Manifest is one implementation's manifest. The field order is the family's
// and the manifest digest depends on it: do not reorder.
type Manifest struct {
	// ImplementationID is ≤ 96 bytes of [A-Za-z0-9._-].
	ImplementationID string `json:"implementation_id"`
	// ImplementationVersion is [major, minor, patch], not [0,0,0].
	ImplementationVersion Version `json:"implementation_version"`
	// Module is the snake_case module the implementation fills.
	Module string `json:"module"`
	// ArtifactSHA256 is the executable's digest as bare 64 lowercase hex (no
	// "sha256:" prefix: the family's own inconsistency, kept).
	ArtifactSHA256 string `json:"artifact_sha256"`
	// Executable is a local, clean path relative to the artifact root.
	Executable string `json:"executable"`
	// Argv are the arguments after argv[0]; default [].
	Argv []string `json:"argv"`
	// ProtocolVersion is 1 or 2.
	ProtocolVersion uint32 `json:"protocol_version"`
	// RequestedCapabilities is the provider's capability request; default [].
	RequestedCapabilities []string `json:"requested_capabilities"`
	// Dependencies on other implementations; default [].
	Dependencies []Dependency `json:"dependencies"`
	// RuntimeDeadlineMs is 1..3,600,000.
	RuntimeDeadlineMs uint64 `json:"runtime_deadline_ms"`
	// CancellationDeadlineMs is 1..300,000.
	CancellationDeadlineMs uint64 `json:"cancellation_deadline_ms"`
	// EvidenceLimits bound a run's output.
	EvidenceLimits EvidenceLimits `json:"evidence_limits"`
	// FailurePolicy is fail_closed, request_host_fallback or
	// request_host_quarantine (the host treats all as fail_closed).
	FailurePolicy string `json:"failure_policy"`
}

// ManifestDigest is "sha256:" over the canonical encoding of m with every
// field present (absent lists written as []), in the family's field order.
func ManifestDigest(m Manifest) (string, error) {
	if m.Argv == nil {
		m.Argv = []string{}
	}
	if m.RequestedCapabilities == nil {
		m.RequestedCapabilities = []string{}
	}
	if m.Dependencies == nil {
		m.Dependencies = []Dependency{}
	}
	return strictjson.DigestOf(m)
}

// Bounds of a manifest (docs/reference/catalog.md).
const (
	// MaxExecutablePathBytes bounds the manifest's executable path.
	MaxExecutablePathBytes = 512
	// MaxArgvEntries bounds argv's length.
	MaxArgvEntries = 64
	// MaxArgvEntryBytes bounds each argv entry.
	MaxArgvEntryBytes = 1 << 10
	// MaxArgvBytes bounds the sum of argv's entries.
	MaxArgvBytes = 16 << 10
	// MaxDependencies bounds a manifest's dependencies.
	MaxDependencies = 64
	// MaxRuntimeDeadlineMs bounds runtime_deadline_ms (one hour).
	MaxRuntimeDeadlineMs = 3_600_000
	// MaxCancellationDeadlineMs bounds cancellation_deadline_ms (five minutes).
	MaxCancellationDeadlineMs = 300_000
	// MaxEvidenceBytes bounds evidence_limits.stdout_bytes and stderr_bytes.
	MaxEvidenceBytes = 4 << 20
	// MaxObservations bounds evidence_limits.observations.
	MaxObservations = 4096
	// MaxManifestBytes bounds a lone manifest document (the catalog bound).
	MaxManifestBytes = MaxCatalogBytes
)

// Failure policies a manifest may request. The host treats every one as
// fail_closed: it owns fallback and quarantine (docs/reference/catalog.md).
const (
	FailurePolicyFailClosed                = "fail_closed"
	FailurePolicyRequestHostFallback       = "request_host_fallback"
	FailurePolicyRequestHostQuarantine     = "request_host_quarantine"
	protocolVersionMin, protocolVersionMax = 1, 2
)

// String prints the version as "major.minor.patch".
func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2])
}

// Compare orders versions component by component: -1, 0 or +1.
func (v Version) Compare(o Version) int {
	for i := range v {
		if c := cmp.Compare(v[i], o[i]); c != 0 {
			return c
		}
	}
	return 0
}

// manifestWire is a manifest as decoded: pointers tell an absent required
// member from a zero value, so the error can say "required" rather than
// "must be at least 1".
type manifestWire struct {
	ImplementationID       *string             `json:"implementation_id"`
	ImplementationVersion  *Version            `json:"implementation_version"`
	Module                 *string             `json:"module"`
	ArtifactSHA256         *string             `json:"artifact_sha256"`
	Executable             *string             `json:"executable"`
	Argv                   []string            `json:"argv"`
	ProtocolVersion        *uint32             `json:"protocol_version"`
	RequestedCapabilities  []string            `json:"requested_capabilities"`
	Dependencies           []dependencyWire    `json:"dependencies"`
	RuntimeDeadlineMs      *uint64             `json:"runtime_deadline_ms"`
	CancellationDeadlineMs *uint64             `json:"cancellation_deadline_ms"`
	EvidenceLimits         *evidenceLimitsWire `json:"evidence_limits"`
	FailurePolicy          *string             `json:"failure_policy"`
}

type dependencyWire struct {
	ImplementationID *string  `json:"implementation_id"`
	MinimumVersion   *Version `json:"minimum_version"`
}

type evidenceLimitsWire struct {
	StdoutBytes  *uint64 `json:"stdout_bytes"`
	StderrBytes  *uint64 `json:"stderr_bytes"`
	Observations *uint64 `json:"observations"`
}

func required[T any](field string, p *T) (T, *Error) {
	if p == nil {
		var zero T
		return zero, invalidf(field, ErrMissingField, "required field missing")
	}
	return *p, nil
}

// manifest converts the decoded form, checking required members and writing
// the defaults ([] for argv, requested_capabilities and dependencies).
func (w *manifestWire) manifest(field string) (Manifest, *Error) {
	var m Manifest
	var err *Error
	set := func(dst *string, name string, p *string) {
		if err == nil {
			*dst, err = required(Field(field, name), p)
		}
	}
	set(&m.ImplementationID, "implementation_id", w.ImplementationID)
	if err == nil {
		m.ImplementationVersion, err = required(Field(field, "implementation_version"), w.ImplementationVersion)
	}
	set(&m.Module, "module", w.Module)
	set(&m.ArtifactSHA256, "artifact_sha256", w.ArtifactSHA256)
	set(&m.Executable, "executable", w.Executable)
	if err == nil {
		m.ProtocolVersion, err = required(Field(field, "protocol_version"), w.ProtocolVersion)
	}
	if err == nil {
		m.RuntimeDeadlineMs, err = required(Field(field, "runtime_deadline_ms"), w.RuntimeDeadlineMs)
	}
	if err == nil {
		m.CancellationDeadlineMs, err = required(Field(field, "cancellation_deadline_ms"), w.CancellationDeadlineMs)
	}
	if err == nil {
		var limits evidenceLimitsWire
		limits, err = required(Field(field, "evidence_limits"), w.EvidenceLimits)
		lf := Field(field, "evidence_limits")
		if err == nil {
			m.EvidenceLimits.StdoutBytes, err = required(Field(lf, "stdout_bytes"), limits.StdoutBytes)
		}
		if err == nil {
			m.EvidenceLimits.StderrBytes, err = required(Field(lf, "stderr_bytes"), limits.StderrBytes)
		}
		if err == nil {
			m.EvidenceLimits.Observations, err = required(Field(lf, "observations"), limits.Observations)
		}
	}
	set(&m.FailurePolicy, "failure_policy", w.FailurePolicy)
	if err != nil {
		return Manifest{}, err
	}
	m.Argv = nonNil(w.Argv)
	m.RequestedCapabilities = nonNil(w.RequestedCapabilities)
	m.Dependencies = make([]Dependency, 0, len(w.Dependencies))
	for i, d := range w.Dependencies {
		df := Index(Field(field, "dependencies"), i)
		id, err := required(Field(df, "implementation_id"), d.ImplementationID)
		if err != nil {
			return Manifest{}, err
		}
		minimum, err := required(Field(df, "minimum_version"), d.MinimumVersion)
		if err != nil {
			return Manifest{}, err
		}
		m.Dependencies = append(m.Dependencies, Dependency{ImplementationID: id, MinimumVersion: minimum})
	}
	return m, validateManifest(field, m)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ParseManifest parses one manifest document strictly
// (docs/reference/catalog.md: every bound, defaults written out). A manifest
// normally arrives inside a catalog (ParseCatalog); a lone one is what
// `kubectl iteron digest manifest --manifest` reads.
func ParseManifest(data []byte) (Manifest, error) {
	var w manifestWire
	if err := DecodeStrict(data, &w, MaxManifestBytes, ""); err != nil {
		return Manifest{}, err
	}
	m, err := w.manifest("")
	if err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// ValidateManifest checks every value rule of docs/reference/catalog.md on a
// manifest built in memory (a catalog generator's output, say). Field paths in
// its errors are relative to the manifest.
func ValidateManifest(m Manifest) error {
	if err := validateManifest("", m); err != nil {
		return err
	}
	return nil
}

func validateManifest(field string, m Manifest) *Error {
	f := func(name string) string { return Field(field, name) }
	if !IsImplementationID(m.ImplementationID) {
		return invalidf(f("implementation_id"), ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-]", m.ImplementationID, MaxImplementationIDBytes)
	}
	if m.ImplementationVersion == (Version{}) {
		return invalidf(f("implementation_version"), ErrInvalidValue, "[0,0,0] is not a version")
	}
	if !IsModuleID(m.Module) {
		return invalidf(f("module"), ErrInvalidValue, "%q is not a module ID (^[a-z][a-z0-9_]{0,47}$)", m.Module)
	}
	if !IsBareDigest(m.ArtifactSHA256) {
		return invalidf(f("artifact_sha256"), ErrInvalidValue, "%q is not 64 lowercase hex digits (no sha256: prefix inside a manifest)", m.ArtifactSHA256)
	}
	if err := checkExecutable(f("executable"), m.Executable); err != nil {
		return err
	}
	if err := checkArgv(f("argv"), m.Argv); err != nil {
		return err
	}
	if m.ProtocolVersion < protocolVersionMin || m.ProtocolVersion > protocolVersionMax {
		return invalidf(f("protocol_version"), ErrUnsupportedVersion, "protocol %d is not supported (1 or 2)", m.ProtocolVersion)
	}
	if err := CheckCapabilitySet(f("requested_capabilities"), m.RequestedCapabilities); err != nil {
		return err.(*Error)
	}
	if err := checkDependencies(f("dependencies"), m); err != nil {
		return err
	}
	if m.RuntimeDeadlineMs < 1 || m.RuntimeDeadlineMs > MaxRuntimeDeadlineMs {
		return invalidf(f("runtime_deadline_ms"), ErrInvalidValue, "%d is outside 1..%d", m.RuntimeDeadlineMs, MaxRuntimeDeadlineMs)
	}
	if m.CancellationDeadlineMs < 1 || m.CancellationDeadlineMs > MaxCancellationDeadlineMs {
		return invalidf(f("cancellation_deadline_ms"), ErrInvalidValue, "%d is outside 1..%d", m.CancellationDeadlineMs, MaxCancellationDeadlineMs)
	}
	lf := f("evidence_limits")
	if m.EvidenceLimits.StdoutBytes > MaxEvidenceBytes {
		return invalidf(Field(lf, "stdout_bytes"), ErrInvalidValue, "%d exceeds %d (4 MiB)", m.EvidenceLimits.StdoutBytes, MaxEvidenceBytes)
	}
	if m.EvidenceLimits.StderrBytes > MaxEvidenceBytes {
		return invalidf(Field(lf, "stderr_bytes"), ErrInvalidValue, "%d exceeds %d (4 MiB)", m.EvidenceLimits.StderrBytes, MaxEvidenceBytes)
	}
	if m.EvidenceLimits.Observations > MaxObservations {
		return invalidf(Field(lf, "observations"), ErrInvalidValue, "%d exceeds %d", m.EvidenceLimits.Observations, MaxObservations)
	}
	switch m.FailurePolicy {
	case FailurePolicyFailClosed, FailurePolicyRequestHostFallback, FailurePolicyRequestHostQuarantine:
	default:
		return invalidf(f("failure_policy"), ErrInvalidValue, "%q is not fail_closed, request_host_fallback or request_host_quarantine", m.FailurePolicy)
	}
	return nil
}

// checkExecutable enforces a clean relative path under the artifact root:
// filepath.IsLocal(e) && filepath.Clean(e) == e, no backslash, no NUL, at
// most 512 bytes, and not the root itself.
func checkExecutable(field, e string) *Error {
	switch {
	case len(e) > MaxExecutablePathBytes:
		return invalidf(field, ErrInvalidValue, "%d bytes exceed %d", len(e), MaxExecutablePathBytes)
	case strings.ContainsAny(e, "\\\x00"):
		return invalidf(field, ErrInvalidValue, "%q contains a backslash or NUL", e)
	case !filepath.IsLocal(e):
		return invalidf(field, ErrInvalidValue, "%q is not a local relative path (empty, absolute or escaping the root)", e)
	case filepath.Clean(e) != e:
		return invalidf(field, ErrInvalidValue, "%q is not clean (it cleans to %q)", e, filepath.Clean(e))
	case e == ".":
		return invalidf(field, ErrInvalidValue, "%q names the artifact root itself, not a file in it", e)
	}
	return nil
}

// checkArgv bounds argv; a NUL byte is refused too, since exec cannot pass it.
func checkArgv(field string, argv []string) *Error {
	if len(argv) > MaxArgvEntries {
		return invalidf(field, ErrTooLarge, "%d entries exceed %d", len(argv), MaxArgvEntries)
	}
	total := 0
	for i, a := range argv {
		if len(a) > MaxArgvEntryBytes {
			return invalidf(Index(field, i), ErrTooLarge, "%d bytes exceed %d", len(a), MaxArgvEntryBytes)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return invalidf(Index(field, i), ErrInvalidValue, "contains a NUL byte, which exec cannot pass")
		}
		total += len(a)
	}
	if total > MaxArgvBytes {
		return invalidf(field, ErrTooLarge, "%d bytes in all exceed %d", total, MaxArgvBytes)
	}
	return nil
}

func checkDependencies(field string, m Manifest) *Error {
	if len(m.Dependencies) > MaxDependencies {
		return invalidf(field, ErrTooLarge, "%d dependencies exceed %d", len(m.Dependencies), MaxDependencies)
	}
	seen := make(map[string]bool, len(m.Dependencies))
	for i, d := range m.Dependencies {
		df := Field(Index(field, i), "implementation_id")
		switch {
		case !IsImplementationID(d.ImplementationID):
			return invalidf(df, ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-]", d.ImplementationID, MaxImplementationIDBytes)
		case d.ImplementationID == m.ImplementationID:
			return invalidf(df, ErrCycle, "%q depends on itself", m.ImplementationID)
		case seen[d.ImplementationID]:
			return invalidf(df, ErrDuplicate, "%q is listed twice", d.ImplementationID)
		}
		seen[d.ImplementationID] = true
	}
	return nil
}
