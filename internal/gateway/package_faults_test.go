package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/test/pkgruntimetest"
)

// The fault table of package runtimes through the whole stack: the
// coordinator's transactions and ledger, the launcher, and the gateway. Each
// runtime is test/seedruntime built with one fault as its default. Every test
// ends by showing that nothing of the fault is left: no process, socket
// directory or group record beyond the serving runtime's, and no goroutine of
// a Watch.

// faultPlan is the seed runtime with fault filling module, answering as
// the seed's revision.
func faultPlan(tb testing.TB, module, fault string, edit ...func(*catalog.PackageRuntimeManifest)) verifier.LaunchPlan {
	tb.Helper()
	return pkgruntimetest.Plan(tb, module, seedWithFault(tb, fault), runtimeRevisions[pkgruntimetest.Seed], edit...)
}

// runtimeProcesses are the live runtime and provider processes of this
// test binary: children of its reaper running as the provider uid.
func runtimeProcesses() []int {
	es, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var uid, ppid, state string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok && len(strings.Fields(v)) > 0 {
				uid = strings.Fields(v)[0]
			}
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			}
		}
		if uid == strconv.Itoa(providerUID) && ppid == strconv.Itoa(os.Getpid()) && !strings.HasPrefix(state, "Z") {
			out = append(out, pid)
		}
	}
	sort.Ints(out)
	return out
}

// runtimeSockets are the launcher's per-runtime socket directories.
func runtimeSockets(tb testing.TB) []string {
	tb.Helper()
	return pkgruntimetest.DirNames(tb, runtimeSocketDir)
}

// runtimeRecords are the launcher's group records.
func runtimeRecords(tb testing.TB) []string {
	tb.Helper()
	return pkgruntimetest.DirNames(tb, filepath.Join(runtimeDir, "records"))
}

// watchGoroutines counts the goroutines serving or reading a package
// runtime's Watch (the gateway's relay and the host's stream reader).
func watchGoroutines() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "gateway.(*Server).watchPackage") || strings.Contains(g, "pkgruntime.(*Watch).read") {
			n++
		}
	}
	return n
}

// expectOnly checks that the only runtime left is the one with pid: one
// process, one socket directory, one record (named after its pid), and no
// goroutine of a Watch.
func expectOnly(tb testing.TB, pid int) {
	tb.Helper()
	expectLeft(tb, pid)
}

// expectLeft waits until the runtimes left are exactly pids (each with its
// socket directory and record) and no goroutine of a Watch is, and fails
// with what is left if that takes over 30 s.
func expectLeft(tb testing.TB, pids ...int) {
	tb.Helper()
	matches := func(ps []int, recs []string) bool {
		if len(ps) != len(pids) || len(recs) != len(pids) {
			return false
		}
		for i, p := range pids {
			if ps[i] != p {
				return false
			}
		}
		for _, r := range recs {
			if !slices.ContainsFunc(pids, func(p int) bool { return strings.HasPrefix(r, strconv.Itoa(p)+"-") }) {
				return false
			}
		}
		return true
	}
	sort.Ints(pids)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, recs := runtimeProcesses(), runtimeRecords(tb)
		if matches(ps, recs) && len(runtimeSockets(tb)) == len(pids) && watchGoroutines() == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("want only runtimes %v left; processes %v, socket dirs %v, records %v, watch goroutines %d",
				pids, ps, runtimeSockets(tb), recs, watchGoroutines())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// gone reports whether pid is no longer a runtime of this test binary.
func gone(pid int) bool {
	for _, p := range runtimeProcesses() {
		if p == pid {
			return false
		}
	}
	return true
}

// settleFailed waits until the coordinator has nothing left to do for a
// and target's generation has failed, and returns the failure.
func (h *harness) settleFailed(a *activationRef, target hotswap.ModuleTarget) (hotswap.ActivationStatus, hotswap.Failure) {
	h.tb.Helper()
	var (
		st  hotswap.ActivationStatus
		got hotswap.Failure
	)
	waitFor(h.tb, "generation "+target.GenerationName+" to fail", func() bool {
		var ok bool
		st, ok = h.coord.Status(a.key.UID)
		if !ok || st.Busy {
			return false
		}
		for _, f := range st.Failures {
			if f.GenerationName == target.GenerationName {
				got = f
				return true
			}
		}
		if ms := st.Modules[target.Module]; ms.Active == target.GenerationName {
			h.tb.Fatalf("generation %s became active; want it to fail", target.GenerationName)
		}
		return false
	})
	return st, got
}

// get reads key through the gateway and checks the answer.
func (h *harness) get(a *activationRef, module, key, want string) *gatewayv1.InvokeResponse {
	h.tb.Helper()
	resp, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		Export: "get", InputJson: `{"key":"` + key + `"}`})
	if err != nil {
		h.tb.Fatalf("get %s from %s: %v", key, module, err)
	}
	if !resp.GetOk() || resp.GetValueJson() != want {
		h.tb.Fatalf("get %s from %s answered ok=%v value %s error %q; want %s", key, module, resp.GetOk(), resp.GetValueJson(), resp.GetError(), want)
	}
	return resp
}

