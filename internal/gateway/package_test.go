package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/test/pkgruntimetest"
)

var (
	runtimesOnce sync.Once
	runtimeBins  map[string]string
	runtimeDir   string
	runtimesErr  error
	pkgLauncher  *pkgruntime.Launcher
	// runtimeSocketDir is the launcher's SocketDir (the fault tests check
	// that nothing of a failed runtime is left in it).
	runtimeSocketDir string
)

// packageRuntimes builds the example runtimes once per test binary and
// starts the one package-runtime launcher (beside the shared executor: one
// spawner and reaper for both).
func packageRuntimes(tb testing.TB) (map[string]string, *pkgruntime.Launcher) {
	tb.Helper()
	sharedExecutor(tb)
	runtimesOnce.Do(func() {
		runtimeDir, runtimesErr = os.MkdirTemp("", "iteron-gateway-runtimes-")
		if runtimesErr != nil {
			return
		}
		providertest.RemoveAtExit(runtimeDir)
		if runtimeBins, runtimesErr = pkgruntimetest.Build(runtimeDir); runtimesErr != nil {
			return
		}
		sockets, err := os.MkdirTemp("", "gwrt")
		if err != nil {
			runtimesErr = err
			return
		}
		providertest.RemoveAtExit(sockets)
		runtimeSocketDir = sockets
		pkgLauncher, runtimesErr = pkgruntime.NewLauncher(pkgruntime.LaunchConfig{
			ProviderUID: providerUID, ProviderGID: providerUID, RecordDir: filepath.Join(runtimeDir, "records"),
			SocketDir: sockets, KillTimeout: 5 * time.Second, SealCacheBytes: 64 << 20,
		})
	})
	if runtimesErr != nil {
		tb.Fatal(runtimesErr)
	}
	return runtimeBins, pkgLauncher
}

// withPackageRuntimes makes the harness launch package-runtime plans.
func withPackageRuntimes(tb testing.TB) harnessOption {
	_, l := packageRuntimes(tb)
	return func(h *hotswap.Config, _ *Config) { h.Launch = providers.WithPackageRuntimes(h.Launch, l) }
}

// runtimeRevisions are the package_revision_id each runtime answers with.
var runtimeRevisions = map[string]string{pkgruntimetest.KV: "kv-1.0.0", pkgruntimetest.Seed: "seed-kv-1"}

// kvPlan is the SDK's kv runtime filling module.
func kvPlan(tb testing.TB, module string) verifier.LaunchPlan {
	bins, _ := packageRuntimes(tb)
	return pkgruntimetest.Plan(tb, module, bins[pkgruntimetest.KV], runtimeRevisions[pkgruntimetest.KV])
}

// seedPlan is the proto-only runtime filling module.
func seedPlan(tb testing.TB, module string) verifier.LaunchPlan {
	bins, _ := packageRuntimes(tb)
	return pkgruntimetest.Plan(tb, module, bins[pkgruntimetest.Seed], runtimeRevisions[pkgruntimetest.Seed])
}

// put stores value (JSON) at key through the gateway.
func (h *harness) put(a *activationRef, module, key, value string) *gatewayv1.InvokeResponse {
	h.tb.Helper()
	resp, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		Export: "put", InputJson: `{"key":"` + key + `","value":` + value + `}`})
	if err != nil {
		h.tb.Fatalf("put %s=%s in %s: %v", key, value, module, err)
	}
	if !resp.GetOk() || resp.GetValueJson() != value {
		h.tb.Fatalf("put %s=%s in %s answered ok=%v value %s error %q", key, value, module, resp.GetOk(), resp.GetValueJson(), resp.GetError())
	}
	return resp
}

// watchStream is an open gateway Watch whose events arrive on a channel.
type watchStream struct {
	events chan *gatewayv1.WatchEvent
	err    chan error
	cancel context.CancelFunc
}

