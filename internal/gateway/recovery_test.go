package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/survivor"
)

// The recovery window, driven deterministically: a survivor (in this
// process, as cmd/iteron-survivor runs it) owns the providers, a manager
// (coordinator and gateway, as cmd/manager wires them) is stopped and a new
// one started over the same state directory, and Config.BeforeRecovery
// holds the new manager's re-attach or relaunch of a module for as long as
// the test makes calls inside the window.

// recoveryNode is one state directory with its survivor, and the manager
// currently attached to it.
type recoveryNode struct {
	t      *testing.T
	dir    string
	lock   *os.File
	srv    *survivor.Server
	served chan error
	logs   *lineLog
}

// lineLog keeps every component's log lines for the failure output.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) logger(name string) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, time.Now().Format("15:04:05.000")+" "+name+" "+prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{})
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func startRecoveryNode(t *testing.T) *recoveryNode {
	t.Helper()
	n := &recoveryNode{t: t, dir: socketDir(t), served: make(chan error, 1), logs: &lineLog{}}
	f, err := os.OpenFile(statedir.Dir(n.dir).Lock(), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	n.lock = f
	ex := procexec.DefaultConfig(filepath.Join(n.dir, "procs"))
	// The uid the shared executor's providers run as: the subreaper of
	// either executor kills a stray process of the other's uid.
	ex.ProviderUID, ex.ProviderGID = providerUID, providerUID
	srv, err := survivor.NewServer(survivor.ServerConfig{StateDir: n.dir, GatewaySocket: filepath.Join(n.dir, "sgw.sock"), GatewayGroup: -1,
		Executor: ex, Log: n.logs.logger("survivor")})
	if err != nil {
		t.Fatal(err)
	}
	n.srv = srv
	go func() { n.served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-n.served
		f.Close()
		if t.Failed() {
			t.Logf("survivor and manager log:\n%s", n.logs)
		}
	})
	return n
}

// recoveryManager is one manager attached to the node's survivor: its
// survivor client, coordinator and gateway.
type recoveryManager struct {
	client *survivor.Client
	coord  *hotswap.Coordinator
	srv    *Server
	served chan error
	gw     *Client
	socket string
	// outcomes hands the survivor client's outcomes to srv, as
	// cmd/manager does.
	outcomes *OutcomeRelay
}

// startManager attaches a manager, as cmd/manager does after a (re)start
// when restarted is set; hook is its BeforeRecovery.
func (n *recoveryNode) startManager(restarted bool, hook func(hotswap.ActivationKey, string)) *recoveryManager {
	t := n.t
	t.Helper()
	m := &recoveryManager{served: make(chan error, 1), outcomes: NewOutcomeRelay(true), socket: filepath.Join(n.dir, fmt.Sprintf("gw-%d.sock", time.Now().UnixNano()%1e6))}
	client, err := survivor.NewClient(survivor.ClientConfig{Socket: statedir.Dir(n.dir).SurvivorSocket(), Lock: n.lock, Log: n.logs.logger("client"),
		OnOutcome: m.outcomes.Deliver})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	att, err := client.Attached(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.client = client
	log := n.logs.logger("manager")
	coord, err := hotswap.New(hotswap.Config{StateDir: n.dir, Owner: providers.NewSurvivorOwner(client, att, n.dir, log), Log: log,
		RecoverAtStart: restarted, BeforeRecovery: hook})
	if err != nil {
		t.Fatal(err)
	}
	m.coord = coord
	allow, err := ParseAllow([]string{"uid:0=*"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{NodeName: "node-test", Allow: allow, SocketGroup: testGroup, Coordinator: coord, Socket: m.socket})
	if err != nil {
		t.Fatal(err)
	}
	m.outcomes.Start(srv, att.Outcomes)
	m.srv = srv
	lis, err := Listen(m.socket, testGroup)
	if err != nil {
		t.Fatal(err)
	}
	go func() { m.served <- srv.Serve(lis) }()
	if m.gw, err = Dial(m.socket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stop)
	return m
}

// stop stops the manager as a SIGTERM does: the gateway stops, the
// coordinator detaches (the survivor keeps the providers), the client goes.
func (m *recoveryManager) stop() {
	if m.srv == nil {
		return
	}
	m.gw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.srv.Stop(ctx)
	<-m.served
	_ = m.coord.Shutdown(ctx)
	m.client.Close()
	m.srv = nil
}

// answer is what one call got.
type answer struct {
	count    int64
	replayed bool
	code     codes.Code
	reason   string
	msg      string
	took     time.Duration
}

func (a answer) String() string {
	if a.reason == "" {
		return fmt.Sprintf("count %d (replayed %v) after %s", a.count, a.replayed, a.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s %s after %s", a.code, a.reason, a.took.Round(time.Millisecond))
}

// call invokes the counter through m's gateway under id (fresh when "").
func (m *recoveryManager) call(t *testing.T, a *activationRef, id string, deadline time.Duration) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline+30*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := m.gw.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		InvocationId: id, InputJson: `{"key":"k","add":1}`, DeadlineMs: uint64(deadline.Milliseconds())})
	out := answer{took: time.Since(start)}
	if err != nil {
		st, _ := status.FromError(err)
		out.code, out.msg = st.Code(), st.Message()
		if f, ok := ReasonOf(err); ok {
			out.reason = f.Reason
		} else {
			out.reason = "(no reason) " + st.Message()
		}
		return out
	}
	out.count, out.replayed = decodeCounter(t, resp.ObservationJson).Count, resp.Replayed
	return out
}

// held is a BeforeRecovery hook that holds each recovery until released,
// and says which module it holds.
type held struct {
	reached chan string
	release chan struct{}
}

func newHeld() *held { return &held{reached: make(chan string, 8), release: make(chan struct{})} }

func (h *held) hook(_ hotswap.ActivationKey, module string) {
	h.reached <- module
	<-h.release
}

func (h *held) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.reached:
	case <-time.After(60 * time.Second):
		t.Fatalf("the manager never reached %s", what)
	}
}

