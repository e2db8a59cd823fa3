package crash

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/test/faultfs"
)

// The ledger-fault table through the real manager binary: for each
// transaction kind and phase, the manager's ledger directory (and only it)
// is a FUSE file system (test/faultfs) that fails the append carrying that
// phase's record with ENOSPC or EIO (alternating by cell) and then every
// write, as a full disk or a dead device would, until the test frees it.
// Everything else is as a user has it: activations created and changed
// through the API server, calls through the gateway's unix socket with
// `kubectl iteron invoke`, status read from the API, the ledger checked
// with `kubectl iteron ledger verify`.
//
// Each cell checks, while the disk is full: the fault fired in the
// manager's own write; the activation says Stalled=True LedgerUnwritable
// and Ready=False; the generation that served before answers calls with
// its state (or, where nothing can serve, calls fail at once with
// ledger_unwritable); no process of any provider group the failed
// transaction started is left (whole groups, from the manager's process
// records watched with inotify and /proc). Then the disk is freed: the
// manager closes the interrupted transaction by itself and the work goes
// on (a swap cut short is retried as a new attempt without a request);
// then the manager is restarted (SIGTERM, start again): the ledger
// verifies, the interrupted transaction is closed as documented
// (blocked(<phase>, "ledger_unwritable: …") + rolled_back, or closed
// forward past the point of no return), and the module serves the
// expected state.
//
// make test runs every phase of the hot swap and one phase of each other
// kind; ITERON_FAULTS=all (make faults) runs every phase of every kind.
// internal/hotswap's TestALedgerAppendThatFails… is the in-process twin.

const lfModule = "prompt_system"

// lfPhases are the phases of each kind whose record the table fails.
var lfPhases = map[string][]ledger.Phase{
	"first activation": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseAtomicSwitch, ledger.PhaseCommitted},
	"hot swap": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce, ledger.PhaseSnapshot, ledger.PhaseMigrate,
		ledger.PhaseRestore, ledger.PhaseReadiness, ledger.PhaseAtomicSwitch, ledger.PhaseDrain, ledger.PhaseCommitted},
	"cold replace": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce, ledger.PhaseAtomicSwitch, ledger.PhaseDrain, ledger.PhaseCommitted},
	"renewal": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce, ledger.PhaseSnapshot, ledger.PhaseRestore,
		ledger.PhaseReadiness, ledger.PhaseAtomicSwitch, ledger.PhaseDrain, ledger.PhaseCommitted},
	"relaunch":   {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseRestore, ledger.PhaseReadiness, ledger.PhaseAtomicSwitch, ledger.PhaseCommitted},
	"retirement": {ledger.PhaseVerify, ledger.PhaseQuiesce, ledger.PhaseSnapshot, ledger.PhaseDrain, ledger.PhaseCommitted},
}

var lfKindOrder = []string{"first activation", "hot swap", "cold replace", "renewal", "relaunch", "retirement"}

// lfInMakeTest is the one phase of each kind other than the hot swap that
// make test runs (internal/hotswap's table runs the same ones).
var lfInMakeTest = map[string]ledger.Phase{
	"first activation": ledger.PhaseShadowLoad, "cold replace": ledger.PhaseAtomicSwitch, "renewal": ledger.PhaseSnapshot,
	"relaunch": ledger.PhaseRestore, "retirement": ledger.PhaseQuiesce,
}

// lfCell is one cell of the table.
type lfCell struct {
	kind  string
	phase ledger.Phase
	// forward: the failed record comes after work that cannot be undone;
	// the transaction stands and is closed forward.
	forward bool
	errno   syscall.Errno
}

func lfCells() []lfCell {
	all := os.Getenv("ITERON_FAULTS") == "all"
	var cells []lfCell
	for _, kind := range lfKindOrder {
		for _, p := range lfPhases[kind] {
			if !all && kind != "hot swap" && lfInMakeTest[kind] != p {
				continue
			}
			forward := p == ledger.PhaseCommitted || p == ledger.PhaseDrain && (kind == "renewal" || kind == "retirement")
			errno := syscall.ENOSPC
			if len(cells)%2 == 1 {
				errno = syscall.EIO
			}
			cells = append(cells, lfCell{kind, p, forward, errno})
		}
	}
	return cells
}

