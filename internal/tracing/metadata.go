package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// ToOutgoing puts sc in ctx's outgoing gRPC metadata (traceparent,
// tracestate), for the server a client calls to continue the trace; ctx as
// it is when sc is not valid.
func ToOutgoing(ctx context.Context, sc trace.SpanContext) context.Context {
	if !sc.IsValid() {
		return ctx
	}
	tp := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + (sc.TraceFlags() & trace.FlagsSampled).String()
	if ts := sc.TraceState().String(); ts != "" {
		return metadata.AppendToOutgoingContext(ctx, "traceparent", tp, "tracestate", ts)
	}
	return metadata.AppendToOutgoingContext(ctx, "traceparent", tp)
}
