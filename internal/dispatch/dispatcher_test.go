package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// scriptedBackend is a pure-logic stand-in for a provider process: each run
// blocks until released (or cancelled) and records concurrency. The real
// process path is tested through the coordinator with real providers.
type scriptedBackend struct {
	name      string
	hold      chan struct{} // runs wait on it when non-nil
	delay     time.Duration // each run takes this long
	active    atomic.Int32
	maxActive atomic.Int32
	runs      atomic.Int32
	fits      atomic.Bool
	mu        sync.Mutex
	cancelled []string
	cancelCh  map[string]chan struct{}
}

func newScripted(name string) *scriptedBackend {
	b := &scriptedBackend{name: name, cancelCh: map[string]chan struct{}{}}
	b.fits.Store(true)
	return b
}

func (b *scriptedBackend) Run(ctx context.Context, req RunRequest, observe func(Observation)) (Observation, error) {
	runID, input := req.ID, req.Input
	n := b.active.Add(1)
	defer b.active.Add(-1)
	for {
		m := b.maxActive.Load()
		if n <= m || b.maxActive.CompareAndSwap(m, n) {
			break
		}
	}
	b.runs.Add(1)
	b.mu.Lock()
	cancel := make(chan struct{})
	b.cancelCh[runID] = cancel
	b.mu.Unlock()
	time.Sleep(b.delay)
	if b.hold != nil {
		select {
		case <-b.hold:
		case <-cancel:
			return Observation{}, errors.New("cancelled")
		case <-ctx.Done():
			return Observation{}, ctx.Err()
		}
	}
	obs := Observation{Sequence: 1, Terminal: true, Body: []byte(fmt.Sprintf(`{"served_by":%q,"input":%s}`, b.name, input.Raw()))}
	if observe != nil {
		observe(obs)
	}
	return obs, nil
}

func (b *scriptedBackend) Cancel(ctx context.Context, runID, reason string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cancelled = append(b.cancelled, runID)
	if ch, ok := b.cancelCh[runID]; ok {
		close(ch)
		delete(b.cancelCh, runID)
	}
	return nil
}

func (b *scriptedBackend) Fits(time.Duration, int) bool { return b.fits.Load() }

// startedDispatcher returns a running dispatcher with a queue bound of 8.
func startedDispatcher(t *testing.T, b Backend, lineage int64) *Dispatcher {
	t.Helper()
	d := NewDispatcher("prompt_system", 8)
	if _, err := d.Switch(Route{Lineage: lineage, Name: fmt.Sprint("g", lineage), Backend: b}); err != nil {
		t.Fatal(err)
	}
	d.Resume()
	t.Cleanup(d.Close)
	return d
}

func call(id string, timeout time.Duration) Call {
	return Call{ID: id, Input: protocol.MustPayload(`{}`), Deadline: time.Now().Add(timeout)}
}

