package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
)

const module = "prompt_system"

// counterActivation deploys counter v2 as module in a new activation of
// namespace and waits until it is Active.
func (h *harness) counterActivation(namespace, name string) (*activationRef, hotswap.ModuleTarget) {
	h.tb.Helper()
	a := newActivation(namespace, name)
	t := h.deploy(a, counterImpl(h.tb, module, "counter-a"), hotswap.SwapPolicy{})
	h.settle(a, t)
	return a, t
}

func TestInvokeRunsTheActiveGenerationAndNamesIt(t *testing.T) {
	h := newHarness(t)
	a, target := h.counterActivation("default", "stack")
	got, resp := h.count(a, module, "a", 3)
	if got.Count != 3 || got.Total != 3 || got.Version != "2.0.0" {
		t.Fatalf("observation %+v; want count 3 total 3 from 2.0.0", got)
	}
	if resp.Generation != 1 || resp.GenerationName != target.GenerationName || resp.Replayed || resp.InvocationId == "" {
		t.Fatalf("response %+v; want generation 1 (%s), not replayed, an invocation id chosen by the gateway", resp, target.GenerationName)
	}
	got, _ = h.count(a, module, "a", 2)
	if got.Count != 5 {
		t.Fatalf("second call count %d; want 5 (one provider, state kept)", got.Count)
	}
}

