package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

// fakeRuntime is a package runtime as a route offers it: only its exit is
// observed here.
type fakeRuntime struct {
	*scriptedBackend
	exited chan struct{}
}

func newFakeRuntime(name string) *fakeRuntime {
	return &fakeRuntime{scriptedBackend: newScripted(name), exited: make(chan struct{})}
}

func (*fakeRuntime) Watch(context.Context, PackageCall, protocol.Payload) (*pkgruntime.Watch, error) {
	return nil, nil
}
func (*fakeRuntime) Status(context.Context, string) (string, error) { return "", nil }
func (*fakeRuntime) CancelInvocation(context.Context, string) (string, error) {
	return "", nil
}
func (*fakeRuntime) Exports() []string                   { return nil }
func (*fakeRuntime) CancellationDeadline() time.Duration { return time.Second }
func (r *fakeRuntime) Exited() <-chan struct{}           { return r.exited }
func (*fakeRuntime) Pid() int                            { return 1 }

func runtimeRoute(lineage int64, r *fakeRuntime) Route {
	return Route{Lineage: lineage, Name: r.name, Backend: r, Package: r}
}

// switchTo installs route as a coordinator does: pause, switch, resume.
func switchTo(t *testing.T, d *Dispatcher, route Route) {
	t.Helper()
	if err := switchRoute(d, route); err != nil {
		t.Fatal(err)
	}
}

func switchRoute(d *Dispatcher, route Route) error {
	if _, err := d.Pause(context.Background(), time.Second); err != nil {
		return err
	}
	if _, err := d.Switch(route); err != nil {
		return err
	}
	d.Resume()
	return nil
}

func TestAWatchWaitingForTheNextRuntimeWakesWhenItIsSwitchedIn(t *testing.T) {
	first, next := newFakeRuntime("g1"), newFakeRuntime("g2")
	d := startedDispatcher(t, first, 1)
	switchTo(t, d, runtimeRoute(1, first))
	got := make(chan *Route, 1)
	go func() {
		r, why := d.AwaitPackageRoute(context.Background(), first, time.Minute)
		if why != nil {
			t.Error(why)
		}
		got <- r
	}()
	select {
	case r := <-got:
		t.Fatalf("returned %v while the runtime it ran on still served", r)
	case <-time.After(50 * time.Millisecond):
	}
	switchTo(t, d, runtimeRoute(2, next))
	select {
	case r := <-got:
		if r == nil || r.Package != next || r.Lineage != 2 {
			t.Fatalf("route %+v; want generation 2's runtime", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the switch did not wake the watch waiting for the next runtime")
	}
}

func TestAWatchDoesNotMoveWhereItCannotFollow(t *testing.T) {
	for _, c := range []struct {
		name    string
		change  func(t *testing.T, d *Dispatcher)
		timeout time.Duration
		code    string
		says    string
	}{
		{"a line-protocol provider serves the module now", func(t *testing.T, d *Dispatcher) {
			switchTo(t, d, Route{Lineage: 2, Name: "g2", Backend: newScripted("g2")})
		}, time.Minute, reasons.StaleGeneration, "line-protocol"},
		{"nothing can serve the module", func(t *testing.T, d *Dispatcher) { d.SetUnavailable(reasons.ActivationFailed, "no runtime starts") }, time.Minute, reasons.ActivationFailed, "no runtime starts"},
		{"the module was retired", func(t *testing.T, d *Dispatcher) { d.Close() }, time.Minute, reasons.StaleGeneration, "retired"},
		{"no runtime takes over in time", func(*testing.T, *Dispatcher) {}, 30 * time.Millisecond, reasons.StaleGeneration, "took over within"},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := newFakeRuntime("g1")
			d := startedDispatcher(t, first, 1)
			switchTo(t, d, runtimeRoute(1, first))
			c.change(t, d)
			r, why := d.AwaitPackageRoute(context.Background(), first, c.timeout)
			if r != nil || why == nil || why.Code != c.code || !strings.Contains(why.Message, c.says) {
				t.Fatalf("route %v, why %v; want %s saying %q", r, why, c.code, c.says)
			}
		})
	}
}

func TestAWatchWhoseCallerLeavesStopsWaiting(t *testing.T) {
	first := newFakeRuntime("g1")
	d := startedDispatcher(t, first, 1)
	switchTo(t, d, runtimeRoute(1, first))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, why := d.AwaitPackageRoute(ctx, first, time.Minute); why == nil || why.Code != reasons.DeadlineExceeded {
		t.Fatalf("why %v; want deadline_exceeded", why)
	}
}

func TestARuntimeIsRoutedAwayWhenItExitsOrTheRouteMoves(t *testing.T) {
	first, next := newFakeRuntime("g1"), newFakeRuntime("g2")
	d := startedDispatcher(t, first, 1)
	route := runtimeRoute(1, first)
	switchTo(t, d, route)
	if d.RoutedAway(route, 20*time.Millisecond) {
		t.Fatal("a runtime that still serves was routed away")
	}
	close(first.exited)
	if !d.RoutedAway(route, time.Minute) {
		t.Fatal("a runtime whose process exited still serves")
	}
	route2 := runtimeRoute(2, next)
	switchTo(t, d, route2)
	go func() {
		time.Sleep(20 * time.Millisecond)
		if err := switchRoute(d, runtimeRoute(3, newFakeRuntime("g3"))); err != nil {
			t.Error(err)
		}
	}()
	if !d.RoutedAway(route2, time.Minute) {
		t.Fatal("a runtime the module switched away from still serves")
	}
}

// unreadRuntime is a runtime that has not read a run's request when it is
// asked to cancel it: it answers unknown and cancels nothing.
type unreadRuntime struct{ *fakeRuntime }

func (unreadRuntime) CancelInvocation(context.Context, string) (string, error) {
	return "unknown", nil
}

func TestACancelThatReachesTheRuntimeBeforeItsRunEndsTheCallAtOnce(t *testing.T) {
	r := unreadRuntime{newFakeRuntime("g1")}
	r.hold = make(chan struct{}) // the run ends only when its context does
	d := startedDispatcher(t, r, 1)
	switchTo(t, d, Route{Lineage: 1, Name: "g1", Backend: r, Package: r})
	c := call("early", time.Minute)
	ended := make(chan error, 1)
	if err := d.Submit(&c, func(_ Result, err error) { ended <- err }); err != nil {
		t.Fatal(err)
	}
	for _, started := c.Started(); !started; _, started = c.Started() {
		time.Sleep(time.Millisecond)
	}
	state, err := c.Cancel(context.Background(), "test")
	if err != nil || state != "unknown" {
		t.Fatalf("Cancel = %q, %v; want the runtime's unknown", state, err)
	}
	select {
	case err := <-ended:
		var ce *CallError
		if !errors.As(err, &ce) || ce.Code != reasons.Cancelled || !strings.Contains(ce.Message, "before its runtime had read it") {
			t.Fatalf("the call ended with %v; want cancelled, ended by the manager before the runtime read it", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled call did not end: it would hold its slot until its deadline (a minute)")
	}
}
