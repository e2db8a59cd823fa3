package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// metadataCarrier lets the propagator read and write gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// FromIncoming is the caller's span context in a gRPC server's incoming
// metadata (traceparent, tracestate), as a remote parent in ctx; ctx as it
// is when the caller sent none or tracing is off.
func FromIncoming(ctx context.Context) context.Context {
	if !Enabled() {
		return ctx
	}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get("traceparent")) == 0 {
		return ctx
	}
	return Propagator.Extract(ctx, metadataCarrier(md))
}

// ToOutgoing puts sc in ctx's outgoing gRPC metadata, for the server a
// client calls to continue the trace; ctx as it is when sc is not valid.
func ToOutgoing(ctx context.Context, sc trace.SpanContext) context.Context {
	if !sc.IsValid() {
		return ctx
	}
	md := metadata.MD{}
	Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), metadataCarrier(md))
	for k, v := range md {
		ctx = metadata.AppendToOutgoingContext(ctx, k, v[0])
	}
	return ctx
}