// expectWatchServes opens a Watch of key on module, checks its initial
// event and closes it: the module's runtime serves Watches.
func (h *harness) expectWatchServes(a *activationRef, module, id, key, want string) {
	h.tb.Helper()
	w := h.watch(a, module, id, key)
	ev := w.next(h.tb, "a new watch's initial event")
	if !ev.GetInitial() || ev.GetValueJson() != want {
		h.tb.Fatalf("a new watch's first event: %s; want initial with %s", describe(ev), want)
	}
	w.cancel()
}

// servingPid waits until module is served by a runtime process and returns
// its pid.
func (h *harness) servingPid(a *activationRef, module string, not int) int {
	h.tb.Helper()
	var pid int
	waitFor(h.tb, "module "+module+" to be served by a process other than "+strconv.Itoa(not), func() bool {
		st, ok := h.coord.Status(a.key.UID)
		ms := st.Modules[module]
		pid = ms.Pid
		return ok && ms.Serving && ms.Phase == iteronv1.PhaseActive && pid != 0 && pid != not && !gone(pid)
	})
	return pid
}

func TestALaunchTimeFaultOfAPackageRuntimeFailsTheNewGenerationAndLeavesTheOldOneServingWithNothingOfTheFaultyLaunchLeft(t *testing.T) {
	cases := []struct {
		name    string
		fault   string
		edit    func(*catalog.PackageRuntimeManifest)
		field   string
		message string
	}{
		{name: "a proof made with another key", fault: "wrong-proof", field: "handshake.authentication_proof", message: "does not prove the launch key"},
		{name: "no proof", fault: "no-proof", field: "handshake.authentication_proof", message: "missing"},
		{name: "a revision other than the pinned one", fault: "other-revision", field: "handshake.package_revision_id", message: `"seed-kv-2", but the manifest pins "seed-kv-1"`},
		{name: "exports other than the pinned ones", fault: "other-exports", field: "handshake.export_ids", message: "but the manifest pins"},
		{name: "a capability beyond the admitted set", fault: "extra-capability", field: "handshake.capabilities", message: `"irreversible_external" is not among the admitted capabilities`},
		{name: "a handshake that never answers", fault: "hang-handshake", field: "handshake", message: "no answer within deadlines.handshake_ms (300ms)",
			edit: func(m *catalog.PackageRuntimeManifest) { m.Deadlines.HandshakeMs = 300 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var edits []func(*catalog.PackageRuntimeManifest)
			if tc.edit != nil {
				edits = append(edits, tc.edit)
			}
			const module = faultModule
			faulty := faultPlan(t, module, tc.fault, edits...)
			h := newHarness(t, withPackageRuntimes(t))
			a := newActivation("default", "faults")
			g1 := h.deployPlan(a, kvPlan(t, module), hotswap.SwapPolicy{})
			st := h.settle(a, g1)
			pid := st.Modules[module].Pid
			h.put(a, module, "k", `"kept"`)
			expectOnly(t, pid)

			g2 := h.deployPlan(a, faulty, hotswap.SwapPolicy{})
			st, f := h.settleFailed(a, g2)
			if f.Code != "activation_failed" || !strings.Contains(f.Message, tc.field+": ") || !strings.Contains(f.Message, tc.message) {
				t.Fatalf("failure %+v; want activation_failed naming %s (%q)", f, tc.field, tc.message)
			}
			gs := st.Generations[g2.GenerationName]
			if gs.Phase != iteronv1.PhaseFailed || gs.Reason != "activation_failed" {
				t.Fatalf("generation %s: phase %s reason %s; want Failed, activation_failed", g2.GenerationName, gs.Phase, gs.Reason)
			}
			ms := st.Modules[module]
			if ms.Active != g1.GenerationName || ms.Phase != iteronv1.PhaseActive || ms.Pid != pid {
				t.Fatalf("module %s: active %s phase %s pid %d; want %s still Active on pid %d", module, ms.Active, ms.Phase, ms.Pid, g1.GenerationName, pid)
			}
			h.get(a, module, "k", `"kept"`)
			// The faulty process never became the generation's (the launcher
			// killed it before handing it over), so no pid of it is recorded:
			// what is left is checked from the process table instead.
			if gs.LastPid != 0 && !gone(gs.LastPid) {
				t.Fatalf("the faulty runtime's process %d is still there", gs.LastPid)
			}
			expectOnly(t, pid)
			t.Logf("%s: %s failed: %s: %s", tc.fault, g2.GenerationName, f.Code, f.Message)
			t.Logf("%s: %s still Active on pid %d (pid before %d), get k = \"kept\"; left: processes %v, socket dirs %v, records %v",
				tc.fault, g1.GenerationName, ms.Pid, pid, runtimeProcesses(), runtimeSockets(t), runtimeRecords(t))
		})
	}
}

