package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iteron.dev/operator/internal/reasons"
)

// outcome collects what a submitted call's done received, and how often.
type outcome struct {
	calls  atomic.Int32
	ended  chan struct{}
	result Result
	err    error
}

func newOutcome() *outcome { return &outcome{ended: make(chan struct{})} }

func (o *outcome) done(r Result, err error) {
	if o.calls.Add(1) == 1 {
		o.result, o.err = r, err
		close(o.ended)
	}
}

func (o *outcome) wait(t *testing.T) {
	t.Helper()
	select {
	case <-o.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the submitted call never ended")
	}
}

// submitted is a call to submit: the *Call is its handle.
func submitted(id string, timeout time.Duration) *Call {
	c := call(id, timeout)
	return &c
}

func codeOfErr(err error) string {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

func TestASubmittedCallNobodyWaitsForStillEndsAtItsDeadlineInTheQueue(t *testing.T) {
	d := NewDispatcher("prompt_system", 8) // paused, no route: the call can only wait
	t.Cleanup(d.Close)
	o := newOutcome()
	if err := d.Submit(submitted("c1", 20*time.Millisecond), o.done); err != nil {
		t.Fatal(err)
	}
	o.wait(t)
	if codeOfErr(o.err) != reasons.DeadlineExceeded || d.QueueLength() != 0 {
		t.Fatalf("err=%v queue=%d; want deadline_exceeded and the call out of the queue", o.err, d.QueueLength())
	}
}

func TestASubmittedCallRunsAndItsDoneGetsTheResult(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	o := newOutcome()
	q := submitted("c1", 5*time.Second)
	err := d.Submit(q, o.done)
	if err != nil {
		t.Fatal(err)
	}
	o.wait(t)
	if o.err != nil || o.result.Lineage != 1 || string(o.result.Terminal.Body) == "" {
		t.Fatalf("result=%+v err=%v; want generation 1's terminal observation", o.result, o.err)
	}
	if q.Withdraw(&CallError{Code: reasons.Cancelled}) {
		t.Fatal("a call that ended was withdrawn")
	}
}

func TestWithdrawingASubmittedCallThatRunsLeavesItToItsRun(t *testing.T) {
	b := newScripted("g1")
	b.hold = make(chan struct{})
	d := startedDispatcher(t, b, 1)
	o := newOutcome()
	q := submitted("c1", 5*time.Second)
	err := d.Submit(q, o.done)
	if err != nil {
		t.Fatal(err)
	}
	for b.runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if q.Withdraw(&CallError{Code: reasons.Cancelled, Message: "test"}) {
		t.Fatal("Withdraw took a running call out of the queue")
	}
	close(b.hold)
	o.wait(t)
	if o.err != nil {
		t.Fatalf("the run's result was replaced: %v", o.err)
	}
}

func TestACallRefusedAtOnceNeverCallsDone(t *testing.T) {
	d := NewDispatcher("prompt_system", 1)
	t.Cleanup(d.Close)
	first := newOutcome()
	if err := d.Submit(submitted("c1", 5*time.Second), first.done); err != nil {
		t.Fatal(err)
	}
	second := newOutcome()
	if err := d.Submit(submitted("c2", 5*time.Second), second.done); codeOfErr(err) != reasons.QueueFull {
		t.Fatalf("Submit to a full queue = %v, want queue_full", err)
	}
	d.SetUnavailable(reasons.ActivationFailed, "test")
	first.wait(t)
	if codeOfErr(first.err) != reasons.ActivationFailed || second.calls.Load() != 0 {
		t.Fatalf("queued call: %v (want activation_failed); refused call's done ran %d times (want 0)", first.err, second.calls.Load())
	}
}

// Every party that can end a call — its run, its deadline, a withdrawal,
// the dispatch loop, Close — races for it here: done runs exactly once for
// each call Submit accepted.
func TestEverySubmittedCallEndsExactlyOnceWhateverEndsIt(t *testing.T) {
	b := newScripted("g1")
	b.delay = 100 * time.Microsecond
	d := NewDispatcher("prompt_system", 64)
	if _, err := d.Switch(Route{Lineage: 1, Name: "g1", Backend: b}); err != nil {
		t.Fatal(err)
	}
	d.Resume()
	var (
		mu       sync.Mutex
		outcomes []*outcome
		wg       sync.WaitGroup
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				o := newOutcome()
				q := submitted(fmt.Sprintf("w%d-%d", w, i), time.Duration(i%5)*time.Millisecond+time.Microsecond)
				err := d.Submit(q, o.done)
				if err != nil {
					continue // refused at once (queue_full)
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
				if i%3 == 0 {
					q.Withdraw(&CallError{Code: reasons.Cancelled, Message: "test"})
				}
			}
		}()
	}
	wg.Wait()
	d.Close()
	for _, o := range outcomes {
		o.wait(t)
	}
	time.Sleep(20 * time.Millisecond) // a second done, if any, has had time to run
	for i, o := range outcomes {
		if n := o.calls.Load(); n != 1 {
			t.Fatalf("call %d: done ran %d times, want exactly once", i, n)
		}
	}
	if len(outcomes) == 0 {
		t.Fatal("no call was accepted")
	}
}

