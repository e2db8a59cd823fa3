package doctor

import (
	"iteron.dev/operator/internal/reasons"
	"time"
)

// Severity says whether a finding keeps the activation from being healthy.
type Severity string

const (
	// SeverityProblem is something that keeps the activation from serving
	// its desired state, or that needs a person: the CLI exits 1.
	SeverityProblem Severity = "problem"
	// SeverityInfo is context that needs no action (a paused activation
	// whose spec runs, a Node whose existence cannot be known).
	SeverityInfo Severity = "info"
)

// Finding codes: stable, machine-readable, documented one by one in
// docs/troubleshooting.md.
const (
	// FindingModuleNotActive: a module has no Active generation.
	FindingModuleNotActive = "module_not_active"
	// FindingSwapFailed: a module serves its old generation; the new one
	// failed and is not retried for the same target.
	FindingSwapFailed = "swap_failed"
	// FindingDependencyBlocked: a module waits for a dependency that does
	// not serve.
	FindingDependencyBlocked = "dependency_blocked"
	// FindingOptionalDependencyMissing: a module is Active without an
	// optional requirement of the seam graph (its status diagnostics).
	FindingOptionalDependencyMissing = "optional_dependency_missing"
	// FindingPlanWaiting: a module waits because an earlier transaction of
	// the same plan failed (a plan is not atomic across modules).
	FindingPlanWaiting = "plan_waiting"
	// FindingSpecNotApplied: the spec asks for an implementation (or a set
	// of modules) that status does not show running.
	FindingSpecNotApplied = "spec_not_applied"
	// FindingNotReady: Ready is not True for the current spec and nothing
	// more specific explains it (a transaction in progress, usually).
	FindingNotReady = "not_ready"
	// FindingStalled: Stalled is True; the manager will not progress
	// without a change.
	FindingStalled = "stalled"
	// FindingPaused: spec.paused is true.
	FindingPaused = "paused"
	// FindingRetryPending: the iteron.dev/retry annotation differs from
	// status.lastHandledRetryAt.
	FindingRetryPending = "retry_pending"
	// FindingNotObserved: status.observedGeneration (or a condition's) lags
	// metadata.generation: the manager has not acted on the current spec.
	FindingNotObserved = "not_observed"
	// FindingNodeMissing: the Node spec.nodeName names does not exist while
	// other Nodes do: no manager runs there.
	FindingNodeMissing = "node_missing"
	// FindingNodeUnknown: whether the Node exists cannot be known (no Node
	// objects at all, or Nodes not readable).
	FindingNodeUnknown = "node_unknown"
	// FindingFinalizerStuck: the activation is being deleted and its
	// finalizer is held for a Node that no longer exists.
	FindingFinalizerStuck = "finalizer_stuck"
	// FindingDeletionPending: the activation is being deleted and the
	// manager has not released its finalizer yet (the Node exists or its
	// existence is unknown).
	FindingDeletionPending = "deletion_pending"
	// FindingLedgerCorrupt: the ledger does not verify (the status says so,
	// or the file on the node broke a rule).
	FindingLedgerCorrupt = reasons.LedgerCorrupt
	// FindingLedgerUnreadable: --state-dir was given but the ledger could
	// not be read (missing, permissions).
	FindingLedgerUnreadable = "ledger_unreadable"
	// FindingOrphanedProcess: a recorded provider group is alive but no
	// activation's status shows it serving.
	FindingOrphanedProcess = "orphaned_process"
	// FindingUnconfirmedProcess: a recorded provider group is alive, is not
	// claimed by any status yet, and started within the grace period (a
	// transaction in progress, most likely).
	FindingUnconfirmedProcess = "unconfirmed_process"
	// FindingStaleProcessRecord: a process record names a process that is
	// gone (or a pid now reused): the manager that wrote it did not remove it.
	FindingStaleProcessRecord = "stale_process_record"
	// FindingStateDirUnreadable: --state-dir was given but could not be read.
	FindingStateDirUnreadable = "state_dir_unreadable"
	// FindingReceiptsUnreadable: the activation's receipts file, or a line
	// of it, could not be read: the receipts it held are lost (the others
	// are still cited).
	FindingReceiptsUnreadable = "receipts_unreadable"
	// FindingPartialView: some objects could not be read (RBAC); the
	// diagnosis may miss something.
	FindingPartialView = "partial_view"
)