// serveFaulty deploys the seed runtime with fault as module's first
// generation (its handshake is fine) and returns the generation and pid.
func (h *harness) serveFaulty(a *activationRef, module, fault string, edit ...func(*catalog.PackageRuntimeManifest)) (hotswap.ModuleTarget, int) {
	h.tb.Helper()
	g := h.deployPlan(a, faultPlan(h.tb, module, fault, edit...), hotswap.SwapPolicy{})
	st := h.settle(a, g)
	pid := st.Modules[module].Pid
	if pid == 0 {
		h.tb.Fatalf("module %s has no pid: %+v", module, st.Modules[module])
	}
	return g, pid
}

// ctxT is a context that ends with the test (or after a minute).
func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

const faultModule = "prompt_system"

func TestARuntimeThatCrashesMidInvokeFailsTheCallAndIsRelaunched(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "crash-invoke")
	g, pid := h.serveFaulty(a, faultModule, "crash-invoke")
	_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: faultModule,
		Export: "put", InputJson: `{"key":"k","value":1}`})
	// A call that ran and failed is INTERNAL (the reason table's RunGRPC for
	// provider_failed); UNAVAILABLE is for a module that cannot take calls.
	f := expectFailure(t, err, codes.Internal, "provider_failed", "invoke: the runtime is unreachable")
	relaunched := h.servingPid(a, faultModule, pid)
	if !gone(pid) {
		t.Fatalf("the crashed runtime %d is still there", pid)
	}
	// The relaunched runtime serves (a Watch: every Invoke of this build
	// crashes it).
	h.expectWatchServes(a, faultModule, "after-the-crash", "k", "null")
	expectOnly(t, relaunched)
	st, _ := h.coord.Status(a.key.UID)
	t.Logf("crash-invoke: the call failed %s (generation %d): %s", status.Code(err), f.Generation, status.Convert(err).Message())
	t.Logf("crash-invoke: %s pid %d crashed, relaunched as pid %d (%s: %s); a Watch on it got its initial event", g.GenerationName, pid, relaunched,
		st.Generations[g.GenerationName].Phase, st.Generations[g.GenerationName].Message)
}

