package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/test/otlptest"
)

// callerContext is a caller's sampled W3C span context, as an instrumented
// client would send it.
func callerContext(seed byte) trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for i := range tid {
		tid[i] = seed + byte(i)
	}
	for i := range sid {
		sid[i] = seed ^ byte(0x5a+i)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// transactionTrace is the root span of module's one transaction of kind and
// the spans below it in start order; it fails the test unless there is
// exactly one.
func transactionTrace(t *testing.T, spans []otlptest.Span, kind, generation string) (otlptest.Span, []otlptest.Span) {
	t.Helper()
	var roots []otlptest.Span
	for _, s := range spans {
		if s.Name == "transaction "+kind && s.Attr(string(tracing.GenerationKey)) == generation {
			roots = append(roots, s)
		}
	}
	if len(roots) != 1 {
		t.Fatalf("%d %s transactions of %s traced; want exactly one", len(roots), kind, generation)
	}
	root := roots[0]
	if root.ParentID() != "" {
		t.Fatalf("the transaction's span has parent %s; a transaction is a trace of its own", root.ParentID())
	}
	var phases []otlptest.Span
	for _, s := range spans {
		if s.ParentID() == root.SpanID() {
			if s.TraceID() != root.TraceID() {
				t.Fatalf("phase %s is in trace %s, its transaction in %s", s.Name, s.TraceID(), root.TraceID())
			}
			phases = append(phases, s)
		}
	}
	return root, phases
}

func names(spans []otlptest.Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// checkAgainstLedger checks that each phase span names the sequence and hash
// of its transaction's record of that phase in the ledger file.
func checkAgainstLedger(t *testing.T, stateDir, uid, txnID string, phases []otlptest.Span) {
	t.Helper()
	dir, err := ledger.ActivationDir(stateDir, uid)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct{ seq, hash string }
	byPhase := map[string]rec{}
	if _, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		if r.TransactionID == txnID {
			byPhase[string(r.Phase)] = rec{fmt.Sprint(r.Sequence), r.RecordSHA256}
		}
		return nil
	}); err != nil {
		t.Fatalf("the ledger does not verify: %v", err)
	}
	if len(byPhase) != len(phases) {
		t.Errorf("the ledger has %d records of transaction %s, the trace %d phase spans %v", len(byPhase), txnID, len(phases), names(phases))
	}
	for _, p := range phases {
		want, ok := byPhase[p.Name]
		if !ok {
			t.Errorf("phase span %s has no record in the ledger", p.Name)
			continue
		}
		if got := p.Attr(string(tracing.LedgerSeqKey)); got != want.seq {
			t.Errorf("phase %s: span says ledger sequence %q, the ledger file %s", p.Name, got, want.seq)
		}
		if got := p.Attr(string(tracing.LedgerHashKey)); got != want.hash {
			t.Errorf("phase %s: span says record hash %q, the ledger file %s", p.Name, got, want.hash)
		}
	}
}