// Finding is one thing the doctor found.
type Finding struct {
	// Code is one of the Finding* constants.
	Code string `json:"code"`
	// Severity is problem or info.
	Severity Severity `json:"severity"`
	// Module is the module concerned, "" for the activation as a whole.
	Module string `json:"module,omitempty"`
	// Summary says what is wrong, in one sentence with the names and
	// values involved.
	Summary string `json:"summary"`
	// Hint says what to do, when the fix is not a single command.
	Hint string `json:"hint,omitempty"`
	// Commands are the exact commands that clear the finding, in order;
	// Hint says when they are safe to run.
	Commands []string `json:"commands,omitempty"`
}

// ObjectRef names the diagnosed activation.
type ObjectRef struct {
	// Namespace and Name of the ImplementationActivation.
	Namespace string `json:"namespace"`
	// Name of the ImplementationActivation.
	Name string `json:"name"`
	// UID keys its ledger.
	UID string `json:"uid"`
	// NodeName is spec.nodeName.
	NodeName string `json:"nodeName"`
}

// ConditionSummary is one condition of the activation.
type ConditionSummary struct {
	// Type is Ready, Reconciling, Stalled, Degraded or Verified.
	Type string `json:"type"`
	// Status is True, False or Unknown; "Missing" when the manager never
	// wrote it.
	Status string `json:"status"`
	// Reason is the condition's CamelCase reason.
	Reason string `json:"reason,omitempty"`
	// Message explains it.
	Message string `json:"message,omitempty"`
	// Stale is true when the condition describes an older spec than
	// metadata.generation.
	Stale bool `json:"stale,omitempty"`
}

// RetryStatus compares the iteron.dev/retry annotation with its echo.
type RetryStatus struct {
	// Requested is the annotation's value.
	Requested string `json:"requested,omitempty"`
	// Handled is status.lastHandledRetryAt.
	Handled string `json:"handled,omitempty"`
	// Pending is true when a request has not been handled.
	Pending bool `json:"pending"`
}

// NodeState says what is known of the Node spec.nodeName names.
type NodeState string

const (
	// NodePresent: the Node object exists.
	NodePresent NodeState = "present"
	// NodeMissing: it does not, while other Node objects do.
	NodeMissing NodeState = "missing"
	// NodeUnknown: the cluster has no Node objects at all (a control plane
	// without kubelets), or Nodes could not be read.
	NodeUnknown NodeState = "unknown"
)

// NodeStatus is what the doctor knows of the activation's Node.
type NodeStatus struct {
	// Name is spec.nodeName.
	Name string `json:"name"`
	// State is present, missing or unknown.
	State NodeState `json:"state"`
	// Detail says why the state is unknown.
	Detail string `json:"detail,omitempty"`
}

// SandboxSummary is the sandbox of one module's active generation.
type SandboxSummary struct {
	// Module is the module.
	Module string `json:"module"`
	// Generation names the Generation.
	Generation string `json:"generation"`
	// Sandbox is what its sandbox applied, as the ledger's note says it.
	Sandbox string `json:"sandbox"`
	// Violations are what it did under --sandbox=audit that the enforced
	// sandbox refuses, by syscall.
	Violations map[string]int64 `json:"violations,omitempty"`
}

