package v1alpha1

import (
	"fmt"
	"strings"
)

// Condition types of both kinds. Ready summarizes the others. Reconciling and
// Stalled are the abnormal-true pair kstatus reads; Degraded and Verified are
// specific to this API.
const (
	// ConditionReady is True when every module is Active at the desired
	// generation (activation) or when the generation is Active (generation).
	ConditionReady = "Ready"
	// ConditionReconciling is True while the manager is moving towards the
	// desired state (a plan or a transaction is in progress).
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the manager will not progress without a
	// change: a failed swap, a corrupt ledger, an authority change.
	ConditionStalled = "Stalled"
	// ConditionDegraded is True when part of a plan moved and part did not, or
	// a module is not serving.
	ConditionDegraded = "Degraded"
	// ConditionVerified is True when every source passed verification (bytes,
	// manifest, capability ceiling, graph).
	ConditionVerified = "Verified"
)

// Condition reasons: the CamelCase twins of the operator's error reasons
// (status `reason` fields carry the snake_case form; the table that maps one
// to the other is internal/reasons), plus the reasons of normal progress.
const (
	ReasonUnsupportedVersion    = "UnsupportedVersion"
	ReasonVerificationFailed    = "VerificationFailed"
	ReasonSchemaMismatch        = "SchemaMismatch"
	ReasonDependencyUnsatisfied = "DependencyUnsatisfied"
	ReasonDependencyCycle       = "DependencyCycle"
	ReasonDependencyConflict    = "DependencyConflict"
	ReasonStaleGeneration       = "StaleGeneration"
	ReasonAuthorityChanged      = "AuthorityChanged"
	ReasonPermissionDenied      = "PermissionDenied"
	ReasonActivationFailed      = "ActivationFailed"
	ReasonProviderFailed        = "ProviderFailed"
	ReasonDeadlineExceeded      = "DeadlineExceeded"
	ReasonCleanupFailed         = "CleanupFailed"
	ReasonRollbackFailed        = "RollbackFailed"
	ReasonLedgerCorrupt         = "LedgerCorrupt"
	ReasonQueueFull             = "QueueFull"
	ReasonLedgerUnwritable      = "LedgerUnwritable"
	ReasonRecovering            = "Recovering"
	ReasonArtifactUnavailable   = "ArtifactUnavailable"
	ReasonArtifactRefused       = "ArtifactRefused"
	ReasonSandboxUnavailable    = "SandboxUnavailable"
	ReasonMemoryExceeded        = "MemoryExceeded"

	// ReasonNotImplemented is set while a reconciler has nothing to act with.
	ReasonNotImplemented = "NotImplemented"
	// ReasonSucceeded: the desired state holds.
	ReasonSucceeded = "Succeeded"
	// ReasonProgressing: a plan or transaction is in progress.
	ReasonProgressing = "Progressing"
	// ReasonPaused: spec.paused is true; spec changes are not acted on.
	ReasonPaused = "Paused"
	// ReasonRetryRequested: the iteron.dev/retry annotation changed.
	ReasonRetryRequested = "RetryRequested"
)

// Annotations and labels.
const (
	// AnnotationRetry, set to a timestamp, starts a new attempt of a swap that
	// failed for the same target (the Flux requestedAt pattern); the handled
	// value is echoed in status.lastHandledRetryAt.
	AnnotationRetry = "iteron.dev/retry"
	// LabelActivation names the activation a Generation belongs to. For people
	// only: the manager selects by spec.nodeName and owner, never by label.
	LabelActivation = "iteron.dev/activation"
	// LabelModule names the module of a Generation. For people only.
	LabelModule = "iteron.dev/module"
	// AnnotationActivationGeneration records on a Generation the
	// metadata.generation of the activation spec it was created for: a
	// failed attempt is retried for a new spec, never for the same one.
	AnnotationActivationGeneration = "iteron.dev/activation-generation"
	// AnnotationRetryOf records on a Generation the iteron.dev/retry value
	// whose request created it: a request is answered once, even when the
	// status that echoes it could not be written.
	AnnotationRetryOf = "iteron.dev/retry-of"
	// FinalizerActivation holds an activation until every module is retired,
	// every process reaped and every Generation deleted.
	FinalizerActivation = "iteron.dev/retire"
)

// MaxMessageBytes bounds every status message (etcd's request limit is far
// above the sum of all bounded status fields).
const MaxMessageBytes = 1024

// GenerationName is the name of a Generation object:
// <activation>-<module with _ → ->-g<lineage>-<attempt> (at most 100
// characters given the bounds of the activation name and the module).
func GenerationName(activationName, module string, lineage int64, attempt int32) string {
	return fmt.Sprintf("%s-%s-g%d-%d", activationName, strings.ReplaceAll(module, "_", "-"), lineage, attempt)
}