func TestCallsRunOneAtATime(t *testing.T) {
	b := newScripted("g1")
	b.delay = 2 * time.Millisecond
	d := startedDispatcher(t, b, 1)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := d.Invoke(context.Background(), call(fmt.Sprint("c", i), 5*time.Second)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if b.runs.Load() != 8 || b.maxActive.Load() != 1 {
		t.Fatalf("runs=%d max concurrent=%d; want 8 runs, never more than 1 at once", b.runs.Load(), b.maxActive.Load())
	}
}

func TestCallsWaitAcrossASwitchAndRunOnTheNewGeneration(t *testing.T) {
	old, next := newScripted("g1"), newScripted("g2")
	d := startedDispatcher(t, old, 1)
	if _, err := d.Pause(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	results := make(chan Result, 3)
	for i := range 3 {
		go func() {
			r, err := d.Invoke(context.Background(), call(fmt.Sprint("c", i), 5*time.Second))
			if err != nil {
				t.Error(err)
			}
			results <- r
		}()
	}
	for d.QueueLength() < 3 {
		time.Sleep(time.Millisecond)
	}
	if old.runs.Load() != 0 {
		t.Fatal("a call ran while paused")
	}
	prev, err := d.Switch(Route{Lineage: 2, Name: "g2", Backend: next})
	if err != nil || prev.Lineage != 1 {
		t.Fatalf("Switch: prev=%+v err=%v", prev, err)
	}
	d.Resume()
	for range 3 {
		if r := <-results; r.Lineage != 2 || r.Name != "g2" {
			t.Fatalf("served by %d/%s, want the new generation", r.Lineage, r.Name)
		}
	}
	if old.runs.Load() != 0 || next.runs.Load() != 3 {
		t.Fatalf("old ran %d, new ran %d", old.runs.Load(), next.runs.Load())
	}
}

func TestAPinnedCallFailsWithStaleGenerationAfterACutover(t *testing.T) {
	d := startedDispatcher(t, newScripted("g1"), 1)
	c := call("pinned-ok", time.Second)
	c.PinnedLineage = 1
	if r, err := d.Invoke(context.Background(), c); err != nil || r.Lineage != 1 {
		t.Fatalf("pinned to the active lineage: %+v %v", r, err)
	}
	_, _ = d.Pause(context.Background(), time.Second)
	_, _ = d.Switch(Route{Lineage: 2, Name: "g2", Backend: newScripted("g2")})
	d.Resume()
	c = call("pinned-stale", time.Second)
	c.PinnedLineage = 1
	_, err := d.Invoke(context.Background(), c)
	var ce *CallError
	if !errors.As(err, &ce) || ce.Code != reasons.StaleGeneration {
		t.Fatalf("pinned to the old lineage: %v; want stale_generation", err)
	}
}

func TestAPinnedCallQueuedAcrossACutoverFailsWithStaleGeneration(t *testing.T) {
	d := startedDispatcher(t, newScripted("g1"), 1)
	_, _ = d.Pause(context.Background(), time.Second)
	errc := make(chan error, 1)
	go func() {
		c := call("pinned", 5*time.Second)
		c.PinnedLineage = 1
		_, err := d.Invoke(context.Background(), c)
		errc <- err
	}()
	for d.QueueLength() < 1 {
		time.Sleep(time.Millisecond)
	}
	_, _ = d.Switch(Route{Lineage: 2, Name: "g2", Backend: newScripted("g2")})
	d.Resume()
	var ce *CallError
	if err := <-errc; !errors.As(err, &ce) || ce.Code != reasons.StaleGeneration {
		t.Fatalf("queued pinned call: %v; want stale_generation", err)
	}
}

func TestAFullQueueRefusesWithQueueFull(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	_, _ = d.Pause(context.Background(), time.Second)
	for i := range 8 {
		go func() { _, _ = d.Invoke(context.Background(), call(fmt.Sprint("c", i), 5*time.Second)) }()
	}
	for d.QueueLength() < 8 {
		time.Sleep(time.Millisecond)
	}
	_, err := d.Invoke(context.Background(), call("one-too-many", 5*time.Second))
	var ce *CallError
	if !errors.As(err, &ce) || ce.Code != reasons.QueueFull {
		t.Fatalf("9th call: %v; want queue_full", err)
	}
	d.Resume()
}

func TestADeadlinePassingInTheQueueFailsAndWithdrawsTheCall(t *testing.T) {
	b := newScripted("g1")
	d := startedDispatcher(t, b, 1)
	_, _ = d.Pause(context.Background(), time.Second)
	_, err := d.Invoke(context.Background(), call("late", 50*time.Millisecond))
	var ce *CallError
	if !errors.As(err, &ce) || ce.Code != reasons.DeadlineExceeded {
		t.Fatalf("call: %v; want deadline_exceeded", err)
	}
	if d.QueueLength() != 0 {
		t.Fatalf("the expired call is still queued")
	}
	d.Resume()
	time.Sleep(20 * time.Millisecond)
	if b.runs.Load() != 0 {
		t.Fatal("an expired call ran")
	}
}

func TestPauseCancelsARunThatOutlivesTheQuiesceTimeout(t *testing.T) {
	b := newScripted("g1")
	b.hold = make(chan struct{})
	d := startedDispatcher(t, b, 1)
	errc := make(chan error, 1)
	go func() { _, err := d.Invoke(context.Background(), call("long-run", 10*time.Second)); errc <- err }()
	for b.active.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancelled, err := d.Pause(context.Background(), 50*time.Millisecond)
	if err != nil || len(cancelled) != 1 || cancelled[0].CallID != "long-run" || cancelled[0].Route.Lineage != 1 {
		t.Fatalf("Pause: cancelled=%+v err=%v; want the in-flight run reported", cancelled, err)
	}
	if err := <-errc; err == nil {
		t.Fatal("the cancelled call reported success")
	}
	if b.cancelled[0] != "long-run" {
		t.Fatalf("cancelled %v", b.cancelled)
	}
}

func TestPauseWithoutARunInFlightCancelsNothing(t *testing.T) {
	d := startedDispatcher(t, newScripted("g1"), 1)
	if cancelled, err := d.Pause(context.Background(), time.Millisecond); cancelled != nil || err != nil {
		t.Fatalf("Pause on an idle dispatcher: %+v %v", cancelled, err)
	}
}

func TestSwitchRefusesWhileDispatching(t *testing.T) {
	d := startedDispatcher(t, newScripted("g1"), 1)
	if _, err := d.Switch(Route{Lineage: 2, Backend: newScripted("g2")}); err == nil {
		t.Fatal("Switch on a running dispatcher succeeded")
	}
	if d.Route().Lineage != 1 {
		t.Fatal("the route changed")
	}
}

func TestACallThatDoesNotFitTheRemainingLifetimeWaitsForTheRenewal(t *testing.T) {
	old, renewed := newScripted("g1"), newScripted("g1-renewed")
	old.fits.Store(false)
	d := startedDispatcher(t, old, 1)
	res := make(chan Result, 1)
	go func() {
		r, err := d.Invoke(context.Background(), call("c", 5*time.Second))
		if err != nil {
			t.Error(err)
		}
		res <- r
	}()
	for d.QueueLength() < 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if old.runs.Load() != 0 {
		t.Fatal("a call that does not fit ran")
	}
	_, _ = d.Pause(context.Background(), time.Second)
	_, _ = d.Switch(Route{Lineage: 1, Name: "g1", Backend: renewed})
	d.Resume()
	<-res
	if renewed.runs.Load() != 1 {
		t.Fatal("the call did not run on the renewed process")
	}
}

func TestCloseFailsQueuedCalls(t *testing.T) {
	d := NewDispatcher("prompt_system", 8)
	errc := make(chan error, 1)
	go func() { _, err := d.Invoke(context.Background(), call("c", 5*time.Second)); errc <- err }()
	for d.QueueLength() < 1 {
		time.Sleep(time.Millisecond)
	}
	d.Close()
	d.Close()
	if err := <-errc; !errors.Is(err, ErrDispatcherClosed) {
		t.Fatalf("queued call after Close: %v", err)
	}
	if _, err := d.Invoke(context.Background(), call("after", time.Second)); !errors.Is(err, ErrDispatcherClosed) {
		t.Fatalf("call after Close: %v", err)
	}
}

func TestARouteWithSeveralSlotsRunsThatManyCallsAtOnceAndQuiesceCancelsEveryOne(t *testing.T) {
	b := newScripted("g1")
	b.hold = make(chan struct{})
	d := NewDispatcher("prompt_system", 8)
	if _, err := d.Switch(Route{Lineage: 1, Name: "g1", Backend: b, Slots: 3}); err != nil {
		t.Fatal(err)
	}
	d.Resume()
	t.Cleanup(d.Close)
	errc := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := d.Invoke(context.Background(), call(fmt.Sprint("c", i), 10*time.Second))
			errc <- err
		}()
	}
	for b.active.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	if q := d.QueueLength(); q != 1 {
		t.Fatalf("with 3 slots full, %d calls wait; want 1", q)
	}
	cancelled, err := d.Pause(context.Background(), 20*time.Millisecond)
	if err != nil || len(cancelled) != 3 {
		t.Fatalf("Pause: cancelled %+v, err %v; want the 3 runs in flight", cancelled, err)
	}
	for range 3 {
		if err := <-errc; err == nil {
			t.Fatal("a cancelled call reported success")
		}
	}
	if got := b.maxActive.Load(); got != 3 {
		t.Fatalf("at most %d runs ran at once; want 3", got)
	}
	if d.QueueLength() != 1 || b.runs.Load() != 3 {
		t.Fatalf("paused: %d queued, %d runs started; want the fourth call still queued", d.QueueLength(), b.runs.Load())
	}
	close(b.hold)
	d.Resume()
	if err := <-errc; err != nil {
		t.Fatalf("the fourth call, run after the pause: %v", err)
	}
}
