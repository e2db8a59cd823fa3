package gateway

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/reasons"
)

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
	return failure(reasons.GRPCCode(reason), reason, message, 0)
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