func TestHandshakeNamesTheNodeTheInstanceAndTheModulesTheCallerMaySee(t *testing.T) {
	h := newHarness(t, func(_ *hotswap.Config, c *Config) {
		c.Allow, _ = ParseAllow([]string{"uid:0=team-a"})
	})
	_, target := h.counterActivation("team-a", "stack")
	h.counterActivation("team-b", "other")
	ctx := context.Background()
	resp, err := h.client.Handshake(ctx, &gatewayv1.HandshakeRequest{ProtocolVersion: ProtocolVersion, Nonce: "n-1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.NodeName != "node-test" || resp.InstanceId != h.server.InstanceID() || len(resp.InstanceId) != 32 || resp.Nonce != "n-1" {
		t.Fatalf("handshake %+v", resp)
	}
	if len(resp.ProtocolVersions) != 1 || resp.ProtocolVersions[0] != ProtocolVersion {
		t.Fatalf("protocol versions %v", resp.ProtocolVersions)
	}
	if len(resp.Modules) != 1 {
		t.Fatalf("modules %v; want only team-a's (the caller may not see team-b)", resp.Modules)
	}
	m := resp.Modules[0]
	if m.Namespace != "team-a" || m.Activation != "stack" || m.Module != module || m.Generation != 1 ||
		m.GenerationName != target.GenerationName || m.Epoch != target.Epoch || m.ImplementationId != "counter-a" || m.Phase != "Active" {
		t.Fatalf("module %+v; want team-a/stack %s at generation 1 with its epoch", m, module)
	}
	if c := resp.Caller; c.Uid != 0 || len(c.Namespaces) != 1 || c.Namespaces[0] != "team-a" || c.Pid == 0 {
		t.Fatalf("caller %+v", c)
	}
	_, err = h.client.Handshake(ctx, &gatewayv1.HandshakeRequest{ProtocolVersion: "iteron-gateway/9"})
	expectFailure(t, err, codes.FailedPrecondition, "unsupported_version", "iteron-gateway/9", ProtocolVersion)
}

func TestWatchStreamsEveryObservationInOrder(t *testing.T) {
	h := newHarness(t)
	a, target := h.counterActivation("default", "stack")
	stream, err := h.client.Watch(context.Background(), &gatewayv1.WatchRequest{
		Namespace: "default", Activation: "stack", Module: module, InvocationId: "watch-1",
		InputJson: `{"key":"w","add":1,"progress":5}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	var events []*gatewayv1.WatchEvent
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	if len(events) != 6 {
		t.Fatalf("%d events; want 5 progress observations and the terminal one", len(events))
	}
	for i, ev := range events {
		if ev.InvocationId != "watch-1" || ev.Generation != 1 || ev.GenerationName != target.GenerationName || ev.Replayed {
			t.Fatalf("event %d: %+v", i, ev)
		}
		if i > 0 && ev.Sequence <= events[i-1].Sequence {
			t.Fatalf("event %d sequence %d after %d: not in order", i, ev.Sequence, events[i-1].Sequence)
		}
		if last := i == len(events)-1; ev.Terminal != last {
			t.Fatalf("event %d terminal=%v", i, ev.Terminal)
		}
		if i < 5 && ev.ObservationJson != fmt.Sprintf(`{"progress":%d}`, i) {
			t.Fatalf("event %d observation %s; want progress %d", i, ev.ObservationJson, i)
		}
	}
	if got := decodeCounter(t, events[5].ObservationJson); got.Count != 1 {
		t.Fatalf("terminal %+v", got)
	}
	// A repeat of the same invocation replays only the terminal observation.
	stream, err = h.client.Watch(context.Background(), &gatewayv1.WatchRequest{
		Namespace: "default", Activation: "stack", Module: module, InvocationId: "watch-1",
		InputJson: `{"key":"w","add":1,"progress":5}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || !ev.Replayed || !ev.Terminal || ev.ObservationJson != events[5].ObservationJson {
		t.Fatalf("replayed watch: %+v %v; want the terminal observation, replayed", ev, err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("replayed watch goes on: %v", err)
	}
	if got, _ := h.count(a, module, "w", 0); got.Count != 1 {
		t.Fatalf("count after the repeat %d; want 1 (the watch ran once)", got.Count)
	}
}

func TestInvocationStatusFollowsACallFromQueuedToCompleted(t *testing.T) {
	h := newHarness(t)
	a, target := h.counterActivation("default", "stack")
	ctx := context.Background()
	statusOf := func(id string) *gatewayv1.InvocationStatus {
		st, err := h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: id})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := statusOf("never-made"); st.State != gatewayv1.InvocationState_INVOCATION_STATE_UNKNOWN {
		t.Fatalf("unknown invocation: %v", st)
	}
	var wg sync.WaitGroup
	for _, id := range []string{"slow", "behind"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: id, InputJson: `{"key":"s","add":1,"sleep_ms":700}`}); err != nil {
				t.Error(err)
			}
		}()
		// "slow" takes the run slot before "behind" is sent.
		waitFor(t, id+" to be known", func() bool { return statusOf(id).State != gatewayv1.InvocationState_INVOCATION_STATE_UNKNOWN })
		if id == "slow" {
			waitFor(t, "slow to run", func() bool { return statusOf("slow").State == gatewayv1.InvocationState_INVOCATION_STATE_RUNNING })
		}
	}
	if st := statusOf("slow"); st.State != gatewayv1.InvocationState_INVOCATION_STATE_RUNNING || st.Generation != 1 || st.GenerationName != target.GenerationName || st.Activation != "stack" || st.Module != module {
		t.Fatalf("slow: %v; want RUNNING on generation 1", st)
	}
	if st := statusOf("behind"); st.State != gatewayv1.InvocationState_INVOCATION_STATE_QUEUED || st.Generation != 0 {
		t.Fatalf("behind: %v; want QUEUED (the slot is taken)", st)
	}
	wg.Wait()
	for _, id := range []string{"slow", "behind"} {
		if st := statusOf(id); st.State != gatewayv1.InvocationState_INVOCATION_STATE_COMPLETED || st.Generation != 1 || st.Reason != "" {
			t.Fatalf("%s: %v; want COMPLETED on generation 1", id, st)
		}
	}
	if got, _ := h.count(a, module, "s", 0); got.Count != 2 {
		t.Fatalf("count %d; want 2", got.Count)
	}
}