// queued waits until the module's queue holds n calls: the call was
// accepted and waits (the positive signal before a window is watched).
func queued(t *testing.T, m *recoveryManager, a *activationRef, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d calls queued for %s", n, module), func() bool {
		d, ok := m.coord.Dispatcher(a.key.Namespace, a.key.Name, module)
		return ok && d.QueueLength() >= n
	})
}

// pending is a call made in a goroutine.
type pending chan answer

func (m *recoveryManager) callAsync(t *testing.T, a *activationRef, id string, deadline time.Duration) pending {
	p := make(pending, 1)
	go func() { p <- m.call(t, a, id, deadline) }()
	return p
}

// notAnsweredWithin fails when p is answered within d.
func (p pending) notAnsweredWithin(t *testing.T, what string, d time.Duration) {
	t.Helper()
	select {
	case got := <-p:
		t.Fatalf("%s was answered inside the window (%s); it must wait", what, got)
	case <-time.After(d):
	}
}

func (p pending) answer(t *testing.T, what string) answer {
	t.Helper()
	select {
	case got := <-p:
		return got
	case <-time.After(60 * time.Second):
		t.Fatalf("%s was never answered", what)
		return answer{}
	}
}

// row is one line of the table the test prints.
type recoveryRow struct{ window, call, got string }

