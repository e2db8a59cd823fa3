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
// +kubebuilder:validation:XValidation:rule="!has(self.probes) || self.probes.all(p, has(self.sources) && self.sources.exists(s, s.module == p.module))",message="probes[].module must be one of sources[].module"
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

	// probes are synthetic calls the node's manager makes once every module
	// serves its desired generation, before it reports Ready: a failed
	// probe makes the activation Stalled (reason ProbeFailed). Each names a
	// module of sources admitted read_only.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Probes []ActivationProbe `json:"probes,omitempty"`
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

// WaveStep is a wave of the rollout: the nodes it moves, by count, by
// percentage or by label cohort, and how long they soak once Ready.
// +kubebuilder:validation:XValidation:rule="!(has(self.nodes) && has(self.percent))",message="give nodes or percent, not both"
// +kubebuilder:validation:XValidation:rule="has(self.nodes) || has(self.percent) || has(self.selector)",message="a wave moves nodes, a percent of them or a label cohort (selector)"
type WaveStep struct {
	// nodes is how many nodes this wave moves (among those selector
	// matches, when set).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Nodes *int32 `json:"nodes,omitempty"`

	// percent is the share of the selected nodes (of those selector
	// matches, when set) this wave moves, rounded up: at least one node.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Percent *int32 `json:"percent,omitempty"`

	// selector is a cohort: only nodes with these labels move in this wave
	// (every such node that has not moved yet, unless nodes or percent
	// bound it). Cohort waves in order move, for example, one zone or one
	// hardware class after another.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// soakSeconds is how long the wave's nodes must stay Ready before the
	// next step; a node that is not Ready restarts it. Analyses run while
	// a wave soaks.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	SoakSeconds *int32 `json:"soakSeconds,omitempty"`
}

// PauseStep stops the rollout between waves.
type PauseStep struct {
	// durationSeconds ends the pause by itself after this long. Unset: the
	// rollout waits for kubectl iteron rollout promote (the
	// iteron.dev/promote annotation).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	DurationSeconds *int32 `json:"durationSeconds,omitempty"`
}

// RolloutStep is one step of a rollout: a wave or a pause.
// +kubebuilder:validation:XValidation:rule="has(self.wave) != has(self.pause)",message="a step is either a wave or a pause"
type RolloutStep struct {
	// wave moves nodes to the new revision.
	// +optional
	Wave *WaveStep `json:"wave,omitempty"`
	// pause waits for a promotion or a duration.
	// +optional
	Pause *PauseStep `json:"pause,omitempty"`
}

// AnalysisMetric is one measurement made, count times every interval, while
// each wave soaks (Argo Rollouts' AnalysisTemplate metric): the wave goes on
// once every metric succeeded, and fails (onFailure) once more than
// failureLimit measurements failed or more than consecutiveErrorLimit in a
// row could not be made.
type AnalysisMetric struct {
	// name identifies the metric in status and events (a DNS label).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// provider is the name of the AnalysisProvider (cluster-scoped) that
	// answers.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Provider string `json:"provider"`

	// query is the PromQL instant query (a Prometheus provider; unused by a
	// webhook). {{revision}} is the new revision's hash (the managers'
	// call metrics carry it as the label revision), {{nodes}} a regular
	// expression matching exactly the wave's nodes (node=~"{{nodes}}"),
	// {{wave}}, {{set}} and {{namespace}} what they say.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query,omitempty"`

	// successCondition is a CEL expression that must be true for a
	// measurement to succeed. For a Prometheus provider `result` is the
	// list of the vector's values (a scalar is a list of one) and `series`
	// the list of {labels, value}: `result.size() > 0 && result.all(v, v <
	// 0.05)`. For a webhook `status` is the HTTP status and `result` the
	// JSON body; default `status >= 200 && status < 300`.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	SuccessCondition string `json:"successCondition,omitempty"`

	// intervalSeconds is the time between measurements; the first is made
	// one interval after the wave's nodes are Ready.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	IntervalSeconds *int32 `json:"intervalSeconds,omitempty"`

	// count is the number of measurements per wave.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Count *int32 `json:"count,omitempty"`

	// failureLimit is the number of failed measurements a wave tolerates.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	FailureLimit *int32 `json:"failureLimit,omitempty"`

	// consecutiveErrorLimit is the number of measurements in a row that
	// could not be made (no answer in time, a refused query, an answer too
	// large) a wave tolerates.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	ConsecutiveErrorLimit *int32 `json:"consecutiveErrorLimit,omitempty"`
}

// RolloutAnalysis is what judges each wave.
type RolloutAnalysis struct {
	// metrics are measured while each wave soaks.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	Metrics []AnalysisMetric `json:"metrics"`
}

