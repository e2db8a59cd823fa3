package verifier

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

// EvidenceLimits bound what one run of a provider may produce (the manifest's
// evidence_limits), and the stderr ring of its process.
type EvidenceLimits struct {
	// StdoutBytes bounds the stdout bytes of one run, start to terminal observation.
	StdoutBytes int64
	// StderrBytes is the size of the stderr ring (newest bytes kept).
	StderrBytes int64
	// Observations bounds the observations of one run.
	Observations int
}

// SandboxRequest is what a source asks of the node's sandbox
// (spec.sources[].sandbox): the least level its launch must apply ("",
// "none", "limits" or "isolated") and its bounds; a zero bound takes the
// node's default. internal/sandbox resolves it against the node's policy.
type SandboxRequest struct {
	// Require is the least level ("" requires nothing).
	Require string `json:"require,omitempty"`
	// MemoryBytes, CPUMillis, Tasks and TmpBytes are the bounds asked.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	Tasks       int64 `json:"tasks,omitempty"`
	TmpBytes    int64 `json:"tmp_bytes,omitempty"`
}

// LaunchPlan is everything needed to run one verified provider, and nothing
// that was not verified. Its fields are unexported: only this package's
// verifier mints plans (and tests, through NewLaunchPlanForTest), so a plan in
// hand is proof that its bytes, manifest and capability ceiling were checked.
type LaunchPlan struct {
	module               string
	implementationID     string
	version              [3]uint64
	protocolVersion      int
	manifestSHA256       string
	artifactSHA256       string
	artifactRoot         string
	executable           string
	argv                 []string
	candidateSHA256      string
	admitted             []string
	authoritySHA256      string
	runtimeDeadline      time.Duration
	cancellationDeadline time.Duration
	limits               EvidenceLimits
	contracts            protocol.ModuleContracts
	failurePolicy        string
	// packageRuntime is set when the source is a package-runtime manifest
	// (spec: docs/reference/package-runtimes.md) rather than a catalog.
	packageRuntime *catalog.PackageRuntimeManifest
	// sandbox is what the source asks of the sandbox.
	sandbox SandboxRequest
}

// Module is the module the provider fills (snake_case).
func (p LaunchPlan) Module() string { return p.module }

// ImplementationID is the manifest's implementation_id.
func (p LaunchPlan) ImplementationID() string { return p.implementationID }

// Version is the manifest's implementation_version.
func (p LaunchPlan) Version() [3]uint64 { return p.version }

// ProtocolVersion is 1 or 2.
func (p LaunchPlan) ProtocolVersion() int { return p.protocolVersion }

// ManifestSHA256 is the verified canonical manifest digest ("sha256:…").
func (p LaunchPlan) ManifestSHA256() string { return p.manifestSHA256 }

// ArtifactSHA256 is the verified executable digest ("sha256:…").
func (p LaunchPlan) ArtifactSHA256() string { return p.artifactSHA256 }

// ArtifactRoot is the canonical absolute artifact root (the provider's cwd).
func (p LaunchPlan) ArtifactRoot() string { return p.artifactRoot }

// Executable is the canonical absolute path of the verified executable.
func (p LaunchPlan) Executable() string { return p.executable }

// Argv is the manifest's argv (without argv[0]); a copy.
func (p LaunchPlan) Argv() []string { return slices.Clone(p.argv) }

// CandidateSHA256 is the activation's candidate digest, bound into every run.
func (p LaunchPlan) CandidateSHA256() string { return p.candidateSHA256 }

// AdmittedCapabilities is requested ∩ ceiling, sorted; a copy.
func (p LaunchPlan) AdmittedCapabilities() []string { return slices.Clone(p.admitted) }

// AuthoritySHA256 is the digest of the admitted capability array.
func (p LaunchPlan) AuthoritySHA256() string { return p.authoritySHA256 }

// RuntimeDeadline is the manifest's runtime_deadline_ms: the longest a run,
// and a process, may live.
func (p LaunchPlan) RuntimeDeadline() time.Duration { return p.runtimeDeadline }