// watch opens a Watch of key on module and reads it in the background.
func (h *harness) watch(a *activationRef, module, id, key string) *watchStream {
	h.tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := h.client.Watch(ctx, &gatewayv1.WatchRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		InvocationId: id, Export: "watch", InputJson: `{"key":"` + key + `"}`})
	if err != nil {
		cancel()
		h.tb.Fatalf("watch %s: %v", module, err)
	}
	w := &watchStream{events: make(chan *gatewayv1.WatchEvent, 64), err: make(chan error, 1), cancel: cancel}
	go func(stream grpc.ServerStreamingClient[gatewayv1.WatchEvent]) {
		for {
			ev, err := stream.Recv()
			if err != nil {
				w.err <- err
				return
			}
			w.events <- ev
		}
	}(stream)
	h.tb.Cleanup(cancel)
	return w
}

// next is the stream's next event; the test fails if the stream ends or
// nothing arrives within 30 s.
func (w *watchStream) next(tb testing.TB, what string) *gatewayv1.WatchEvent {
	tb.Helper()
	select {
	case ev := <-w.events:
		return ev
	case err := <-w.err:
		tb.Fatalf("%s: the watch ended: %v", what, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("%s: no event within 30s", what)
	}
	return nil
}

func describe(ev *gatewayv1.WatchEvent) string {
	return "seq=" + strconv.FormatUint(ev.GetSequence(), 10) + " generation=" + ev.GetGenerationName() + " initial=" + boolString(ev.GetInitial()) + " value=" + ev.GetValueJson()
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestACutoverOfOneRuntimeMovesItsWatchAndLeavesTheOtherModulesProcessAndStreamAlone(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "stack")
	const unchanged, changed = "prompt_system", "prompt_planner"
	h.deployPlan(a, kvPlan(t, unchanged), hotswap.SwapPolicy{})
	tChanged := h.deployPlan(a, kvPlan(t, changed), hotswap.SwapPolicy{})
	st := h.settle(a, tChanged)
	pidUnchanged, pidChanged := st.Modules[unchanged].Pid, st.Modules[changed].Pid
	if pidUnchanged == 0 || pidChanged == 0 {
		t.Fatalf("pids before the cutover: %s %d, %s %d", unchanged, pidUnchanged, changed, pidChanged)
	}
	h.put(a, unchanged, "x", "1")
	h.put(a, changed, "y", `"before"`)

	wu := h.watch(a, unchanged, "watch-unchanged", "x")
	wc := h.watch(a, changed, "watch-changed", "y")
	first := wu.next(t, "unchanged module's initial event")
	if !first.GetInitial() || first.GetValueJson() != "1" {
		t.Fatalf("unchanged module's first event: %s", describe(first))
	}
	firstChanged := wc.next(t, "changed module's initial event")
	if !firstChanged.GetInitial() || firstChanged.GetValueJson() != `"before"` || firstChanged.GetGeneration() != 1 {
		t.Fatalf("changed module's first event: %s", describe(firstChanged))
	}

	// The cutover: the changed module moves to another implementation (the
	// proto-only runtime), a cold replace.
	tNew := h.deployPlan(a, seedPlan(t, changed), hotswap.SwapPolicy{})
	st = h.settle(a, tNew)

	moved := wc.next(t, "the moved watch's first event on the new runtime")
	if !moved.GetInitial() || moved.GetGeneration() != 2 || moved.GetGenerationName() != tNew.GenerationName || moved.GetValueJson() != "null" {
		t.Fatalf("the moved watch's event: %s; want the initial event of %s (the new runtime starts empty: null)", describe(moved), tNew.GenerationName)
	}
	h.put(a, changed, "y", `"after"`)
	if ev := wc.next(t, "the moved watch's next change"); ev.GetInitial() || ev.GetValueJson() != `"after"` || ev.GetGenerationName() != tNew.GenerationName {
		t.Fatalf("the moved watch's next event: %s", describe(ev))
	}

	// The unchanged module: same process, same stream, nothing in between.
	if got := st.Modules[unchanged].Pid; got != pidUnchanged {
		t.Fatalf("module %s's pid went from %d to %d across another module's cutover", unchanged, pidUnchanged, got)
	}
	if got := st.Modules[changed].Pid; got == pidChanged || got == 0 {
		t.Fatalf("module %s's pid is %d after its cutover (was %d)", changed, got, pidChanged)
	}
	select {
	case ev := <-wu.events:
		t.Fatalf("the unchanged module's watch got an event nobody caused: %s", describe(ev))
	case err := <-wu.err:
		t.Fatalf("the unchanged module's watch ended across the cutover: %v", err)
	default:
	}
	h.put(a, unchanged, "x", "2")
	ev := wu.next(t, "the unchanged module's next change")
	if ev.GetInitial() || ev.GetValueJson() != "2" || ev.GetSequence() != 2 || ev.GetGeneration() != 1 {
		t.Fatalf("the unchanged module's event after the cutover: %s; want seq=2, not initial, value 2, generation 1", describe(ev))
	}
	t.Logf("before the cutover: %s pid %d, %s pid %d", unchanged, pidUnchanged, changed, pidChanged)
	t.Logf("after the cutover:  %s pid %d (unchanged), %s pid %d (%s)", unchanged, st.Modules[unchanged].Pid, changed, st.Modules[changed].Pid, tNew.GenerationName)
	t.Logf("unchanged module's watch: %s, then %s (one stream, no initial in between)", describe(first), describe(ev))
	t.Logf("changed module's watch: %s, then moved: %s", describe(firstChanged), describe(moved))
}

// BenchmarkPackageInvoke: a 200-byte put to the kv runtime through the
// gateway (gRPC on the gateway's unix socket → dispatcher → the host's
// connection → gRPC on the runtime's socket: two hops) against a bare
// grpc-go call of the same request to a kv runtime process of the same
// binary over a unix socket (one hop; pkgruntimetest starts it with a key
// the benchmark knows, so the call can carry a valid grant). Each iteration
// makes one of each, alternating; reports the medians and gateway ÷ direct.
func BenchmarkPackageInvoke(b *testing.B) {
	h := newHarness(b, withPackageRuntimes(b))
	a := newActivation("default", "bench")
	t := h.deployPlan(a, kvPlan(b, module), hotswap.SwapPolicy{})
	h.settle(a, t)

	bins, _ := packageRuntimes(b)
	proc := pkgruntimetest.Start(b, bins[pkgruntimetest.KV])
	direct := pkgruntimetest.DialDirect(b, proc)

	value := `"` + strings.Repeat("abcdefghij", 15) + `"`
	req := &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module, Export: "put",
		InputJson: `{"key":"k","value":` + value + `}`}
	input, err := pkgruntime.MapFromJSON([]byte(req.InputJson), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var viaGateway, bare []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		resp, err := h.client.Invoke(ctx, req)
		viaGateway = append(viaGateway, time.Since(t0))
		if err != nil || !resp.GetOk() {
			b.Fatal(resp, err)
		}
		t0 = time.Now()
		ok, err := direct.Invoke(ctx, "put", input)
		bare = append(bare, time.Since(t0))
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	b.StopTimer()
	mg, md := pkgruntimetest.Median(viaGateway), pkgruntimetest.Median(bare)
	b.ReportMetric(float64(mg)/1e3, "gateway-p50-µs")
	b.ReportMetric(float64(md)/1e3, "direct-p50-µs")
	b.ReportMetric(float64(mg)/float64(md), "ratio")
}

var (
	faultBuildsMu sync.Mutex
	faultBuilds   = map[string]string{}
)

// seedWithFault is the proto-only runtime built to misbehave as fault
// (built once per test binary).
func seedWithFault(tb testing.TB, fault string) string {
	tb.Helper()
	packageRuntimes(tb)
	faultBuildsMu.Lock()
	defer faultBuildsMu.Unlock()
	if p, ok := faultBuilds[fault]; ok {
		return p
	}
	p, err := pkgruntimetest.BuildSeedWithFault(runtimeDir, fault)
	if err != nil {
		tb.Fatal(err)
	}
	faultBuilds[fault] = p
	return p
}

func TestInvokesRunUpToTheRuntimesConcurrencyBoundAndACancelIsAnsweredByTheRuntime(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "stack")
	plan := pkgruntimetest.Plan(t, module, seedWithFault(t, "hang-invoke"), runtimeRevisions[pkgruntimetest.Seed], func(m *catalog.PackageRuntimeManifest) {
		m.Limits.MaxConcurrentInvocations = 2
		m.Deadlines.InvokeMs = 60_000
	})
	h.settle(a, h.deployPlan(a, plan, hotswap.SwapPolicy{}))

	ids := []string{"hang-1", "hang-2", "hang-3"}
	ended := make(chan error, len(ids))
	for i, id := range ids {
		go func() {
			_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
				InvocationId: id, Export: "get", InputJson: `{"key":"k"}`, DeadlineMs: 60_000})
			ended <- err
		}()
		if i < 2 {
			// The first two take the two slots before the third arrives.
			waitFor(t, id+" running", func() bool { return h.status(a, id).GetState() == gatewayv1.InvocationState_INVOCATION_STATE_RUNNING })
		}
	}
	waitFor(t, "hang-3 queued", func() bool {
		return h.status(a, "hang-3").GetState() == gatewayv1.InvocationState_INVOCATION_STATE_QUEUED
	})
	for _, id := range ids[:2] {
		// The gateway says RUNNING once the dispatcher started the call, a
		// moment before the runtime has its request (it answers unknown
		// until then).
		waitFor(t, id+"'s runtime_state running (the runtime's own answer)", func() bool { return h.status(a, id).GetRuntimeState() == "running" })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.client.CancelInvocation(ctx, &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: "hang-1"})
	// The runtime may wind the call down before the gateway reads its
	// state back: FAILED with reason cancelled is then as true as
	// CANCELLATION_REQUESTED; the runtime's own answer is the same.
	woundDown := st.GetState() == gatewayv1.InvocationState_INVOCATION_STATE_FAILED && st.GetReason() == "cancelled"
	if err != nil || (st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED && !woundDown) || st.GetRuntimeState() != "cancellation-requested" {
		t.Fatalf("CancelInvocation(hang-1) = %+v, %v; want CANCELLATION_REQUESTED (or FAILED, reason cancelled, once wound down) and the runtime's cancellation-requested", st, err)
	}
	expectFailure(t, <-ended, codes.Canceled, "cancelled")
	waitFor(t, "hang-3 running in the freed slot", func() bool {
		return h.status(a, "hang-3").GetState() == gatewayv1.InvocationState_INVOCATION_STATE_RUNNING
	})
	for _, id := range ids[1:] {
		if _, err := h.client.CancelInvocation(ctx, &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: id}); err != nil {
			t.Fatal(err)
		}
		expectFailure(t, <-ended, codes.Canceled, "cancelled")
	}
	t.Logf("cancel of a running invocation answered: state %s, runtime_state %q", st.GetState(), st.GetRuntimeState())
}