func TestAHandleCancelsAQueuedCallByWithdrawingIt(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	_, _ = d.Pause(context.Background(), time.Second) // as during a swap: calls queue
	o := newOutcome()
	h := submitted("c1", 5*time.Second)
	err := d.Submit(h, o.done)
	if err != nil {
		t.Fatal(err)
	}
	if _, started := h.Started(); started || h.CancelRequested() {
		t.Fatal("a queued call reports started or cancel requested")
	}
	if state, err := h.Cancel(context.Background(), "the client changed its mind"); state != "" || err != nil {
		t.Fatalf("Cancel = %q, %v; want nothing from a runtime", state, err)
	}
	select {
	case <-o.ended:
	default:
		t.Fatal("the withdrawn call had not ended when Cancel returned")
	}
	if codeOfErr(o.err) != reasons.Cancelled || !strings.Contains(o.err.Error(), "the client changed its mind") || !h.CancelRequested() {
		t.Fatalf("err=%v requested=%v; want cancelled with the reason", o.err, h.CancelRequested())
	}
	d.Resume()
	if b.runs.Load() != 0 || d.QueueLength() != 0 {
		t.Fatalf("runs=%d queue=%d; want the call never run and out of the queue", b.runs.Load(), d.QueueLength())
	}
}

func TestAHandleCancelsARunningCallInTheBackground(t *testing.T) {
	b := newScripted("g1")
	b.hold = make(chan struct{})
	d := startedDispatcher(t, b, 1)
	o := newOutcome()
	jobs := make(chan error, 1)
	c := call("c1", 10*time.Second)
	c.Background = func(job func() error) { go func() { jobs <- job() }() }
	h := &c
	err := d.Submit(h, o.done)
	if err != nil {
		t.Fatal(err)
	}
	for b.runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if route, started := h.Started(); !started || route.Lineage != 1 {
		t.Fatalf("Started = %+v, %v; want generation 1", route, started)
	}
	if _, err := h.Cancel(context.Background(), "client cancel"); err != nil {
		t.Fatal(err)
	}
	if err := <-jobs; err != nil {
		t.Fatalf("the background cancellation: %v", err)
	}
	o.wait(t)
	if o.err == nil || !h.CancelRequested() {
		t.Fatalf("err=%v requested=%v; want the run ended by its cancellation", o.err, h.CancelRequested())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.cancelled) != 1 || b.cancelled[0] != "c1" {
		t.Fatalf("backend cancelled %v; want c1", b.cancelled)
	}
}

func TestACallIsSubmittedOnceAndOneRefusedAtOnceMayBeSubmittedAgain(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	d.SetUnavailable(reasons.VerificationFailed, "nothing can serve")
	c := submitted("c1", 5*time.Second)
	if err := d.Submit(c, newOutcome().done); codeOfErr(err) != reasons.VerificationFailed {
		t.Fatalf("submit while unavailable: %v; want verification_failed", err)
	}
	if _, started := c.Started(); started || c.Withdraw(&CallError{Code: reasons.Cancelled}) {
		t.Fatal("a refused call reports a state of its own")
	}
	d.SetAvailable()
	o := newOutcome()
	if err := d.Submit(c, o.done); err != nil {
		t.Fatalf("the refused call submitted again: %v", err)
	}
	o.wait(t)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if err := d.Submit(c, newOutcome().done); codeOfErr(err) != reasons.InvalidRequest {
		t.Fatalf("a second submission of an accepted call: %v; want invalid_request", err)
	}
	if b.runs.Load() != 1 {
		t.Fatalf("%d runs; want 1", b.runs.Load())
	}
}
