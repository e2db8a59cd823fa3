package gateway

import (
	"context"
	"fmt"
	"math"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
)

// roundTrip holds each mode's ns/op of the last run, for the ratios.
var roundTrip struct {
	sync.Mutex
	nsPerOp map[string]float64
}

// goroutinesCreated is how many goroutines this process has started so far.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// reportGoroutines reports the goroutines started per call since before:
// each is a hand-off a call pays for (client and server streams, the
// dispatcher's run, any waiter), counted in this process only.
func reportGoroutines(b *testing.B, before uint64) {
	b.ReportMetric(float64(goroutinesCreated()-before)/float64(b.N), "goroutines/op")
}

func recordRoundTrip(b *testing.B, mode string) {
	roundTrip.Lock()
	defer roundTrip.Unlock()
	if roundTrip.nsPerOp == nil {
		roundTrip.nsPerOp = map[string]float64{}
	}
	roundTrip.nsPerOp[mode] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// BenchmarkCallRoundTrip measures one counter call three ways in one run:
// through the gateway (gRPC on the unix socket → dispatcher → provider
// process), straight through the executor (the same provider process, no
// gateway: the baseline), and as a go-plugin gRPC call to a plugin
// subprocess doing the same work in-process (the peer). The last
// sub-benchmark reports the ratios of the first three.
func BenchmarkCallRoundTrip(b *testing.B) {
	input := `{"key":"bench","add":1}`
	b.Run("direct-procexec", func(b *testing.B) {
		impl := counterImpl(b, module, "bench-direct")
		plan := providertest.Plan(b, impl)
		launch := func() *procexec.Process {
			p, err := sharedExecutor(b).Launch(plan)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := p.Load(context.Background()); err != nil {
				b.Fatal(err)
			}
			return p
		}
		p := launch()
		defer func() { p.Close() }()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		before := goroutinesCreated()
		for i := 0; i < b.N; i++ {
			if p.Budget().StdinBytes < 64<<10 {
				b.StopTimer()
				p.Close()
				p = launch()
				b.StartTimer()
			}
			run, err := p.Start(ctx, fmt.Sprintf("run-%d", i), jsontext.Value(input), 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := run.Result(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportGoroutines(b, before)
		recordRoundTrip(b, "direct")
	})
	b.Run("gateway-invoke", func(b *testing.B) {
		h := newHarness(b)
		h.counterActivation("default", "bench")
		req := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "bench", Module: module, InputJson: input}
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		before := goroutinesCreated()
		for i := 0; i < b.N; i++ {
			if _, err := h.client.Invoke(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportGoroutines(b, before)
		recordRoundTrip(b, "gateway")
	})
	b.Run("go-plugin-grpc", func(b *testing.B) {
		client := startPlugin(b)
		req := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "bench", Module: module, InputJson: input}
		ctx := context.Background()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := client.Invoke(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		recordRoundTrip(b, "goplugin")
	})
	b.Run("ratios", func(b *testing.B) {
		roundTrip.Lock()
		ns := roundTrip.nsPerOp
		roundTrip.Unlock()
		if ns["direct"] == 0 || ns["gateway"] == 0 || ns["goplugin"] == 0 {
			b.Skip("run the three modes first (-bench CallRoundTrip)")
		}
		for i := 0; i < b.N; i++ {
		}
		b.ReportMetric(ns["gateway"]/ns["direct"], "gateway/direct")
		b.ReportMetric(ns["goplugin"]/ns["direct"], "goplugin/direct")
		b.ReportMetric(ns["gateway"]/ns["goplugin"], "gateway/goplugin")
	})
}

// Swap-pause benchmark parameters: pauseSwaps hot swaps of a counter
// holding at least pauseStateBytes of state, with pauseWorkers callers
// calling throughout.
const (
	pauseSwaps      = 50
	pauseStateBytes = 100 << 10
	pauseWorkers    = 2
	pauseKeyBytes   = 64
)

// BenchmarkSwapPause measures what a caller sees of a hot swap: for each
// swap, the time from the last call dispatched to the old generation to the
// first call dispatched to the new one, while callers call continuously.
// Its work is fixed (pauseSwaps swaps); run it with -benchtime=1x. It
// reports the pause's p50, p99 and max over the swaps, the whole swap
// transaction's p50 (apply → committed, as the coordinator runs it), and
// the state size moved.
func BenchmarkSwapPause(b *testing.B) {
	var (
		mu    sync.Mutex
		times = map[int64][]time.Time{} // lineage → dispatch times
	)
	h := newHarness(b, func(_ *hotswap.Config, c *Config) {
		c.OnDispatch = func(d Dispatch) {
			mu.Lock()
			times[d.Route.Lineage] = append(times[d.Route.Lineage], d.At)
			mu.Unlock()
		}
	})
	impls := []artifacts.Implementation{
		counterImpl(b, module, "pause-a"),
		counterImpl(b, module, "pause-b", func(s *artifacts.Spec) { s.Version = catalog.Version{2, 0, 1} }),
	}
	a := newActivation("default", "pause")
	h.settle(a, h.deploy(a, impls[0], hotswap.SwapPolicy{}))
	// When each phase of each swap became durable, for the breakdown.
	var phases []phaseAt
	h.mu.Lock()
	h.afterPhase = func(_ hotswap.ActivationKey, _ string, phase string) {
		mu.Lock()
		phases = append(phases, phaseAt{phase, time.Now()})
		mu.Unlock()
	}
	h.mu.Unlock()

	// State: one entry of about pauseKeyBytes+20 bytes per key.
	keys := pauseStateBytes/(pauseKeyBytes+20) + 1
	for i := range keys {
		key := fmt.Sprintf("k%0*d", pauseKeyBytes-1, i)
		if _, err := h.client.Invoke(context.Background(), &gatewayv1.InvokeRequest{Namespace: "default", Activation: "pause", Module: module, InputJson: fmt.Sprintf(`{"key":%q,"add":1}`, key)}); err != nil {
			b.Fatal(err)
		}
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range pauseWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := h.client.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "pause", Module: module, InputJson: fmt.Sprintf(`{"key":"hot-%d","add":1}`, w)})
				cancel()
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	b.ResetTimer()
	var swapDurations []time.Duration
	for k := 1; k <= pauseSwaps; k++ {
		start := time.Now()
		target := h.deploy(a, impls[k%2], hotswap.SwapPolicy{})
		if err := h.waitActive(a, target, 60*time.Second); err != nil {
			b.Fatal(err)
		}
		swapDurations = append(swapDurations, time.Since(start))
		// Let each new generation take calls before the next swap.
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	if failed.Load() != 0 {
		b.Fatalf("%d calls failed during the swaps", failed.Load())
	}
	snap, ok, err := hotswap.NewSnapshotStore(h.stateDir).Latest(a.key.UID, module)
	if err != nil || !ok {
		b.Fatalf("no durable snapshot: %v", err)
	}
	if len(snap.State) < pauseStateBytes {
		b.Fatalf("state of %d bytes; want at least %d", len(snap.State), pauseStateBytes)
	}

	var pauses []time.Duration
	// steps[i] are the durations, within the pause, from the last call on
	// the old generation to each phase record of the swap being durable
	// and then to the first call on the new one.
	steps := map[string][]time.Duration{}
	mu.Lock()
	for g := int64(2); g <= 1+pauseSwaps; g++ {
		old, next := times[g-1], times[g]
		if len(old) == 0 || len(next) == 0 {
			b.Fatalf("generation %d or %d took no call", g-1, g)
		}
		lastOld, firstNew := slices.MaxFunc(old, time.Time.Compare), slices.MinFunc(next, time.Time.Compare)
		pauses = append(pauses, firstNew.Sub(lastOld))
		prev := lastOld
		for _, p := range phases {
			if p.at.Before(lastOld) || p.at.After(firstNew) {
				continue
			}
			steps[p.phase] = append(steps[p.phase], p.at.Sub(prev))
			prev = p.at
		}
		steps["first_call"] = append(steps["first_call"], firstNew.Sub(prev))
	}
	mu.Unlock()
	var breakdown []string
	for _, name := range []string{"quiesce", "snapshot", "migrate", "restore", "readiness", "atomic_switch", "first_call"} {
		d := steps[name]
		slices.Sort(d)
		if len(d) > 0 {
			breakdown = append(breakdown, fmt.Sprintf("%s p50 %v", name, percentile(d, 50).Round(10*time.Microsecond)))
		}
	}
	b.Logf("pause breakdown (time since the previous step): %s", strings.Join(breakdown, ", "))
	slices.Sort(pauses)
	slices.Sort(swapDurations)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(percentile(pauses, 50)), "pause-p50-ms")
	b.ReportMetric(ms(percentile(pauses, 99)), "pause-p99-ms")
	b.ReportMetric(ms(pauses[len(pauses)-1]), "pause-max-ms")
	b.ReportMetric(ms(percentile(swapDurations, 50)), "swap-p50-ms")
	b.ReportMetric(float64(len(snap.State))/1024, "state-KiB")
	b.Logf("%d swaps, %d KiB of state: pauses %s", pauseSwaps, len(snap.State)>>10, durations(pauses))
}

type phaseAt struct {
	phase string
	at    time.Time
}

// percentile is the nearest-rank percentile p of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[max(rank-1, 0)]
}

func durations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(10 * time.Microsecond).String()
	}
	return strings.Join(parts, " ")
}