// GenerationSummary is a Generation as the doctor shows it.
type GenerationSummary struct {
	// Name of the Generation object.
	Name string `json:"name"`
	// Lineage and Attempt are spec.generation and spec.attempt.
	Lineage int64 `json:"lineage"`
	// Attempt is spec.attempt.
	Attempt int32 `json:"attempt"`
	// ImplementationID and Version are the implementation it runs.
	ImplementationID string `json:"implementationID"`
	// Version is the implementation's version.
	Version string `json:"version,omitempty"`
	// Phase and Step are its lifecycle position.
	Phase string `json:"phase,omitempty"`
	// Step is the transaction phase in progress or last passed.
	Step string `json:"step,omitempty"`
	// Pid is the provider's pid while one runs.
	Pid int64 `json:"pid,omitempty"`
	// Reason and Message explain a Failed or Inactive generation.
	Reason string `json:"reason,omitempty"`
	// Message explains Reason.
	Message string `json:"message,omitempty"`
	// StderrTail is the last bytes of the provider's stderr.
	StderrTail string `json:"stderrTail,omitempty"`
	// StderrDroppedBytes counts stderr bytes that left the ring.
	StderrDroppedBytes int64 `json:"stderrDroppedBytes,omitempty"`
	// Renewals counts fresh processes of this generation.
	Renewals int32 `json:"renewals,omitempty"`
	// TransactionID is the generation's last ledger transaction.
	TransactionID string `json:"transactionID,omitempty"`
	// Receipts are the generation's effect receipts, cited for a Failed
	// generation: what it did that its failure and rollback do not undo.
	Receipts *ReceiptsCitation `json:"receipts,omitempty"`
	// Sandbox is what its process's sandbox applied, as one line
	// (docs/security.md), "" when status shows none.
	Sandbox string `json:"sandbox,omitempty"`
	// SandboxViolations are what it did under --sandbox=audit that the
	// enforced sandbox refuses, by syscall.
	SandboxViolations map[string]int64 `json:"sandboxViolations,omitempty"`
}

// ReceiptsCitation is what the doctor says of a Failed generation's receipts.
type ReceiptsCitation struct {
	// Total, Irreversible and ReversibleRuns count them (from the receipts
	// file when it was read, else from status.receipts).
	Total int `json:"total"`
	// Irreversible counts the irreversible ones.
	Irreversible int `json:"irreversible"`
	// ReversibleRuns counts the runs that needed no receipt (file only).
	ReversibleRuns int64 `json:"reversibleRuns,omitempty"`
	// Incomplete is true when receipts are missing; IncompleteReason says why.
	Incomplete bool `json:"incomplete,omitempty"`
	// IncompleteReason says why the evidence is incomplete.
	IncompleteReason string `json:"incompleteReason,omitempty"`
	// Recent are the newest receipts, one line each (file only).
	Recent []string `json:"recent,omitempty"`
	// Source is "file" or "status".
	Source string `json:"source"`
	// Command prints them all.
	Command string `json:"command"`
}

// LedgerBlock is the last blocked record of a module's transactions.
type LedgerBlock struct {
	// Source is "file" (read from the ledger on the node) or "status"
	// (status.ledger.recent, the last 16 records).
	Source string `json:"source"`
	// Sequence is the blocked record's sequence.
	Sequence int64 `json:"sequence"`
	// TransactionID is its transaction.
	TransactionID string `json:"transactionID"`
	// Phase is the phase that failed.
	Phase string `json:"phase"`
	// BlockKind is validation, dependency, provider or deadline (from the
	// record, or derived from the reason code for status records).
	BlockKind string `json:"blockKind,omitempty"`
	// Reason is "<code>: <message>".
	Reason string `json:"reason,omitempty"`
	// Ending is how the transaction ended (rolled_back, rollback_failed),
	// "" when its end is not in view.
	Ending string `json:"ending,omitempty"`
}