func TestCancellingAQueuedCallWithdrawsItAndItNeverRuns(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	ctx := context.Background()
	slow, queued := h.slowThenQueued(t, "stack", "c", 800)
	st, err := h.client.CancelInvocation(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "queued", Reason: "changed my mind"})
	if err != nil || st.State != gatewayv1.InvocationState_INVOCATION_STATE_FAILED || st.Reason != reasons.Cancelled || !strings.Contains(st.Message, "changed my mind") {
		t.Fatalf("cancel of a queued call: %v %v; want FAILED, reason cancelled, naming the reason", st, err)
	}
	expectFailure(t, <-queued, codes.Canceled, reasons.Cancelled)
	if err := <-slow; err != nil {
		t.Fatalf("the running call: %v", err)
	}
	if got, _ := h.count(a, module, "c", 0); got.Count != 1 {
		t.Fatalf("count %d; want 1 (the withdrawn call, which adds 100, never ran)", got.Count)
	}
}

func TestCancellingARunningCallAsksTheProviderAndTheWatchEndsCancelled(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	pidBefore := h.pid(a)
	ctx := context.Background()
	stream, err := h.client.Watch(ctx, &gatewayv1.WatchRequest{
		Namespace: "default", Activation: "stack", Module: module, InvocationId: "long",
		InputJson: `{"key":"x","add":1,"progress":1,"sleep_ms":20000}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.Terminal || ev.ObservationJson != `{"progress":0}` {
		t.Fatalf("first event %+v %v", ev, err)
	}
	start := time.Now()
	st, err := h.client.CancelInvocation(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "long"})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED && st.State != gatewayv1.InvocationState_INVOCATION_STATE_FAILED {
		t.Fatalf("cancel of a running call: %v; want CANCELLATION_REQUESTED (or already FAILED)", st)
	}
	_, err = stream.Recv()
	expectFailure(t, err, codes.Canceled, reasons.Cancelled)
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the cancelled run ended after %v; its sleep was 20 s", waited)
	}
	st, _ = h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "long"})
	if st.State != gatewayv1.InvocationState_INVOCATION_STATE_FAILED || st.Reason != reasons.Cancelled || st.Generation != 1 {
		t.Fatalf("status after cancel: %v", st)
	}
	// The provider lives on (a cancel is not a fault) and the cancelled run
	// changed nothing.
	if got, _ := h.count(a, module, "x", 0); got.Count != 0 {
		t.Fatalf("count %d; want 0", got.Count)
	}
	if pid := h.pid(a); pid != pidBefore {
		t.Fatalf("provider pid %d → %d: the cancel killed it", pidBefore, pid)
	}
	// Cancelling an ended call reports how it ended.
	st, err = h.client.CancelInvocation(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "long"})
	if err != nil || st.State != gatewayv1.InvocationState_INVOCATION_STATE_FAILED {
		t.Fatalf("second cancel: %v %v", st, err)
	}
}

func (h *harness) pid(a *activationRef) int {
	st, _ := h.coord.Status(a.key.UID)
	return st.Modules[module].Pid
}

func TestARepeatedInvocationIDReturnsTheFirstOutcomeAndNeverRunsTwice(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	h.counterActivation("other", "stack")
	req := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "once-1", InputJson: `{"key":"k","add":5}`}
	first, err := h.invoke(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	// The same input, spelled differently, is the same call.
	again, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "once-1", InputJson: `{ "add": 5, "key": "k" }`})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || first.Replayed || again.ObservationJson != first.ObservationJson || again.Generation != first.Generation {
		t.Fatalf("repeat %+v of %+v; want the same outcome, replayed", again, first)
	}

	// A repeat while the first is still running waits for its outcome.
	slow := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "once-2", InputJson: `{"key":"k","add":1,"sleep_ms":400}`}
	results := make(chan *gatewayv1.InvokeResponse, 3)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.invoke(nil, slow)
			if err != nil {
				t.Error(err)
				return
			}
			results <- r
		}()
	}
	wg.Wait()
	close(results)
	var obs []string
	replayed := 0
	for r := range results {
		obs = append(obs, r.ObservationJson)
		if r.Replayed {
			replayed++
		}
	}
	if len(obs) != 3 || obs[0] != obs[1] || obs[1] != obs[2] || replayed != 2 {
		t.Fatalf("three concurrent sends: %v (%d replayed); want one outcome, two replays", obs, replayed)
	}
	if got, _ := h.count(a, module, "k", 0); got.Count != 6 {
		t.Fatalf("count %d; want 6: each invocation ran exactly once", got.Count)
	}

	// The same ID for a different call is refused, not answered with the
	// first call's outcome.
	_, err = h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "once-1", InputJson: `{"key":"k","add":6}`})
	expectFailure(t, err, codes.AlreadyExists, reasons.InvocationConflict, `"once-1"`)
	// IDs are per namespace: another namespace's once-1 is its own call.
	other, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "other", Activation: "stack", Module: module, InvocationId: "once-1", InputJson: `{"key":"k","add":5}`})
	if err != nil || other.Replayed || decodeCounter(t, other.ObservationJson).Count != 5 {
		t.Fatalf("once-1 in another namespace: %+v %v; want its own first run", other, err)
	}
}

func TestAManagerRestartGivesANewInstanceIDAndForgetsInvocations(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	ctx := context.Background()
	hs1, err := h.client.Handshake(ctx, &gatewayv1.HandshakeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	req := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "before-restart", InputJson: `{"key":"r","add":1}`}
	if _, err := h.invoke(nil, req); err != nil {
		t.Fatal(err)
	}
	if r, err := h.invoke(nil, req); err != nil || !r.Replayed {
		t.Fatalf("repeat before the restart: %+v %v", r, err)
	}
	h.stopServer()
	if _, err := h.client.Handshake(ctx, &gatewayv1.HandshakeRequest{}); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Fatalf("handshake with the gateway stopped: %v", err)
	}
	h.startServer()
	hs2, err := h.client.Handshake(ctx, &gatewayv1.HandshakeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if hs2.InstanceId == hs1.InstanceId || hs2.InstanceId == "" {
		t.Fatalf("instance id %q before and %q after the restart; want a new one", hs1.InstanceId, hs2.InstanceId)
	}
	// The table went with the old instance: the repeat runs again, which is
	// what the new instance_id told the client.
	r, err := h.invoke(nil, req)
	if err != nil || r.Replayed || decodeCounter(t, r.ObservationJson).Count != 2 {
		t.Fatalf("repeat after the restart: %+v %v; want a new run (count 2)", r, err)
	}
	_ = a
}

func TestAPinnedCallFailsWithStaleGenerationAfterACutover(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	one := int64(1)
	r, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InputJson: `{"key":"p","add":2}`, PinnedGeneration: &one})
	if err != nil || r.Generation != 1 {
		t.Fatalf("pinned to the active generation: %+v %v", r, err)
	}
	next := h.deploy(a, counterImpl(t, module, "counter-b"), hotswap.SwapPolicy{})
	h.settle(a, next)
	_, err = h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "pinned-old", InputJson: `{"key":"p","add":2}`, PinnedGeneration: &one})
	f := expectFailure(t, err, codes.FailedPrecondition, "stale_generation", "generation 2", "pins 1")
	if f.Generation != 2 {
		t.Fatalf("failure detail %+v; want the serving generation 2", f)
	}
	st, _ := h.client.GetInvocationStatus(context.Background(), &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "pinned-old"})
	if st.State != gatewayv1.InvocationState_INVOCATION_STATE_FAILED || st.Reason != "stale_generation" {
		t.Fatalf("status %v", st)
	}
	// Unpinned, the same call goes to the new generation, state migrated.
	got, resp := h.count(a, module, "p", 1)
	if resp.Generation != 2 || resp.GenerationName != next.GenerationName || got.Count != 3 {
		t.Fatalf("unpinned after the swap: %+v %+v; want generation 2 and count 3", resp, got)
	}
	two := int64(2)
	if r, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InputJson: `{"key":"p","add":0}`, PinnedGeneration: &two}); err != nil || r.Generation != 2 {
		t.Fatalf("pinned to the new generation: %+v %v", r, err)
	}
}

func TestCallsArrivingDuringASwapWaitAndRunOnTheNewGeneration(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	h.count(a, module, "q", 10)
	d, _ := h.coord.Dispatcher("default", "stack", module)
	const n = 4
	type outcome struct {
		resp *gatewayv1.InvokeResponse
		err  error
	}
	results := make(chan outcome, n)
	var once sync.Once
	h.mu.Lock()
	h.afterPhase = func(_ hotswap.ActivationKey, _ string, phase string) {
		if phase != "quiesce" {
			return
		}
		once.Do(func() {
			// The old generation is quiesced: these calls must wait, not fail.
			for i := range n {
				go func() {
					r, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InputJson: fmt.Sprintf(`{"key":"q","add":%d}`, i+1)})
					results <- outcome{r, err}
				}()
			}
			waitFor(t, "the calls to queue during the swap", func() bool { return d.QueueLength() == n })
		})
	}
	h.mu.Unlock()
	next := h.deploy(a, counterImpl(t, module, "counter-b"), hotswap.SwapPolicy{})
	h.settle(a, next)
	var counts []int64
	for range n {
		o := <-results
		if o.err != nil {
			t.Fatalf("a call made during the swap failed: %v", o.err)
		}
		if o.resp.Generation != 2 || o.resp.QueuedMs == 0 {
			t.Fatalf("a call made during the swap ran on generation %d after %d ms in the queue; want generation 2, after waiting", o.resp.Generation, o.resp.QueuedMs)
		}
		counts = append(counts, decodeCounter(t, o.resp.ObservationJson).Count)
	}
	if got, _ := h.count(a, module, "q", 0); got.Count != 10+1+2+3+4 {
		t.Fatalf("count %d after the swap; want 20 (state migrated, every queued call ran once): %v", got.Count, counts)
	}
}

func TestDeadlines(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stack")
	ctx := context.Background()

	t.Run("a call whose deadline passes in the queue fails with deadline_exceeded and never runs", func(t *testing.T) {
		slow := make(chan error, 1)
		go func() {
			_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "holder", InputJson: `{"key":"d","add":1,"sleep_ms":1200}`})
			slow <- err
		}()
		waitFor(t, "the holder to run", func() bool {
			st, _ := h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "holder"})
			return st.GetState() == gatewayv1.InvocationState_INVOCATION_STATE_RUNNING
		})
		start := time.Now()
		_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "late", InputJson: `{"key":"d","add":100}`, DeadlineMs: 300})
		expectFailure(t, err, codes.DeadlineExceeded, "deadline_exceeded", "queue")
		if el := time.Since(start); el < 250*time.Millisecond || el > 1100*time.Millisecond {
			t.Fatalf("failed after %v; want about the 300 ms deadline", el)
		}
		if err := <-slow; err != nil {
			t.Fatal(err)
		}
		if got, _ := h.count(a, module, "d", 0); got.Count != 1 {
			t.Fatalf("count %d; want 1 (the late call never ran)", got.Count)
		}
	})

	t.Run("the gRPC deadline bounds the call when it is the earlier", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := h.client.Invoke(cctx, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "grpc-deadline", InputJson: `{"key":"e","add":1,"sleep_ms":5000}`, DeadlineMs: 60000})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("error %v; want DEADLINE_EXCEEDED", err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("returned after %v", el)
		}
		// The run itself got the caller's deadline as start.deadline_ms: it
		// ended (a run past its deadline is a fault of the provider) at
		// about 300 ms, not after its 5 s sleep.
		var st *gatewayv1.InvocationStatus
		waitFor(t, "the run to end", func() bool {
			st, _ = h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "grpc-deadline"})
			return st.GetState() == gatewayv1.InvocationState_INVOCATION_STATE_FAILED
		})
		if st.Reason != "deadline_exceeded" {
			t.Fatalf("status %v; want FAILED with deadline_exceeded", st)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Fatalf("the run ended after %v; its deadline was 300 ms", el)
		}
	})
}

func TestRequestsAreValidatedBeforeAnythingRuns(t *testing.T) {
	h := newHarness(t)
	h.counterActivation("default", "stack")
	ok := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InputJson: `{"key":"v","add":1}`}
	zero := int64(0)
	cases := []struct {
		name   string
		edit   func(r *gatewayv1.InvokeRequest)
		code   codes.Code
		reason string
		frag   string
	}{
		{"a namespace that is not a namespace name", func(r *gatewayv1.InvokeRequest) { r.Namespace = "Default" }, codes.InvalidArgument, reasons.InvalidRequest, `"Default"`},
		{"an empty activation", func(r *gatewayv1.InvokeRequest) { r.Activation = "" }, codes.InvalidArgument, reasons.InvalidRequest, "activation"},
		{"a module that is not a module ID", func(r *gatewayv1.InvokeRequest) { r.Module = "Prompt.System" }, codes.InvalidArgument, reasons.InvalidRequest, "module"},
		{"an invocation id with a space", func(r *gatewayv1.InvokeRequest) { r.InvocationId = "a b" }, codes.InvalidArgument, reasons.InvalidRequest, "invocation_id"},
		{"a pinned generation of 0", func(r *gatewayv1.InvokeRequest) { r.PinnedGeneration = &zero }, codes.InvalidArgument, reasons.InvalidRequest, "pinned_generation"},
		{"an input with a duplicate key", func(r *gatewayv1.InvokeRequest) { r.InputJson = `{"key":"v","key":"w"}` }, codes.FailedPrecondition, "schema_mismatch", "input_json"},
		{"an input with trailing data", func(r *gatewayv1.InvokeRequest) { r.InputJson = `{"key":"v"} {}` }, codes.FailedPrecondition, "schema_mismatch", "input_json"},
		{"an input over 512 KiB", func(r *gatewayv1.InvokeRequest) { r.InputJson = `"` + strings.Repeat("x", 512<<10) + `"` }, codes.FailedPrecondition, "schema_mismatch", "bytes"},
		{"a deadline over an hour", func(r *gatewayv1.InvokeRequest) { r.DeadlineMs = 3_600_001 }, codes.InvalidArgument, reasons.InvalidRequest, "deadline_ms"},
		{"an activation that is not on this node", func(r *gatewayv1.InvokeRequest) { r.Activation = "nope" }, codes.NotFound, reasons.NotFound, "default/nope"},
		{"a module the activation does not have", func(r *gatewayv1.InvokeRequest) { r.Module = "session_fork" }, codes.NotFound, reasons.NotFound, "session_fork"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &gatewayv1.InvokeRequest{Namespace: ok.Namespace, Activation: ok.Activation, Module: ok.Module, InputJson: ok.InputJson}
			tc.edit(r)
			_, err := h.invoke(nil, r)
			expectFailure(t, err, tc.code, tc.reason, tc.frag)
		})
	}
	entries, _, _, _ := h.server.table.stats()
	if entries != 0 {
		t.Fatalf("%d invocations recorded; refused requests are never recorded", entries)
	}
}

func TestACallWithoutPeerCredentialsIsUnauthenticated(t *testing.T) {
	h := newHarness(t)
	// A context that did not come through the unix socket transport.
	ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{})
	_, err := h.server.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module})
	expectFailure(t, err, codes.Unauthenticated, reasons.Unauthenticated, "peer credentials")
	_, err = h.server.Handshake(ctx, &gatewayv1.HandshakeRequest{})
	expectFailure(t, err, codes.Unauthenticated, reasons.Unauthenticated)
}

func TestAFullQueueRefusesWithResourceExhaustedAndTheIDStaysUsable(t *testing.T) {
	h := newHarness(t, func(c *hotswap.Config, _ *Config) { c.QueueLimit = 1 })
	a, _ := h.counterActivation("default", "stack")
	ctx := context.Background()
	errs := make(chan error, 2)
	for _, id := range []string{"holder", "waiter"} {
		go func() {
			_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: id, InputJson: `{"key":"f","add":1,"sleep_ms":600}`})
			errs <- err
		}()
		want := gatewayv1.InvocationState_INVOCATION_STATE_RUNNING
		if id == "waiter" {
			want = gatewayv1.InvocationState_INVOCATION_STATE_QUEUED
		}
		waitFor(t, id, func() bool {
			st, _ := h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: id})
			return st.GetState() == want
		})
	}
	req := &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InvocationId: "refused", InputJson: `{"key":"f","add":1}`}
	_, err := h.invoke(nil, req)
	expectFailure(t, err, codes.ResourceExhausted, "queue_full")
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Refused at the door, it never ran: the same ID may be sent again.
	r, err := h.invoke(nil, req)
	if err != nil || r.Replayed {
		t.Fatalf("retry of a refused call: %+v %v; want a first run", r, err)
	}
	if got, _ := h.count(a, module, "f", 0); got.Count != 3 {
		t.Fatalf("count %d; want 3", got.Count)
	}
}

func TestAModuleThatCannotServeIsReportedAtOnce(t *testing.T) {
	h := newHarness(t)
	a := newActivation("default", "broken")
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, Module: module, ImplementationID: "broken", Argv: []string{"--fault", "crash", "--at", "load", "--always"}})
	h.deploy(a, impl, hotswap.SwapPolicy{})
	waitFor(t, "the activation to fail", func() bool {
		st, ok := h.coord.Status(a.key.UID)
		return ok && !st.Busy && len(st.Failures) > 0
	})
	start := time.Now()
	_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "broken", Module: module, InputJson: `{"key":"b","add":1}`, DeadlineMs: 20000})
	expectFailure(t, err, codes.Unavailable, "activation_failed", "no active generation")
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("answered after %v: the call waited instead of failing at once", el)
	}
}

func TestStaleOutputIsDroppedAndTheCallFails(t *testing.T) {
	// A dispatcher switches only between runs, so a real provider cannot
	// produce this; the check is exercised directly: an observation that
	// arrives for generation 1 while the module routes to generation 2.
	srv, err := New(Config{Coordinator: emptyCoordinator{}})
	if err != nil {
		t.Fatal(err)
	}
	d := dispatch.NewDispatcher(module, 4)
	t.Cleanup(d.Close)
	if _, err := d.Switch(dispatch.Route{Lineage: 2, Name: "g2", Backend: nopBackend{}}); err != nil {
		t.Fatal(err)
	}
	inv := newInvocation()
	inv.key, inv.id, inv.module, inv.dispatcher, inv.streaming = "default\x00s", "s", module, d, true
	inv.started, inv.generation, inv.generationName = true, 1, "g1"
	srv.observe(inv, dispatch.Observation{Sequence: 1, Terminal: true, Body: []byte(`{"count":1}`)})
	if srv.DroppedObservations() != 1 || len(inv.events) != 0 {
		t.Fatalf("dropped %d, queued %d; want the stale observation dropped", srv.DroppedObservations(), len(inv.events))
	}
	srv.finish(inv, dispatch.Result{Lineage: 1, Name: "g1", Terminal: dispatch.Observation{Terminal: true, Body: []byte(`{"count":1}`)}}, nil)
	f := expectFailure(t, inv.err, codes.FailedPrecondition, "stale_generation", "dropped")
	if f.Generation != 2 || inv.result.Terminal.Body != nil {
		t.Fatalf("detail %+v, result %+v; want the serving generation and no output", f, inv.result)
	}
	// The current generation's output is delivered.
	inv2 := newInvocation()
	inv2.dispatcher, inv2.streaming, inv2.generation = d, true, 2
	srv.observe(inv2, dispatch.Observation{Sequence: 1, Body: []byte(`{}`)})
	if len(inv2.events) != 1 || srv.DroppedObservations() != 1 {
		t.Fatal("an observation of the serving generation was dropped")
	}
}

type emptyCoordinator struct{}

func (emptyCoordinator) Lookup(namespace, name, _ string) (*dispatch.Dispatcher, error) {
	return nil, &dispatch.CallError{Code: reasons.NotFound, Message: "no activation " + namespace + "/" + name + " on this node"}
}
func (emptyCoordinator) ServedModules() []dispatch.ServedModule { return nil }

type nopBackend struct{}

func (nopBackend) Run(context.Context, dispatch.RunRequest, func(dispatch.Observation)) (dispatch.Observation, error) {
	return dispatch.Observation{}, errors.New("not used")
}
func (nopBackend) Cancel(context.Context, string, string) error { return nil }
func (nopBackend) Fits(time.Duration, int) bool                 { return true }

func TestStoppingTheGatewayWithdrawsTheCallsStillQueuedAndTheyNeverRun(t *testing.T) {
	h := newHarness(t)
	a, _ := h.counterActivation("default", "stop")
	ctx := context.Background()
	slow, queued := h.slowThenQueued(t, "stop", "s", 1500)
	d, err := h.coord.Lookup("default", "stop", module)
	if err != nil {
		t.Fatal(err)
	}
	if d.QueueLength() != 1 {
		t.Fatalf("%d calls queued in the module; want the one", d.QueueLength())
	}
	h.client.Close()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h.server.Stop(stopCtx)
	if err := <-h.served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	h.server = nil
	if d.QueueLength() != 0 {
		t.Fatalf("%d calls still queued in the module after the gateway stopped; want none", d.QueueLength())
	}
	for _, ch := range []chan error{slow, queued} {
		if err := <-ch; err == nil {
			t.Fatal("a call answered OK over a connection the test closed")
		}
	}
	// The module's dispatcher outlives the gateway: a call through the next
	// one queues behind anything left, so its count says whether the
	// withdrawn call (+100) ran.
	h.startServer()
	if got, _ := h.count(a, module, "s", 0); got.Count != 1 {
		t.Fatalf("count %d; want 1 (the slow call ran, the withdrawn one never did)", got.Count)
	}
}

// slowThenQueued makes two calls to the counter of activation (namespace
// default): "slow" (adds 1 to key, then sleeps sleepMs), seen running, and
// "queued" (adds 100), seen queued behind it. Each channel gets its call's
// error.
func (h *harness) slowThenQueued(t *testing.T, activation, key string, sleepMs int) (slow, queued chan error) {
	t.Helper()
	ctx := context.Background()
	slow, queued = make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: activation, Module: module, InvocationId: "slow", InputJson: fmt.Sprintf(`{"key":%q,"add":1,"sleep_ms":%d}`, key, sleepMs)})
		slow <- err
	}()
	waitFor(t, "slow to run", func() bool {
		st, _ := h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "slow"})
		return st.GetState() == gatewayv1.InvocationState_INVOCATION_STATE_RUNNING
	})
	go func() {
		_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: "default", Activation: activation, Module: module, InvocationId: "queued", InputJson: fmt.Sprintf(`{"key":%q,"add":100}`, key)})
		queued <- err
	}()
	waitFor(t, "queued to queue", func() bool {
		st, _ := h.client.GetInvocationStatus(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "queued"})
		return st.GetState() == gatewayv1.InvocationState_INVOCATION_STATE_QUEUED
	})
	return slow, queued
}
