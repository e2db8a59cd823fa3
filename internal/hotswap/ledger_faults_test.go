package hotswap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/test/faultfs"
)

// The ledger-fault table: for each transaction kind and phase, the ledger's
// directory sits on a real file system (FUSE) that fails the append
// carrying that phase with ENOSPC and keeps failing every write (a full
// disk) until healed. Each cell checks what the runner's one failure policy
// promises: what served before serves (or, past the point of no return, the
// transaction stands), nothing the transaction started is left running,
// the status says ledger_unwritable, and once the disk is healed the
// coordinator replays the ledger by itself, the transaction is closed
// truthfully, the ledger verifies and the work goes on.
//
// make test runs every phase of the hot swap and one phase of every other
// kind; ITERON_FAULTS=all (make faults) runs every phase of every kind.

// ledgerFaultCell is one cell of the table.
type ledgerFaultCell struct {
	kind  string
	phase ledger.Phase
	// forward: the failed record comes after work that cannot be undone;
	// the transaction stands and is closed forward.
	forward bool
}

var ledgerFaultKinds = map[string][]ledger.Phase{
	"first activation": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseAtomicSwitch, ledger.PhaseCommitted},
	"hot swap": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce, ledger.PhaseSnapshot, ledger.PhaseMigrate,
		ledger.PhaseRestore, ledger.PhaseReadiness, ledger.PhaseAtomicSwitch, ledger.PhaseDrain, ledger.PhaseCommitted},
	"cold replace": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce, ledger.PhaseAtomicSwitch, ledger.PhaseDrain, ledger.PhaseCommitted},
	"renewal": {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce, ledger.PhaseSnapshot, ledger.PhaseRestore,
		ledger.PhaseReadiness, ledger.PhaseAtomicSwitch, ledger.PhaseDrain, ledger.PhaseCommitted},
	"relaunch":   {ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseRestore, ledger.PhaseReadiness, ledger.PhaseAtomicSwitch, ledger.PhaseCommitted},
	"retirement": {ledger.PhaseVerify, ledger.PhaseQuiesce, ledger.PhaseSnapshot, ledger.PhaseDrain, ledger.PhaseCommitted},
}

// inMakeTest is the one phase of each kind other than the hot swap that
// make test runs.
var inMakeTest = map[string]ledger.Phase{
	"first activation": ledger.PhaseShadowLoad, "cold replace": ledger.PhaseAtomicSwitch, "renewal": ledger.PhaseSnapshot,
	"relaunch": ledger.PhaseRestore, "retirement": ledger.PhaseQuiesce,
}

func ledgerFaultCells() []ledgerFaultCell {
	all := os.Getenv("ITERON_FAULTS") == "all"
	var cells []ledgerFaultCell
	for _, kind := range []string{"first activation", "hot swap", "cold replace", "renewal", "relaunch", "retirement"} {
		for _, p := range ledgerFaultKinds[kind] {
			if !all && kind != "hot swap" && inMakeTest[kind] != p {
				continue
			}
			forward := p == ledger.PhaseCommitted ||
				p == ledger.PhaseDrain && (kind == "renewal" || kind == "retirement")
			cells = append(cells, ledgerFaultCell{kind, p, forward})
		}
	}
	return cells
}

// recordBytes is what the ledger writes for the phase's record (its outcome
// after the phase), so a rule fails that one append.
func recordBytes(p ledger.Phase) string {
	if p == ledger.PhaseCommitted {
		return `"phase":"committed","outcome":"committed"`
	}
	return fmt.Sprintf(`"phase":%q,"outcome":"applied"`, string(p))
}

// newFaultyLedgerHarness is a harness whose ledgers directory is a FUSE
// mount over a backing directory.
func newFaultyLedgerHarness(t *testing.T) (*harness, *faultfs.FS) {
	t.Helper()
	stateDir := t.TempDir()
	// Mounted before the harness starts, so it is unmounted after the
	// coordinator's shutdown.
	fsys := faultfs.Over(t, filepath.Join(stateDir, statedir.LedgersDir))
	uidCounter.Lock()
	uidCounter.n++
	uid := fmt.Sprintf("%08x-0000-4000-8000-000000000000", 0xb0000000+uidCounter.n)
	uidCounter.Unlock()
	return newHarnessAt(t, stateDir, ActivationKey{Namespace: "default", Name: "stack", UID: uid}), fsys
}

