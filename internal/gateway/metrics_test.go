package gateway

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"iteron.dev/operator/internal/hotswap"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
)

func TestCallsAreCountedByOutcomeWithBoundedLabels(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "metered")
	okBefore := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "", "ok"))
	badBefore := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "", "schema_mismatch"))
	h.count(a, module, "a", 1)
	h.count(a, module, "a", 1)
	_, err := h.client.Invoke(context.Background(), &gatewayv1.InvokeRequest{Namespace: "default", Activation: "metered", Module: module, InputJson: `{"key":"v","key":"w"}`})
	if err == nil {
		t.Fatal("an input with a duplicate key was accepted")
	}
	if d := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "", "ok")) - okBefore; d != 2 {
		t.Fatalf("iteron_gateway_calls_total{code=ok} grew by %v, want 2", d)
	}
	if d := testutil.ToFloat64(callsTotal.WithLabelValues("default", "metered", module, "", "schema_mismatch")) - badBefore; d != 1 {
		t.Fatalf("iteron_gateway_calls_total{code=schema_mismatch} grew by %v, want 1", d)
	}
}

// TestCallsAreCountedAndTimedUnderTheRevisionOfTheGenerationThatTookThem
// swaps a module from a generation of revision rev-a to one of rev-b: the
// calls each served are counted and timed under its revision; a call
// refused before any generation took it has no revision.
func TestCallsAreCountedAndTimedUnderTheRevisionOfTheGenerationThatTookThem(t *testing.T) {
	h := newHarness(t)
	a := newActivation("default", "revisioned")
	a.revision = "rev-a"
	h.settle(a, h.deploy(a, counterImpl(t, module, "counter-a"), hotswap.SwapPolicy{}))
	calls := func(rev, code string) float64 {
		return testutil.ToFloat64(callsTotal.WithLabelValues("default", "revisioned", module, rev, code))
	}
	timed := func(rev string) uint64 {
		m := &dto.Metric{}
		if err := callDuration.WithLabelValues("default", "revisioned", module, rev).(prometheus.Histogram).Write(m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	h.count(a, module, "k", 1)
	h.count(a, module, "k", 1)
	a.revision = "rev-b"
	h.settle(a, h.deploy(a, counterImpl(t, module, "counter-b"), hotswap.SwapPolicy{}))
	h.count(a, module, "k", 1)
	_, err := h.client.Invoke(context.Background(), &gatewayv1.InvokeRequest{Namespace: "default", Activation: "revisioned", Module: module, InputJson: `{"key":"v","key":"w"}`})
	if err == nil {
		t.Fatal("an input with a duplicate key was accepted")
	}
	for _, c := range []struct {
		rev, code string
		want      float64
	}{{"rev-a", "ok", 2}, {"rev-b", "ok", 1}, {"", "schema_mismatch", 1}} {
		if got := calls(c.rev, c.code); got != c.want {
			t.Errorf("iteron_gateway_calls_total{revision=%q,code=%q} = %v; want %v", c.rev, c.code, got, c.want)
		}
	}
	if a, b, none := timed("rev-a"), timed("rev-b"), timed(""); a != 2 || b != 1 || none != 0 {
		t.Errorf("iteron_gateway_call_duration_seconds counts: rev-a %d, rev-b %d, none %d; want 2, 1, 0 (a refused call is not timed)", a, b, none)
	}
}
