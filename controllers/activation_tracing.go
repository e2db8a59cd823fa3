package controllers

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// rolloutSpan is the rollout node span an activation's stamp carries
// (iteron.dev/traceparent, written by a fleet controller that traces), for
// the activation's transactions to link to. It is invalid when there is
// none or the value does not parse: the link is a reader's convenience,
// never a reason to fail a reconcile. It is read whether or not this
// manager traces (the coordinator uses it only when it does): absent, it
// costs one map lookup.
func rolloutSpan(act *iteronv1.ImplementationActivation) trace.SpanContext {
	v := act.Annotations[iteronv1.AnnotationTraceparent]
	if v == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": v})
	return trace.SpanContextFromContext(ctx)
}
