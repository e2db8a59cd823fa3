package catalog

import "iteron.dev/operator/pkg/strictjson"

// Catalog is a catalog file: {"schema_version":1,"implementations":[…]}
// (spec/wire.md §2).
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