// ChainLink is one module of a dependency chain.
type ChainLink struct {
	// Module is the module.
	Module string `json:"module"`
	// Phase is its phase in status.
	Phase string `json:"phase,omitempty"`
	// Reason and Message are its status reason.
	Reason string `json:"reason,omitempty"`
	// Message explains Reason.
	Message string `json:"message,omitempty"`
}

// ModuleDiagnosis is one module that does not serve its desired
// implementation.
type ModuleDiagnosis struct {
	// Module is the module.
	Module string `json:"module"`
	// DesiredImplementationID is what the spec asks for.
	DesiredImplementationID string `json:"desiredImplementationID,omitempty"`
	// Phase is the module's phase in status. Only a module whose phase is
	// Active serves: a module whose generation is Failed, Preparing (being
	// relaunched or activated) or Inactive serves nothing, and calls for it
	// fail or wait.
	Phase string `json:"phase,omitempty"`
	// ImplementationID is what serves now ("" when nothing does: a Failed
	// or relaunching generation's implementation is in Active, not here).
	ImplementationID string `json:"implementationID,omitempty"`
	// Reason and Message are the module's status reason.
	Reason string `json:"reason,omitempty"`
	// Message explains Reason.
	Message string `json:"message,omitempty"`
	// Active is the Generation that serves, if any.
	Active *GenerationSummary `json:"active,omitempty"`
	// Target is the newest Generation that is not the active one (the
	// failed or in-progress target), if any.
	Target *GenerationSummary `json:"target,omitempty"`
	// LastBlock is the module's last blocked ledger record, if one is in
	// view.
	LastBlock *LedgerBlock `json:"lastBlock,omitempty"`
	// Chain is the dependency chain that gates the module: the module
	// first, the root cause last. Empty when it is not gated.
	Chain []ChainLink `json:"chain,omitempty"`
	// ChainText says the chain in words.
	ChainText string `json:"chainText,omitempty"`
}

// LedgerDiagnosis is what is known of the activation's ledger.
type LedgerDiagnosis struct {
	// Source is "status" or "file".
	Source string `json:"source"`
	// Path is the ledger directory (status.ledger.file, or the one under
	// --state-dir).
	Path string `json:"path,omitempty"`
	// Records is the number of records the ledger has held.
	Records int64 `json:"records"`
	// HeadSHA256 is the last record's hash.
	HeadSHA256 string `json:"headSHA256,omitempty"`
	// Missing is true when --state-dir holds no ledger for the activation
	// (no transaction has run yet, or the wrong state dir).
	Missing bool `json:"missing,omitempty"`
	// Verified reports the ledger verified (status: at the manager's last
	// open; file: just now, with the status head as an anchor).
	Verified bool `json:"verified"`
	// Rule, Sequence, File, Line and Detail describe the broken rule of a
	// file that does not verify.
	Rule string `json:"rule,omitempty"`
	// Sequence is where the rule broke.
	Sequence uint64 `json:"sequence,omitempty"`
	// File is the segment file.
	File string `json:"file,omitempty"`
	// Line is the 1-based line in File.
	Line int `json:"line,omitempty"`
	// Error is the error as the ledger reports it.
	Error string `json:"error,omitempty"`
	// OpenTransaction is the transaction the file leaves open, if any (the
	// manager closes it forward at its next start).
	OpenTransaction string `json:"openTransaction,omitempty"`
}

// ProcessDiagnosis is one durable process record of the node.
type ProcessDiagnosis struct {
	// File is the record file.
	File string `json:"file"`
	// Pid, Pgid and StartTime identify the group.
	Pid int `json:"pid"`
	// Pgid is the process group.
	Pgid int `json:"pgid"`
	// StartTime is the leader's start time in clock ticks since boot.
	StartTime uint64 `json:"startTime"`
	// Module and ImplementationID are what the record says it runs.
	Module string `json:"module"`
	// ImplementationID is the recorded implementation.
	ImplementationID string `json:"implementationID"`
	// Alive reports the leader still runs (pid, pgid, start time and boot
	// all match).
	Alive bool `json:"alive"`
	// AgeSeconds is how long the leader has run.
	AgeSeconds int64 `json:"ageSeconds,omitempty"`
	// ClaimedBy is the Generation (namespace/name) whose status shows the
	// pid, "" when none does.
	ClaimedBy string `json:"claimedBy,omitempty"`
	// Verdict is serving, in_transaction, orphaned, unconfirmed or stale.
	Verdict string `json:"verdict"`
}