func TestARuntimeThatCrashesMidWatchHasTheWatchMovedToEachRelaunchedProcessUntilItsCrashBudgetEndsIt(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "crash-watch")
	g, pid := h.serveFaulty(a, faultModule, "crash-watch")
	h.put(a, faultModule, "k", "1")
	// Each process of this build exits right after sending a Watch's
	// initial event (which may or may not leave the process before it
	// does). The gateway moves the caller's Watch to every relaunched
	// process of the generation, which crashes it again, until the crash
	// budget fails the generation: then the stream ends with
	// stale_generation, naming why it could not move.
	pids := map[int]bool{pid: true}
	stopPolling, polled := make(chan struct{}), make(chan struct{})
	go func() { // the processes the module runs on, as they come and go
		defer close(polled)
		for {
			select {
			case <-stopPolling:
				return
			case <-time.After(time.Millisecond):
			}
			if st, ok := h.coord.Status(a.key.UID); ok && st.Modules[faultModule].Pid != 0 {
				pids[st.Modules[faultModule].Pid] = true
			}
		}
	}()
	w := h.watch(a, faultModule, "crashing", "k")
	var events []string
	var end error
	for end == nil {
		select {
		case ev := <-w.events:
			if !ev.GetInitial() || ev.GetGenerationName() != g.GenerationName || ev.GetSequence() != uint64(len(events)+1) {
				t.Fatalf("event %s; want each one the initial event of a process of %s, numbered on", describe(ev), g.GenerationName)
			}
			events = append(events, describe(ev))
		case end = <-w.err:
		}
	}
	close(stopPolling)
	<-polled
	expectFailure(t, end, codes.FailedPrecondition, "stale_generation", "watch crashing ended on generation "+g.GenerationName,
		"could not move to the module's next runtime: "+g.GenerationName+": the provider process exited", fmt.Sprintf("crashed %d times", hotswap.CrashBudget))
	if strings.Contains(status.Convert(end).Message(), "rpc error") {
		t.Fatalf("message %q: the reason of the next runtime's absence is quoted as a Go error, not as its own message", status.Convert(end).Message())
	}
	st, _ := h.coord.Status(a.key.UID)
	gs := st.Generations[g.GenerationName]
	if gs.Phase != iteronv1.PhaseFailed || gs.Reason != "provider_failed" {
		t.Fatalf("generation %s: %s %s %s; want Failed, provider_failed", g.GenerationName, gs.Phase, gs.Reason, gs.Message)
	}
	if len(pids) < 2 {
		t.Fatalf("processes seen %v; want the watch to have moved to a relaunched process", pids)
	}
	expectLeft(t) // nothing of the failed generation: no process, socket directory or record
	t.Logf("crash-watch: processes seen %v (first %d); events the caller got: %q", sortedPids(pids), pid, events)
	t.Logf("crash-watch: the stream ended: %s %s", status.Code(end), status.Convert(end).Message())
}

