package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Capability is one capability a provider may request and a host may admit.
// +kubebuilder:validation:Enum=read_only;reversible_local;code_executing;trust_mutating;irreversible_external
type Capability string

// The five capabilities of the protocol family.
const (
	CapabilityReadOnly             Capability = "read_only"
	CapabilityReversibleLocal      Capability = "reversible_local"
	CapabilityCodeExecuting        Capability = "code_executing"
	CapabilityTrustMutating        Capability = "trust_mutating"
	CapabilityIrreversibleExternal Capability = "irreversible_external"
)

// SwapStrategy says how a Reloaded module moves to its new implementation.
// +kubebuilder:validation:Enum=Hot;Cold
type SwapStrategy string

const (
	// SwapStrategyHot migrates state: shadow-load, quiesce, snapshot, migrate,
	// restore, readiness, one atomic switch, drain. Both sides must speak
	// protocol 2.
	SwapStrategyHot SwapStrategy = "Hot"
	// SwapStrategyCold moves no state: shadow-load the new, quiesce, switch,
	// drain the old.
	SwapStrategyCold SwapStrategy = "Cold"
)

// StateDisposition says what happens to a module's state on a swap.
// +kubebuilder:validation:Enum=Migrate;Discard
type StateDisposition string

const (
	// StateDispositionMigrate carries state into the new generation.
	StateDispositionMigrate StateDisposition = "Migrate"
	// StateDispositionDiscard starts the new generation empty (for example a
	// GitOps revert to an implementation with no down-migration).
	StateDispositionDiscard StateDisposition = "Discard"
)

// ActivationSource selects the implementation that fills one module, pinned by
// digest. It is the family's activation-document source in camelCase.
// +kubebuilder:validation:XValidation:rule="has(self.oci) ? !has(self.catalogPath) && !has(self.artifactRoot) : has(self.catalogPath) && has(self.artifactRoot)",message="give either catalogPath and artifactRoot, or oci, not both"
type ActivationSource struct {
	// module is the module this source fills, in snake_case (for example
	// prompt_system). At most one source per module.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=48
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9_]{0,47}$`
	Module string `json:"module"`

	// implementationID selects the manifest in the catalog by its
	// implementation_id; for a package runtime it is the manifest's
	// package_revision_id. Unique across the activation's sources.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=96
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]{1,96}$`
	ImplementationID string `json:"implementationID"`

	// catalogPath is the absolute, canonical path of the catalog file on the
	// node, or of a package-runtime manifest (a file with a top-level
	// schema_id). It must lie under the manager's allowed roots and contain
	// no symlink. Give it with artifactRoot, or give oci instead of both.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule=`self.matches('^(/[^/\\x00]+)+$') && !self.matches('(^|/)[.][.]?(/|$)')`,message="must be an absolute, clean path: no empty, '.' or '..' segment, no trailing '/', not '/' alone"
	CatalogPath string `json:"catalogPath,omitempty"`

	// artifactRoot is the absolute, canonical directory holding the
	// executable; the provider runs with it as its working directory. It must
	// lie under the manager's allowed roots and contain no symlink. Give it
	// with catalogPath, or give oci instead of both.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule=`self.matches('^(/[^/\\x00]+)+$') && !self.matches('(^|/)[.][.]?(/|$)')`,message="must be an absolute, clean path: no empty, '.' or '..' segment, no trailing '/', not '/' alone"
	ArtifactRoot string `json:"artifactRoot,omitempty"`

	// oci pulls the catalog and the executable from an OCI registry instead
	// of reading catalogPath and artifactRoot on the node: the manager pulls
	// the artifact by digest into its artifact store and verifies it as it
	// verifies files (manifestSHA256 and artifactSHA256 still pin the bytes).
	// +optional
	OCI *OCISource `json:"oci,omitempty"`

	// manifestSHA256 pins the selected manifest: "sha256:" and the lowercase
	// hex digest of its canonical encoding.
	// +required
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	ManifestSHA256 string `json:"manifestSHA256"`

	// artifactSHA256 pins the executable's bytes: "sha256:" and the lowercase
	// hex digest.
	// +required
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	ArtifactSHA256 string `json:"artifactSHA256"`

	// sandbox is what this source asks of the node's sandbox: a level the
	// launch must apply and the provider's bounds. Empty takes the node's
	// defaults (docs/security.md, "The sandbox").
	// +optional
	Sandbox *SourceSandbox `json:"sandbox,omitempty"`
}