func TestALedgerAppendThatFailsLeavesServiceAsItWasAndResumesOnceWritable(t *testing.T) {
	for _, cell := range ledgerFaultCells() {
		t.Run(fmt.Sprintf("%s at %s", cell.kind, cell.phase), func(t *testing.T) {
			runLedgerFaultCell(t, cell)
		})
	}
}

func runLedgerFaultCell(t *testing.T, cell ledgerFaultCell) {
	h, fsys := newFaultyLedgerHarness(t)
	swap := SwapPolicy{Deadline: 20 * time.Second, QuiesceTimeout: time.Second, Cold: cell.kind == "cold replace"}
	v2 := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2})
	v2b := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, ImplementationID: "counter-v2b"})
	v1 := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1})
	v1b := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1, ImplementationID: "counter-v1b"})
	arm := func() *faultfs.Fault {
		return fsys.FailWrites(faultfs.Rule{Path: "ledger-*.jsonl", Contains: recordBytes(cell.phase), Errno: syscall.ENOSPC, Persist: faultfs.Everything})
	}
	var (
		old, next ModuleTarget
		oldPid    int
		fault     *faultfs.Fault
		// count is the counter value the module holds when the fault fires
		// (every kind but a first activation has served a=5 by then).
		count = 5
	)
	switch cell.kind {
	case "first activation":
		fault = arm()
		next = h.target(v2)
		h.applyWith(swap, 0, next)
		count = 0
	case "hot swap", "cold replace", "relaunch", "retirement":
		impl, nextImpl := v2, v2b
		if cell.kind == "cold replace" {
			impl, nextImpl = v1, v1b
		}
		old = h.target(impl)
		checkpoints := time.Duration(0)
		if cell.kind == "relaunch" {
			// A durable snapshot for the relaunch to restore.
			checkpoints = 200 * time.Millisecond
		}
		h.applyWith(swap, checkpoints, old)
		st := h.settle()
		oldPid = st.Modules["prompt_system"].Pid
		h.count("prompt_system", "a", 5)
		if checkpoints > 0 {
			counted := time.Now()
			h.waitStatus("a checkpoint after the call", func(st ActivationStatus) bool {
				cp := st.Generations[old.GenerationName].LastCheckpoint
				return cp != nil && cp.At.After(counted)
			})
		}
		fault = arm()
		switch cell.kind {
		case "relaunch":
			killGroup(t, oldPid)
		case "retirement":
			h.applyWith(swap, 0)
		default:
			next = h.target(nextImpl)
			h.applyWith(swap, 0, next)
		}
	case "renewal":
		// A 20 s lifetime with a 6 s renewal margin: the renewal is due 14 s
		// after the start, leaving 6 s to heal the disk before the process
		// reaches its end of life. Within the margin a call does not fit
		// the old process: made while the disk is full, it waits for the
		// renewal, which waits for the ledger (below).
		old = h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, RuntimeDeadlineMs: 20_000}))
		h.applyWith(SwapPolicy{Deadline: 5 * time.Second, QuiesceTimeout: time.Second}, 0, old)
		st := h.settle()
		oldPid = st.Modules["prompt_system"].Pid
		h.count("prompt_system", "a", 5)
		fault = arm()
	}
	if !fault.WaitFired(30 * time.Second) {
		t.Fatalf("the %s record was never appended (phases so far: %v)", cell.phase, h.recorded())
	}
	st := h.waitStatus("ledger_unwritable in status", func(st ActivationStatus) bool { return st.LedgerUnwritable != "" && !st.Busy })
	if !strings.Contains(st.LedgerUnwritable, "no space left on device") {
		t.Errorf("the status does not name the error: %q", st.LedgerUnwritable)
	}
	ms := st.Modules["prompt_system"]
	// The transaction the failed append belonged to.
	txTarget, renewal := next, uint64(0)
	if txTarget.GenerationName == "" {
		txTarget, renewal = old, 1 // a renewal, relaunch or retirement of old: its /r1
	}
	id, err := ledger.NewTransactionID(h.key.UID, "prompt_system", uint64(txTarget.Lineage), uint64(txTarget.Attempt), renewal)
	if err != nil {
		t.Fatal(err)
	}
	failedTxn := id.String()

	// While the disk is full: what serves, and what is left.
	var waiting chan error // a call that waits for the disk to be freed
	switch {
	case cell.kind == "renewal" && cell.forward:
		if ms.Pid == oldPid || !ms.Serving || !processGone(oldPid) {
			t.Fatalf("a renewal past its drain must leave the fresh process serving and the old (pid %d) gone: %+v", oldPid, ms)
		}
		count++
		if out := h.count("prompt_system", "a", 1); out["count"] != float64(count) {
			t.Fatalf("while the disk is full the renewed process answered %v; want a=%d", out, count)
		}
	case cell.kind == "renewal":
		if ms.Pid != oldPid || !ms.Serving {
			t.Fatalf("the renewal must leave the old process (pid %d) serving: %+v", oldPid, ms)
		}
		// A call does not fit the old process (within its renewal margin):
		// it waits for the renewal, neither answered nor refused while the
		// disk is full, and is answered by the renewed process once it is
		// freed.
		count++
		want := count
		waiting = make(chan error, 1)
		go func() {
			r, err := h.invoke("prompt_system", `{"key":"a","add":1}`)
			var out struct{ Count int }
			if err == nil {
				err = json.Unmarshal(r.Terminal.Body, &out)
			}
			if err == nil && out.Count != want {
				err = fmt.Errorf("answered %s; want a=%d", r.Terminal.Body, want)
			}
			waiting <- err
		}()
		select {
		case err := <-waiting:
			t.Fatalf("a call within the old process's renewal margin ended while the disk is full (%v); want it to wait for the renewal", err)
		case <-time.After(time.Second):
		}
	case cell.kind == "first activation" && !cell.forward, cell.kind == "relaunch" && !cell.forward:
		// Nothing serves and nothing can be prepared: calls fail at once
		// with the reason instead of waiting out their deadline.
		start := time.Now()
		_, err := h.invoke("prompt_system", `{"key":"a","add":1}`)
		var ce *dispatch.CallError
		if !errors.As(err, &ce) || ce.Code != reasons.LedgerUnwritable || time.Since(start) > 2*time.Second {
			t.Fatalf("a call while nothing can serve: %v after %s; want ledger_unwritable at once", err, time.Since(start))
		}
		if ms.Serving {
			t.Fatalf("module %+v serves", ms)
		}
	case cell.kind == "retirement" && cell.forward:
		if _, ok := st.Modules["prompt_system"]; ok {
			t.Fatalf("a retirement past its drain left the module: %+v", ms)
		}
	default:
		count++
		if cell.kind == "cold replace" && (cell.phase == ledger.PhaseDrain || cell.phase == ledger.PhaseCommitted) {
			// No state moves in a cold replace: the new generation, or the
			// old one relaunched by the rollback, starts afresh.
			count = 1
		}
		out := h.count("prompt_system", "a", 1)
		if out["count"] != float64(count) {
			t.Fatalf("while the disk is full the module answered %v; want a=%d", out, count)
		}
	}
	if next.GenerationName != "" {
		gs := st.Generations[next.GenerationName]
		switch {
		case cell.forward:
			if ms.Active != next.GenerationName || !ms.Serving {
				t.Fatalf("past the point of no return the new generation must serve: %+v", ms)
			}
		default:
			if gs.Phase != iteronv1.PhaseFailed || gs.Reason != reasons.LedgerUnwritable {
				t.Fatalf("new generation: %s %q (%s); want Failed ledger_unwritable", gs.Phase, gs.Reason, gs.Message)
			}
			if gs.LastPid != 0 && !processGone(gs.LastPid) {
				t.Fatalf("the new generation's process %d was left running", gs.LastPid)
			}
			if old.GenerationName != "" && (ms.Active != old.GenerationName || !ms.Serving) {
				t.Fatalf("the old generation must serve: %+v", ms)
			}
		}
	}

	// Free the disk: the coordinator replays the ledger by itself.
	fsys.Heal()
	if waiting != nil {
		if err := <-waiting; err != nil {
			t.Fatalf("the call that waited for the renewal: %v", err)
		}
	}
	st = h.waitStatus("the ledger writable again", func(st ActivationStatus) bool { return st.LedgerUnwritable == "" })
	var tx []recordBrief
	for _, r := range h.ledgerRecords() { // verifies
		if r.txn == failedTxn {
			tx = append(tx, r)
		}
	}
	switch n := len(tx); {
	case cell.phase == ledger.PhaseVerify:
		// Its first record never became durable: the transaction never
		// started, as far as the ledger is concerned.
		if n != 0 {
			t.Fatalf("a transaction whose first record failed must leave no record; it left %v", tx)
		}
	case cell.forward:
		if n == 0 || tx[n-1].phase != ledger.PhaseCommitted {
			t.Fatalf("a transaction past its point of no return must be closed forward; it is %v", tx)
		}
	default:
		if n < 2 || tx[n-1].phase != ledger.PhaseRolledBack || tx[n-2].outcome != ledger.OutcomeBlocked || tx[n-2].phase != cell.phase ||
			!strings.HasPrefix(tx[n-2].reason, reasons.LedgerUnwritable+": ") {
			t.Fatalf("the interrupted transaction must close blocked(%s, ledger_unwritable) + rolled_back; it is %v", cell.phase, tx)
		}
	}

	// The work goes on.
	switch cell.kind {
	case "first activation", "hot swap", "cold replace":
		if !cell.forward {
			f := failureFor(st, next.GenerationName)
			if f == nil || !f.Retryable {
				t.Fatalf("the attempt cut short by the ledger must be retryable: %+v", f)
			}
			retry := h.targetAt(nextImplOf(cell.kind, v2, v2b, v1b), next.Lineage, next.Attempt+1)
			h.applyWith(swap, 0, retry)
			next = retry
		}
		st = h.waitStatus("the new generation serving", func(st ActivationStatus) bool {
			ms := st.Modules["prompt_system"]
			return ms.Active == next.GenerationName && ms.Serving && !st.Busy
		})
	case "renewal":
		h.waitStatus("a renewal committed", func(st ActivationStatus) bool {
			return st.Generations[old.GenerationName].Renewals >= 1
		})
	case "relaunch":
		st = h.waitStatus("the generation relaunched", func(st ActivationStatus) bool { return st.Modules["prompt_system"].Serving })
	case "retirement":
		st = h.waitStatus("the module retired", func(st ActivationStatus) bool {
			_, ok := st.Modules["prompt_system"]
			return !ok && !st.Busy
		})
		if !processGone(oldPid) {
			t.Fatalf("the retired generation's process %d is still running", oldPid)
		}
	}
	if cell.kind != "retirement" {
		switch {
		case cell.kind == "first activation" && !cell.forward, cell.kind == "cold replace" && !cell.forward:
			count = 1 // a fresh generation
		default:
			count++
		}
		if out := h.count("prompt_system", "a", 1); out["count"] != float64(count) {
			t.Fatalf("after the ledger recovered the module answered %v; want a=%d", out, count)
		}
	}
	h.ledgerRecords()
	t.Logf("%s at %s: fault fired (%d writes failed), status named ledger_unwritable, service as expected, healed, ledger verifies, last transaction %v", cell.kind, cell.phase, fault.Count(), tx)
}

