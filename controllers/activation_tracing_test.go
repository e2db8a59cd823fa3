package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

// TestTheDesiredStateCarriesTheRolloutSpanOfTheStampsTraceparent: the
// coordinator's desired state links the activation's transactions to the
// rollout node span its stamp names; a value that is not a W3C
// traceparent is no link, and no error.
func TestTheDesiredStateCarriesTheRolloutSpanOfTheStampsTraceparent(t *testing.T) {
	for _, c := range []struct {
		name, traceparent string
		// trace and span are the IDs wanted ("" : an invalid span context).
		trace, span string
	}{
		{"a stamp's traceparent is the rollout span", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		{"an activation no traced rollout stamped has none", "", "", ""},
		{"garbage is none", "not a traceparent", "", ""},
		{"a traceparent of an unknown version's bad form is none", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", ""},
		{"an all-zero trace ID is none", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", ""},
		{"an all-zero span ID is none", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", ""},
		{"a truncated traceparent is none", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0b", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			act := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "default", UID: "uid", Generation: 3}}
			if c.traceparent != "" {
				act.Annotations = map[string]string{iteronv1.AnnotationTraceparent: c.traceparent}
			}
			d := desiredOf(&activationScope{act: act, key: hotswap.ActivationKey{Namespace: "default", Name: "a", UID: "uid"}})
			sc := d.RolloutSpan
			if c.trace == "" {
				if sc.IsValid() {
					t.Errorf("RolloutSpan %s/%s from %q; want an invalid span context", sc.TraceID(), sc.SpanID(), c.traceparent)
				}
				return
			}
			if !sc.IsValid() || sc.TraceID().String() != c.trace || sc.SpanID().String() != c.span || !sc.IsSampled() {
				t.Errorf("RolloutSpan %s/%s (valid %v, sampled %v); want %s/%s, sampled", sc.TraceID(), sc.SpanID(), sc.IsValid(), sc.IsSampled(), c.trace, c.span)
			}
			if d.SpecGeneration != 3 {
				t.Errorf("SpecGeneration %d; want 3", d.SpecGeneration)
			}
		})
	}
}
