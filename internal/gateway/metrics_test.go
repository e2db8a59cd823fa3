package gateway

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
)

func TestCallsAreCountedByOutcomeWithBoundedLabels(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "metered")
	okBefore := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "ok"))
	badBefore := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "schema_mismatch"))
	h.count(a, module, "a", 1)
	h.count(a, module, "a", 1)
	_, err := h.client.Invoke(context.Background(), &gatewayv1.InvokeRequest{Namespace: "default", Activation: "metered", Module: module, InputJson: `{"key":"v","key":"w"}`})
	if err == nil {
		t.Fatal("an input with a duplicate key was accepted")
	}
	if d := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "ok")) - okBefore; d != 2 {
		t.Fatalf("iteron_gateway_calls_total{code=ok} grew by %v, want 2", d)
	}
	if d := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "schema_mismatch")) - badBefore; d != 1 {
		t.Fatalf("iteron_gateway_calls_total{code=schema_mismatch} grew by %v, want 1", d)
	}
}
