// Package reasons is the one table of the operator's error reasons. Every
// other package reads it: a status `reason`, a condition reason, a ledger
// blocked record, a gateway status code and the choice between stalling and
// retrying all come from one row, so they cannot disagree. A new reason is
// added here and nowhere else; docs/reference/reasons.md is rendered from
// this table (make generate) and a test fails when the two differ.
//
// The package imports nothing of this module: it is the first package of
// the internal layering, so the ledger can read it without the API types.
// Condition reasons are the CamelCase twins of the codes; a test holds them
// equal to the api package's constants.
package reasons

import (
	"strings"

	"google.golang.org/grpc/codes"
)

// Code is an error reason: snake_case, stable, machine-readable. Status
// `reason` fields, ledger reasons ("<code>: <message>") and the gateway's
// Failure detail carry it.
type Code string

// Reasons of a module, a generation or a transaction. The constants are
// untyped so that they fit both Code and the plain strings of status fields
// and errors.
const (
	// UnsupportedVersion: a schema or protocol version the host does not
	// speak, or a state operation a protocol-1 provider cannot do.
	UnsupportedVersion = "unsupported_version"
	// VerificationFailed: a digest, manifest, path, interpreter or allowed
	// root check refused the bytes (never retried as a crash).
	VerificationFailed = "verification_failed"
	// SchemaMismatch: a document or request is not of the expected shape.
	SchemaMismatch = "schema_mismatch"
	// DependencyUnsatisfied: a module waits for, or lacks, a dependency.
	DependencyUnsatisfied = "dependency_unsatisfied"
	// DependencyCycle: the module graph has a cycle.
	DependencyCycle = "dependency_cycle"
	// DependencyConflict: several sources of the activation provide the
	// contract a module requires, and the graph selects none of them.
	DependencyConflict = "dependency_conflict"
	// StaleGeneration: a target or a pinned call names a generation that
	// is not (or no longer) the one it must follow or run on.
	StaleGeneration = "stale_generation"
	// AuthorityChanged: the admitted capabilities changed where they must
	// not (a hot swap, or a relaunch after the node's ceiling changed).
	AuthorityChanged = "authority_changed"
	// PermissionDenied: the caller may not call that namespace.
	PermissionDenied = "permission_denied"
	// ActivationFailed: a provider could not be started or loaded.
	ActivationFailed = "activation_failed"
	// ProviderFailed: a provider failed, crashed or broke the protocol.
	ProviderFailed = "provider_failed"
	// DeadlineExceeded: a transaction, run or call ran out of time.
	DeadlineExceeded = "deadline_exceeded"
	// CleanupFailed: an old process did not stop within its cancellation
	// deadline and was killed; recorded, and the transaction commits.
	CleanupFailed = "cleanup_failed"
	// RollbackFailed: a post-switch rollback could not restore the old
	// generation; the module serves nothing.
	RollbackFailed = "rollback_failed"
	// LedgerCorrupt: the ledger does not replay or verify; nothing is done
	// for the activation until an operator resolves it.
	LedgerCorrupt = "ledger_corrupt"
	// LedgerUnwritable: a ledger append failed (disk full, I/O error); the
	// ledger refuses appends until it is replayed, which the coordinator
	// retries with backoff.
	LedgerUnwritable = "ledger_unwritable"
	// QueueFull: a module's call queue is full.
	QueueFull = "queue_full"
	// Recovering: the module's committed generation is being recovered
	// (re-attached or relaunched after a restart or a crash), or the
	// manager has not replayed this node's activations yet; the call never
	// ran and may be retried.
	Recovering = "recovering"
	// ArtifactUnavailable: an OCI source could not be pulled for a reason
	// that may pass (registry unreachable, 5xx, timeout, a truncated
	// download, a full artifact store); retried with backoff while what
	// served keeps serving.
	ArtifactUnavailable = "artifact_unavailable"
	// ArtifactRefused: the registry refused the pull (401, 403, 404); not
	// retried until the spec or the registry credentials change.
	ArtifactRefused = "artifact_refused"
	// ProbeFailed: an activation's probe failed on the generation that
	// serves its module (a wrong answer, a failed call, too slow); the
	// generation keeps serving, nothing progresses until the spec changes
	// or a retry is requested.
	ProbeFailed = "probe_failed"
	// SandboxUnavailable: the node cannot give a launch what its source
	// requires of the sandbox (a level, or a bound above the node's
	// ceiling); not retried until the spec or the node changes.
	SandboxUnavailable = "sandbox_unavailable"
	// MemoryExceeded: the kernel killed a provider for exceeding its
	// memory bound (the sandbox's cgroup).
	MemoryExceeded = "memory_exceeded"
)