func TestAHotSwapUnderACallerLoopIsOneTraceWithEveryPhaseInOrderAndTheCallsThatWaitedLinkToIt(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "iteron-manager-test")
	rcv := otlptest.TraceTo(t, "iteron-manager")
	// counter-b's source was pulled for the swap (as the artifact
	// resolver reports an OCI source's pull to the coordinator).
	pullStart := time.Now().Add(-3 * time.Second).Truncate(time.Millisecond)
	pullEnd := pullStart.Add(1200 * time.Millisecond)
	h := newHarness(t, func(c *hotswap.Config, _ *Config) {
		c.Pulled = func(plan verifier.LaunchPlan) (hotswap.PullTiming, bool) {
			if plan.ImplementationID() != "counter-b" {
				return hotswap.PullTiming{}, false
			}
			return hotswap.PullTiming{Digest: "sha256:" + strings.Repeat("b", 64), Start: pullStart, End: pullEnd}, true
		}
	})
	a, _ := h.counterActivation("default", "stack")
	d, _ := h.coord.Dispatcher("default", "stack", module)
	caller := callerContext(0x10)
	ctx := tracing.ToOutgoing(context.Background(), caller)

	// A caller loop, before, during and after the swap.
	stop := make(chan struct{})
	var loop sync.WaitGroup
	var calls, failed atomic.Int64
	loop.Add(1)
	go func() {
		defer loop.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			_, err := h.invoke(cctx, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InputJson: `{"key":"loop","add":1}`})
			cancel()
			calls.Add(1)
			if err != nil {
				failed.Add(1)
				t.Errorf("a call of the loop failed: %v", err)
			}
		}
	}()
	// And calls that certainly wait: made once the old generation is
	// quiesced.
	const waiting = 3
	var quiesced sync.WaitGroup
	quiesced.Add(waiting)
	var once sync.Once
	h.mu.Lock()
	h.afterPhase = func(_ hotswap.ActivationKey, _ string, phase string) {
		if phase != string(ledger.PhaseQuiesce) {
			return
		}
		once.Do(func() {
			for i := range waiting {
				go func() {
					defer quiesced.Done()
					if _, err := h.invoke(ctx, &gatewayv1.InvokeRequest{Namespace: "default", Activation: "stack", Module: module, InputJson: fmt.Sprintf(`{"key":"w","add":%d}`, i+1)}); err != nil {
						t.Errorf("a call made during the swap failed: %v", err)
					}
				}()
			}
			waitFor(t, "the calls to queue during the swap", func() bool { return d.QueueLength() >= waiting })
		})
	}
	h.mu.Unlock()
	// The swap is a rollout's stamp: its transaction links to the node's
	// span.
	a.rollout = callerContext(0x77)
	next := h.deploy(a, counterImpl(t, module, "counter-b"), hotswap.SwapPolicy{})
	h.settle(a, next)
	quiesced.Wait()
	time.Sleep(50 * time.Millisecond) // a few calls of the loop after the swap
	close(stop)
	loop.Wait()
	t.Logf("the caller loop made %d calls, %d failed", calls.Load(), failed.Load())

	var root otlptest.Span
	var phases []otlptest.Span
	spans := rcv.WaitFor(t, "the hot swap's trace", func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Name == "transaction hot_swap" {
				return true
			}
		}
		return false
	})
	rcv.WaitFor(t, "every phase of the hot swap", func(spans []otlptest.Span) bool {
		root, phases = transactionTrace(t, spans, "hot_swap", next.GenerationName)
		return len(phases) >= 11
	})
	spans = rcv.Spans()
	root, phases = transactionTrace(t, spans, "hot_swap", next.GenerationName)
	want := []string{"pull", "verify", "shadow_load", "quiesce", "snapshot", "migrate", "restore", "readiness", "atomic_switch", "drain", "committed"}
	if got := names(phases); !slices.Equal(got, want) {
		t.Fatalf("the hot swap's phase spans, in start order, are %v; want %v", got, want)
	}
	// The trace opens with the pull of the new source, as it happened.
	pull := phases[0]
	if root.StartTimeUnixNano != uint64(pullStart.UnixNano()) || pull.StartTimeUnixNano != uint64(pullStart.UnixNano()) || pull.EndTimeUnixNano != uint64(pullEnd.UnixNano()) ||
		pull.Attr("iteron.source.digest") != "sha256:"+strings.Repeat("b", 64) {
		t.Errorf("the pull span runs %d–%d (the transaction from %d) for %q; want the pull's %d–%d and digest",
			pull.StartTimeUnixNano, pull.EndTimeUnixNano, root.StartTimeUnixNano, pull.Attr("iteron.source.digest"), pullStart.UnixNano(), pullEnd.UnixNano())
	}
	phases = phases[1:]
	for i := 1; i < len(phases); i++ {
		if phases[i].StartTimeUnixNano < phases[i-1].EndTimeUnixNano {
			t.Errorf("phase %s starts before phase %s ended", phases[i].Name, phases[i-1].Name)
		}
	}
	if root.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR || root.Attr(string(tracing.OutcomeKey)) != "committed" {
		t.Errorf("the transaction's span has status %v and outcome %q; want committed", root.Status, root.Attr(string(tracing.OutcomeKey)))
	}
	if root.Attr(string(tracing.ModuleKey)) != module || root.Attr(string(tracing.LineageKey)) != "2" {
		t.Errorf("the transaction's span names module %q lineage %q; want %s and 2", root.Attr(string(tracing.ModuleKey)), root.Attr(string(tracing.LineageKey)), module)
	}
	if !root.LinksTo(a.rollout.SpanID().String()) {
		t.Errorf("the transaction's span does not link to the rollout's node span %s", a.rollout.SpanID())
	}
	if root.Service != "iteron-manager-test" {
		t.Errorf("the spans come from service %q; want OTEL_SERVICE_NAME's iteron-manager-test", root.Service)
	}
	checkAgainstLedger(t, h.stateDir, a.key.UID, root.Attr(string(tracing.TransactionKey)), phases)

	// The calls that waited for the swap: their queue spans link to it, and
	// each is part of the caller's trace.
	byID := map[string]otlptest.Span{}
	for _, s := range spans {
		byID[s.SpanID()] = s
	}
	linked := 0
	for _, s := range spans {
		if s.Name != "queue" || !s.LinksTo(root.SpanID()) {
			continue
		}
		linked++
		call, ok := byID[s.ParentID()]
		if !ok || call.Name != "invoke" {
			t.Fatalf("a queue span's parent %s is not a received invoke span", s.ParentID())
		}
		if call.TraceID() != caller.TraceID().String() || call.ParentID() != caller.SpanID().String() {
			t.Errorf("the call's span is in trace %s below %s; want the caller's %s below %s", call.TraceID(), call.ParentID(), caller.TraceID(), caller.SpanID())
		}
		if s.EndTimeUnixNano < phases[7].StartTimeUnixNano {
			t.Errorf("a call linked to the swap left the queue before the atomic switch")
		}
		ran := false
		for _, r := range spans {
			if r.ParentID() == call.SpanID() && r.Name == "run" && r.Attr(string(tracing.LineageKey)) == "2" {
				ran = true
			}
		}
		if !ran {
			t.Errorf("call %s waited for the swap but has no run span on generation 2", call.Attr(string(tracing.InvocationKey)))
		}
	}
	if linked < waiting {
		t.Fatalf("%d queue spans link to the swap; want at least the %d calls made after its quiesce", linked, waiting)
	}
	t.Logf("trace %s: %d phases, %d calls linked to the swap", root.TraceID(), len(phases), linked)
}