func sortedPids(m map[int]bool) []int {
	var out []int
	for p := range m {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

func TestARuntimeThatHangsInInvokeFailsTheCallAtInvokeMsAndTheRuntimesInvocationEnds(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "hang-invoke")
	_, pid := h.serveFaulty(a, faultModule, "hang-invoke", func(m *catalog.PackageRuntimeManifest) { m.Deadlines.InvokeMs = 300 })
	start := time.Now()
	_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: faultModule,
		InvocationId: "hung", Export: "put", InputJson: `{"key":"k","value":1}`})
	took := time.Since(start)
	expectFailure(t, err, codes.DeadlineExceeded, "deadline_exceeded", "invoke: no answer within 300ms")
	// The runtime's own view of the run: it ended (the seed marks a hung
	// invocation failed once its context is cancelled).
	inv, ok := h.server.table.lookup(a.key.Namespace + "\x00hung")
	if !ok {
		t.Fatal("the gateway does not know invocation hung")
	}
	d, err2 := h.coord.Lookup(a.key.Namespace, a.key.Name, faultModule)
	if err2 != nil {
		t.Fatal(err2)
	}
	var state string
	waitFor(t, "the runtime to end the hung invocation", func() bool {
		state, err2 = d.Route().Package.Status(ctxT(t), inv.runID)
		return err2 == nil && state == "failed"
	})
	st, serr := h.client.GetInvocationStatus(ctxT(t), &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: "hung"})
	if serr != nil || st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_FAILED || st.GetReason() != "deadline_exceeded" {
		t.Fatalf("status of hung: %+v %v; want FAILED, deadline_exceeded", st, serr)
	}
	if ms, _ := h.coord.Status(a.key.UID); ms.Modules[faultModule].Pid != pid {
		t.Fatalf("pid %d after a hung call; want the same runtime %d (a hang is not a crash)", ms.Modules[faultModule].Pid, pid)
	}
	h.expectWatchServes(a, faultModule, "after-the-hang", "k", "null")
	expectOnly(t, pid)
	t.Logf("hang-invoke: the call failed after %v: %s %s; the runtime's state of run %s: %s; same pid %d", took.Round(time.Millisecond), status.Code(err), status.Convert(err).Message(), inv.runID, state, pid)
}

func TestARuntimeWhoseWatchNeverSendsEndsAtTheCallersDeadlineWithItsWatchCancelled(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "hang-watch")
	_, pid := h.serveFaulty(a, faultModule, "hang-watch", func(m *catalog.PackageRuntimeManifest) { m.Limits.MaxWatches = 1 })
	// Twice: the second Watch is opened (not queue_full), so the first one's
	// slot of the runtime's one was given back.
	for i, id := range []string{"hung-1", "hung-2"} {
		start := time.Now()
		stream, err := h.client.Watch(ctxT(t), &gatewayv1.WatchRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: faultModule,
			InvocationId: id, Export: "watch", InputJson: `{"key":"k"}`, DeadlineMs: 300})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := stream.Recv()
		if ev != nil {
			t.Fatalf("watch %d: an event %s; want none", i, describe(ev))
		}
		// It ends in the relay (the caller stopped watching) or, on a busy
		// machine, while the runtime's stream was still being opened.
		expectFailure(t, err, codes.DeadlineExceeded, "deadline_exceeded")
		took := time.Since(start)
		waitFor(t, "the watch's goroutines to end", func() bool { return watchGoroutines() == 0 })
		t.Logf("hang-watch: watch %s ended after %v: %s %s", id, took.Round(time.Millisecond), status.Code(err), status.Convert(err).Message())
	}
	h.put(a, faultModule, "k", "1")
	h.get(a, faultModule, "k", "1")
	expectOnly(t, pid)
	t.Logf("hang-watch: same pid %d serves Invokes after both watches", pid)
}

func TestARuntimeStateOutsideTheFiveIsNotPassedOnThroughTheGateway(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "bad-state")
	_, pid := h.serveFaulty(a, faultModule, "bad-state")
	w := h.watch(a, faultModule, "observed", "k")
	if ev := w.next(t, "the watch's initial event"); !ev.GetInitial() {
		t.Fatalf("first event %s", describe(ev))
	}
	if n := watchGoroutines(); n < 2 {
		t.Fatalf("%d goroutines of an open watch seen; want the gateway's relay and the host's reader (the leak check counts them)", n)
	}
	st, err := h.client.GetInvocationStatus(ctxT(t), &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: "observed"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetRuntimeState() != "" || st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_RUNNING ||
		!strings.Contains(st.GetMessage(), `status.state: "done" is not one of`) {
		t.Fatalf("status %+v; want RUNNING, no runtime_state, and a message naming status.state", st)
	}
	w.cancel()
	waitFor(t, "the watch's goroutines to end", func() bool { return watchGoroutines() == 0 })
	h.put(a, faultModule, "k", "1")
	h.get(a, faultModule, "k", "1")
	expectOnly(t, pid)
	t.Logf("bad-state: status of a running watch: state %s, runtime_state %q, message %q; same pid %d", st.GetState(), st.GetRuntimeState(), st.GetMessage(), pid)
}