// status is the gateway's InvocationStatus of id in a's namespace.
func (h *harness) status(a *activationRef, id string) *gatewayv1.InvocationStatus {
	h.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: id})
	if err != nil {
		h.tb.Fatalf("status of %s: %v", id, err)
	}
	return st
}

func TestARelaunchAfterTheRuntimeCrashesMovesItsOpenWatch(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "stack")
	target := h.deployPlan(a, kvPlan(t, module), hotswap.SwapPolicy{})
	st := h.settle(a, target)
	pid := st.Modules[module].Pid
	h.put(a, module, "k", `"v1"`)
	w := h.watch(a, module, "watch-k", "k")
	if ev := w.next(t, "initial event"); !ev.GetInitial() || ev.GetValueJson() != `"v1"` {
		t.Fatalf("first event: %s", describe(ev))
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	moved := w.next(t, "the watch's first event on the relaunched runtime")
	if !moved.GetInitial() || moved.GetValueJson() != "null" || moved.GetGenerationName() != target.GenerationName {
		t.Fatalf("after the crash: %s; want the relaunched runtime's initial event (it starts empty: null) on %s", describe(moved), target.GenerationName)
	}
	var now int
	waitFor(t, "the relaunched runtime to serve", func() bool {
		st, _ := h.coord.Status(a.key.UID)
		now = st.Modules[module].Pid
		return now != 0 && now != pid && st.Modules[module].Serving
	})
	h.put(a, module, "k", `"v2"`)
	if ev := w.next(t, "the next change"); ev.GetInitial() || ev.GetValueJson() != `"v2"` {
		t.Fatalf("after the relaunch: %s", describe(ev))
	}
	t.Logf("runtime pid %d killed; relaunched as pid %d; the watch went on: %s", pid, now, describe(moved))
}