// Process verdicts.
const (
	VerdictServing       = "serving"
	VerdictInTransaction = "in_transaction"
	VerdictOrphaned      = "orphaned"
	VerdictUnconfirmed   = "unconfirmed"
	VerdictStale         = "stale"
	VerdictUnreadable    = "unreadable"
)

// EventSummary is one event about the activation.
type EventSummary struct {
	// Time is when it last happened.
	Time time.Time `json:"time"`
	// Type is Normal or Warning.
	Type string `json:"type"`
	// Reason is the event's reason.
	Reason string `json:"reason"`
	// Message is the event's note.
	Message string `json:"message"`
	// Count is how many times it happened (1 when unknown).
	Count int32 `json:"count,omitempty"`
}

// Report is the whole diagnosis of one activation.
type Report struct {
	// Activation names the activation.
	Activation ObjectRef `json:"activation"`
	// Healthy is true when every module is Active at its desired
	// implementation, Ready is True for the current spec and no finding is
	// a problem.
	Healthy bool `json:"healthy"`
	// Generation and ObservedGeneration are metadata.generation and
	// status.observedGeneration.
	Generation int64 `json:"generation"`
	// ObservedGeneration is status.observedGeneration.
	ObservedGeneration int64 `json:"observedGeneration"`
	// Paused is spec.paused.
	Paused bool `json:"paused"`
	// Deleting is set when metadata.deletionTimestamp is.
	Deleting *time.Time `json:"deleting,omitempty"`
	// Finalizers are metadata.finalizers.
	Finalizers []string `json:"finalizers,omitempty"`
	// Conditions are the five conditions in a fixed order.
	Conditions []ConditionSummary `json:"conditions"`
	// Retry compares the retry annotation with its echo.
	Retry RetryStatus `json:"retry"`
	// Node is what is known of spec.nodeName's Node.
	Node NodeStatus `json:"node"`
	// ModuleCount and ActiveCount are the spec's modules and the Active ones.
	ModuleCount int `json:"moduleCount"`
	// ActiveCount counts modules Active at their desired implementation.
	ActiveCount int `json:"activeCount"`
	// ServingCount counts the spec's modules that a generation serves now
	// (status phase Active), whatever its implementation: a module whose
	// swap failed while its old generation serves counts; one whose active
	// generation is Failed, refused a relaunch or being relaunched does not.
	ServingCount int `json:"servingCount"`
	// Modules are the modules that do not serve their desired
	// implementation, in status order.
	Modules []ModuleDiagnosis `json:"modules,omitempty"`
	// Sandboxes are what the sandbox of each module's active generation
	// applied, and what it counted under --sandbox=audit, healthy modules
	// included (in status order; modules whose generation shows none are
	// left out).
	Sandboxes []SandboxSummary `json:"sandboxes,omitempty"`
	// Ledger is what is known of the ledger, nil when nothing is.
	Ledger *LedgerDiagnosis `json:"ledger,omitempty"`
	// Processes are the node's process records (with --state-dir).
	Processes []ProcessDiagnosis `json:"processes,omitempty"`
	// Events are the newest events about the activation, oldest first.
	Events []EventSummary `json:"events,omitempty"`
	// Findings are what the doctor found, problems first.
	Findings []Finding `json:"findings"`
}

// Problems counts the findings of severity problem.
func (r *Report) Problems() int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == SeverityProblem {
			n++
		}
	}
	return n
}