func TestAFailedSwapsTraceNamesTheFailingPhaseAndReasonAndItsLogLinesCarryTheTrace(t *testing.T) {
	rcv := otlptest.TraceTo(t, "iteron-manager")
	var logMu sync.Mutex
	var lines []string
	h := newHarness(t, func(c *hotswap.Config, _ *Config) {
		c.Log = funcr.New(func(prefix, args string) {
			logMu.Lock()
			lines = append(lines, args)
			logMu.Unlock()
		}, funcr.Options{})
	})
	a, _ := h.counterActivation("default", "stack")
	broken := providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, Module: module, ImplementationID: "broken-migrate",
		Argv: []string{"--fault", "crash", "--at", "migrate", "--always"}})
	g2 := h.deploy(a, broken, hotswap.SwapPolicy{})
	waitFor(t, "the failed swap to settle", func() bool {
		st, ok := h.coord.Status(a.key.UID)
		return ok && !st.Busy && len(st.Failures) > 0
	})

	var root otlptest.Span
	var phases []otlptest.Span
	rcv.WaitFor(t, "the failed swap's trace", func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Name == "transaction hot_swap" && s.Attr(string(tracing.GenerationKey)) == g2.GenerationName {
				root, phases = transactionTrace(t, spans, "hot_swap", g2.GenerationName)
				return len(phases) > 0 && phases[len(phases)-1].Name == "rolled_back"
			}
		}
		return false
	})
	want := []string{"verify", "shadow_load", "quiesce", "snapshot", "migrate", "rolled_back"}
	if got := names(phases); !slices.Equal(got, want) {
		t.Fatalf("the failed swap's phase spans are %v; want %v", got, want)
	}
	migrate := phases[4]
	if migrate.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || migrate.Attr(string(tracing.ReasonKey)) == "" {
		t.Fatalf("the migrate span has status %v and reason %q; want an error with its reason code", migrate.Status, migrate.Attr(string(tracing.ReasonKey)))
	}
	reason := migrate.Attr(string(tracing.ReasonKey))
	if root.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || root.Attr(string(tracing.PhaseKey)) != "migrate" || root.Attr(string(tracing.ReasonKey)) != reason ||
		!strings.Contains(root.Status.GetMessage(), reason) {
		t.Fatalf("the transaction's span has status %v, phase %q, reason %q; want an error naming migrate and %s", root.Status, root.Attr(string(tracing.PhaseKey)), root.Attr(string(tracing.ReasonKey)), reason)
	}
	if root.Attr(string(tracing.OutcomeKey)) != "rolled_back" {
		t.Errorf("the transaction's outcome is %q; want rolled_back", root.Attr(string(tracing.OutcomeKey)))
	}
	checkAgainstLedger(t, h.stateDir, a.key.UID, root.Attr(string(tracing.TransactionKey)), phases)

	// The log line of the rollback names the trace and the span it is in.
	logMu.Lock()
	defer logMu.Unlock()
	found := false
	for _, l := range lines {
		if strings.Contains(l, `"transaction rolled back"`) {
			found = true
			if !strings.Contains(l, `"trace_id"="`+root.TraceID()+`"`) || !strings.Contains(l, `"span_id"=`) {
				t.Errorf("the rollback's log line does not carry trace %s and a span: %s", root.TraceID(), l)
			}
		}
	}
	if !found {
		t.Fatalf("no \"transaction rolled back\" log line among %d", len(lines))
	}
	t.Logf("trace %s: failed at %s with %s", root.TraceID(), root.Attr(string(tracing.PhaseKey)), reason)
}