func TestARuntimeResultOverTheMessageBoundFailsTheCallNamingTheBound(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "big-result")
	_, pid := h.serveFaulty(a, faultModule, "big-result", func(m *catalog.PackageRuntimeManifest) { m.Limits.MaxMessageBytes = 64 << 10 })
	_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: faultModule,
		Export: "get", InputJson: `{"key":"k"}`})
	expectFailure(t, err, codes.Internal, "provider_failed", "invoke: a message over limits.max_message_bytes", "65536")
	if ms, _ := h.coord.Status(a.key.UID); ms.Modules[faultModule].Pid != pid {
		t.Fatalf("pid %d after an oversized result; want the same runtime %d", ms.Modules[faultModule].Pid, pid)
	}
	h.expectWatchServes(a, faultModule, "after-the-big-result", "k", "null")
	expectOnly(t, pid)
	t.Logf("big-result: %s %s; same pid %d", status.Code(err), status.Convert(err).Message(), pid)
}

func TestARuntimeWatchFloodingASlowCallerIsHeldBackByFlowControlThroughTheGateway(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "flood-watch")
	_, pid := h.serveFaulty(a, faultModule, "flood-watch")
	ctx, cancel := context.WithCancel(ctxT(t))
	stream, err := h.client.Watch(ctx, &gatewayv1.WatchRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: faultModule,
		InvocationId: "flood", Export: "watch", InputJson: `{"key":"k"}`})
	if err != nil {
		t.Fatal(err)
	}
	// Each flood event's value is "<n>-<unix ns when sent>-<1000 bytes>".
	next := func() (n int, sent time.Time) {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var v string
		if err := json.Unmarshal([]byte(ev.GetValueJson()), &v); err != nil {
			t.Fatalf("event value %.60s: %v", ev.GetValueJson(), err)
		}
		f := strings.SplitN(v, "-", 3)
		n, _ = strconv.Atoi(f[0])
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		return n, time.Unix(0, ns)
	}
	next() // the initial event
	// The slow caller: it reads nothing for a second. A runtime that could
	// send without limit sends hundreds of thousands of 1 KB events in that
	// time; what it can send is bounded by the windows between it and the
	// caller (the host's Watch stream, the one event the host holds, the
	// gateway's stream to the caller).
	time.Sleep(time.Second)
	resume := time.Now()
	ahead, last := 0, 0
	for {
		n, sent := next()
		if last != 0 && n != last+1 {
			t.Fatalf("event %d after %d: events were lost or reordered", n, last)
		}
		last = n
		if sent.After(resume) {
			break
		}
		ahead++
	}
	if ahead > 1024 {
		t.Fatalf("%d events (1 KB each) were sent while the caller read nothing: nothing held the runtime back", ahead)
	}
	for i := 0; i < 500; i++ {
		if n, _ := next(); n != last+1 {
			t.Fatalf("event %d after %d: events were lost or reordered", n, last)
		} else {
			last = n
		}
	}
	cancel()
	waitFor(t, "the watch's goroutines to end", func() bool { return watchGoroutines() == 0 })
	h.put(a, faultModule, "k", "1")
	h.get(a, faultModule, "k", "1")
	expectOnly(t, pid)
	t.Logf("flood-watch: while the caller paused 1 s, the runtime sent %d events (1 KB each) and was held there; the next 500 followed in order; same pid %d", ahead, pid)
}

