package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ActivationTemplate is an ImplementationActivation's spec without nodeName
// and paused: what the ActivationSet controller stamps on every selected
// node. Its fields, their defaults and their validation are those of
// ImplementationActivationSpec (a test keeps the two schemas equal), so a
// stamped activation's spec is the template plus the node's name.
// +kubebuilder:validation:XValidation:rule="!has(self.sources) || self.sources.all(a, self.sources.exists_one(b, b.implementationID == a.implementationID))",message="sources[].implementationID must be unique"
type ActivationTemplate struct {
	// candidateSHA256 is the opaque identity of this candidate selection,
	// bound into every run and every ledger record on every node.
	// +required
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	CandidateSHA256 string `json:"candidateSHA256"`

	// sources select one implementation per module, keyed by module. The
	// catalog and artifact paths name files on each node: every selected
	// node must hold the same bytes there.
	// +optional
	// +listType=map
	// +listMapKey=module
	// +kubebuilder:validation:MaxItems=64
	Sources []ActivationSource `json:"sources,omitempty"`

	// capabilityCeiling narrows each node's capability ceiling for the
	// stamped activations; it can never widen it. Empty means each node's
	// ceiling.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=5
	CapabilityCeiling []Capability `json:"capabilityCeiling,omitempty"`

	// swap bounds and shapes the transactions on each node.
	// +optional
	// +kubebuilder:default={}
	Swap SwapPolicy `json:"swap,omitzero"`

	// checkpoint says how often Active state is made durable on each node.
	// +optional
	// +kubebuilder:default={}
	Checkpoint CheckpointPolicy `json:"checkpoint,omitzero"`

	// generationHistoryLimit is the number of Inactive or Failed Generation
	// objects kept per module on each node.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	GenerationHistoryLimit *int32 `json:"generationHistoryLimit,omitempty"`
}

// FailurePolicy says what a rollout does when a node it moved goes Stalled.
// +kubebuilder:validation:Enum=Halt;Revert
type FailurePolicy string

const (
	// FailurePolicyHalt stops the rollout where it is: moved nodes stay on
	// the new revision, the failed node keeps serving its old generation,
	// nodes not reached keep theirs. A person decides (kubectl iteron rollout
	// status|resume|undo).
	FailurePolicyHalt FailurePolicy = "Halt"
	// FailurePolicyRevert stops the rollout and moves every node that left
	// the stable revision back to it, wave by wave, with
	// revertStateDisposition.
	FailurePolicyRevert FailurePolicy = "Revert"
)

// CanaryStrategy is the first wave of a rollout and its soak.
type CanaryStrategy struct {
	// nodes is how many nodes the first wave moves (the first ones by node
	// name). The rollout goes on only once every canary is Ready and has
	// stayed Ready for soakSeconds.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Nodes int32 `json:"nodes,omitempty"`

	// soakSeconds is how long every canary must stay Ready before the next
	// wave starts; a canary that is not Ready during the soak restarts it,
	// one that goes Stalled fails the rollout.
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	SoakSeconds *int32 `json:"soakSeconds,omitempty"`
}

// RolloutStrategy says how a new template reaches the selected nodes.
type RolloutStrategy struct {
	// canary, when set, is a first wave of its own with a soak time. Unset:
	// the rollout starts with a wave of maxUnavailable nodes.
	// +optional
	Canary *CanaryStrategy `json:"canary,omitempty"`

	// maxUnavailable bounds the nodes that are not Ready while the rollout
	// changes nodes: a wave moves at most maxUnavailable minus the nodes
	// already not Ready, and the next wave starts only once every moved
	// node is Ready. An integer (at least 1) or a percentage of the selected
	// nodes ("25%", rounded down, at least 1 node).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer of at least 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// onFailure is Halt (stop where the rollout is) or Revert (move the
	// nodes that left the stable revision back to it) when a node the
	// rollout moved goes Stalled (its swap failed; its old generation still
	// serves there).
	// +optional
	// +kubebuilder:default=Halt
	OnFailure FailurePolicy `json:"onFailure,omitempty"`

	// revertStateDisposition is the stateDisposition of the swaps a revert
	// makes: Migrate carries each node's state back (the previous
	// implementation must read the newer state layout: a down-migration),
	// Discard starts the previous implementation with empty state (for
	// providers without a down-migration). status.halt says which a revert
	// used.
	// +optional
	// +kubebuilder:default=Migrate
	RevertStateDisposition StateDisposition `json:"revertStateDisposition,omitempty"`
}

