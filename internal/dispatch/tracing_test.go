package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/test/otlptest"
)

// hopBackend relays its runs "through the survivor": it notes the hop's
// times as a survivor-backed provider does.
type hopBackend struct{ *scriptedBackend }

func (b hopBackend) Run(ctx context.Context, req RunRequest, observe func(Observation)) (Observation, error) {
	if req.Hop != nil {
		req.Hop.Start = time.Now()
		defer func() { req.Hop.End = time.Now() }()
	}
	return b.scriptedBackend.Run(ctx, req, observe)
}

// recordSpans turns tracing on for the test, sampling what the caller's
// context says, and returns the spans made so far when asked.
func recordSpans(t *testing.T) func() map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	rec := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	return func() map[string]sdktrace.ReadOnlySpan {
		tracing.Flush()
		out := map[string]sdktrace.ReadOnlySpan{}
		for _, sp := range rec.Ended() {
			out[sp.Name()] = sp
		}
		return out
	}
}

func sampledCall() trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled})
}

func TestATracedCallsQueueRunAndSurvivorHopAreSpansBelowTheCallLinkedToTheSwapItWaitedFor(t *testing.T) {
	spans := recordSpans(t)
	d := startedDispatcher(t, hopBackend{newScripted("g1")}, 1)
	swap := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{9}, TraceFlags: trace.FlagsSampled})
	if _, err := d.Pause(trace.ContextWithSpanContext(context.Background(), swap), time.Second); err != nil {
		t.Fatal(err)
	}
	c := call("traced", 10*time.Second)
	c.Span = sampledCall()
	done := make(chan error, 1)
	go func() { _, err := d.Invoke(context.Background(), c); done <- err }()
	waitUntil(t, func() bool { return d.QueueLength() == 1 })
	d.Resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var got map[string]sdktrace.ReadOnlySpan
	waitUntil(t, func() bool { got = spans(); return len(got) == 3 })
	queue, run, hop := got["queue"], got["run"], got["survivor_hop"]
	if queue.Parent().SpanID() != c.Span.SpanID() || run.Parent().SpanID() != c.Span.SpanID() || hop.Parent().SpanID() != run.SpanContext().SpanID() {
		t.Fatalf("parents: queue %s, run %s, hop %s; want the call %s, the call, the run %s",
			queue.Parent().SpanID(), run.Parent().SpanID(), hop.Parent().SpanID(), c.Span.SpanID(), run.SpanContext().SpanID())
	}
	if len(queue.Links()) != 1 || queue.Links()[0].SpanContext.SpanID() != swap.SpanID() {
		t.Fatalf("the queue span links %v; want the swap it waited for", queue.Links())
	}
	if queue.EndTime().After(run.StartTime()) || hop.StartTime().Before(run.StartTime()) || hop.EndTime().After(run.EndTime()) {
		t.Fatal("the queue does not end as the run starts, or the hop is not inside the run")
	}
}

func TestACallThatNeverRanHasOnlyAFailedQueueSpanAndAnUntracedCallHasNone(t *testing.T) {
	spans := recordSpans(t)
	d := startedDispatcher(t, newScripted("g1"), 1)
	if _, err := d.Pause(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	c := call("late", 30*time.Millisecond)
	c.Span = sampledCall()
	if _, err := d.Invoke(context.Background(), c); err == nil {
		t.Fatal("a call that waited out its deadline succeeded")
	}
	if _, err := d.Invoke(context.Background(), call("untraced", 30*time.Millisecond)); err == nil {
		t.Fatal("a call that waited out its deadline succeeded")
	}
	var got map[string]sdktrace.ReadOnlySpan
	waitUntil(t, func() bool { got = spans(); return len(got) > 0 })
	time.Sleep(20 * time.Millisecond)
	got = spans()
	q, ok := got["queue"]
	if len(got) != 1 || !ok || q.Status().Description == "" || q.Attributes()[0].Value.AsString() != reasons.DeadlineExceeded {
		t.Fatalf("spans %v; want one failed queue span with reason %s", got, reasons.DeadlineExceeded)
	}
}

func TestWithTracingOffACallAllocatesNothingForTracing(t *testing.T) {
	d := startedDispatcher(t, newScripted("g1"), 1)
	c := call("warm", time.Minute)
	if _, err := d.Invoke(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	run := func(traced bool) float64 {
		i := 0
		return testing.AllocsPerRun(200, func() {
			i++
			c := call("c", time.Minute)
			if traced {
				c.Span = sampledCall() // tracing is off: the context is carried, nothing is made
			}
			if _, err := d.Invoke(context.Background(), c); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
		})
	}
	plain, carried := run(false), run(true)
	if carried > plain {
		t.Fatalf("a call with a sampled context allocates %.1f with tracing off, %.1f without one", carried, plain)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
