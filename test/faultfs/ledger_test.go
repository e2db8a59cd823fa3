package faultfs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/strictjson"
	"iteron.dev/operator/test/faultfs"
)

const ledgerUID = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"

func digest(name string) string { return strictjson.Digest([]byte(name)) }

func generation(n uint64, impl string) ledger.GenerationRef {
	if n == 0 {
		return ledger.GenerationRef{}
	}
	return ledger.GenerationRef{Generation: n, ImplementationID: impl, ArtifactSHA256: digest("artifact " + impl)}
}

func txnSpec(t *testing.T, kind ledger.Kind, old, nw ledger.GenerationRef) ledger.TxnSpec {
	t.Helper()
	id, err := ledger.NewTransactionID(ledgerUID, "prompt_system", nw.Generation, 1, 0)
	must(t, err)
	return ledger.TxnSpec{Kind: kind, ID: id, CandidateSHA256: digest("candidate"), Old: old, New: nw,
		AuthoritySHA256: digest("authority"), DeadlineMs: 30000}
}

// openLedger opens the activation's ledger through the mount with a first
// activation committed, and a hot swap begun up to quiesce.
func openLedger(t *testing.T, fsys *faultfs.FS) (*ledger.Ledger, *ledger.Txn) {
	t.Helper()
	l, _, err := ledger.OpenActivation(fsys.Mountpoint(), ledgerUID, ledger.Options{Create: true})
	must(t, err)
	t.Cleanup(func() { l.Close() })
	tx, err := l.Begin(txnSpec(t, ledger.KindFirstActivation, generation(0, ""), generation(1, "prompt-fast")))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())
	tx, err = l.Begin(txnSpec(t, ledger.KindHotSwap, generation(1, "prompt-fast"), generation(2, "prompt-smart")))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	return l, tx
}

// phases replays the ledger directory read-only and returns its records'
// phases.
func phases(t *testing.T, dir string) ([]ledger.Phase, ledger.State) {
	t.Helper()
	var ps []ledger.Phase
	st, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		ps = append(ps, r.Phase)
		return nil
	})
	if err != nil {
		t.Fatalf("the ledger does not verify: %v", err)
	}
	return ps, st
}

var beforeSnapshot = []ledger.Phase{
	ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseAtomicSwitch, ledger.PhaseCommitted,
	ledger.PhaseVerify, ledger.PhaseShadowLoad, ledger.PhaseQuiesce,
}

// The real ledger, on the mount: the append that carries "phase":"snapshot"
// fails with ENOSPC, the ledger call returns an error wrapping ENOSPC and
// freezes, and the ledger on the backing directory verifies with every
// record before the snapshot and nothing torn. Healed, it reopens through
// the mount and recovery closes the swap.
func TestALedgerAppendCarryingTheChosenPhaseFailsWithENOSPCAndTheLedgerVerifiesAfterwards(t *testing.T) {
	fsys, backing := mount(t)
	l, tx := openLedger(t, fsys)
	dir := filepath.Join(backing, statedir.LedgersDir, ledgerUID)
	seg := filepath.Join(dir, ledger.SegmentName(1))
	before, err := os.ReadFile(seg)
	must(t, err)

	fault := fsys.FailWrites(faultfs.Rule{Path: "ledgers/*/ledger-*.jsonl", Contains: `"phase":"snapshot"`, Errno: syscall.ENOSPC})
	err = tx.Snapshot(digest("state g1"))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Snapshot on a full disk = %v, want an error wrapping ENOSPC", err)
	}
	var ioErr *ledger.IOError
	if !errors.As(err, &ioErr) || ioErr.Op != "write" {
		t.Fatalf("Snapshot error %v is not the ledger's write IOError", err)
	}
	if !fault.WaitFired(0) || fault.Count() != 1 {
		t.Fatalf("fault fired %d times", fault.Count())
	}
	f := fsys.Failures()[0]
	if f.Path != filepath.Join(statedir.LedgersDir, ledgerUID, ledger.SegmentName(1)) || !bytes.Contains(f.Data, []byte(`"schema_id":"iteron-operator-ledger/1","sequence":7,`)) {
		t.Fatalf("failure %v", f)
	}
	if !errors.Is(l.Err(), syscall.ENOSPC) {
		t.Fatalf("the ledger is not frozen by the failure: %v", l.Err())
	}
	after, err := os.ReadFile(seg)
	must(t, err)
	if !bytes.Equal(after, before) {
		t.Fatalf("the failed append changed the segment: %d bytes, was %d", len(after), len(before))
	}
	must(t, l.Close())

	ps, st := phases(t, dir)
	if !slices.Equal(ps, beforeSnapshot) || st.NextSequence != 7 || st.Open == nil || st.Open.Identity.New.Generation != 2 {
		t.Fatalf("replay: phases %v, next %d, open %+v", ps, st.NextSequence, st.Open)
	}

	fsys.Heal()
	l2, report, err := ledger.OpenActivation(fsys.Mountpoint(), ledgerUID, ledger.Options{})
	must(t, err)
	defer l2.Close()
	if report.TornTail != nil || report.State.Open == nil || !slices.Equal(report.State.Open.Applied, beforeSnapshot[4:]) {
		t.Fatalf("reopen: torn %+v, open %+v", report.TornTail, report.State.Open)
	}
	rec, err := l2.Recover()
	must(t, err)
	if rec.Outcome != ledger.OutcomeRolledBack {
		t.Fatalf("recovery %+v", rec)
	}
	must(t, l2.Close())
	ps, st = phases(t, dir)
	if want := append(slices.Clone(beforeSnapshot), ledger.PhaseSnapshot, ledger.PhaseRolledBack); !slices.Equal(ps, want) || st.Open != nil {
		t.Fatalf("after recovery: phases %v, want %v; open %+v", ps, want, st.Open)
	}
}

// An fdatasync that fails with EIO after the snapshot record was written:
// the ledger call returns an error wrapping EIO and freezes; the record is in
// the backing file (written, not known durable) and the ledger verifies with
// it.
func TestALedgerFdatasyncFailingWithEIOFreezesTheLedgerAndTheLedgerVerifies(t *testing.T) {
	fsys, backing := mount(t)
	l, tx := openLedger(t, fsys)
	dir := filepath.Join(backing, statedir.LedgersDir, ledgerUID)

	// The next fdatasync of a segment is the snapshot record's.
	fault := fsys.FailFsyncs(faultfs.Rule{Path: "ledger-*.jsonl", Errno: syscall.EIO})
	err := tx.Snapshot(digest("state g1"))
	var ioErr *ledger.IOError
	if !errors.Is(err, syscall.EIO) || !errors.As(err, &ioErr) || ioErr.Op != "fdatasync" {
		t.Fatalf("Snapshot with a failing fdatasync = %v", err)
	}
	if fault.Count() != 1 || !fsys.Failures()[0].Datasync {
		t.Fatalf("failures %v", fsys.Failures())
	}
	if err := tx.Migrate(); !errors.Is(err, ledger.ErrFrozen) {
		t.Fatalf("the next append = %v, want ErrFrozen", err)
	}
	must(t, l.Close())
	ps, st := phases(t, dir)
	if want := append(slices.Clone(beforeSnapshot), ledger.PhaseSnapshot); !slices.Equal(ps, want) || st.NextSequence != 8 {
		t.Fatalf("replay: phases %v, want %v", ps, want)
	}
	data, err := os.ReadFile(filepath.Join(dir, ledger.SegmentName(1)))
	must(t, err)
	if !strings.HasSuffix(string(data), "\n") {
		t.Fatal("the segment ends in a torn record")
	}
}
