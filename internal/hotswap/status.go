package hotswap

import (
	"time"

	"iteron.dev/operator/internal/effects"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/ledger"
)

// ActivationKey identifies an activation on this node.
type ActivationKey struct {
	// Namespace and Name of the ImplementationActivation.
	Namespace, Name string
	// UID keys its ledger and snapshots: a re-created activation of the same
	// name starts afresh.
	UID string
}

// Failure is a target that failed; it is not retried until the controller
// hands a new target (a new attempt).
type Failure struct {
	// Module is the module.
	Module string
	// GenerationName is the failed target.
	GenerationName string
	// Code is the reason code; Message explains it (≤ 1 KiB).
	Code, Message string
	// Retryable marks an attempt that was cut short by a manager restart
	// rather than failed by its provider: a new attempt follows without a
	// retry request.
	Retryable bool
}

// ActivationStatus is a consistent snapshot of one activation's runtime
// state, for the controllers.
type ActivationStatus struct {
	// Key identifies the activation.
	Key ActivationKey
	// AppliedSpecGeneration is the metadata.generation of the last Apply.
	AppliedSpecGeneration int64
	// Busy is true while a transaction runs or work of the applied plan is
	// left to do.
	Busy bool
	// Removing is true after Remove; Removed once every module is retired.
	Removing, Removed bool
	// Modules are the modules the coordinator knows, by module.
	Modules map[string]ModuleStatus
	// Generations are the generations the coordinator knows, by name.
	Generations map[string]GenerationStatus
	// Targets are the generations the applied plan asks for, by module (a
	// module the plan keeps as it runs names none).
	Targets map[string]string
	// Failures are the failed targets of the applied plan.
	Failures []Failure
	// FailedAttempts are every attempt known to have failed or been cut
	// short, by Generation name: an attempt number is never reused.
	FailedAttempts map[string]Failure
	// Ledger summarizes the activation's ledger (nil before it is opened).
	Ledger *ledger.Summary
	// LedgerFile is the ledger's directory.
	LedgerFile string
	// LedgerError is set when the ledger is corrupt: nothing is done for
	// the activation until an operator resolves it.
	LedgerError string
	// LedgerUnwritable explains a ledger that cannot be written now (disk
	// full, I/O error): transactions wait, serving modules keep serving,
	// and the coordinator resumes once writes succeed.
	LedgerUnwritable string
}

// ModuleStatus is one module's runtime state.
type ModuleStatus struct {
	// Module is the module.
	Module string
	// Active is the active generation's name ("" when none).
	Active string
	// ImplementationID of the active generation.
	ImplementationID string
	// Lineage of the active generation.
	Lineage int64
	// Epoch of the active generation.
	Epoch string
	// AdmittedCapabilities of the active generation.
	AdmittedCapabilities []string
	// AuthoritySHA256 is the digest of AdmittedCapabilities.
	AuthoritySHA256 string
	// Attempt of the active generation.
	Attempt int32
	// Phase is the active generation's phase, or Inactive/Failed when none
	// serves.
	Phase iteronv1.ModulePhase
	// Serving is true while a process of the active generation serves calls.
	Serving bool
	// Reason and Message explain a module that is not Active.
	Reason, Message string
	// Pid of the active process.
	Pid int
	// Committed is the ledger's last committed generation when the module
	// has none active (after a manager restart, until it is relaunched).
	Committed *CommittedGeneration
}

// GenerationStatus is one generation's runtime state, mirrored into its
// Generation object's status.
type GenerationStatus struct {
	Name    string
	Module  string
	Lineage int64
	Attempt int32
	Phase   iteronv1.ModulePhase
	Step    iteronv1.GenerationStep
	Pid     int
	// LastPid is the pid of the generation's last process, kept after it
	// is gone (for evidence and doctor).
	LastPid          int
	ProcessStartedAt time.Time
	Renewals         int32
	StateSHA256      string
	LastCheckpoint   *CheckpointInfo
	Reason, Message  string
	StderrTail       string
	StderrDropped    int64
	Receipts         ReceiptCounts
	// Resources are the live resources the generation's EffectScope holds
	// (process, route, crash-watch, streams …), in the order they were
	// registered; empty once it is disposed.
	Resources        []effects.Resource
	TransactionID    string
	LastSequence     uint64
	LastRecordSHA256 string
	StartedAt        time.Time
	ActivatedAt      time.Time
	DrainedAt        time.Time
	// Sandbox is what its process's sandbox applied (nil without one).
	Sandbox *iteronv1.SandboxStatus
}

// CheckpointInfo is the newest durable snapshot of a generation.
type CheckpointInfo struct {
	StateSHA256 string
	At          time.Time
}

// ReceiptCounts summarizes a generation's receipts.
type ReceiptCounts struct {
	Total, Irreversible int32
	// Truncated is true when receipts are missing: evicted, or lost with a
	// manager restart (IncompleteReason says which).
	Truncated bool
	// ReversibleRuns counts the generation's reversible runs (no receipt
	// each).
	ReversibleRuns int64
	// IncompleteReason says why the evidence is incomplete ("" when it is
	// complete).
	IncompleteReason string
}
