package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ActivationProbe is a synthetic call the node's manager makes to a module
// once its desired generation serves, before it reports the activation
// Ready: for modules that no caller exercises yet. The module must be
// admitted read_only (a probe has no side effects and leaves no receipts);
// the manager refuses a spec whose probe names any other module.
type ActivationProbe struct {
	// name identifies the probe in status (a DNS label).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// module is the module called: one of sources[].module, admitted
	// read_only.
	// +required
	// +kubebuilder:validation:MaxLength=48
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9_]{0,47}$`
	Module string `json:"module"`

	// input is the run's input: one JSON object, as a caller would send it.
	// +required
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=4096
	Input string `json:"input"`

	// check is a CEL expression over `result`, the terminal observation as
	// JSON (a map for an object), that must be true: for example
	// `result.upper == "ABC"`. An answer it rejects, or that does not come
	// within timeoutMilliseconds, fails the probe.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Check string `json:"check"`

	// timeoutMilliseconds bounds the call, its wait in the module's queue
	// included: the latency bound. A slower answer fails the probe.
	// +optional
	// +kubebuilder:default=5000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=60000
	TimeoutMilliseconds *int32 `json:"timeoutMilliseconds,omitempty"`
}

// ProbePhase is a probe's outcome.
// +kubebuilder:validation:Enum=Passed;Failed
type ProbePhase string

// Probe outcomes.
const (
	// ProbePassed: the answer came in time and the check was true.
	ProbePassed ProbePhase = "Passed"
	// ProbeFailed: the call failed, was too slow, or the check was false
	// or could not be evaluated.
	ProbeFailed ProbePhase = "Failed"
)

// ProbeStatus is the outcome of one probe against one generation.
type ProbeStatus struct {
	// name is the probe's name.
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// module is the module probed.
	// +kubebuilder:validation:MaxLength=48
	Module string `json:"module"`
	// generationName is the Generation that answered (the probe runs again
	// for another generation or another spec).
	// +kubebuilder:validation:MaxLength=253
	GenerationName string `json:"generationName"`
	// specGeneration is the activation's metadata.generation it ran for.
	SpecGeneration int64 `json:"specGeneration"`
	// phase is Passed or Failed.
	Phase ProbePhase `json:"phase"`
	// latencyMilliseconds is how long the call took.
	// +optional
	LatencyMilliseconds int64 `json:"latencyMilliseconds,omitempty"`
	// result is the answer (the terminal observation), at most 256 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Result string `json:"result,omitempty"`
	// message says what decided the phase, at most 512 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
	// at is when the probe ran.
	At metav1.Time `json:"at"`
}
