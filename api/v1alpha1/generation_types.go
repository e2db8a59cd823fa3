package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GenerationStep is the transaction phase a generation is in or last passed.
// +kubebuilder:validation:Enum=verify;shadow_load;quiesce;snapshot;migrate;restore;readiness;atomic_switch;drain;committed;rolled_back
type GenerationStep string

// Transaction steps, in ledger order (docs/reference/ledger.md).
const (
	StepVerify       GenerationStep = "verify"
	StepShadowLoad   GenerationStep = "shadow_load"
	StepQuiesce      GenerationStep = "quiesce"
	StepSnapshot     GenerationStep = "snapshot"
	StepMigrate      GenerationStep = "migrate"
	StepRestore      GenerationStep = "restore"
	StepReadiness    GenerationStep = "readiness"
	StepAtomicSwitch GenerationStep = "atomic_switch"
	StepDrain        GenerationStep = "drain"
	StepCommitted    GenerationStep = "committed"
	StepRolledBack   GenerationStep = "rolled_back"
)

// Implementation is the verified implementation a generation runs: what the
// manifest said, pinned by digest, with canonical node-local paths.
type Implementation struct {
	// id is the manifest's implementation_id.
	// +kubebuilder:validation:MaxLength=96
	ID string `json:"id"`
	// version is the manifest's implementation_version as "major.minor.patch".
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version"`
	// manifestSHA256 is the verified canonical manifest digest.
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	ManifestSHA256 string `json:"manifestSHA256"`
	// artifactSHA256 is the verified executable digest.
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	ArtifactSHA256 string `json:"artifactSHA256"`
	// catalogPath is the canonical catalog the manifest was verified from;
	// a restarted manager re-verifies it to relaunch this generation.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	CatalogPath string `json:"catalogPath,omitempty"`
	// artifactRoot is the canonical artifact root (the provider's working
	// directory).
	// +kubebuilder:validation:MaxLength=512
	ArtifactRoot string `json:"artifactRoot"`
	// executable is the canonical absolute path of the executable.
	// +kubebuilder:validation:MaxLength=1024
	Executable string `json:"executable"`
	// argv are the manifest's arguments after argv[0].
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=1024
	Argv []string `json:"argv,omitempty"`
	// protocolVersion is 1 or 2.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2
	ProtocolVersion int32 `json:"protocolVersion"`
	// interpreter is the allowlisted interpreter of a '#!' script, empty for
	// a binary.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Interpreter string `json:"interpreter,omitempty"`
	// packageRuntime is set when the implementation is a package runtime (a
	// quixos.runtime.PackageRuntime server named by a package-runtime
	// manifest) rather than a line-protocol provider: id is then its
	// package_revision_id, version 0.0.0, and protocolVersion 1 (the host
	// moves no state: a version change is a cold replace).
	// +optional
	PackageRuntime *PackageRuntimeImplementation `json:"packageRuntime,omitempty"`
}

// PackageRuntimeImplementation is what a package runtime's manifest pins
// beyond the common fields.
type PackageRuntimeImplementation struct {
	// runtimeProtocolVersion is the manifest's runtime_protocol_version.
	// +kubebuilder:validation:MaxLength=64
	RuntimeProtocolVersion string `json:"runtimeProtocolVersion"`
	// exports are the manifest's export IDs, sorted: what the runtime's
	// handshake must name, and what a call's export may be.
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=96
	Exports []string `json:"exports"`
}

// Deadlines are the manifest's deadlines.
type Deadlines struct {
	// runtimeMs bounds a run and the lifetime of a process.
	RuntimeMs int64 `json:"runtimeMs"`
	// cancellationMs bounds cancel and stop.
	CancellationMs int64 `json:"cancellationMs"`
}

// EvidenceLimits are the manifest's per-run output bounds.
type EvidenceLimits struct {
	// stdoutBytes bounds stdout per run.
	StdoutBytes int64 `json:"stdoutBytes"`
	// stderrBytes is the size of the stderr ring.
	StderrBytes int64 `json:"stderrBytes"`
	// observations bounds observations per run.
	Observations int64 `json:"observations"`
}