func nextImplOf(kind string, v2, v2b, v1b artifacts.Implementation) artifacts.Implementation {
	switch kind {
	case "first activation":
		return v2
	case "cold replace":
		return v1b
	}
	return v2b
}

// recordBrief is one ledger record as the fault table reads it.
type recordBrief struct {
	txn     string
	module  string
	phase   ledger.Phase
	outcome ledger.Outcome
	reason  string
}

func (r recordBrief) String() string {
	if r.reason != "" {
		return fmt.Sprintf("%s:%s(%s)", r.phase, r.outcome, r.reason)
	}
	return fmt.Sprintf("%s:%s", r.phase, r.outcome)
}

// ledgerRecords replays and verifies the ledger from disk. A replay that
// races the coordinator's own append (the file grew while it was read) is
// read again.
func (h *harness) ledgerRecords() []recordBrief {
	h.t.Helper()
	dir, err := ledger.ActivationDir(h.stateDir, h.key.UID)
	if err != nil {
		h.t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		var out []recordBrief
		_, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
			b := recordBrief{txn: r.TransactionID, module: r.Module, phase: r.Phase, outcome: r.Outcome}
			if r.Reason != nil {
				b.reason = *r.Reason
			}
			out = append(out, b)
			return nil
		})
		var re *ledger.RuleError
		if errors.As(err, &re) && re.Rule == ledger.RuleSizeChanged && attempt < 20 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			h.t.Fatalf("the ledger does not verify: %v", err)
		}
		return out
	}
}