func TestAnOpenWatchHoldsItsInvocationIDUntilItEnds(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "stack")
	target := h.deployPlan(a, kvPlan(t, module), hotswap.SwapPolicy{})
	h.settle(a, target)
	w := h.watch(a, module, "held", "k")
	if ev := w.next(t, "initial event"); !ev.GetInitial() {
		t.Fatalf("first event: %s", describe(ev))
	}
	// Open: its ID answers for it, and no other call may take it.
	st, err := h.client.GetInvocationStatus(ctxT(t), &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: "held"})
	if err != nil || st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_RUNNING || st.GetRuntimeState() != "running" || st.GetGenerationName() != target.GenerationName {
		t.Fatalf("status of the open watch: %+v %v; want RUNNING on %s, the runtime's running", st, err, target.GenerationName)
	}
	_, err = h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module, InvocationId: "held",
		Export: "get", InputJson: `{"key":"k"}`})
	expectFailure(t, err, codes.AlreadyExists, reasons.InvocationConflict, `"held"`)
	stream, err := h.client.Watch(ctxT(t), &gatewayv1.WatchRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		InvocationId: "held", Export: "watch", InputJson: `{"key":"k"}`})
	if err == nil {
		// The refusal of a stream comes with its first read.
		_, err = stream.Recv()
	}
	expectFailure(t, err, codes.AlreadyExists, reasons.InvocationConflict, `"held"`)
	// Ended by its caller: forgotten, the ID is free again.
	w.cancel()
	waitFor(t, "the watch's goroutines to end", func() bool { return watchGoroutines() == 0 })
	st, err = h.client.GetInvocationStatus(ctxT(t), &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: "held"})
	if err != nil || st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_UNKNOWN {
		t.Fatalf("status after the watch ended: %+v %v; want UNKNOWN", st, err)
	}
	again := h.watch(a, module, "held", "k")
	if ev := again.next(t, "the initial event of a new watch under the same ID"); !ev.GetInitial() {
		t.Fatalf("first event: %s", describe(ev))
	}
}

