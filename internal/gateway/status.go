package gateway

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/ledger"
)

// The gateway's own reasons, beyond DESIGN §8's error reasons: they
// describe the request or the caller, not a failure of a module.
const (
	// ReasonInvalidRequest: a field of the request is missing or malformed
	// (INVALID_ARGUMENT).
	ReasonInvalidRequest = "invalid_request"
	// ReasonNotFound: no such activation or module on this node (NOT_FOUND).
	ReasonNotFound = "not_found"
	// ReasonCancelled: the client cancelled the invocation (CANCELLED).
	ReasonCancelled = "cancelled"
	// ReasonInterrupted: the host cancelled the run — a swap's quiesce
	// timeout, a retirement or a shutdown — so it may be retried under a new
	// invocation_id (ABORTED).
	ReasonInterrupted = "interrupted"
	// ReasonUnauthenticated: the connection carries no peer credentials
	// (UNAUTHENTICATED).
	ReasonUnauthenticated = "unauthenticated"
	// ReasonInvocationConflict: the invocation_id is already in use for a
	// different request in this namespace (ALREADY_EXISTS).
	ReasonInvocationConflict = "invocation_conflict"
)

// codeOfReason is DESIGN §8's reason → gRPC code table, plus the gateway's
// own reasons. cleanup_failed is never returned to a caller (the
// transaction commits) and has no code.
var codeOfReason = map[string]codes.Code{
	string(ledger.ReasonUnsupportedVersion):    codes.FailedPrecondition,
	string(ledger.ReasonVerificationFailed):    codes.FailedPrecondition,
	string(ledger.ReasonSchemaMismatch):        codes.FailedPrecondition,
	string(ledger.ReasonDependencyUnsatisfied): codes.FailedPrecondition,
	string(ledger.ReasonDependencyCycle):       codes.FailedPrecondition,
	string(ledger.ReasonStaleGeneration):       codes.FailedPrecondition,
	string(ledger.ReasonAuthorityChanged):      codes.FailedPrecondition,
	string(ledger.ReasonPermissionDenied):      codes.PermissionDenied,
	string(ledger.ReasonActivationFailed):      codes.Unavailable,
	string(ledger.ReasonProviderFailed):        codes.Unavailable,
	string(ledger.ReasonDeadlineExceeded):      codes.DeadlineExceeded,
	string(ledger.ReasonRollbackFailed):        codes.Unavailable,
	string(ledger.ReasonLedgerCorrupt):         codes.Unavailable,
	string(ledger.ReasonQueueFull):             codes.ResourceExhausted,
	ReasonInvalidRequest:                       codes.InvalidArgument,
	ReasonNotFound:                             codes.NotFound,
	ReasonCancelled:                            codes.Canceled,
	ReasonInterrupted:                          codes.Aborted,
	ReasonUnauthenticated:                      codes.Unauthenticated,
	ReasonInvocationConflict:                   codes.AlreadyExists,
}

// CodeOf returns the gRPC code of a reason: DESIGN §8's table (a module
// that cannot serve because its provider failed is UNAVAILABLE; a run that
// failed is INTERNAL, see RunCodeOf), then the gateway's own reasons;
// Unknown for anything else.
func CodeOf(reason string) codes.Code {
	if c, ok := codeOfReason[reason]; ok {
		return c
	}
	return codes.Unknown
}

// RunCodeOf is CodeOf for the failure of a run itself: provider_failed is
// INTERNAL there (the call reached the provider, which failed it).
func RunCodeOf(reason string) codes.Code {
	if reason == string(ledger.ReasonProviderFailed) {
		return codes.Internal
	}
	return CodeOf(reason)
}

// failure builds the status of a failed call: code, the message
// "<reason>: <message>", and a Failure detail carrying the same.
func failure(code codes.Code, reason, message string, generation int64) error {
	st := status.New(code, reason+": "+message)
	if withDetail, err := st.WithDetails(&gatewayv1.Failure{Reason: reason, Message: message, Generation: generation}); err == nil {
		st = withDetail
	}
	return st.Err()
}

// fail is failure with the code of reason.
func fail(reason, message string) error {
	return failure(CodeOf(reason), reason, message, 0)
}

// ReasonOf returns the Failure (reason, message, generation) of an error a
// gateway call returned: its Failure detail, else the "<reason>: " prefix
// of the status message (reason "" when there is none, as for a status the
// gRPC library made itself). ok is false for an error that is not a gRPC
// status at all.
func ReasonOf(err error) (f *gatewayv1.Failure, ok bool) {
	if err == nil {
		return nil, false
	}
	st, isStatus := status.FromError(err)
	if !isStatus {
		return &gatewayv1.Failure{Message: err.Error()}, false
	}
	for _, d := range st.Details() {
		if fd, isFailure := d.(*gatewayv1.Failure); isFailure {
			return fd, true
		}
	}
	msg := st.Message()
	if reason, rest, found := strings.Cut(msg, ": "); found && reason != "" && !strings.ContainsAny(reason, " \t") {
		return &gatewayv1.Failure{Reason: reason, Message: rest}, true
	}
	return &gatewayv1.Failure{Message: msg}, true
}