// lfRow is what a cell found, for the table printed at the end.
type lfRow struct {
	cell                                                  lfCell
	served, call, groups, status, closing, retry, elapsed string
}

func TestALedgerThatCannotBeWrittenLeavesTheOldGenerationServing(t *testing.T) {
	faultfs.SkipUnlessSupported(t)
	var rows []lfRow
	for _, c := range lfCells() {
		t.Run(fmt.Sprintf("%s at %s", c.kind, c.phase), func(t *testing.T) {
			start := time.Now()
			row := lfRun(t, c)
			row.elapsed = time.Since(start).Round(100 * time.Millisecond).String()
			rows = append(rows, row)
		})
	}
	var b strings.Builder
	b.WriteString("\n| kind | phase | errno | served while the ledger was unwritable | a call's answer (latency) | provider groups (seen, left, gone) | status | the interrupted transaction in the ledger | after heal + restart | cell time |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.cell.kind, r.cell.phase, lfErrnoName(r.cell.errno),
			r.served, r.call, r.groups, r.status, r.closing, r.retry, r.elapsed)
	}
	t.Logf("ledger-fault table (%d cells):%s", len(rows), b.String())
}

func lfErrnoName(e syscall.Errno) string {
	if e == syscall.ENOSPC {
		return "ENOSPC"
	}
	return "EIO"
}

// lfExpect is what a cell expects of the module, per stage.
type lfExpect struct {
	// servingGen is the Generation that serves while the ledger is
	// unwritable ("" when nothing serves); servingVersion is what its
	// observations say.
	servingGen, servingVersion string
	// sameProcess: the process that served before the fault still serves
	// (otherwise another one of servingGen does: relaunched, renewed, new).
	sameProcess bool
	// during is the count a call answers while the ledger is unwritable
	// (0: the call must fail at once). A renewal's old process, within its
	// renewal margin, fits no call: the call waits for the renewal and
	// answers this once the disk is freed.
	during int
	// failedGen is the Generation the failed transaction started (Failed
	// ledger_unwritable afterwards), "" when none.
	failedGen string
	// finalGen serves once the ledger is writable again ("" after a
	// retirement); after and restarted are the counts it then answers,
	// before and after the manager's restart.
	finalGen, finalImpl string
	after, restarted    int
	// txn is the interrupted transaction's ID.
	txn string
}