func TestAPackageRuntimesCallCarriesTheRunsTraceContextOnToTheRuntime(t *testing.T) {
	rcv := otlptest.TraceTo(t, "iteron-manager")
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "stack")
	target := h.deployPlan(a, seedPlan(t, module), hotswap.SwapPolicy{})
	h.settle(a, target)
	caller := callerContext(0x30)
	get := func(ctx context.Context) string {
		t.Helper()
		resp, err := h.invoke(ctx, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
			Export: "get", InputJson: `{"key":"traceparent"}`})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetValueJson()
	}
	if got := get(context.Background()); got != "null" {
		t.Fatalf("an untraced call (parentbased_always_off, no caller context) reached the runtime with traceparent %s", got)
	}
	cctx, cancel := context.WithTimeout(tracing.ToOutgoing(context.Background(), caller), time.Minute)
	defer cancel()
	got := get(cctx)
	spans := rcv.WaitFor(t, "the call's run span", func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Name == "run" && s.TraceID() == caller.TraceID().String() {
				return true
			}
		}
		return false
	})
	for _, s := range spans {
		if s.Name == "run" && s.TraceID() == caller.TraceID().String() {
			if want := `"00-` + s.TraceID() + "-" + s.SpanID() + `-01"`; got != want {
				t.Fatalf("the runtime got traceparent %s; want the run's span, %s", got, want)
			}
			return
		}
	}
}