// BenchmarkPackageWatchEvents: events per second a fast caller gets through
// the gateway from a runtime's flooding Watch (1 KB events), alone and
// while a second caller's Watch on the same runtime, through the same
// gateway connection, is read slowly (1 ms per event); reports both rates
// and beside ÷ alone (1.0: the slow caller costs the fast one nothing).
func BenchmarkPackageWatchEvents(b *testing.B) {
	h := newHarness(b, withPackageRuntimes(b))
	a := newActivation("default", "bench")
	t := h.deployPlan(a, pkgruntimetest.Plan(b, module, seedWithFault(b, "flood-watch"), runtimeRevisions[pkgruntimetest.Seed]), hotswap.SwapPolicy{})
	h.settle(a, t)
	const events = 5000
	open := func(ctx context.Context, key string) grpc.ServerStreamingClient[gatewayv1.WatchEvent] {
		stream, err := h.client.Watch(ctx, &gatewayv1.WatchRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
			Export: "watch", InputJson: `{"key":"` + key + `"}`})
		if err != nil {
			b.Fatal(err)
		}
		return stream
	}
	rate := func() float64 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream := open(ctx, "fast")
		t0 := time.Now()
		for i := 0; i < events; i++ {
			if _, err := stream.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		return events / time.Since(t0).Seconds()
	}
	var alone, beside []float64
	for i := 0; i < b.N; i++ {
		alone = append(alone, rate())
		ctx, cancel := context.WithCancel(context.Background())
		slow := open(ctx, "slow")
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				time.Sleep(time.Millisecond)
				if _, err := slow.Recv(); err != nil {
					return
				}
			}
		}()
		beside = append(beside, rate())
		cancel()
		<-done
	}
	ma, mb := pkgruntimetest.Median(alone), pkgruntimetest.Median(beside)
	b.ReportMetric(ma, "alone-events/s")
	b.ReportMetric(mb, "beside-a-slow-caller-events/s")
	b.ReportMetric(mb/ma, "ratio")
}