func lfRun(t *testing.T, c lfCell) lfRow {
	row := lfRow{cell: c}
	n := newNode(t)
	fsys := lfMountLedgers(t, n)
	groups := lfWatchGroups(t, filepath.Join(n.stateDir, "procs"))
	name := "lf-" + strings.ReplaceAll(strings.ReplaceAll(c.kind+"-"+string(c.phase), " ", "-"), "_", "-")
	arm := func() *faultfs.Fault {
		return fsys.FailWrites(faultfs.Rule{Path: "ledger-*.jsonl", Contains: lfRecordBytes(c.phase), Errno: c.errno, Persist: faultfs.Everything})
	}
	gen := func(lineage int64, attempt int32) string {
		return iteronv1.GenerationName(name, lfModule, lineage, attempt)
	}
	noCheckpoints := func(s *iteronv1.ImplementationActivationSpec) { s.Checkpoint.IntervalSeconds = ptr.To[int32](0) }

	var (
		a     *iteronv1.ImplementationActivation
		m     *manager
		fault *faultfs.Fault
		x     lfExpect
		// oldPid is the group serving before the fault (0 for a first
		// activation).
		oldPid int
	)
	// before makes the old generation serve a=5 and returns its pid.
	before := func(impl string) int {
		got := waitFor(t, a, "Ready with "+impl, readyWith(lfModule, impl))
		if ans := n.lfCall(t, a, "a", 5); ans.err != "" || ans.count != 5 {
			t.Fatalf("the first call answered %s; want a=5", ans)
		}
		return lfGenerationPid(t, got.Status.Modules[0].GenerationName)
	}
	switch c.kind {
	case "first activation":
		m = n.start(t, "")
		fault = arm()
		a = newActivation(t, name, noCheckpoints, source(t, artifacts.CounterV2, lfModule, "counter-v2"))
		x = lfExpect{failedGen: gen(1, 1), finalGen: gen(1, 2), finalImpl: "counter-v2", after: 1, restarted: 2}
		if c.forward {
			x = lfExpect{servingGen: gen(1, 1), servingVersion: "2.0.0", during: 1, finalGen: gen(1, 1), finalImpl: "counter-v2", after: 2, restarted: 3}
		}
		x.txn = lfTxn(t, a, 1, 1, 0)
	case "hot swap", "cold replace":
		edit := noCheckpoints
		if c.kind == "cold replace" {
			edit = func(s *iteronv1.ImplementationActivationSpec) {
				noCheckpoints(s)
				s.Swap.Strategy = iteronv1.SwapStrategyCold
			}
		}
		a = newActivation(t, name, edit, source(t, artifacts.CounterV1, lfModule, "counter-v1"))
		m = n.start(t, "")
		oldPid = before("counter-v1")
		fault = arm()
		lfUpdate(t, a, func(s *iteronv1.ImplementationActivationSpec) {
			s.Sources[0] = source(t, artifacts.CounterV2, lfModule, "counter-v2")
		})
		// Hot: the state moves (a=5, then one call while the disk is full);
		// cold: it does not, and a post-switch rollback relaunches the old
		// generation empty (no swap snapshot, no checkpoints).
		x = lfExpect{servingGen: gen(1, 1), servingVersion: "1.0.0", sameProcess: c.phase != ledger.PhaseDrain, during: 6, failedGen: gen(2, 1),
			finalGen: gen(2, 2), finalImpl: "counter-v2", after: 7, restarted: 8}
		if c.kind == "cold replace" {
			x.after, x.restarted = 1, 2
			if c.phase == ledger.PhaseDrain {
				x.during = 1
			}
		}
		if c.forward {
			x = lfExpect{servingGen: gen(2, 1), servingVersion: "2.0.0", during: 6, finalGen: gen(2, 1), finalImpl: "counter-v2", after: 7, restarted: 8}
			if c.kind == "cold replace" {
				x.during, x.after, x.restarted = 1, 2, 3
			}
		}
		x.txn = lfTxn(t, a, 2, 1, 0)
	case "renewal":
		// A 20 s lifetime and a 10 s renewal margin (swap deadline 9 s +
		// quiesce 1 s): the renewal is due 10 s after the start, leaving
		// 10 s to free the disk before the process reaches its end of life
		// (the probes run 1, 3 and 7 s after the failure). Within the
		// margin a call does not fit the old process: made while the disk
		// is full, it waits in the queue for the renewal, which waits for
		// the ledger, and is answered by the renewed process once the disk
		// is freed. Past the drain the renewed process serves, and answers
		// at once.
		impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: lfModule, ImplementationID: "counter-short", RuntimeDeadlineMs: 20_000})
		src := providertest.Catalog(t, impl)[0]
		a = newActivation(t, name, func(s *iteronv1.ImplementationActivationSpec) {
			noCheckpoints(s)
			s.Swap.DeadlineSeconds = 9
			s.Swap.QuiesceTimeoutSeconds = ptr.To[int32](1)
		}, iteronv1.ActivationSource{Module: lfModule, ImplementationID: "counter-short", CatalogPath: src.CatalogPath,
			ArtifactRoot: src.ArtifactRoot, ManifestSHA256: src.ManifestSHA256, ArtifactSHA256: src.ArtifactSHA256})
		m = n.start(t, "")
		oldPid = before("counter-short")
		fault = arm()
		x = lfExpect{servingGen: gen(1, 1), servingVersion: "2.0.0", sameProcess: !c.forward, during: 6, finalGen: gen(1, 1), finalImpl: "counter-short", after: 7, restarted: 8}
		x.txn = lfTxn(t, a, 1, 1, 1)
	case "relaunch":
		a = newActivation(t, name, func(s *iteronv1.ImplementationActivationSpec) {
			s.Checkpoint.IntervalSeconds = ptr.To[int32](1)
		}, source(t, artifacts.CounterV2, lfModule, "counter-v2"))
		m = n.start(t, "")
		oldPid = before("counter-v2")
		waitCheckpointed(t, a, 5) // what the relaunch restores
		fault = arm()
		if err := syscall.Kill(-oldPid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill the provider group %d: %v", oldPid, err)
		}
		x = lfExpect{finalGen: gen(1, 1), finalImpl: "counter-v2", after: 6, restarted: 7}
		if c.forward {
			x = lfExpect{servingGen: gen(1, 1), servingVersion: "2.0.0", during: 6, finalGen: gen(1, 1), finalImpl: "counter-v2", after: 7, restarted: 8}
		}
		x.txn = lfTxn(t, a, 1, 1, 1)
	case "retirement":
		a = newActivation(t, name, noCheckpoints, source(t, artifacts.CounterV2, lfModule, "counter-v2"))
		m = n.start(t, "")
		oldPid = before("counter-v2")
		fault = arm()
		lfUpdate(t, a, func(s *iteronv1.ImplementationActivationSpec) { s.Sources = nil })
		x = lfExpect{servingGen: gen(1, 1), servingVersion: "2.0.0", sameProcess: true, during: 6}
		if c.forward {
			x = lfExpect{}
		}
		x.txn = lfTxn(t, a, 1, 1, 1)
	}
	dump := func() {
		if t.Failed() && a != nil {
			t.Logf("failed writes: %v", fsys.Failures())
			t.Logf("provider groups seen: %v", groups.all(t))
			t.Logf("ledger: %v", lfRecords(t, n, a, ""))
			if m != nil {
				t.Logf("the first manager's output (its end):\n%s", tail(m.out.String(), 6000))
			}
		}
	}
	t.Cleanup(dump)

	// The fault fires in the manager's own append (the rule matched the
	// record's bytes; a failure keeps only their first 256).
	if !fault.WaitFired(60 * time.Second) {
		b, _ := json.MarshalIndent(get(t, a).Status, "", "  ")
		t.Fatalf("the %s record was never appended; status:\n%s\nmanager output:\n%s", c.phase, b, tail(m.out.String(), 3000))
	}
	firedAt := time.Now()
	failures := fsys.Failures()
	if len(failures) == 0 || failures[0].PID != uint32(m.cmd.Process.Pid) || failures[0].Errno != c.errno {
		t.Fatalf("the first failed write is not the manager's (pid %d) %s record with %v: %v", m.cmd.Process.Pid, c.phase, c.errno, failures)
	}
	t.Logf("fault fired: %s", failures[0])

	// While the disk is full: status. The expected resting state is
	// waited for; every other Stalled status seen on the way is kept (a
	// transaction still ending — a post-switch rollback — may be reported
	// before it is over).
	modulesOK := func(a *iteronv1.ImplementationActivation) bool {
		switch ms := a.Status.Modules; {
		case c.kind == "retirement" && x.servingGen != "":
			// A module whose source left the spec stays listed until its
			// process is gone: here it still serves (its retirement waits
			// for the ledger), Active on the generation it had.
			return len(ms) == 1 && ms[0].GenerationName == x.servingGen && ms[0].Phase == iteronv1.PhaseActive
		case c.kind == "retirement":
			return len(ms) == 0
		case x.servingGen != "":
			return len(ms) == 1 && ms[0].GenerationName == x.servingGen && ms[0].Phase == iteronv1.PhaseActive
		default:
			return len(ms) == 1 && ms[0].Phase != iteronv1.PhaseActive
		}
	}
	var transient []string
	st := waitFor(t, a, "Stalled with LedgerUnwritable, Ready=False and the expected modules", func(a *iteronv1.ImplementationActivation) bool {
		r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
		resting := stalledWith(reasons.LedgerUnwritable)(a) && r != nil && r.Status == metav1.ConditionFalse && a.Status.ObservedGeneration == a.Generation
		if resting && !modulesOK(a) {
			if s := lfModules(a); len(transient) == 0 || transient[len(transient)-1] != s {
				transient = append(transient, s)
			}
		}
		return resting && modulesOK(a)
	})
	stalled := meta.FindStatusCondition(st.Status.Conditions, iteronv1.ConditionStalled)
	ready := meta.FindStatusCondition(st.Status.Conditions, iteronv1.ConditionReady)
	errText := c.errno.Error()
	if !strings.Contains(lfConditionText(st), errText) {
		t.Errorf("no condition names the error %q: %s", errText, lfConditionText(st))
	}
	t.Logf("%s after the fault: Stalled=%s %s (%q), Ready=%s %s; modules %s", time.Since(firedAt).Round(time.Millisecond),
		stalled.Status, stalled.Reason, stalled.Message, ready.Status, ready.Reason, lfModules(st))
	if len(transient) > 0 {
		t.Logf("before that, Stalled LedgerUnwritable with observedGeneration current but modules %v", transient)
	}
	row.status = fmt.Sprintf("Stalled %s, Ready %s %s; module %s", stalled.Reason, ready.Status, ready.Reason, lfModules(st))
	if len(transient) > 0 {
		row.status += fmt.Sprintf(" (first, while the transaction ended: %s)", strings.Join(transient, ", "))
	}

	// While the disk is full: who answers.
	servingPid := 0
	if x.servingGen != "" {
		// The Generation's mirrored status names the serving process: the
		// one that served before, or another (relaunched, renewed, new).
		which := map[bool]string{true: "the process that served before", false: "another process"}[x.sameProcess]
		g := waitGeneration(t, x.servingGen, fmt.Sprintf("Active with %s (pid %d before)", which, oldPid), func(g *iteronv1.Generation) bool {
			return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && (int(g.Status.Pid) == oldPid) == x.sameProcess
		})
		servingPid = int(g.Status.Pid)
		row.served = fmt.Sprintf("%s v%s, %s", x.servingGen, x.servingVersion, map[bool]string{true: "same process", false: "pid " + fmt.Sprint(servingPid) + " (not " + fmt.Sprint(oldPid) + ")"}[x.sameProcess])
	}
	// waiting is the answer of a call that waits for the disk to be freed.
	var waiting chan lfAnswer
	switch {
	case c.kind == "renewal" && !c.forward:
		// The old process is within its renewal margin: the call does not
		// fit it and waits in the queue for the renewal. It must not be
		// answered (nor refused) while the disk is full.
		waiting = make(chan lfAnswer, 1)
		go func() { waiting <- n.lfCall(t, a, "a", 1) }()
		select {
		case ans := <-waiting:
			t.Fatalf("a call within the old process's renewal margin was answered while the disk is full: %s; want it to wait for the renewal", ans)
		case <-time.After(2 * time.Second):
		}
		row.call = "waits for the renewal"
	case x.servingGen != "":
		ans := n.lfCall(t, a, "a", 1)
		if ans.err != "" || ans.count != x.during || ans.version != x.servingVersion {
			t.Fatalf("while the disk is full the module answered %s; want a=%d from version %s", ans, x.during, x.servingVersion)
		}
		row.call = fmt.Sprintf("a=%d (%s)", ans.count, ans.took.Round(time.Millisecond))
	default:
		// Nothing can serve: a call fails at once with the reason instead
		// of waiting out its deadline (15 s).
		ans := n.lfCall(t, a, "a", 1)
		want := reasons.LedgerUnwritable
		if c.kind == "retirement" {
			want = reasons.NotFound
		}
		if !strings.HasPrefix(ans.err, want+":") || ans.took > 3*time.Second {
			t.Fatalf("a call while nothing serves answered %s; want %s at once", ans, want)
		}
		row.served = "nothing"
		code, _, _ := strings.Cut(ans.err, ":")
		row.call = fmt.Sprintf("%s at once (%s)", code, ans.took.Round(time.Millisecond))
	}
	t.Logf("served while the disk is full: %s; call: %s", row.served, row.call)

	// While the disk is full: nothing the failed transaction started is
	// left, only the serving group.
	var want []int
	if servingPid != 0 {
		want = []int{servingPid}
	}
	took := groups.waitOnly(t, "while the ledger is unwritable", want...)
	seen := groups.all(t)
	var gone []string
	for _, g := range seen {
		if g.pgid != servingPid {
			gone = append(gone, g.String())
		}
	}
	row.groups = fmt.Sprintf("%d seen, %d left (%d gone: %s)", len(seen), len(want), len(gone), strings.Join(gone, " "))
	t.Logf("provider groups: %s; checked in %s", row.groups, took.Round(time.Millisecond))
	if x.failedGen != "" {
		g := waitGeneration(t, x.failedGen, "Failed ledger_unwritable", func(g *iteronv1.Generation) bool {
			return g.Status.Phase == iteronv1.PhaseFailed && g.Status.Reason == reasons.LedgerUnwritable
		})
		t.Logf("the failed generation %s: %s %s (%s)", g.Name, g.Status.Phase, g.Status.Reason, g.Status.Message)
	}

	// Free the disk: the manager closes the interrupted transaction by
	// itself and the work goes on.
	fsys.Heal()
	healed := time.Now()
	if waiting != nil {
		ans := <-waiting
		if ans.err != "" || ans.count != x.during || ans.version != x.servingVersion {
			t.Fatalf("the call that waited for the renewal answered %s; want a=%d from version %s once the disk was freed", ans, x.during, x.servingVersion)
		}
		row.call = fmt.Sprintf("a=%d once the disk was freed: it waited for the renewal (%s, %s after the heal)", ans.count,
			ans.took.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
		t.Logf("the call that waited: %s", row.call)
	}
	var final *iteronv1.ImplementationActivation
	switch {
	case c.kind == "retirement":
		final = waitFor(t, a, "Ready with no module", func(a *iteronv1.ImplementationActivation) bool {
			r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
			return r != nil && r.Status == metav1.ConditionTrue && a.Status.ObservedGeneration == a.Generation && len(a.Status.Modules) == 0
		})
	default:
		final = waitFor(t, a, "Ready with "+x.finalGen, func(a *iteronv1.ImplementationActivation) bool {
			return readyWith(lfModule, x.finalImpl)(a) && a.Status.Modules[0].GenerationName == x.finalGen
		})
		if c.kind == "renewal" {
			waitGeneration(t, x.finalGen, "renewed", func(g *iteronv1.Generation) bool { return g.Status.Renewals >= 1 })
		}
	}
	resumed := time.Since(healed)
	afterHeal := ""
	if x.finalGen != "" {
		ans := n.lfCall(t, a, "a", 1)
		if ans.err != "" || ans.count != x.after {
			t.Fatalf("after the disk was freed %s answered %s; want a=%d", x.finalGen, ans, x.after)
		}
		afterHeal = fmt.Sprintf("%s a=%d", x.finalGen, ans.count)
	} else {
		afterHeal = "module retired"
	}
	t.Logf("%s after the disk was freed: Ready, %s", resumed.Round(time.Millisecond), afterHeal)

	// Restart the manager. The status the first one wrote says Ready
	// already: the new one's positive signal is the serving generation
	// relaunched (a new pid), or, with nothing to run, a call answered
	// without "recovering".
	prePid := 0
	if x.finalGen != "" {
		prePid = lfGenerationPid(t, x.finalGen)
	}
	if err := m.stop(t); err != nil {
		t.Fatalf("the manager's exit after SIGTERM: %v", err)
	}
	n.start(t, "")
	var restarted lfAnswer
	if x.finalGen != "" {
		waitGeneration(t, x.finalGen, "relaunched by the restarted manager", func(g *iteronv1.Generation) bool {
			return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && int(g.Status.Pid) != prePid
		})
		final = waitFor(t, a, "Ready after the restart", func(a *iteronv1.ImplementationActivation) bool {
			return readyWith(lfModule, x.finalImpl)(a) && a.Status.Modules[0].GenerationName == x.finalGen
		})
		restarted = n.lfCallSettled(t, a, "a", 1)
	} else {
		restarted = n.lfCallSettled(t, a, "a", 1)
		final = waitFor(t, a, "Ready after the restart", func(a *iteronv1.ImplementationActivation) bool {
			r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
			return r != nil && r.Status == metav1.ConditionTrue && a.Status.ObservedGeneration == a.Generation && len(a.Status.Modules) == 0
		})
	}
	verified := n.verifyLedger(t, final)
	tx := lfRecords(t, n, final, x.txn)
	switch k := len(tx); {
	case c.phase == ledger.PhaseVerify:
		// Its first record never became durable: as far as the ledger
		// knows, the transaction never began.
		if k != 0 {
			t.Fatalf("a transaction whose first record failed must leave no record; %s left %v", x.txn, tx)
		}
		row.closing = "none (its first record failed)"
	case c.forward:
		if tx[k-1].phase != ledger.PhaseCommitted || lfHasBlock(tx) {
			t.Fatalf("a transaction past its point of no return must be closed forward; %s is %v", x.txn, tx)
		}
		row.closing = lfTail(tx, 2)
	default:
		if k < 2 || tx[k-1].phase != ledger.PhaseRolledBack || tx[k-2].outcome != ledger.OutcomeBlocked || tx[k-2].phase != c.phase ||
			!strings.HasPrefix(tx[k-2].reason, reasons.LedgerUnwritable+": ") {
			t.Fatalf("the interrupted transaction must close blocked(%s, ledger_unwritable: …) + rolled_back; %s is %v", c.phase, x.txn, tx)
		}
		row.closing = lfTail(tx, 2)
	}
	// After the restart only the serving group is left; every group of the
	// first manager is gone.
	servingPid = 0
	if x.finalGen != "" {
		if restarted.err != "" || restarted.count != x.restarted {
			t.Fatalf("after the restart %s answered %s; want a=%d", x.finalGen, restarted, x.restarted)
		}
		servingPid = lfGenerationPid(t, x.finalGen)
		row.retry = fmt.Sprintf("%s; restarted: %s a=%d", afterHeal, x.finalGen, restarted.count)
		groups.waitOnly(t, "after the restart", servingPid)
	} else {
		if !strings.HasPrefix(restarted.err, reasons.NotFound+":") {
			t.Fatalf("after the restart a call to the retired module answered %s; want %s", restarted, reasons.NotFound)
		}
		row.retry = afterHeal + "; restarted: nothing runs"
		groups.waitOnly(t, "after the restart")
	}
	t.Logf("after the restart: %s; ledger: %s; %s: %v", row.retry, verified, x.txn, tx)
	deleteActivation(t, final)
	return row
}

