package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"iteron.dev/operator/internal/reasons"
)

func TestWithdrawingAQueuedCallFailsItAsCancelledAndItNeverRuns(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	// Paused, as during a swap: calls queue.
	_, _ = d.Pause(context.Background(), time.Second)
	errc := make(chan error, 2)
	results := make(chan Result, 1)
	go func() { _, err := d.Invoke(context.Background(), call("withdrawn", 5*time.Second)); errc <- err }()
	for d.QueueLength() < 1 {
		time.Sleep(time.Millisecond)
	}
	go func() {
		r, err := d.Invoke(context.Background(), call("kept", 5*time.Second))
		errc <- err
		results <- r
	}()
	for d.QueueLength() < 2 {
		time.Sleep(time.Millisecond)
	}
	if !d.Withdraw("withdrawn", "the client changed its mind") {
		t.Fatal("Withdraw did not find the queued call")
	}
	var ce *CallError
	if err := <-errc; !errors.As(err, &ce) || ce.Code != reasons.Cancelled {
		t.Fatalf("withdrawn call: %v; want code cancelled", err)
	}
	if d.QueueLength() != 1 {
		t.Fatalf("queue length %d after withdrawing one of two", d.QueueLength())
	}
	if d.Withdraw("withdrawn", "again") {
		t.Fatal("a second Withdraw of the same call found it")
	}
	d.Resume()
	if err := <-errc; err != nil {
		t.Fatalf("the call behind the withdrawn one: %v", err)
	}
	<-results
	if got := b.runs.Load(); got != 1 {
		t.Fatalf("%d runs; want 1 (the withdrawn call never runs)", got)
	}
}

func TestCancellingTheRunningCallAsksTheBackendAndTheCallEndsWithItsError(t *testing.T) {
	b := newScripted("g1")
	b.hold = make(chan struct{})
	d := startedDispatcher(t, b, 1)
	errc := make(chan error, 1)
	go func() { _, err := d.Invoke(context.Background(), call("long", 10*time.Second)); errc <- err }()
	for b.active.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if run, ok := d.Running(); !ok || run.CallID != "long" || run.Route.Lineage != 1 {
		t.Fatalf("Running() = %+v, %v; want call long on lineage 1", run, ok)
	}
	if d.Withdraw("long", "not queued") {
		t.Fatal("Withdraw found a running call")
	}
	ok, err := d.CancelRunning(context.Background(), "long", "client cancel")
	if !ok || err != nil {
		t.Fatalf("CancelRunning = %v, %v; want true, nil", ok, err)
	}
	var ce *CallError
	if err := <-errc; !errors.As(err, &ce) || ce.Code != reasons.ProviderFailed || ce.Err == nil || ce.Err.Error() != "cancelled" {
		t.Fatalf("cancelled call: %v; want the backend's error", err)
	}
	if len(b.cancelled) != 1 || b.cancelled[0] != "long" {
		t.Fatalf("backend cancelled %v", b.cancelled)
	}
	if _, ok := d.Running(); ok {
		t.Fatal("the slot is still occupied after the cancelled run ended")
	}
}

func TestCancellingACallThatIsNeitherQueuedNorRunningDoesNothing(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	if _, err := d.Invoke(context.Background(), call("done", time.Second)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		id   string
	}{
		{"a finished call", "done"},
		{"an unknown call", "never-made"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if d.Withdraw(tc.id, "x") {
				t.Fatal("Withdraw found it")
			}
			if ok, err := d.CancelRunning(context.Background(), tc.id, "x"); ok || err != nil {
				t.Fatalf("CancelRunning = %v, %v; want false, nil", ok, err)
			}
		})
	}
	if len(b.cancelled) != 0 {
		t.Fatalf("the backend was asked to cancel %v", b.cancelled)
	}
}