// recorded is the phases the AfterPhase hook saw, for failure messages.
func (h *harness) recorded() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.phases)
}

// TestARestartBeforeTheDiskIsFreedClosesTheTransactionAsItEnded stops the
// coordinator while the ledger still cannot be written, frees the disk and
// starts a new coordinator over the same state dir (a restarted manager):
// the interrupted swap is closed as it truly ended — rolled back, with the
// ledger_unwritable reason, even after a durable switch, whose rollback the
// ledger's own rule would have turned into a commit — and the generation
// that served before serves on with every call it answered.
func TestARestartBeforeTheDiskIsFreedClosesTheTransactionAsItEnded(t *testing.T) {
	for _, phase := range []ledger.Phase{ledger.PhaseSnapshot, ledger.PhaseDrain} {
		t.Run(string(phase), func(t *testing.T) {
			h, fsys := newFaultyLedgerHarness(t)
			swap := SwapPolicy{Deadline: 20 * time.Second, QuiesceTimeout: time.Second}
			old := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
			h.applyWith(swap, 0, old)
			h.settle()
			h.count("prompt_system", "a", 5)
			fault := fsys.FailWrites(faultfs.Rule{Path: "ledger-*.jsonl", Contains: recordBytes(phase), Errno: syscall.EIO, Persist: faultfs.Everything})
			next := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, ImplementationID: "counter-v2b"}))
			h.applyWith(swap, 0, next)
			if !fault.WaitFired(30 * time.Second) {
				t.Fatalf("the %s record was never appended", phase)
			}
			h.waitStatus("ledger_unwritable, the old generation serving", func(st ActivationStatus) bool {
				ms := st.Modules["prompt_system"]
				return st.LedgerUnwritable != "" && ms.Active == old.GenerationName && ms.Serving && !st.Busy
			})
			if out := h.count("prompt_system", "a", 1); out["count"] != float64(6) {
				t.Fatalf("while the disk is full: %v; want a=6 from the old generation", out)
			}
			// The manager stops before the disk is freed (its shutdown
			// checkpoints a=6), then a new one starts over the same state.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := h.c.Shutdown(ctx); err != nil {
				t.Logf("shutdown: %v", err)
			}
			fsys.Heal()
			h2 := newHarnessAt(t, h.stateDir, h.key)
			h2.applyWith(swap, 0, old)
			st := h2.waitStatus("the old generation relaunched", func(st ActivationStatus) bool {
				ms := st.Modules["prompt_system"]
				return ms.Active == old.GenerationName && ms.Serving && !st.Busy
			})
			id, err := ledger.NewTransactionID(h.key.UID, "prompt_system", uint64(next.Lineage), uint64(next.Attempt), 0)
			if err != nil {
				t.Fatal(err)
			}
			var tx []recordBrief
			for _, r := range h2.ledgerRecords() {
				if r.txn == id.String() {
					tx = append(tx, r)
				}
			}
			n := len(tx)
			if n < 2 || tx[n-1].phase != ledger.PhaseRolledBack || tx[n-2].phase != phase || !strings.HasPrefix(tx[n-2].reason, reasons.LedgerUnwritable+": ") {
				t.Fatalf("the swap must be closed blocked(%s, ledger_unwritable) + rolled_back after the restart; it is %v", phase, tx)
			}
			if out := h2.count("prompt_system", "a", 1); out["count"] != float64(7) || out["_served_by"] != old.GenerationName {
				t.Fatalf("after the restart: %v; want a=7 from %s (no call lost)", out, old.GenerationName)
			}
			if _, err := os.Stat(pendingPath(h.stateDir, h.key.UID)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the pending close is still there after the ledger holds the close: %v", err)
			}
			t.Logf("%s: restart before the disk was freed → %v, a=7 from %s (status %+v)", phase, tx, old.GenerationName, st.Modules["prompt_system"].Phase)
		})
	}
}