// CancellationDeadline is the manifest's cancellation_deadline_ms, used by
// cancel and stop.
func (p LaunchPlan) CancellationDeadline() time.Duration { return p.cancellationDeadline }

// EvidenceLimits are the manifest's evidence_limits.
func (p LaunchPlan) EvidenceLimits() EvidenceLimits { return p.limits }

// Contracts are the module's seam-graph contracts that requests bind.
func (p LaunchPlan) Contracts() protocol.ModuleContracts { return p.contracts }

// FailurePolicy is the manifest's failure_policy as written (the host treats
// every policy as fail_closed).
func (p LaunchPlan) FailurePolicy() string { return p.failurePolicy }

// Sandbox is what the source asks of the node's sandbox.
func (p LaunchPlan) Sandbox() SandboxRequest { return p.sandbox }

// PackageRuntime returns the verified package-runtime manifest when the
// source is a package runtime (a quixos.runtime.PackageRuntime server), and
// false for a line-protocol provider. A package runtime holds no state the
// host moves: its plan's ProtocolVersion is 1, so it swaps by cold replace.
func (p LaunchPlan) PackageRuntime() (catalog.PackageRuntimeManifest, bool) {
	if p.packageRuntime == nil {
		return catalog.PackageRuntimeManifest{}, false
	}
	m := *p.packageRuntime
	m.ExportIDs = slices.Clone(m.ExportIDs)
	m.RequestedCapabilities = slices.Clone(m.RequestedCapabilities)
	return m, true
}

// LaunchPlanFields is the input of NewLaunchPlanForTest.
type LaunchPlanFields struct {
	Module, ImplementationID       string
	Version                        [3]uint64
	ProtocolVersion                int
	ManifestSHA256, ArtifactSHA256 string
	ArtifactRoot, Executable       string
	Argv                           []string
	CandidateSHA256                string
	AdmittedCapabilities           []string
	AuthoritySHA256                string
	RuntimeDeadline                time.Duration
	CancellationDeadline           time.Duration
	EvidenceLimits                 EvidenceLimits
	Contracts                      protocol.ModuleContracts
	FailurePolicy                  string
	// PackageRuntime, when set, makes the plan a package runtime's.
	PackageRuntime *catalog.PackageRuntimeManifest
	// Sandbox is what the source asks of the sandbox.
	Sandbox SandboxRequest
}

// NewLaunchPlanForTest mints a plan without verification. It exists for the
// executor's own tests, which must hand it plans the verifier would refuse
// (a wrong digest, a missing file); it takes a testing.TB so that no
// production path can call it.
func NewLaunchPlanForTest(tb testing.TB, f LaunchPlanFields) LaunchPlan {
	tb.Helper()
	return newLaunchPlan(f)
}

func newLaunchPlan(f LaunchPlanFields) LaunchPlan {
	plan := LaunchPlan{
		module: f.Module, implementationID: f.ImplementationID, version: f.Version,
		protocolVersion: f.ProtocolVersion, manifestSHA256: f.ManifestSHA256,
		artifactSHA256: f.ArtifactSHA256, artifactRoot: f.ArtifactRoot, executable: f.Executable,
		argv: slices.Clone(f.Argv), candidateSHA256: f.CandidateSHA256,
		admitted: slices.Clone(f.AdmittedCapabilities), authoritySHA256: f.AuthoritySHA256,
		runtimeDeadline: f.RuntimeDeadline, cancellationDeadline: f.CancellationDeadline,
		limits: f.EvidenceLimits, contracts: f.Contracts, failurePolicy: f.FailurePolicy,
		sandbox: f.Sandbox,
	}
	if f.PackageRuntime != nil {
		m := *f.PackageRuntime
		m.ExportIDs = slices.Clone(m.ExportIDs)
		m.RequestedCapabilities = slices.Clone(m.RequestedCapabilities)
		plan.packageRuntime = &m
	}
	return plan
}

