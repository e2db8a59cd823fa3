package gateway

import (
	"context"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/test/otlptest"
)

// heapAllocs is how many heap objects this process has allocated so far
// (runtime/metrics: unlike runtime.ReadMemStats, it does not stop the
// world between the calls it measures).
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// BenchmarkTracedCall measures what the node's tracing adds to a gateway
// call. Every iteration makes one call with tracing off and one with it on,
// sampling every call and exporting each span over OTLP/gRPC to a real
// receiver in a process of its own, each mode first in every other pair, so
// both see the same machine. The caller is an instrumented client in both
// modes: it sends its W3C context either way, and what is measured is the
// node's tracing, not the caller's header. It reports each mode's median,
// their difference (sampled-extra-µs; the acceptance bound is 10 µs) and
// the heap objects allocated per call in each mode (a sampled call's
// spans are made off its path, within 10 ms, and counted in whichever
// call's window they fall).
func BenchmarkTracedCall(b *testing.B) {
	h := newHarness(b)
	h.counterActivation("default", "bench")
	rcv := otlptest.StartChild(b)
	ctx := context.Background()
	exp, err := tracing.NewExporter(ctx, tracing.ExporterSettings{Protocol: "grpc", Endpoint: rcv.Endpoint(), Insecure: true, Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	calls := sdktrace.ParentBased(sdktrace.NeverSample())
	tp := tracing.NewProvider(exp, tracing.Settings{Calls: calls})
	defer tp.Shutdown(ctx) //nolint:errcheck // the receiver goes with the benchmark
	req := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "bench", Module: module, InputJson: `{"key":"bench","add":1}`}
	caller := tracing.ToOutgoing(ctx, callerContext(0x42))
	call := func() (time.Duration, uint64) {
		a0 := heapAllocs()
		t0 := time.Now()
		if _, err := h.client.Invoke(caller, req); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0), heapAllocs() - a0
	}
	var off, on []time.Duration
	var offAllocs, onAllocs uint64
	offCall := func() {
		d, a := call()
		off, offAllocs = append(off, d), offAllocs+a
	}
	onCall := func() {
		uninstall := tracing.Install(tp, tracing.Sampler(calls))
		d, a := call()
		uninstall()
		on, onAllocs = append(on, d), onAllocs+a
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// The second call of a pair tends to be the slower one.
		if i%2 == 0 {
			offCall()
			onCall()
		} else {
			onCall()
			offCall()
		}
	}
	b.StopTimer()
	// The last call's spans are handed over after it was answered: let
	// them arrive before flushing.
	time.Sleep(50 * time.Millisecond)
	tracing.Flush()
	if err := tp.ForceFlush(ctx); err != nil {
		b.Fatal(err)
	}
	// Every sampled call was exported: its invoke, queue and run spans.
	if got := rcv.Received(b); got < 3*b.N {
		b.Fatalf("the receiver got %d spans for %d sampled calls; want at least %d", got, b.N, 3*b.N)
	}
	med := func(d []time.Duration) float64 {
		d = slices.Clone(d)
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 1e3
	}
	b.ReportMetric(med(off), "off-µs")
	b.ReportMetric(med(on), "sampled-µs")
	b.ReportMetric(med(on)-med(off), "sampled-extra-µs")
	b.ReportMetric(float64(offAllocs)/float64(b.N), "off-allocs/call")
	b.ReportMetric(float64(onAllocs)/float64(b.N), "sampled-allocs/call")
}