// TestCallsInsideARecoveryWindowWaitOrAreToldToRetryNeverAWrongReason holds
// each recovery of a module and makes calls inside it: a restarted
// manager's re-attach (before its plan, with a plan that keeps the module
// waiting, with the module's target), a relaunch after a crash, a relaunch
// refused because the artifact changed, and an activation deleted while its
// module is recovered. A call waits; one whose deadline ends first gets
// recovering (UNAVAILABLE: retry) and its retry under the same invocation
// ID runs once; a recovery that concludes the module cannot serve answers
// the waiting calls at once with its reason; a deleted activation answers
// not_found. activation_failed never.
func TestCallsInsideARecoveryWindowWaitOrAreToldToRetryNeverAWrongReason(t *testing.T) {
	const short = 300 * time.Millisecond
	n := startRecoveryNode(t)
	impl := counterImpl(t, module, "counter-v2")
	plan := providertest.Plan(t, impl)
	a := newActivation("default", "held")
	target := hotswap.ModuleTarget{Module: module, Plan: plan, Lineage: 1, Attempt: 1,
		Epoch: "sha256:" + strings.Repeat("0", 63) + "1", GenerationName: "held-prompt-system-g1-1"}
	desired := func(spec int64, t hotswap.ModuleTarget) hotswap.Desired {
		return hotswap.Desired{Key: a.key, SpecGeneration: spec, CandidateSHA256: providertest.CandidateSHA256,
			Swap: hotswap.SwapPolicy{Deadline: 30 * time.Second, QuiesceTimeout: 5 * time.Second}, Modules: []hotswap.ModuleTarget{t},
			ActivateOrder: []string{module}, DrainOrder: []string{module}}
	}
	var rows []recoveryRow
	record := func(window, call string, got answer) {
		rows = append(rows, recoveryRow{window, call, got.String()})
		if got.reason == "activation_failed" {
			t.Errorf("%s: %s got activation_failed (%s): a module being recovered never answers that", window, call, got.msg)
		}
	}
	expect := func(window, call string, got answer, code codes.Code, reason string, fragments ...string) {
		t.Helper()
		record(window, call, got)
		if got.code != code || got.reason != reason {
			t.Fatalf("%s: %s got %s (%q); want %s %s", window, call, got, got.msg, code, reason)
		}
		for _, f := range fragments {
			if !strings.Contains(got.msg, f) {
				t.Fatalf("%s: %s got %q; want it to contain %q", window, call, got.msg, f)
			}
		}
	}
	expectCount := func(window, call string, got answer, count int64, replayed bool) {
		t.Helper()
		record(window, call, got)
		if got.reason != "" || got.count != count || got.replayed != replayed {
			t.Fatalf("%s: %s got %s (%q); want count %d (replayed %v)", window, call, got, got.msg, count, replayed)
		}
	}
	defer func() {
		var b strings.Builder
		fmt.Fprintf(&b, "\nrecovery windows:\n| window | call | answer |\n|---|---|---|\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", r.window, r.call, r.got)
		}
		t.Log(b.String())
	}()

	m1 := n.startManager(false, nil)
	if err := m1.coord.Apply(desired(1, target)); err != nil {
		t.Fatal(err)
	}
	waitServing(t, m1.coord, a, target.GenerationName)
	expectCount("first manager", "call 1", m1.call(t, a, "", 5*time.Second), 1, false)
	pidBefore := servingPid(t, m1.coord, a)
	m1.stop()

	// The restarted manager: nothing prepared yet.
	h := newHeld()
	m2 := n.startManager(true, h.hook)
	m2.coord.ExpectActivations([]string{a.key.UID})
	const w1 = "restart: the activation not replayed yet"
	expect(w1, "call (deadline 300ms)", m2.call(t, a, "", short), codes.Unavailable, "recovering", "not known yet")

	// Replayed: the ledger names the committed generation; no plan yet.
	if err := m2.coord.Prepare(a.key, nil); err != nil {
		t.Fatal(err)
	}
	const w2 = "restart: replayed, no plan yet"
	expect(w2, "call (deadline 300ms)", m2.call(t, a, "", short), codes.Unavailable, "recovering", "being re-attached or relaunched", "retry")

	// A plan that keeps the module as it is (its source is not runnable
	// yet): the worker goes idle with the module still to recover.
	keep := desired(2, hotswap.ModuleTarget{Module: module, Keep: true})
	if err := m2.coord.Apply(keep); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker to go idle on a plan that keeps the module", func() bool {
		st, ok := m2.coord.Status(a.key.UID)
		return ok && !st.Busy && st.AppliedSpecGeneration == 2
	})
	const w3 = "restart: a plan that keeps the module waiting"
	expect(w3, "call (deadline 300ms)", m2.call(t, a, "", short), codes.Unavailable, "recovering", "being re-attached or relaunched")

	// The module's target: the re-attach is held.
	if err := m2.coord.Apply(desired(3, target)); err != nil {
		t.Fatal(err)
	}
	h.wait(t, "the re-attach")
	const w4 = "restart: re-attach held"
	waiting := m2.callAsync(t, a, "held-1", 20*time.Second)
	queued(t, m2, a, 1)
	waiting.notAnsweredWithin(t, "a call made while the re-attach is held", 500*time.Millisecond)
	short1 := m2.call(t, a, "short-1", short)
	expect(w4, "call short-1 (deadline 300ms)", short1, codes.Unavailable, "recovering", "being re-attached or relaunched")
	h.release <- struct{}{}
	expectCount(w4, "call held-1 (deadline 20s), made inside, answered after", waiting.answer(t, "held-1"), 2, false)
	expectCount(w4+", then released", "short-1 retried under its ID", m2.call(t, a, "short-1", 5*time.Second), 3, false)
	expectCount(w4+", then released", "short-1 asked again", m2.call(t, a, "short-1", 5*time.Second), 3, true)
	if pid := servingPid(t, m2.coord, a); pid != pidBefore {
		t.Fatalf("the provider's pid changed from %d to %d across the restart: it was relaunched, not re-attached", pidBefore, pid)
	}

	// A crash: the relaunch is held.
	if err := syscall.Kill(pidBefore, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.wait(t, "the relaunch after the crash")
	const w5 = "crash: relaunch held"
	waiting = m2.callAsync(t, a, "held-2", 20*time.Second)
	queued(t, m2, a, 1)
	waiting.notAnsweredWithin(t, "a call made while the relaunch is held", 500*time.Millisecond)
	expect(w5, "call (deadline 300ms)", m2.call(t, a, "", short), codes.Unavailable, "recovering", "being relaunched", "exited")
	h.release <- struct{}{}
	got := waiting.answer(t, "held-2")
	record(w5, "call held-2 (deadline 20s), made inside, answered after", got)
	if got.reason != "" {
		t.Fatalf("%s: the call made inside got %s (%q); want it served by the relaunched provider", w5, got, got.msg)
	}
	pidRelaunched := servingPid(t, m2.coord, a)

	// A crash while the artifact changed on disk: the relaunch is refused.
	if err := syscall.Kill(pidRelaunched, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.wait(t, "the relaunch after the second crash")
	const w6 = "crash: relaunch refused (the artifact changed)"
	waiting = m2.callAsync(t, a, "held-3", 20*time.Second)
	queued(t, m2, a, 1)
	exe, err := os.OpenFile(impl.Executable, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exe.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	exe.Close()
	h.release <- struct{}{}
	got = waiting.answer(t, "held-3")
	expect(w6, "call held-3 (deadline 20s), made inside", got, codes.FailedPrecondition, "verification_failed")
	if got.took > 15*time.Second {
		t.Fatalf("%s: the waiting call was answered after %s: it waited out its deadline instead of getting the reason at once", w6, got.took)
	}
	expect(w6, "call after (deadline 300ms)", m2.call(t, a, "", short), codes.FailedPrecondition, "verification_failed")
}

// TestACallWaitingForARecoveryOfADeletedActivationGetsNotFound: a restarted
// manager has replayed an activation's ledger (its module waits to be
// re-attached) when the activation is deleted: the waiting call gets
// not_found at once, not a failure of the module.
func TestACallWaitingForARecoveryOfADeletedActivationGetsNotFound(t *testing.T) {
	n := startRecoveryNode(t)
	impl := counterImpl(t, module, "counter-v2")
	plan := providertest.Plan(t, impl)
	a := newActivation("default", "deleted")
	target := hotswap.ModuleTarget{Module: module, Plan: plan, Lineage: 1, Attempt: 1,
		Epoch: "sha256:" + strings.Repeat("0", 63) + "1", GenerationName: "deleted-prompt-system-g1-1"}
	m1 := n.startManager(false, nil)
	if err := m1.coord.Apply(hotswap.Desired{Key: a.key, SpecGeneration: 1, CandidateSHA256: providertest.CandidateSHA256,
		Swap: hotswap.SwapPolicy{Deadline: 30 * time.Second}, Modules: []hotswap.ModuleTarget{target},
		ActivateOrder: []string{module}, DrainOrder: []string{module}}); err != nil {
		t.Fatal(err)
	}
	waitServing(t, m1.coord, a, target.GenerationName)
	m1.stop()

	m2 := n.startManager(true, nil)
	m2.coord.ExpectActivations([]string{a.key.UID})
	if err := m2.coord.Prepare(a.key, nil); err != nil {
		t.Fatal(err)
	}
	waiting := m2.callAsync(t, a, "", 20*time.Second)
	queued(t, m2, a, 1)
	if _, err := m2.coord.Remove(a.key); err != nil {
		t.Fatal(err)
	}
	got := waiting.answer(t, "the waiting call")
	t.Logf("a call waiting for the recovery of an activation deleted meanwhile: %s (%s)", got, got.msg)
	if got.code != codes.NotFound || got.reason != "not_found" || got.took > 15*time.Second {
		t.Fatalf("the waiting call got %s (%q); want NotFound not_found at once", got, got.msg)
	}
}

func waitServing(t *testing.T, c *hotswap.Coordinator, a *activationRef, generation string) {
	t.Helper()
	waitFor(t, generation+" serving", func() bool {
		st, ok := c.Status(a.key.UID)
		return ok && st.Modules[module].Active == generation && st.Modules[module].Serving
	})
}

func servingPid(t *testing.T, c *hotswap.Coordinator, a *activationRef) int {
	t.Helper()
	var pid int
	waitFor(t, "the module serving", func() bool {
		st, ok := c.Status(a.key.UID)
		pid = st.Modules[module].Pid
		return ok && st.Modules[module].Serving && pid > 0
	})
	return pid
}