// RolloutStrategy says how a new template reaches the selected nodes.
// +kubebuilder:validation:XValidation:rule="!(has(self.canary) && has(self.steps))",message="give canary or steps, not both (a canary is a first wave step)"
type RolloutStrategy struct {
	// canary, when set, is a first wave of its own with a soak time. Unset:
	// the rollout starts with a wave of maxUnavailable nodes.
	// +optional
	Canary *CanaryStrategy `json:"canary,omitempty"`

	// steps, when set, are the rollout's first waves and pauses, in order
	// (instead of canary); the nodes left after the last step move in
	// waves of maxUnavailable. Every wave moves at most maxUnavailable
	// nodes that are Ready at a time.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Steps []RolloutStep `json:"steps,omitempty"`

	// analysis, when set, is measured while each wave soaks (the waves of
	// steps or canary, and each later wave): a wave whose analysis fails is
	// a failed wave (onFailure).
	// +optional
	Analysis *RolloutAnalysis `json:"analysis,omitempty"`

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
// +kubebuilder:validation:Enum=Progressing;Soaking;Paused;PausedAtStep;Completed;Halted;Reverting;Reverted;RevertFailed;Deleting
type RolloutPhase string

// Rollout phases.
const (
	// RolloutProgressing: a wave is being moved or is becoming Ready.
	RolloutProgressing RolloutPhase = "Progressing"
	// RolloutSoaking: the canaries are Ready and must stay so for the soak.
	RolloutSoaking RolloutPhase = "Soaking"
	// RolloutPaused: spec.paused is true; no node is moved.
	RolloutPaused RolloutPhase = "Paused"
	// RolloutPausedAtStep: the rollout waits at a pause step for kubectl
	// iteron rollout promote.
	RolloutPausedAtStep RolloutPhase = "PausedAtStep"
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
	// cause is what stopped the rollout: NodeFailed (a moved node went
	// Stalled), AnalysisFailed (a wave's analysis failed), ProbeFailed (a
	// moved node's probe failed) or Aborted (kubectl iteron rollout abort).
	// +optional
	Cause HaltCause `json:"cause,omitempty"`
}

// HaltCause is what stopped a rollout.
// +kubebuilder:validation:Enum=NodeFailed;AnalysisFailed;ProbeFailed;Aborted
type HaltCause string

// Halt causes.
const (
	// HaltNodeFailed: a node the rollout moved went Stalled.
	HaltNodeFailed HaltCause = "NodeFailed"
	// HaltAnalysisFailed: a wave's analysis failed.
	HaltAnalysisFailed HaltCause = "AnalysisFailed"
	// HaltProbeFailed: a probe on a node the rollout moved failed.
	HaltProbeFailed HaltCause = "ProbeFailed"
	// HaltAborted: kubectl iteron rollout abort (always a revert).
	HaltAborted HaltCause = "Aborted"
)

// AnalysisPhase is where an analysis run stands.
// +kubebuilder:validation:Enum=Running;Successful;Failed;Error
type AnalysisPhase string

// Analysis phases (of a run and of a measurement; a measurement is never
// Running).
const (
	// AnalysisRunning: measurements are still due.
	AnalysisRunning AnalysisPhase = "Running"
	// AnalysisSuccessful: every measurement was made, at most failureLimit
	// of them failed (a measurement: its condition was true).
	AnalysisSuccessful AnalysisPhase = "Successful"
	// AnalysisFailed: more than failureLimit measurements failed (a
	// measurement: its condition was false).
	AnalysisFailed AnalysisPhase = "Failed"
	// AnalysisError: more than consecutiveErrorLimit measurements in a row
	// could not be made (a measurement: it could not be made, or its
	// condition could not be evaluated).
	AnalysisError AnalysisPhase = "Error"
)

// Measurement is one measurement of an analysis metric.
type Measurement struct {
	// at is when it was made.
	At metav1.Time `json:"at"`
	// phase is Successful, Failed or Error.
	Phase AnalysisPhase `json:"phase"`
	// value is what was measured (the query's values, or the webhook's
	// status and body), at most 256 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Value string `json:"value,omitempty"`
	// message says why, for a failure or an error, at most 256 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// AnalysisRun is one metric measured for one wave of one revision.
type AnalysisRun struct {
	// metric is spec.strategy.analysis.metrics[].name.
	// +kubebuilder:validation:MaxLength=63
	Metric string `json:"metric"`
	// provider is the AnalysisProvider that answered.
	// +kubebuilder:validation:MaxLength=253
	Provider string `json:"provider"`
	// revision is the update revision measured.
	// +kubebuilder:validation:MaxLength=253
	Revision string `json:"revision"`
	// wave is the wave measured.
	Wave int32 `json:"wave"`
	// phase is where the run stands.
	Phase AnalysisPhase `json:"phase"`
	// startedAt is when the wave's nodes were all Ready.
	StartedAt metav1.Time `json:"startedAt"`
	// finishedAt is when the run succeeded or failed.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// successful, failed and errors count the measurements.
	// +optional
	Successful int32 `json:"successful"`
	// +optional
	Failed int32 `json:"failed"`
	// +optional
	Errors int32 `json:"errors"`
	// consecutiveErrors counts the errors since the last measurement made.
	// +optional
	ConsecutiveErrors int32 `json:"consecutiveErrors,omitempty"`
	// measurements are the newest measurements, at most 10.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	Measurements []Measurement `json:"measurements,omitempty"`
	// message says what decided the phase, at most 512 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=512
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
	// lastHandledPromoteAt echoes the iteron.dev/promote annotation last
	// acted on.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	LastHandledPromoteAt string `json:"lastHandledPromoteAt,omitempty"`
	// lastHandledAbortAt echoes the iteron.dev/abort annotation last acted
	// on.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	LastHandledAbortAt string `json:"lastHandledAbortAt,omitempty"`
	// step is the step of spec.strategy.steps (or the canary, step 1) the
	// rollout is at, from 1; past the last step, the nodes left move in
	// waves of maxUnavailable. 0 when no rollout is under way.
	// +optional
	Step int32 `json:"step,omitempty"`
	// stepStartedAt is when the rollout reached a timed pause step.
	// +optional
	StepStartedAt *metav1.Time `json:"stepStartedAt,omitempty"`
	// analysisRuns are the analysis runs of the newest waves, newest
	// first, at most 16: each metric measured for each wave, with the
	// values that decided it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	AnalysisRuns []AnalysisRun `json:"analysisRuns,omitempty"`
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