// Reasons that describe a call or its caller rather than a module: only the
// gateway returns them.
const (
	// InvalidRequest: a field of the request is missing or malformed.
	InvalidRequest = "invalid_request"
	// NotFound: no such activation or module on this node.
	NotFound = "not_found"
	// Cancelled: the client cancelled the invocation.
	Cancelled = "cancelled"
	// Interrupted: the host cancelled the run (a swap's quiesce timeout, a
	// retirement, a shutdown); it may be retried under a new invocation_id.
	Interrupted = "interrupted"
	// Unauthenticated: the connection carries no peer credentials.
	Unauthenticated = "unauthenticated"
	// InvocationConflict: the invocation_id is in use for a different
	// request in this namespace.
	InvocationConflict = "invocation_conflict"
)

// Ledger block kinds (the `block_kind` of a blocked record).
const (
	BlockValidation = "validation"
	BlockDependency = "dependency"
	BlockProvider   = "provider"
	BlockDeadline   = "deadline"
)

// Reason is one row of the table.
type Reason struct {
	// Code is the reason.
	Code Code
	// Condition is the CamelCase condition reason ("" for a reason only
	// the gateway returns); derived from Code.
	Condition string
	// BlockKind is the ledger block kind of a blocked record with this
	// reason ("" when the table has none).
	BlockKind string
	// Blocks reports whether a transaction may be blocked with this reason
	// (cleanup_failed is only a drain note, rollback_failed an outcome; a
	// ledger_unwritable block is written once the ledger accepts appends
	// again, to close the transaction the failure interrupted).
	Blocks bool
	// GRPC is the gateway's status code for a call that fails for this
	// reason before reaching a provider.
	GRPC codes.Code
	// RunGRPC is the status code when the run itself failed for this
	// reason (provider_failed is INTERNAL there); equal to GRPC otherwise.
	RunGRPC codes.Code
	// Stalling reports whether the reason needs a change (a new spec, a
	// retry request, an operator) before anything progresses: kstatus reads
	// it as Failed through Stalled=True. Others are retried.
	Stalling bool
	// Caller marks reasons that describe a call rather than a module.
	Caller bool
	// Meaning says what it means, for the rendered reference.
	Meaning string
}

// table is the one table. Its order is the reference's order.
var table = []Reason{
	{Code: UnsupportedVersion, BlockKind: BlockValidation, Blocks: true, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "a schema or protocol version the host does not speak, or a hot swap between protocol versions"},
	{Code: VerificationFailed, BlockKind: BlockValidation, Blocks: true, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "a digest, manifest, path, symlink, interpreter or allowed-root check refused the bytes; never retried as a crash"},
	{Code: SchemaMismatch, BlockKind: BlockValidation, Blocks: true, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "a document or request is not of the expected shape"},
	{Code: DependencyUnsatisfied, BlockKind: BlockDependency, Blocks: true, GRPC: codes.FailedPrecondition,
		Meaning: "a module waits for a dependency to be Active, or its implementation dependency is missing"},
	{Code: DependencyCycle, BlockKind: BlockDependency, Blocks: true, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "the module graph has a cycle (the message names it)"},
	{Code: DependencyConflict, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "several sources provide the contract a module requires and the seam graph selects none (the message names them; set the requirement's select)"},
	{Code: StaleGeneration, BlockKind: BlockDependency, Blocks: true, GRPC: codes.FailedPrecondition,
		Meaning: "a target or a pinned call names a generation that is no longer the active one"},
	{Code: AuthorityChanged, BlockKind: BlockValidation, Blocks: true, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "admitted capabilities changed where they must not: a hot swap, or a relaunch after the node's ceiling changed"},
	{Code: PermissionDenied, GRPC: codes.PermissionDenied,
		Meaning: "the caller's uid and gid may not call that namespace (--gateway-allow)"},
	{Code: ActivationFailed, BlockKind: BlockProvider, Blocks: true, GRPC: codes.Unavailable,
		Meaning: "a provider could not be started or loaded"},
	{Code: ProviderFailed, BlockKind: BlockProvider, Blocks: true, GRPC: codes.Unavailable, RunGRPC: codes.Internal,
		Meaning: "a provider failed, crashed or broke the protocol (INTERNAL when the run itself failed)"},
	{Code: DeadlineExceeded, BlockKind: BlockDeadline, Blocks: true, GRPC: codes.DeadlineExceeded,
		Meaning: "a transaction, run or call ran out of time"},
	{Code: CleanupFailed, BlockKind: BlockProvider,
		Meaning: "an old process did not stop within its cancellation deadline and was killed; recorded on the drain, the transaction commits"},
	{Code: RollbackFailed, BlockKind: BlockProvider, GRPC: codes.Unavailable, Stalling: true,
		Meaning: "a post-switch rollback could not restore the old generation: the module serves nothing"},
	{Code: LedgerCorrupt, BlockKind: BlockValidation, Blocks: true, GRPC: codes.Unavailable, Stalling: true,
		Meaning: "the ledger does not replay or verify; nothing is done for the activation until an operator resolves it"},
	{Code: LedgerUnwritable, BlockKind: BlockProvider, Blocks: true, GRPC: codes.Unavailable, Stalling: true,
		Meaning: "a ledger append failed (disk full, I/O error); transactions wait, other modules keep serving, and the manager replays the ledger once writes succeed again, then records the interrupted transaction's end"},
	{Code: QueueFull, GRPC: codes.ResourceExhausted,
		Meaning: "the module's bounded call queue is full"},
	{Code: Recovering, GRPC: codes.Unavailable,
		Meaning: "the module's committed generation is being recovered (re-attached or relaunched after a manager restart, relaunched after a crash) and the call's deadline ended first, or the manager has not replayed this node's activations yet; retry under the same invocation_id (the call never ran)"},
	{Code: ArtifactUnavailable, GRPC: codes.Unavailable,
		Meaning: "an OCI source could not be pulled for a reason that may pass (registry unreachable, 5xx, timeout, truncated download, artifact store full); retried with backoff, what served keeps serving; the message names the registry error"},
	{Code: ArtifactRefused, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "the registry refused the pull (401, 403, 404); not retried until the spec or the registry credentials change; what served keeps serving"},
	{Code: ProbeFailed, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "an activation's probe (spec.probes) failed on the generation that serves its module: a wrong answer, a failed call or one slower than its timeout; that generation keeps serving, and an ActivationSet rollout treats the node as failed (status.probes says what was answered)"},
	{Code: SandboxUnavailable, BlockKind: BlockValidation, Blocks: true, GRPC: codes.FailedPrecondition, Stalling: true,
		Meaning: "the node cannot give the launch what its source requires of the sandbox (spec.sources[].sandbox: a level it cannot apply, or a bound above its --sandbox-max-* ceiling); not retried until the spec or the node changes; what served keeps serving"},
	{Code: MemoryExceeded, BlockKind: BlockProvider, Blocks: true, GRPC: codes.Unavailable, RunGRPC: codes.ResourceExhausted,
		Meaning: "the kernel killed a provider for exceeding its memory bound (its sandbox cgroup); counted like a crash"},
	{Code: InvalidRequest, GRPC: codes.InvalidArgument, Caller: true,
		Meaning: "a field of the request is missing or malformed"},
	{Code: NotFound, GRPC: codes.NotFound, Caller: true,
		Meaning: "no such activation or module on this node"},
	{Code: Cancelled, GRPC: codes.Canceled, Caller: true,
		Meaning: "the client cancelled the invocation"},
	{Code: Interrupted, GRPC: codes.Aborted, Caller: true,
		Meaning: "the host cancelled the run (a swap's quiesce timeout, a retirement, a shutdown); retry under a new invocation_id"},
	{Code: Unauthenticated, GRPC: codes.Unauthenticated, Caller: true,
		Meaning: "the connection carries no peer credentials"},
	{Code: InvocationConflict, GRPC: codes.AlreadyExists, Caller: true,
		Meaning: "the invocation_id is already in use for a different request in this namespace"},
}