// ConformanceTarget describes a local executable that `kubectl iteron
// conformance` runs through the protocol: no catalog, no activation
// document, no verification — the CLI hashed the file itself, and the
// executor copies and re-hashes it at spawn as it does for any plan.
type ConformanceTarget struct {
	// Module is the module the provider is driven as (snake_case).
	Module string
	// ImplementationID is the ID the requests carry.
	ImplementationID string
	// ProtocolVersion is 1 or 2.
	ProtocolVersion int
	// Executable is the absolute, clean path of the executable; its
	// directory is the artifact root (the provider's cwd).
	Executable string
	// ArtifactSHA256 is the digest the CLI computed ("sha256:…").
	ArtifactSHA256 string
	// Argv are the arguments after argv[0].
	Argv []string
	// RuntimeDeadline and CancellationDeadline bound the process and its
	// cancel and stop.
	RuntimeDeadline, CancellationDeadline time.Duration
	// EvidenceLimits bound each run's output and the stderr ring.
	EvidenceLimits EvidenceLimits
	// Admitted are the capabilities to run it as admitted (sorted, on the
	// wire's list; none by default): what its sandbox allows, and what its
	// load request says.
	Admitted []string
}

// conformanceCandidate is the candidate digest conformance runs carry.
var conformanceCandidate = strictjson.Digest([]byte("iteron conformance"))

// PlanForConformance mints the plan of an unverified local executable. It is
// the conformance CLI's own door, and no other caller may use it: the plan it
// returns proves nothing about a catalog or an activation, only that the CLI
// hashed the bytes it names. Contracts are the built-in graph's for the
// module; the capabilities admitted are the target's (none unless given);
// the candidate digest is a fixed conformance digest.
func PlanForConformance(t ConformanceTarget) (LaunchPlan, error) {
	switch {
	case t.ProtocolVersion != 1 && t.ProtocolVersion != 2:
		return LaunchPlan{}, fmt.Errorf("conformance: protocol version %d, want 1 or 2", t.ProtocolVersion)
	case protocol.ValidModule(t.Module) != nil:
		return LaunchPlan{}, fmt.Errorf("conformance: module: %v", protocol.ValidModule(t.Module))
	case protocol.ValidID(t.ImplementationID) != nil:
		return LaunchPlan{}, fmt.Errorf("conformance: implementation ID: %v", protocol.ValidID(t.ImplementationID))
	case !filepath.IsAbs(t.Executable) || filepath.Clean(t.Executable) != t.Executable:
		return LaunchPlan{}, fmt.Errorf("conformance: executable %q must be an absolute, clean path", t.Executable)
	case protocol.ValidDigest(t.ArtifactSHA256) != nil:
		return LaunchPlan{}, fmt.Errorf("conformance: artifact digest: %v", protocol.ValidDigest(t.ArtifactSHA256))
	case t.RuntimeDeadline <= 0 || t.CancellationDeadline <= 0:
		return LaunchPlan{}, fmt.Errorf("conformance: deadlines must be positive")
	}
	admitted := slices.Clone(t.Admitted)
	if admitted == nil {
		admitted = []string{}
	}
	if err := catalog.CheckCapabilitySet("capabilities", admitted); err != nil {
		return LaunchPlan{}, fmt.Errorf("conformance: %v", err)
	}
	authority := catalog.AuthorityDigest(admitted)
	return newLaunchPlan(LaunchPlanFields{
		Module: t.Module, ImplementationID: t.ImplementationID, ProtocolVersion: t.ProtocolVersion,
		ArtifactSHA256: t.ArtifactSHA256, ArtifactRoot: filepath.Dir(t.Executable), Executable: t.Executable,
		Argv: t.Argv, CandidateSHA256: conformanceCandidate, AdmittedCapabilities: admitted, AuthoritySHA256: authority,
		RuntimeDeadline: t.RuntimeDeadline, CancellationDeadline: t.CancellationDeadline,
		EvidenceLimits: t.EvidenceLimits, Contracts: protocol.BuiltinContracts(t.Module), FailurePolicy: "fail_closed",
	}), nil
}