// SandboxLevel orders what a launch applies: None (the launch guarantees
// only), Limits (and the memory, CPU and task bounds) and Isolated (and
// every kernel rule the provider's capabilities map to).
// +kubebuilder:validation:Enum=None;Limits;Isolated
type SandboxLevel string

// The sandbox levels, lowest first.
const (
	SandboxLevelNone     SandboxLevel = "None"
	SandboxLevelLimits   SandboxLevel = "Limits"
	SandboxLevelIsolated SandboxLevel = "Isolated"
)

// SourceSandbox is what a source asks of the node's sandbox. A bound left
// out takes the node's default; one above the node's ceiling
// (--sandbox-max-*) is refused at launch with sandbox_unavailable. The
// manager refuses a memory bound under 16Mi, a CPU bound under 10m and a
// tmp bound under 1Mi (verification_failed, naming the field).
type SourceSandbox struct {
	// require is the least level the launch must apply. A node that cannot
	// apply it refuses the launch (the generation fails with
	// sandbox_unavailable) and what serves keeps serving.
	// +optional
	Require SandboxLevel `json:"require,omitempty"`

	// memory bounds the provider's memory, no swap (for example 512Mi).
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// cpu bounds the provider's CPU time (for example 500m, or 2).
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`

	// tasks bounds the provider's processes and threads together.
	// +optional
	// +kubebuilder:validation:Minimum=8
	// +kubebuilder:validation:Maximum=65536
	Tasks *int32 `json:"tasks,omitempty"`

	// tmp bounds the provider's private /tmp (for example 64Mi).
	// +optional
	Tmp *resource.Quantity `json:"tmp,omitempty"`
}

// OCISource names a provider artifact in an OCI registry, pinned by digest.
type OCISource struct {
	// ref is the artifact: <registry>/<repository>@sha256:<64 hex> (a tag
	// may stand before the digest; the digest decides). A tag alone is
	// refused: what runs must be pinned.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule=`self.matches('^[^@\\s]+@sha256:[0-9a-f]{64}$')`,message="must pin a digest: <registry>/<repository>@sha256:<64 lowercase hex>; a tag alone is refused"
	Ref string `json:"ref"`
}

// SwapPolicy bounds and shapes every transaction of the activation.
type SwapPolicy struct {
	// deadlineSeconds bounds one whole transaction; it is checked before each
	// phase.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	DeadlineSeconds int32 `json:"deadlineSeconds,omitempty"`

	// quiesceTimeoutSeconds is how long quiesce waits for the in-flight run
	// before cancelling it (with a receipt).
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	QuiesceTimeoutSeconds *int32 `json:"quiesceTimeoutSeconds,omitempty"`

	// strategy is Hot (state migrated; protocol 2 on both sides) or Cold
	// (no state moves).
	// +optional
	// +kubebuilder:default=Hot
	Strategy SwapStrategy `json:"strategy,omitempty"`

	// stateDisposition is Migrate (carry state) or Discard (start empty).
	// +optional
	// +kubebuilder:default=Migrate
	StateDisposition StateDisposition `json:"stateDisposition,omitempty"`
}

// CheckpointPolicy says how often Active state is made durable between swaps.
type CheckpointPolicy struct {
	// intervalSeconds between durable snapshots of each Active protocol-2
	// generation; 0 snapshots only at swaps. What a crash can lose is bounded
	// by this interval.
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	IntervalSeconds *int32 `json:"intervalSeconds,omitempty"`
}

// ImplementationActivationSpec is the desired set of implementations on one
// node: the family's activation document plus how to move between versions.
// +kubebuilder:validation:XValidation:rule="!has(self.sources) || self.sources.all(a, self.sources.exists_one(b, b.implementationID == a.implementationID))",message="sources[].implementationID must be unique"
// +kubebuilder:validation:XValidation:rule="!has(self.probes) || self.probes.all(p, has(self.sources) && self.sources.exists(s, s.module == p.module))",message="probes[].module must be one of sources[].module"
type ImplementationActivationSpec struct {
	// nodeName is the node whose manager runs these providers. Immutable:
	// create a new activation to move to another node.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`

	// candidateSHA256 is the opaque identity of this candidate selection,
	// bound into every run and every ledger record.
	// +required
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	CandidateSHA256 string `json:"candidateSHA256"`

	// sources select one implementation per module, keyed by module.
	// +optional
	// +listType=map
	// +listMapKey=module
	// +kubebuilder:validation:MaxItems=64
	Sources []ActivationSource `json:"sources,omitempty"`

	// capabilityCeiling narrows the node's capability ceiling for this
	// activation; it can never widen it. Empty means the node's ceiling.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=5
	CapabilityCeiling []Capability `json:"capabilityCeiling,omitempty"`

	// swap bounds and shapes transactions.
	// +optional
	// +kubebuilder:default={}
	Swap SwapPolicy `json:"swap,omitzero"`

	// checkpoint says how often Active state is made durable.
	// +optional
	// +kubebuilder:default={}
	Checkpoint CheckpointPolicy `json:"checkpoint,omitzero"`

	// generationHistoryLimit is the number of Inactive or Failed Generation
	// objects kept per module.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	GenerationHistoryLimit *int32 `json:"generationHistoryLimit,omitempty"`

	// probes are synthetic calls the node's manager makes once every module
	// serves its desired generation, before it reports Ready: a failed
	// probe makes the activation Stalled (reason ProbeFailed). Each names a
	// module of sources admitted read_only.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Probes []ActivationProbe `json:"probes,omitempty"`

	// paused stops the manager acting on spec changes; running providers keep
	// serving. Argo CD reports a paused activation as Suspended.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// ModulePhase is the lifecycle phase of a module's active generation.
// +kubebuilder:validation:Enum=Inactive;Preparing;Active;Draining;Failed
type ModulePhase string

// Generation phases (docs/concepts.md, the generation lifecycle): Inactive →
// Preparing → Active → Draining → Inactive, and Failed.
const (
	PhaseInactive  ModulePhase = "Inactive"
	PhasePreparing ModulePhase = "Preparing"
	PhaseActive    ModulePhase = "Active"
	PhaseDraining  ModulePhase = "Draining"
	PhaseFailed    ModulePhase = "Failed"
)

// ModuleStatus is the observed state of one module: which generation serves it.
type ModuleStatus struct {
	// module is the module's snake_case ID.
	// +kubebuilder:validation:MaxLength=48
	Module string `json:"module"`
	// implementationID is the implementation of the active generation.
	// +optional
	// +kubebuilder:validation:MaxLength=96
	ImplementationID string `json:"implementationID,omitempty"`
	// phase mirrors the active generation's phase.
	// +optional
	Phase ModulePhase `json:"phase,omitempty"`
	// generation is the lineage number of the active generation (consecutive
	// per module).
	// +optional
	Generation int64 `json:"generation,omitempty"`
	// generationName is the Generation object of the active generation.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	GenerationName string `json:"generationName,omitempty"`
	// epoch is the digest over the module's identity and its direct
	// dependencies' identities; a change means the module is reloaded.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	Epoch string `json:"epoch,omitempty"`
	// admittedCapabilities are the requested capabilities the ceiling admitted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=5
	AdmittedCapabilities []Capability `json:"admittedCapabilities,omitempty"`
	// reason is the snake_case error reason when the module is not Active.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// message explains reason, at most 1 KiB.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// diagnostics say what the module runs without: each optional
	// requirement of a custom seam graph (schema version 3) that no source
	// satisfies. A module with diagnostics is still activated; reason says
	// what keeps a module from running, diagnostics never do.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=1024
	Diagnostics []string `json:"diagnostics,omitempty"`
}

// PlanStatus is the RuntimePlan of the last spec acted on.
type PlanStatus struct {
	// specGeneration is the metadata.generation of the spec this plan was
	// computed for: the plan stays until the spec changes.
	// +optional
	SpecGeneration int64 `json:"specGeneration,omitempty"`
	// added modules have no previous generation.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=48
	Added []string `json:"added,omitempty"`
	// removed modules are retired.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=48
	Removed []string `json:"removed,omitempty"`
	// reloaded modules changed epoch and are swapped.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=48
	Reloaded []string `json:"reloaded,omitempty"`
	// unchanged modules keep their process.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=48
	Unchanged []string `json:"unchanged,omitempty"`
	// activateOrder is the topological order transactions run in.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=48
	ActivateOrder []string `json:"activateOrder,omitempty"`
	// drainOrder is the reverse of activateOrder.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=48
	DrainOrder []string `json:"drainOrder,omitempty"`
}

// LedgerRecordSummary is one ledger record in brief.
type LedgerRecordSummary struct {
	// sequence is the record's sequence number.
	Sequence int64 `json:"sequence"`
	// transactionID is the record's transaction.
	// +kubebuilder:validation:MaxLength=128
	TransactionID string `json:"transactionID"`
	// module is the record's module.
	// +kubebuilder:validation:MaxLength=48
	Module string `json:"module"`
	// phase is the record's phase.
	// +kubebuilder:validation:MaxLength=32
	Phase string `json:"phase"`
	// outcome is applied, blocked, committed, rolled_back or rollback_failed.
	// +kubebuilder:validation:MaxLength=32
	Outcome string `json:"outcome"`
	// reason is the record's reason, truncated to 256 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
}

// LedgerStatus mirrors the head of the activation's durable ledger.
type LedgerStatus struct {
	// file is the ledger's current segment on the node.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	File string `json:"file,omitempty"`
	// headSHA256 is the record hash of the last record.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	HeadSHA256 string `json:"headSHA256,omitempty"`
	// records is the number of records in the chain.
	// +optional
	Records int64 `json:"records,omitempty"`
	// verified is true when the ledger replayed and verified at the last open.
	// +optional
	Verified bool `json:"verified,omitempty"`
	// recent are the last records, at most 16.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Recent []LedgerRecordSummary `json:"recent,omitempty"`
}

// ImplementationActivationStatus is the observed state of an activation.
type ImplementationActivationStatus struct {
	// observedGeneration is the metadata.generation the status describes.
	// It defaults to 0 so that a new activation reads as in progress
	// (kstatus) until the manager has observed it.
	// +optional
	// +kubebuilder:default=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready, Reconciling, Stalled, Degraded, Verified.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// moduleCount is the number of modules in the spec (the MODULES column).
	// +optional
	ModuleCount int32 `json:"moduleCount,omitempty"`
	// activeCount is the number of Active modules (the ACTIVE column).
	// +optional
	ActiveCount int32 `json:"activeCount,omitempty"`
	// modules is one entry per source in ModuleId order: the source of truth
	// for which generation is active. A module whose source left the spec
	// follows, by name, while it is retired (Active, then Draining) until
	// its process is gone.
	// +optional
	// +listType=map
	// +listMapKey=module
	// +kubebuilder:validation:MaxItems=64
	Modules []ModuleStatus `json:"modules,omitempty"`
	// plan is the RuntimePlan of the last spec acted on.
	// +optional
	Plan *PlanStatus `json:"plan,omitempty"`
	// ledger mirrors the head of the durable ledger.
	// +optional
	Ledger *LedgerStatus `json:"ledger,omitempty"`
	// lastHandledRetryAt echoes the iteron.dev/retry annotation last acted on.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	LastHandledRetryAt string `json:"lastHandledRetryAt,omitempty"`
	// probes are the outcomes of spec.probes against the generations that
	// serve now, one per probe: what decided a ProbeFailed.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Probes []ProbeStatus `json:"probes,omitempty"`
}

// ImplementationActivation selects, by digest, the implementation of each
// module on one node; the node's manager verifies, starts and hot-swaps the
// providers.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=iact,categories=iteron
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Modules",type=integer,JSONPath=`.status.moduleCount`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.activeCount`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 40",message="metadata.name must be at most 40 characters (Generation names are derived from it)"
type ImplementationActivation struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata; the name is at most 40
	// characters.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the desired set of implementations.
	// +required
	Spec ImplementationActivationSpec `json:"spec"`

	// status is the observed state, written by the node's manager.
	// +optional
	// +kubebuilder:default={}
	Status ImplementationActivationStatus `json:"status,omitzero"`
}

// ImplementationActivationList is a list of ImplementationActivation.
//
// +kubebuilder:object:root=true
type ImplementationActivationList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	// items are the activations.
	Items []ImplementationActivation `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ImplementationActivation{}, &ImplementationActivationList{})
}