func TestARuntimeThatNeverClosesACancelledWatchHasItCutWithinCancelMs(t *testing.T) {
	for _, how := range []string{"CancelInvocation", "the caller ending its stream"} {
		t.Run("by "+how, func(t *testing.T) {
			h := newHarness(t, withPackageRuntimes(t))
			a := newActivation("default", "ignore-cancel")
			_, pid := h.serveFaulty(a, faultModule, "ignore-cancel", func(m *catalog.PackageRuntimeManifest) { m.Deadlines.CancelMs = 300 })
			w := h.watch(a, faultModule, "stubborn", "k")
			if ev := w.next(t, "the watch's initial event"); !ev.GetInitial() {
				t.Fatalf("first event %s", describe(ev))
			}
			start := time.Now()
			var end error
			if how == "CancelInvocation" {
				st, err := h.client.CancelInvocation(ctxT(t), &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: "stubborn"})
				if err != nil || st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED || st.GetRuntimeState() != "cancellation-requested" {
					t.Fatalf("cancel: %+v %v; want CANCELLATION_REQUESTED, the runtime's cancellation-requested", st, err)
				}
				select {
				case end = <-w.err:
				case ev := <-w.events:
					t.Fatalf("an event after the cancellation: %s", describe(ev))
				case <-time.After(30 * time.Second):
					t.Fatal("the cancelled watch did not end within 30 s")
				}
				expectFailure(t, end, codes.Canceled, "cancelled", "stubborn")
			} else {
				w.cancel()
			}
			waitFor(t, "the watch's goroutines to end", func() bool { return watchGoroutines() == 0 })
			took := time.Since(start)
			// cancel_ms (300 ms) and a margin for a loaded machine: without the
			// cut, the watch would stay open as long as the runtime runs.
			if took > 10*time.Second {
				t.Fatalf("the watch ended %v after its cancellation; want about cancel_ms (300ms)", took)
			}
			h.put(a, faultModule, "k", "1")
			h.get(a, faultModule, "k", "1")
			expectOnly(t, pid)
			t.Logf("ignore-cancel by %s: the gateway's watch ended %v after the cancellation (cancel_ms 300ms): %v; same pid %d serves", how, took.Round(time.Millisecond), end, pid)
		})
	}
}

func TestARuntimeThatIgnoresTheCancelOfARunningCallHasItEndedAfterCancelMs(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "ignore-cancel")
	_, pid := h.serveFaulty(a, faultModule, "hang-invoke-ignore-cancel", func(m *catalog.PackageRuntimeManifest) {
		m.Deadlines.CancelMs = 300
		m.Deadlines.InvokeMs = 120_000
		m.Limits.MaxConcurrentInvocations = 1
	})
	// Each call holds the runtime's only slot until it is ended: the
	// second one running shows that the first one's slot was freed.
	for _, id := range []string{"stubborn-1", "stubborn-2"} {
		ended := make(chan error, 1)
		go func() {
			_, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: faultModule,
				InvocationId: id, Export: "get", InputJson: `{"key":"k"}`, DeadlineMs: 120_000})
			ended <- err
		}()
		waitFor(t, id+"'s runtime_state running", func() bool { return h.status(a, id).GetRuntimeState() == "running" })
		start := time.Now()
		st, err := h.client.CancelInvocation(ctxT(t), &gatewayv1.InvocationControlRequest{Namespace: a.key.Namespace, InvocationId: id})
		if err != nil || st.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_CANCELLATION_REQUESTED || st.GetRuntimeState() != "cancellation-requested" {
			t.Fatalf("cancel %s: %+v %v; want CANCELLATION_REQUESTED, the runtime's cancellation-requested", id, st, err)
		}
		var end error
		select {
		case end = <-ended:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not end within 30 s of its cancellation (cancel_ms 300ms, invoke_ms 120s)", id)
		}
		took := time.Since(start)
		expectFailure(t, end, codes.Canceled, "cancelled", id, "deadlines.cancel_ms (300ms)", "the manager ended the call")
		// The manager gave the runtime its cancel_ms before ending the call.
		if took < 300*time.Millisecond {
			t.Fatalf("%s ended %v after its cancellation; want no sooner than cancel_ms (300ms)", id, took)
		}
		if got := h.status(a, id); got.GetState() != gatewayv1.InvocationState_INVOCATION_STATE_FAILED || got.GetReason() != "cancelled" {
			t.Fatalf("status of %s after it ended: %+v; want FAILED, reason cancelled", id, got)
		}
		t.Logf("%s: the runtime ignored the cancellation; the call ended %v later: %v", id, took.Round(time.Millisecond), end)
	}
	expectOnly(t, pid)
}