// GenerationSpec is one generation of one module: immutable once written.
type GenerationSpec struct {
	// activationName is the owning ImplementationActivation.
	// +kubebuilder:validation:MaxLength=40
	ActivationName string `json:"activationName"`
	// nodeName is the node whose manager runs this generation.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// module is the module's snake_case ID.
	// +kubebuilder:validation:MaxLength=48
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9_]{0,47}$`
	Module string `json:"module"`
	// generation is the lineage number: the state generation, consecutive
	// per module.
	// +kubebuilder:validation:Minimum=1
	Generation int64 `json:"generation"`
	// attempt counts attempts at this lineage number; a failed attempt's
	// number is never reused.
	// +kubebuilder:validation:Minimum=1
	Attempt int32 `json:"attempt"`
	// previous is the Active generation this one replaces; empty for a first
	// activation.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Previous string `json:"previous,omitempty"`
	// candidateSHA256 is the activation's candidate digest.
	// +kubebuilder:validation:MaxLength=71
	CandidateSHA256 string `json:"candidateSHA256"`
	// implementation is the verified implementation this generation runs.
	Implementation Implementation `json:"implementation"`
	// admittedCapabilities are requested ∩ ceiling.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=5
	AdmittedCapabilities []Capability `json:"admittedCapabilities,omitempty"`
	// authoritySHA256 is the digest of the admitted capability array.
	// +kubebuilder:validation:MaxLength=71
	AuthoritySHA256 string `json:"authoritySHA256"`
	// deadlines are the manifest's deadlines.
	Deadlines Deadlines `json:"deadlines"`
	// failurePolicy is the manifest's failure_policy as written; the host
	// treats every policy as fail_closed (it owns fallback and quarantine).
	// +optional
	// +kubebuilder:validation:Enum=fail_closed;request_host_fallback;request_host_quarantine
	FailurePolicy string `json:"failurePolicy,omitempty"`
	// evidenceLimits are the manifest's evidence limits.
	EvidenceLimits EvidenceLimits `json:"evidenceLimits"`
}

// Checkpoint is a durable snapshot of a generation's state.
type Checkpoint struct {
	// stateSHA256 is the digest of the snapshotted state.
	// +kubebuilder:validation:MaxLength=71
	StateSHA256 string `json:"stateSHA256"`
	// at is when the snapshot became durable.
	At metav1.Time `json:"at"`
}

// ReceiptSummary counts the effect receipts of a generation.
type ReceiptSummary struct {
	// total receipts recorded.
	// +optional
	Total int32 `json:"total,omitempty"`
	// irreversible receipts: effects never reported as rolled back.
	// +optional
	Irreversible int32 `json:"irreversible,omitempty"`
	// truncated is true when receipts are missing — evicted, or lost with a
	// manager that did not stop cleanly — so the recovery evidence is
	// incomplete and no clean rollback may be claimed.
	// +optional
	Truncated bool `json:"truncated,omitempty"`
	// incompleteReason says why the evidence is incomplete (for example a
	// manager that stopped without closing the receipts file, whose last
	// receipts may be lost).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	IncompleteReason string `json:"incompleteReason,omitempty"`
}

// LedgerPosition is where a generation's last transaction is in the ledger.
type LedgerPosition struct {
	// transactionID is the generation's last transaction.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	TransactionID string `json:"transactionID,omitempty"`
	// lastSequence is the sequence of its last record.
	// +optional
	LastSequence int64 `json:"lastSequence,omitempty"`
	// lastRecordSHA256 is the hash of its last record.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	LastRecordSHA256 string `json:"lastRecordSHA256,omitempty"`
}

// GenerationStatus is the observed state of a generation, mirrored from the
// node's coordinator.
type GenerationStatus struct {
	// observedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// phase: Inactive, Preparing, Active, Draining or Failed.
	// +optional
	Phase ModulePhase `json:"phase,omitempty"`
	// step is the transaction phase in progress or last passed.
	// +optional
	Step GenerationStep `json:"step,omitempty"`
	// conditions: Ready and the others of the API.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// pid is the provider process id while one runs.
	// +optional
	Pid int64 `json:"pid,omitempty"`
	// processStartedAt is when the current process started.
	// +optional
	ProcessStartedAt *metav1.Time `json:"processStartedAt,omitempty"`
	// renewals counts fresh processes for this same generation (lifetime,
	// stdin or state-operation bounds reached); the lineage does not change.
	// +optional
	Renewals int32 `json:"renewals,omitempty"`
	// stateSHA256 is the digest of the state restored into or snapshotted
	// from this generation.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	StateSHA256 string `json:"stateSHA256,omitempty"`
	// lastCheckpoint is the newest durable snapshot.
	// +optional
	LastCheckpoint *Checkpoint `json:"lastCheckpoint,omitempty"`
	// reason is the snake_case error reason when Failed or Inactive.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// message explains reason, at most 1 KiB.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// stderrTail is the last 2 KiB of the provider's stderr.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	StderrTail string `json:"stderrTail,omitempty"`
	// stderrDroppedBytes counts stderr bytes that left the ring.
	// +optional
	StderrDroppedBytes int64 `json:"stderrDroppedBytes,omitempty"`
	// receipts summarizes effect receipts.
	// +optional
	Receipts *ReceiptSummary `json:"receipts,omitempty"`
	// ledger is where this generation's last transaction is in the ledger.
	// +optional
	Ledger *LedgerPosition `json:"ledger,omitempty"`
	// startedAt is when the generation's first transaction started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// activatedAt is when the generation became Active.
	// +optional
	ActivatedAt *metav1.Time `json:"activatedAt,omitempty"`
	// drainedAt is when the generation's process was drained.
	// +optional
	DrainedAt *metav1.Time `json:"drainedAt,omitempty"`
	// sandbox is what the launch of the current (or last) process applied:
	// the same evidence as its shadow_load ledger record.
	// +optional
	Sandbox *SandboxStatus `json:"sandbox,omitempty"`
}

// SandboxStatus is what one launch's sandbox applied (docs/security.md).
type SandboxStatus struct {
	// mode is the node's sandbox mode: enforce, audit or off.
	// +kubebuilder:validation:MaxLength=16
	Mode string `json:"mode"`
	// level is the level applied: none, limits or isolated.
	// +kubebuilder:validation:MaxLength=16
	Level string `json:"level"`
	// namespaces the provider got of its own (cgroup, ipc, mnt, net, pid,
	// uts, user).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=16
	Namespaces []string `json:"namespaces,omitempty"`
	// network is none (a private, empty network namespace) or node.
	// +kubebuilder:validation:MaxLength=16
	Network string `json:"network"`
	// exec reports whether the provider may execute programs.
	Exec bool `json:"exec"`
	// memoryBytes, cpuMillis, tasks and tmpBytes are the bounds applied; 0
	// is unbounded.
	// +optional
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// +optional
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	// +optional
	Tasks int64 `json:"tasks,omitempty"`
	// +optional
	TmpBytes int64 `json:"tmpBytes,omitempty"`
	// cgroups is the cgroup layout the bounds are on (v1, v2, v1+v2) or
	// unavailable.
	// +kubebuilder:validation:MaxLength=16
	Cgroups string `json:"cgroups"`
	// seccomp is the digest of the seccomp program, or off.
	// +kubebuilder:validation:MaxLength=71
	Seccomp string `json:"seccomp"`
	// landlock is the Landlock ABI applied, 0 when unavailable.
	// +optional
	Landlock int32 `json:"landlock,omitempty"`
	// launcher is the digest of the sandbox launcher.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	Launcher string `json:"launcher,omitempty"`
	// violations counts what a provider under --sandbox=audit did that the
	// enforced sandbox refuses (allowed and logged), by syscall.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Violations map[string]int64 `json:"violations,omitempty"`
}

// Generation is one generation of one module of an ImplementationActivation:
// a verified implementation, its lineage number and its lifecycle. Written by
// the manager only (a ValidatingAdmissionPolicy enforces it).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=igen,categories=iteron
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Module",type=string,JSONPath=`.spec.module`
// +kubebuilder:printcolumn:name="Gen",type=integer,JSONPath=`.spec.generation`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Step",type=string,JSONPath=`.status.step`
// +kubebuilder:printcolumn:name="Implementation",type=string,JSONPath=`.spec.implementation.id`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Generation struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the generation's verified implementation and lineage;
	// immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="Generation spec is immutable"
	Spec GenerationSpec `json:"spec"`

	// status is the generation's observed lifecycle.
	// +optional
	Status GenerationStatus `json:"status,omitzero"`
}

// GenerationList is a list of Generation.
//
// +kubebuilder:object:root=true
type GenerationList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	// items are the generations.
	Items []Generation `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Generation{}, &GenerationList{})
}