// lfMountLedgers puts <state-dir>/ledgers of n on a faultfs over a backing
// directory of its own; the mount goes when the test ends, after the
// managers (cleanups run last-in first-out).
func lfMountLedgers(t *testing.T, n *nodeState) *faultfs.FS {
	t.Helper()
	return faultfs.Over(t, filepath.Join(n.stateDir, statedir.LedgersDir))
}

// lfRecordBytes is what the ledger writes for the phase's record (its
// outcome after the phase), so a rule fails that one append.
func lfRecordBytes(p ledger.Phase) string {
	if p == ledger.PhaseCommitted {
		return `"phase":"committed","outcome":"committed"`
	}
	return fmt.Sprintf(`"phase":%q,"outcome":"applied"`, string(p))
}

func lfTxn(t *testing.T, a *iteronv1.ImplementationActivation, lineage, attempt, renewal uint64) string {
	t.Helper()
	id, err := ledger.NewTransactionID(string(a.UID), lfModule, lineage, attempt, renewal)
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// lfUpdate changes a's spec (retrying on a conflict with the manager's
// writes).
func lfUpdate(t *testing.T, a *iteronv1.ImplementationActivation, edit func(*iteronv1.ImplementationActivationSpec)) {
	t.Helper()
	for i := 0; ; i++ {
		cur := get(t, a)
		edit(&cur.Spec)
		err := env.Client.Update(context.Background(), cur)
		if err == nil {
			return
		}
		if i == 10 {
			t.Fatal(err)
		}
	}
}

// lfAnswer is one call's outcome through the gateway.
type lfAnswer struct {
	count   int
	version string
	err     string
	took    time.Duration
}

func (a lfAnswer) String() string {
	if a.err != "" {
		return fmt.Sprintf("error %q after %s", a.err, a.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("a=%d from version %s after %s", a.count, a.version, a.took.Round(time.Millisecond))
}

// lfCall adds add to key through the gateway with the CLI (a 15 s call
// deadline).
func (n *nodeState) lfCall(t *testing.T, a *iteronv1.ImplementationActivation, key string, add int) lfAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, pluginBin, "invoke", "--socket", n.socket, "--namespace", ns, "--activation", a.Name,
		"--module", lfModule, "--input", fmt.Sprintf(`{"key":%q,"add":%d}`, key, add), "--timeout", "15s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ans := lfAnswer{took: time.Since(start)}
	if err != nil {
		// The CLI prints "error: <reason>: <message> (gRPC <code>)".
		ans.err = strings.TrimPrefix(strings.TrimSpace(stderr.String()), "error: ")
		if ans.err == "" {
			ans.err = err.Error()
		}
		return ans
	}
	var obs struct {
		Count   int    `json:"count"`
		Version string `json:"implementation_version"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &obs); err != nil {
		ans.err = fmt.Sprintf("invoke printed %q: %v", stdout.String(), err)
		return ans
	}
	ans.count, ans.version = obs.Count, obs.Version
	return ans
}

// lfCallSettled is lfCall once a restarted manager's gateway listens and
// no longer answers "recovering" (it has not yet prepared this node's
// activations); such calls certainly did not run.
func (n *nodeState) lfCallSettled(t *testing.T, a *iteronv1.ImplementationActivation, key string, add int) lfAnswer {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ans := n.lfCall(t, a, key, add)
		notYet := strings.HasPrefix(ans.err, reasons.Recovering+":") || strings.Contains(ans.err, "dial unix")
		if !notYet || time.Now().After(deadline) {
			return ans
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	return strings.Join(f, " ")
}

// lfGenerationPid waits for an Active generation's pid in its status.
func lfGenerationPid(t *testing.T, name string) int {
	t.Helper()
	g := waitGeneration(t, name, "Active with a pid", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0
	})
	return int(g.Status.Pid)
}

func lfModules(a *iteronv1.ImplementationActivation) string {
	if len(a.Status.Modules) == 0 {
		return "[]"
	}
	var parts []string
	for _, m := range a.Status.Modules {
		s := fmt.Sprintf("%s %s %s", m.Module, m.GenerationName, m.Phase)
		if m.Reason != "" {
			s += " " + m.Reason
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func lfConditionText(a *iteronv1.ImplementationActivation) string {
	var b strings.Builder
	for _, c := range a.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s %s: %s; ", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, m := range a.Status.Modules {
		fmt.Fprintf(&b, "module %s: %s %s; ", m.Module, m.Reason, m.Message)
	}
	return b.String()
}

// lfRecord is one ledger record in brief.
type lfRecord struct {
	txn     string
	phase   ledger.Phase
	outcome ledger.Outcome
	reason  string
}

func (r lfRecord) String() string {
	if r.reason != "" {
		return fmt.Sprintf("%s:%s(%s)", r.phase, r.outcome, r.reason)
	}
	return fmt.Sprintf("%s:%s", r.phase, r.outcome)
}

var lfLedgerMu sync.Mutex

// lfRecords replays (and so verifies) the activation's ledger and returns
// the records of transaction txn, or every record when txn is "".
func lfRecords(t *testing.T, n *nodeState, a *iteronv1.ImplementationActivation, txn string) []lfRecord {
	t.Helper()
	lfLedgerMu.Lock()
	defer lfLedgerMu.Unlock()
	dir := filepath.Join(n.stateDir, statedir.LedgersDir, string(a.UID))
	for try := 1; ; try++ {
		var out []lfRecord
		_, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
			if txn == "" || r.TransactionID == txn {
				b := lfRecord{txn: r.TransactionID, phase: r.Phase, outcome: r.Outcome}
				if r.Reason != nil {
					b.reason = *r.Reason
				}
				out = append(out, b)
			}
			return nil
		})
		// A live ledger may grow while it is read (a renewal, a relaunch):
		// read it again.
		var re *ledger.RuleError
		if errors.As(err, &re) && re.Rule == ledger.RuleSizeChanged && try < 5 {
			continue
		}
		if err != nil {
			t.Errorf("replay the ledger %s: %v", dir, err)
		}
		return out
	}
}

func lfHasBlock(tx []lfRecord) bool {
	for _, r := range tx {
		if r.outcome == ledger.OutcomeBlocked {
			return true
		}
	}
	return false
}

// lfTail is the last k records, the reason cut to its code and a few words.
func lfTail(tx []lfRecord, k int) string {
	var parts []string
	for _, r := range tx[max(len(tx)-k, 0):] {
		if r.reason != "" {
			r.reason = firstWords(r.reason, 4) + " …"
		}
		parts = append(parts, r.String())
	}
	return strings.Join(parts, " + ")
}