var byCode = func() map[Code]Reason {
	m := make(map[Code]Reason, len(table))
	for _, r := range table {
		if r.RunGRPC == codes.OK {
			r.RunGRPC = r.GRPC
		}
		if !r.Caller {
			r.Condition = camel(string(r.Code))
		}
		m[r.Code] = r
	}
	return m
}()

// All returns the table's rows in order.
func All() []Reason {
	out := make([]Reason, len(table))
	for i, r := range table {
		out[i] = byCode[r.Code]
	}
	return out
}

// Lookup returns the row of code, and false for an unknown code.
func Lookup(code Code) (Reason, bool) {
	r, ok := byCode[code]
	return r, ok
}

// Known reports whether code is in the table.
func Known(code string) bool {
	_, ok := byCode[Code(code)]
	return ok
}

// ConditionReason returns the CamelCase condition reason of code, or "" for
// an unknown code or one only the gateway returns.
func ConditionReason(code string) string {
	return byCode[Code(code)].Condition
}

// Stalls reports whether code needs a change before anything progresses.
func Stalls(code string) bool {
	return byCode[Code(code)].Stalling
}

// BlockKindOf returns the ledger block kind a blocked record carries for
// code, and whether code may block a transaction at all.
func BlockKindOf(code Code) (string, bool) {
	r, ok := byCode[code]
	if !ok || !r.Blocks {
		return "", false
	}
	return r.BlockKind, true
}

// GRPCCode returns the gateway's status code for code; Unknown for a code
// outside the table, and for one that is never returned to a caller.
func GRPCCode(code string) codes.Code {
	if r, ok := byCode[Code(code)]; ok && r.GRPC != codes.OK {
		return r.GRPC
	}
	return codes.Unknown
}

// RunGRPCCode is GRPCCode for the failure of a run itself.
func RunGRPCCode(code string) codes.Code {
	if r, ok := byCode[Code(code)]; ok && r.RunGRPC != codes.OK {
		return r.RunGRPC
	}
	return codes.Unknown
}

// Verification reports whether code means a source failed verification
// (the Verified condition).
func Verification(code string) bool {
	switch Code(code) {
	case VerificationFailed, UnsupportedVersion, SchemaMismatch:
		return true
	}
	return false
}

// camel is the CamelCase twin of a snake_case code.
func camel(code string) string {
	var b strings.Builder
	for _, part := range strings.Split(code, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}