// ActivationSetSpec is the desired activation of many nodes.
type ActivationSetSpec struct {
	// nodeSelector selects the Nodes that get an activation (by their
	// labels). An empty selector selects every node.
	// +required
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`

	// template is the spec every selected node's ImplementationActivation
	// gets, with that node's name. A change is rolled out wave by wave per
	// strategy; the controller never changes the template.
	// +required
	Template ActivationTemplate `json:"template"`

	// strategy says how a changed template reaches the nodes.
	// +optional
	// +kubebuilder:default={}
	Strategy RolloutStrategy `json:"strategy,omitzero"`

	// paused stops the rollout: no node is moved to another revision. New
	// matching nodes still get the stable revision, nodes that stop
	// matching lose their activation, and hand edits are still set back.
	// Argo CD reports a paused set as Suspended.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// revisionHistoryLimit is the number of template revisions
	// (ControllerRevisions) kept besides the ones nodes are on.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	RevisionHistoryLimit *int32 `json:"revisionHistoryLimit,omitempty"`
}

// RolloutPhase is where a rollout stands, in one word (the PHASE column).
// +kubebuilder:validation:Enum=Progressing;Soaking;Paused;Completed;Halted;Reverting;Reverted;RevertFailed;Deleting
type RolloutPhase string

// Rollout phases.
const (
	// RolloutProgressing: a wave is being moved or is becoming Ready.
	RolloutProgressing RolloutPhase = "Progressing"
	// RolloutSoaking: the canaries are Ready and must stay so for the soak.
	RolloutSoaking RolloutPhase = "Soaking"
	// RolloutPaused: spec.paused is true; no node is moved.
	RolloutPaused RolloutPhase = "Paused"
	// RolloutCompleted: every selected node is Ready on the update revision.
	RolloutCompleted RolloutPhase = "Completed"
	// RolloutHalted: a moved node went Stalled; onFailure is Halt.
	RolloutHalted RolloutPhase = "Halted"
	// RolloutReverting: a moved node went Stalled; moved nodes go back.
	RolloutReverting RolloutPhase = "Reverting"
	// RolloutReverted: every node is back on the stable revision.
	RolloutReverted RolloutPhase = "Reverted"
	// RolloutRevertFailed: a node could not go back (it went Stalled on the
	// stable revision: for example its provider has no down-migration).
	RolloutRevertFailed RolloutPhase = "RevertFailed"
	// RolloutDeleting: the set is being deleted; its activations are retired.
	RolloutDeleting RolloutPhase = "Deleting"
)

// FailedNode is a node whose activation is Stalled.
type FailedNode struct {
	// node is the node's name.
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// activation is the stamped ImplementationActivation.
	// +kubebuilder:validation:MaxLength=40
	Activation string `json:"activation"`
	// revision is the revision (ControllerRevision) the node was on.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Revision string `json:"revision,omitempty"`
	// reason is the Stalled condition's reason (for example
	// ActivationFailed).
	// +kubebuilder:validation:MaxLength=128
	Reason string `json:"reason"`
	// message is the Stalled condition's message, at most 512 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// NodeConflictReason says why a selected node has no stamped activation.
// +kubebuilder:validation:Enum=NotOwned;NameCollision
type NodeConflictReason string

const (
	// ConflictNotOwned: an activation with the node's stamped name exists
	// and this set did not stamp it; it is never adopted or changed.
	ConflictNotOwned NodeConflictReason = "NotOwned"
	// ConflictNameCollision: another selected node's stamped name is the
	// same; the node whose name sorts first keeps it.
	ConflictNameCollision NodeConflictReason = "NameCollision"
)

// NodeConflict is a selected node the set cannot stamp an activation for.
type NodeConflict struct {
	// node is the node's name.
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// activation is the stamped name the node would get.
	// +kubebuilder:validation:MaxLength=40
	Activation string `json:"activation"`
	// reason is NotOwned or NameCollision.
	Reason NodeConflictReason `json:"reason"`
	// message explains reason, at most 512 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// RolloutHalt records a rollout stopped by a failed node. It stays until the
// template changes or the rollout is resumed (iteron.dev/resume).
type RolloutHalt struct {
	// revision is the update revision that failed.
	// +kubebuilder:validation:MaxLength=253
	Revision string `json:"revision"`
	// toRevision is the stable revision a revert moves nodes back to.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ToRevision string `json:"toRevision,omitempty"`
	// action is Halt or Revert (spec.strategy.onFailure when it happened).
	Action FailurePolicy `json:"action"`
	// stateDisposition is how a revert moves state back: Migrate (state
	// carried to the previous implementation) or Discard (it starts empty).
	// Empty for Halt.
	// +optional
	StateDisposition StateDisposition `json:"stateDisposition,omitempty"`
	// at is when the rollout stopped.
	At metav1.Time `json:"at"`
	// nodes are the nodes that failed, at most 16.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	Nodes []string `json:"nodes,omitempty"`
	// message says what failed where, at most 1 KiB.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// ActivationSetStatus is the observed state of a set's rollout.
type ActivationSetStatus struct {
	// observedGeneration is the metadata.generation the status describes at
	// rest (Completed, Halted, Reverted, RevertFailed or Paused); while a
	// rollout moves it stays behind, so kstatus reads InProgress.
	// +optional
	// +kubebuilder:default=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready, Reconciling, Stalled (kstatus).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// phase is where the rollout stands.
	// +optional
	Phase RolloutPhase `json:"phase,omitempty"`
	// currentRevision is the stable revision (a ControllerRevision named
	// <set>-<hash>): what every node ran when the last rollout completed,
	// and what new nodes get while a rollout is under way.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CurrentRevision string `json:"currentRevision,omitempty"`
	// updateRevision is the revision of spec.template.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	UpdateRevision string `json:"updateRevision,omitempty"`
	// collisionCount counts hash collisions of revision names; it is mixed
	// into the next hash.
	// +optional
	CollisionCount *int32 `json:"collisionCount,omitempty"`
	// desiredNodes is the number of selected nodes.
	// +optional
	DesiredNodes int32 `json:"desiredNodes"`
	// updatedNodes is the number of nodes whose activation is on the update
	// revision.
	// +optional
	UpdatedNodes int32 `json:"updatedNodes"`
	// readyNodes is the number of nodes whose activation is Ready for its
	// current spec.
	// +optional
	ReadyNodes int32 `json:"readyNodes"`
	// failedNodes is the number of nodes whose activation is Stalled.
	// +optional
	FailedNodes int32 `json:"failedNodes"`
	// wave is the number of the rollout's current wave (1 is the canary
	// when there is one); 0 before the first.
	// +optional
	Wave int32 `json:"wave"`
	// waveNodes are the nodes of the current wave, at most 32.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	WaveNodes []string `json:"waveNodes,omitempty"`
	// soakStartedAt is when every canary was first seen Ready for the
	// update revision.
	// +optional
	SoakStartedAt *metav1.Time `json:"soakStartedAt,omitempty"`
	// soakedRevision is the update revision whose canaries completed their
	// soak: later waves do not soak again.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SoakedRevision string `json:"soakedRevision,omitempty"`
	// halt, when set, is a rollout stopped by a failed node.
	// +optional
	Halt *RolloutHalt `json:"halt,omitempty"`
	// failed are the nodes whose activation is Stalled, by node name, at
	// most 16 (failedNodes counts them all).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Failed []FailedNode `json:"failed,omitempty"`
	// conflicts are selected nodes without a stamped activation, at most 16.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Conflicts []NodeConflict `json:"conflicts,omitempty"`
	// lastHandledResumeAt echoes the iteron.dev/resume annotation last acted
	// on.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	LastHandledResumeAt string `json:"lastHandledResumeAt,omitempty"`
}

// ActivationSet rolls one activation template out across the nodes its
// selector matches: one ImplementationActivation per node, changed wave by
// wave, stopped by the first node that fails.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=aset,categories=iteron
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredNodes`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedNodes`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.failedNodes`
// +kubebuilder:printcolumn:name="Wave",type=integer,JSONPath=`.status.wave`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.updateRevision`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="metadata.name must be at most 63 characters (it is a label value on every stamped activation)"
type ActivationSet struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata; the name is at most 63
	// characters.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the template, the nodes and the rollout strategy.
	// +required
	Spec ActivationSetSpec `json:"spec"`

	// status is the rollout's observed state, written by the fleet
	// controller.
	// +optional
	// +kubebuilder:default={}
	Status ActivationSetStatus `json:"status,omitzero"`
}

// ActivationSetList is a list of ActivationSet.
//
// +kubebuilder:object:root=true
type ActivationSetList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	// items are the sets.
	Items []ActivationSet `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ActivationSet{}, &ActivationSetList{})
}
