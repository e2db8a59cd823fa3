package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/statedir"
)

func readSegment(t testing.TB, dir string, n int) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, SegmentName(n)))
	must(t, err)
	return data
}

// beginSwap starts a hot swap of prompt_system g1 → g2 and writes verify.
func beginSwap(t testing.TB, l *Ledger) *Txn {
	t.Helper()
	tx, err := l.Begin(spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	return tx
}

func TestASecondWriterAppendingIsDetectedByTheSizeCheck(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	tx := beginSwap(t, l)

	// Another writer appends a perfectly formed line through its own
	// descriptor.
	foreign := append(bytes.Clone(splitLines(readSegment(t, dir, 1))[0]), '\n')
	f, err := os.OpenFile(filepath.Join(dir, SegmentName(1)), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.Write(foreign)
	must(t, err)
	must(t, f.Close())
	before := readSegment(t, dir, 1)

	err = tx.ShadowLoad()
	if re := asRuleError(t, err); re.Rule != RuleSizeChanged || re.Sequence != 1 {
		t.Fatalf("append after a foreign write = %v", err)
	}
	if !bytes.Equal(readSegment(t, dir, 1), before) {
		t.Fatal("the ledger wrote after detecting a second writer")
	}
	// Frozen: nothing is appended until the ledger is reopened and replayed.
	if err := tx.ShadowLoad(); !errors.Is(err, ErrFrozen) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("next append = %v, want ErrFrozen caused by the size rule", err)
	}
	if _, err := l.Begin(spec(t, KindFirstActivation, "context_assembly", gen(0, ""), gen(1, "c"), 1, 0)); !errors.Is(err, ErrFrozen) {
		t.Fatalf("Begin on a frozen ledger = %v", err)
	}
	must(t, l.Close())
	// The replay then judges the foreign line: a second verify record.
	_, _, err = Open(dir, Options{})
	if re := asRuleError(t, err); re.Rule != RuleSequence || re.Sequence != 1 {
		t.Fatalf("reopen = %v", err)
	}
}

func TestASegmentReplacedUnderTheWriterIsDetected(t *testing.T) {
	cases := []struct {
		name    string
		replace func(t *testing.T, seg string)
	}{
		{"by a symlink", func(t *testing.T, seg string) {
			copyPath := seg + ".copy"
			must(t, os.WriteFile(copyPath, readFile(t, seg), 0o600))
			must(t, os.Remove(seg))
			must(t, os.Symlink(copyPath, seg))
		}},
		{"by another file of the same size", func(t *testing.T, seg string) {
			tmp := seg + ".new"
			must(t, os.WriteFile(tmp, readFile(t, seg), 0o600))
			must(t, os.Rename(tmp, seg))
		}},
		{"by nothing", func(t *testing.T, seg string) { must(t, os.Remove(seg)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ledger")
			l := openNew(t, dir, Options{})
			tx := beginSwap(t, l)
			tc.replace(t, filepath.Join(dir, SegmentName(1)))
			err := tx.ShadowLoad()
			if re := asRuleError(t, err); re.Rule != RuleNotRegularFile {
				t.Fatalf("append = %v", err)
			}
			if err := l.Err(); err == nil {
				t.Fatal("the ledger is not frozen")
			}
		})
	}
}

func readFile(t testing.TB, path string) []byte {
	data, err := os.ReadFile(path)
	must(t, err)
	return data
}

// TestAnIOErrorFreezesTheLedgerUntilItIsReopened makes a real write fail:
// RLIMIT_FSIZE lets the record only partly into the file (EFBIG; Go ignores
// SIGXFSZ), the ledger freezes, and a reopen truncates the torn record and
// replays to the state before the failed append.
func TestAnIOErrorFreezesTheLedgerUntilItIsReopened(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	tx := beginSwap(t, l)
	must(t, tx.ShadowLoad())
	good := readSegment(t, dir, 1)
	stateBefore := l.State()

	var old unix.Rlimit
	must(t, unix.Getrlimit(unix.RLIMIT_FSIZE, &old))
	lim := unix.Rlimit{Cur: uint64(len(good)) + 100, Max: old.Max}
	must(t, unix.Setrlimit(unix.RLIMIT_FSIZE, &lim))
	err := tx.Quiesce()
	must(t, unix.Setrlimit(unix.RLIMIT_FSIZE, &old))

	var ioErr *IOError
	if !errors.As(err, &ioErr) || ioErr.Op != "write" || !errors.Is(err, unix.EFBIG) {
		t.Fatalf("append beyond RLIMIT_FSIZE = %v, want an IOError wrapping EFBIG", err)
	}
	if got := readSegment(t, dir, 1); len(got) != len(good)+100 {
		t.Fatalf("segment is %d bytes, want the torn %d", len(got), len(good)+100)
	}
	// The limit is gone, yet the ledger refuses: a later success proves
	// nothing about what is durable.
	if err := tx.Quiesce(); !errors.Is(err, ErrFrozen) || !errors.Is(err, unix.EFBIG) {
		t.Fatalf("append after the error = %v, want ErrFrozen caused by EFBIG", err)
	}
	if err := tx.Quiesce(); !errors.Is(err, ErrFrozen) {
		t.Fatalf("append after the error = %v", err)
	}
	must(t, l.Close())

	l2, report, err := Open(dir, Options{})
	must(t, err)
	defer l2.Close()
	if report.TornTail == nil || report.TornTail.Bytes != 100 || report.TornTail.Offset != int64(len(good)) {
		t.Fatalf("torn tail = %+v", report.TornTail)
	}
	if !bytes.Equal(readSegment(t, dir, 1), good) {
		t.Fatal("reopen did not restore the segment to its complete records")
	}
	stateBefore.FirstSegment, stateBefore.LastSegment = 1, 1
	if !reflect.DeepEqual(report.State, stateBefore) {
		t.Fatalf("replayed state\n%+v\nbefore the failed append\n%+v", report.State, stateBefore)
	}
}

func TestOpenTruncatesOnlyTheTornTail(t *testing.T) {
	complete := scenarioBytes(t)
	lines := splitLines(complete)
	cases := []struct {
		name string
		tail []byte
		nul  bool
	}{
		{"an unterminated record", lines[3][:200], false},
		{"a whole record without its newline", lines[3], false},
		{"a tail of NUL bytes", make([]byte, 4096), true},
		{"a record cut short then NULs", append(bytes.Clone(lines[3][:50]), make([]byte, 30)...), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeSegment(t, append(bytes.Clone(complete), tc.tail...))
			// Verify never repairs.
			if _, err := Verify(dir, VerifyOptions{}); asRuleError(t, err).Rule != RuleTornRecord {
				t.Fatalf("Verify = %v", err)
			}
			l, report, err := Open(dir, Options{})
			must(t, err)
			defer l.Close()
			want := &TornTail{File: filepath.Join(dir, SegmentName(1)), Offset: int64(len(complete)), Bytes: int64(len(tc.tail)), NUL: tc.nul}
			if !reflect.DeepEqual(report.TornTail, want) {
				t.Fatalf("torn tail = %+v, want %+v", report.TornTail, want)
			}
			if !bytes.Equal(readSegment(t, dir, 1), complete) {
				t.Fatal("the truncation removed more than the torn tail")
			}
			if report.State.NextSequence != uint64(len(lines)) {
				t.Fatalf("replayed %d records, want %d", report.State.NextSequence, len(lines))
			}
			// Appends continue the chain right after the last complete record.
			tx, err := l.Begin(spec(t, KindFirstActivation, "memory_recall", gen(0, ""), gen(1, "m"), 1, 0))
			must(t, err)
			must(t, tx.Verify())
			must(t, l.Close())
			if _, err := Verify(dir, VerifyOptions{}); err != nil {
				t.Fatalf("Verify after appending: %v", err)
			}
		})
	}
}

func TestOpenLocksTheLedgerAgainstASecondLedger(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	if _, _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	must(t, l.Close())
	l2, _, err := Open(dir, Options{})
	must(t, err)
	must(t, l2.Close())
	if err := l2.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := l2.Begin(spec(t, KindFirstActivation, "prompt_system", gen(0, ""), gen(1, "a"), 1, 0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Begin after Close = %v", err)
	}
}

func TestOpenWithoutCreateRefusesAMissingLedger(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	if _, _, err := Open(dir, Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open(missing) = %v, want not exist", err)
	}
	must(t, os.Mkdir(dir, 0o700))
	if _, _, err := Open(dir, Options{}); asRuleError(t, err).Rule != RuleSegmentLayout {
		t.Fatalf("Open(empty dir) = %v", err)
	}
}

// crashAt writes a transaction up to a point and leaves it open, as a
// manager that died there would.
func TestRecoverClosesAnOpenTransactionForward(t *testing.T) {
	cases := []struct {
		name    string
		kind    Kind
		write   func(tx *Txn)
		outcome Outcome
		phases  []string // phase/outcome pairs appended by Recover
	}{
		{"a hot swap before its switch rolls back at the next phase", KindHotSwap, func(tx *Txn) {
			must(t, tx.Verify())
			must(t, tx.ShadowLoad())
			must(t, tx.Quiesce())
			must(t, tx.Snapshot(dg("s1")))
		}, OutcomeRolledBack, []string{"migrate/blocked", "rolled_back/rolled_back"}},
		{"a hot swap after its durable switch goes forward", KindHotSwap, func(tx *Txn) {
			must(t, tx.Verify())
			must(t, tx.ShadowLoad())
			must(t, tx.Quiesce())
			must(t, tx.Snapshot(dg("s1")))
			must(t, tx.Migrate())
			must(t, tx.Restore(dg("s2")))
			must(t, tx.Readiness())
			must(t, tx.AtomicSwitch())
		}, OutcomeCommitted, []string{"drain/applied", "committed/committed"}},
		{"a cold replace after its drain only commits", KindColdReplace, func(tx *Txn) {
			must(t, tx.Verify())
			must(t, tx.ShadowLoad())
			must(t, tx.Quiesce())
			must(t, tx.AtomicSwitch())
			must(t, tx.Drain())
		}, OutcomeCommitted, []string{"committed/committed"}},
		{"a first activation after verify rolls back at shadow_load", KindFirstActivation, func(tx *Txn) {
			must(t, tx.Verify())
		}, OutcomeRolledBack, []string{"shadow_load/blocked", "rolled_back/rolled_back"}},
		{"a blocked transaction finishes its rollback", KindHotSwap, func(tx *Txn) {
			must(t, tx.Verify())
			must(t, tx.Block(PhaseShadowLoad, reasons.ActivationFailed, "exec format error"))
		}, OutcomeRolledBack, []string{"rolled_back/rolled_back"}},
		{"a retirement after its drain commits", KindRetirement, func(tx *Txn) {
			must(t, tx.Verify())
			must(t, tx.Quiesce())
			must(t, tx.Drain())
		}, OutcomeCommitted, []string{"committed/committed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ledger")
			l := openNew(t, dir, Options{})
			var s TxnSpec
			switch tc.kind {
			case KindFirstActivation:
				s = spec(t, tc.kind, "prompt_system", gen(0, ""), gen(1, "a"), 1, 0)
			case KindRetirement:
				s = spec(t, tc.kind, "prompt_system", gen(1, "a"), gen(0, ""), 1, 1)
			default:
				s = spec(t, tc.kind, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0)
			}
			tx, err := l.Begin(s)
			must(t, err)
			tc.write(tx)
			must(t, l.Close()) // the manager dies here

			// Verify accepts the open last transaction of our schema.
			st, err := Verify(dir, VerifyOptions{})
			must(t, err)
			if st.Open == nil || st.Open.Identity.TransactionID != s.ID.String() {
				t.Fatalf("Verify open transaction = %+v", st.Open)
			}
			l2, report, err := Open(dir, Options{Now: newFakeClock().Now})
			must(t, err)
			defer l2.Close()
			if report.State.Open == nil {
				t.Fatal("Open did not report the open transaction")
			}
			if _, err := l2.Begin(spec(t, KindFirstActivation, "context_assembly", gen(0, ""), gen(1, "c"), 1, 0)); !errors.Is(err, ErrTransactionOpen) {
				t.Fatalf("Begin before Recover = %v", err)
			}
			rec, err := l2.Recover()
			must(t, err)
			var got []string
			for _, b := range rec.Appended {
				got = append(got, string(b.Phase)+"/"+string(b.Outcome))
			}
			if rec.Outcome != tc.outcome || !reflect.DeepEqual(got, tc.phases) {
				t.Fatalf("Recover = %s %v, want %s %v", rec.Outcome, got, tc.outcome, tc.phases)
			}
			if tc.outcome == OutcomeRolledBack && len(tc.phases) == 2 && rec.Appended[0].Reason != "provider_failed: host restarted" {
				t.Fatalf("recovery reason = %q", rec.Appended[0].Reason)
			}
			if again, err := l2.Recover(); again != nil || err != nil {
				t.Fatalf("second Recover = %+v, %v", again, err)
			}
			must(t, l2.Close())
			st, err = Verify(dir, VerifyOptions{})
			must(t, err)
			if st.Open != nil {
				t.Fatalf("still open after Recover: %+v", st.Open)
			}
			_, committed := st.LastCommitted["prompt_system"]
			if committed != (tc.outcome == OutcomeCommitted) {
				t.Fatalf("last committed = %+v", st.LastCommitted)
			}
		})
	}
}

func TestRollbackFailedIsRecordedOnlyAfterTheSwitch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	tx := beginSwap(t, l)
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.Snapshot(dg("s1")))
	must(t, tx.Migrate())
	must(t, tx.Restore(dg("s2")))
	must(t, tx.Readiness())
	must(t, tx.AtomicSwitch())
	if !tx.Switched() {
		t.Fatal("Switched() = false after AtomicSwitch")
	}
	must(t, tx.Block(PhaseDrain, reasons.ProviderFailed, "new generation crashed before commit"))
	must(t, tx.RollbackFailed())
	must(t, l.Close())
	st, err := Verify(dir, VerifyOptions{})
	must(t, err)
	last := st.Recent[len(st.Recent)-1]
	if last.Phase != PhaseRolledBack || last.Outcome != OutcomeRollbackFailed || last.Reason != "provider_failed: new generation crashed before commit" {
		t.Fatalf("last record = %+v", last)
	}
	if _, ok := st.LastCommitted["prompt_system"]; ok {
		t.Fatal("a failed rollback counted as a commit")
	}
}

// fillTransactions writes n renewals of module (lineage 1), each a cold
// renewal of six records.
func fillTransactions(t testing.TB, l *Ledger, module string, from, n uint64) {
	t.Helper()
	for r := from; r < from+n; r++ {
		tx, err := l.Begin(spec(t, KindRenewal, module, gen(1, "impl"), gen(1, "impl"), 1, r))
		must(t, err)
		must(t, tx.Verify())
		must(t, tx.ShadowLoad())
		must(t, tx.Quiesce())
		must(t, tx.AtomicSwitch())
		must(t, tx.Drain())
		must(t, tx.Commit())
	}
}

func TestSegmentsAreSealedBetweenTransactionsAndChained(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{SegmentBytes: 64 << 10, RetainSegments: 100})
	activate(t, l, "prompt_system")
	fillTransactions(t, l, "prompt_system", 1, 40)
	st := l.State()
	must(t, l.Close())
	if st.LastSegment < 3 {
		t.Fatalf("wrote %d segments, want several", st.LastSegment)
	}
	var total uint64
	for n := 1; n <= st.LastSegment; n++ {
		seg := filepath.Join(dir, SegmentName(n))
		fi, err := os.Stat(seg)
		must(t, err)
		if fi.Size() > 64<<10 {
			t.Fatalf("segment %d is %d bytes, over the bound", n, fi.Size())
		}
		lines := splitLines(readSegment(t, dir, n))
		recs := decodeLines(t, lines)
		if n < st.LastSegment {
			if fi.Mode().Perm() != 0o400 {
				t.Fatalf("sealed segment %d has mode %v", n, fi.Mode())
			}
			if last := recs[len(recs)-1]; last.Phase != PhaseCommitted {
				t.Fatalf("segment %d ends with %s: sealed inside a transaction", n, last.Phase)
			}
		}
		if recs[0].Sequence != total {
			t.Fatalf("segment %d starts at sequence %d, want %d", n, recs[0].Sequence, total)
		}
		total += uint64(len(recs))
	}
	vs, err := Verify(dir, VerifyOptions{})
	must(t, err)
	if vs.NextSequence != total || vs.FirstSegment != 1 || vs.LastSegment != st.LastSegment || vs.HeadSHA256 != st.HeadSHA256 {
		t.Fatalf("Verify state = %+v", vs)
	}
	// A sealed segment alone is not a complete ledger.
	if _, err := Verify(filepath.Join(dir, SegmentName(2)), VerifyOptions{}); asRuleError(t, err).Rule != RuleSequence {
		t.Fatalf("Verify(segment 2 alone) = %v", err)
	}
}

func activate(t testing.TB, l *Ledger, module string) {
	t.Helper()
	tx, err := l.Begin(spec(t, KindFirstActivation, module, gen(0, ""), gen(1, "impl"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())
}

func TestRetentionKeepsNSealedSegmentsAndVerificationStartsAtTheOldest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{SegmentBytes: 64 << 10, RetainSegments: 2})
	activate(t, l, "prompt_system")
	fillTransactions(t, l, "prompt_system", 1, 40)
	live := l.State()
	must(t, l.Close())
	if live.LastSegment-live.FirstSegment != 2 || live.FirstSegment < 3 {
		t.Fatalf("retained segments %d..%d, want the last two sealed and the open one", live.FirstSegment, live.LastSegment)
	}
	for n := 1; n < live.FirstSegment; n++ {
		if _, err := os.Stat(filepath.Join(dir, SegmentName(n))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("segment %d was kept: %v", n, err)
		}
	}
	st, err := Verify(dir, VerifyOptions{})
	must(t, err)
	if st.FirstSequence == 0 || st.FirstSequence != live.FirstSequence || st.NextSequence != live.NextSequence ||
		st.Records != st.NextSequence-st.FirstSequence || !reflect.DeepEqual(st.LastCommitted, live.LastCommitted) {
		t.Fatalf("replayed %+v\nlive %+v", st, live)
	}
	// Reopening continues the chain from the retained segments.
	l2, _, err := Open(dir, Options{SegmentBytes: 64 << 10, RetainSegments: 2, Now: newFakeClock().Now})
	must(t, err)
	fillTransactions(t, l2, "prompt_system", 41, 3)
	must(t, l2.Close())
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
	// Deleting a retained middle segment breaks the layout.
	st, err = Verify(dir, VerifyOptions{})
	must(t, err)
	must(t, os.Remove(filepath.Join(dir, SegmentName(st.FirstSegment+1))))
	if _, err := Verify(dir, VerifyOptions{}); asRuleError(t, err).Rule != RuleSegmentLayout {
		t.Fatalf("Verify with a hole = %v", err)
	}
}

func TestRetentionKeepsTheSegmentOfAModulesLastCommit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	opts := Options{SegmentBytes: 32 << 10, RetainSegments: 1}
	l := openNew(t, dir, opts)
	activate(t, l, "memory_recall") // committed once, in segment 1
	activate(t, l, "prompt_system")
	fillTransactions(t, l, "prompt_system", 1, 30)
	st := l.State()
	if st.FirstSegment != 1 || st.LastSegment < 3 {
		t.Fatalf("segments %d..%d: segment 1 holds memory_recall's commit and must stay", st.FirstSegment, st.LastSegment)
	}
	// Once memory_recall commits again, the old segments can go.
	tx, err := l.Begin(spec(t, KindRenewal, "memory_recall", gen(1, "impl"), gen(1, "impl"), 1, 1))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.AtomicSwitch())
	must(t, tx.Drain())
	must(t, tx.Commit())
	fillTransactions(t, l, "prompt_system", 31, 6)
	st = l.State()
	must(t, l.Close())
	// The older segments went; the one with memory_recall's new commit pins
	// itself and what follows.
	if pin := st.LastCommitted["memory_recall"].Segment; st.FirstSegment != pin || pin == 1 {
		t.Fatalf("segments %d..%d after the pin moved to segment %d", st.FirstSegment, st.LastSegment, pin)
	}
	if _, err := os.Stat(filepath.Join(dir, SegmentName(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment 1 was kept after the pin moved: %v", err)
	}
	replayed, err := Verify(dir, VerifyOptions{})
	must(t, err)
	if _, ok := replayed.LastCommitted["memory_recall"]; !ok {
		t.Fatal("memory_recall's last commit was pruned")
	}
}

func TestAnAnchorFromStatusMustBeInTheChain(t *testing.T) {
	dir := writeSegment(t, scenarioBytes(t))
	recs := decodeLines(t, splitLines(scenarioBytes(t)))
	cases := []struct {
		name   string
		anchor Anchor
		rule   Rule
	}{
		{"the head", Anchor{uint64(len(recs) - 1), recs[len(recs)-1].RecordSHA256}, ""},
		{"an earlier record", Anchor{7, recs[7].RecordSHA256}, ""},
		{"a record with another hash", Anchor{7, recs[8].RecordSHA256}, RuleAnchor},
		{"a record beyond the head: records were lost", Anchor{uint64(len(recs) + 3), dg("x")}, RuleAnchor},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := Verify(dir, VerifyOptions{Anchor: &tc.anchor})
			if tc.rule == "" {
				if err != nil || !st.AnchorVerified {
					t.Fatalf("Verify = %v, AnchorVerified %v", err, st.AnchorVerified)
				}
			} else if asRuleError(t, err).Rule != tc.rule {
				t.Fatalf("Verify = %v", err)
			}
			l, report, err := Open(dir, Options{Anchor: &tc.anchor})
			if tc.rule == "" {
				must(t, err)
				if !report.State.AnchorVerified {
					t.Fatal("Open: anchor not verified")
				}
				must(t, l.Close())
			} else if asRuleError(t, err).Rule != tc.rule {
				t.Fatalf("Open = %v", err)
			}
		})
	}
	// An empty ledger replacing one whose head status knows is caught.
	empty := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, empty, Options{})
	must(t, l.Close())
	if _, _, err := Open(empty, Options{Anchor: &cases[0].anchor}); asRuleError(t, err).Rule != RuleAnchor {
		t.Fatalf("Open(empty) with an anchor = %v", err)
	}
}

func TestSummaryIsTheHeadTheCountAndTheLast16(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	if s := l.Summary(); s.HeadSHA256 != ZeroSHA256 || s.Records != 0 || len(s.Recent) != 0 {
		t.Fatalf("empty summary = %+v", s)
	}
	writeScenario(t, l)
	s := l.Summary()
	recs := decodeLines(t, splitLines(readSegment(t, dir, 1)))
	if s.Records != uint64(len(recs)) || s.HeadSHA256 != recs[len(recs)-1].RecordSHA256 || len(s.Recent) != RecentRecords {
		t.Fatalf("summary = %+v", s)
	}
	for i, b := range s.Recent {
		r := recs[len(recs)-RecentRecords+i]
		if b.Sequence != r.Sequence || b.Phase != r.Phase || b.RecordSHA256 != r.RecordSHA256 {
			t.Fatalf("recent[%d] = %+v, record %+v", i, b, r)
		}
	}
}

func TestArchiveMovesALedgerAndKeepsABoundedNumber(t *testing.T) {
	state := t.TempDir()
	uids := []string{"11111111-aaaa", "22222222-bbbb", "33333333-cccc"}
	for _, uid := range uids {
		l, _, err := OpenActivation(state, uid, Options{Create: true})
		must(t, err)
		must(t, l.Close())
	}
	got, err := ActivationUIDs(state)
	must(t, err)
	if !reflect.DeepEqual(got, uids) {
		t.Fatalf("ActivationUIDs = %v", got)
	}
	now := time.UnixMilli(1_760_000_000_000)
	var archived []string
	for _, uid := range uids {
		dst, err := Archive(state, uid, now, 2)
		must(t, err)
		archived = append(archived, dst)
	}
	// The first two share a millisecond with nothing; names are unique.
	if want := filepath.Join(state, statedir.LedgersDir, statedir.ArchiveDir, uids[2]+"-1760000000000"); archived[2] != want {
		t.Fatalf("archive path = %s, want %s", archived[2], want)
	}
	entries, err := os.ReadDir(filepath.Join(state, statedir.LedgersDir, statedir.ArchiveDir))
	must(t, err)
	if len(entries) != 2 {
		t.Fatalf("%d archives kept, want 2", len(entries))
	}
	if _, err := Verify(archived[2], VerifyOptions{}); err != nil {
		t.Fatalf("Verify(archive) = %v", err)
	}
	got, err = ActivationUIDs(state)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("ActivationUIDs after archiving = %v", got)
	}
	// One UID archived twice in one millisecond gets the next name.
	for range 2 {
		l, _, err := OpenActivation(state, uids[0], Options{Create: true})
		must(t, err)
		must(t, l.Close())
		_, err = Archive(state, uids[0], now.Add(time.Hour), 10)
		must(t, err)
	}
	if _, err := os.Stat(filepath.Join(state, statedir.LedgersDir, statedir.ArchiveDir, uids[0]+"-1760003600001")); err != nil {
		t.Fatalf("second archive in one millisecond: %v", err)
	}
	if dst, err := Archive(state, "44444444", now, 2); dst != "" || err != nil {
		t.Fatalf("Archive(missing) = %q, %v", dst, err)
	}
	for _, bad := range []string{"", "archive", "../x", "a/b", "-x"} {
		if _, err := ActivationDir(state, bad); err == nil || !strings.Contains(err.Error(), "uid") {
			t.Errorf("ActivationDir(%q) = %v", bad, err)
		}
	}
}

func TestOpenAfterACrashBetweenSealingAndTheNextSegmentAppendsToANewOne(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	activate(t, l, "prompt_system")
	must(t, l.Close())
	// The writer sealed segment 1 (read-only) and died before creating 2.
	seg1 := filepath.Join(dir, SegmentName(1))
	must(t, os.Chmod(seg1, 0o400))
	sealed := readFile(t, seg1)

	l2, report, err := Open(dir, Options{Now: newFakeClock().Now})
	must(t, err)
	if report.State.LastSegment != 2 {
		t.Fatalf("LastSegment = %d, want a new segment 2", report.State.LastSegment)
	}
	tx, err := l2.Begin(spec(t, KindRenewal, "prompt_system", gen(1, "impl"), gen(1, "impl"), 1, 1))
	must(t, err)
	must(t, tx.Verify())
	must(t, l2.Close())
	if !bytes.Equal(readFile(t, seg1), sealed) {
		t.Fatal("the sealed segment was appended to")
	}
	if recs := decodeLines(t, splitLines(readSegment(t, dir, 2))); len(recs) != 1 || recs[0].Sequence != 4 {
		t.Fatalf("segment 2 = %+v", recs)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestATransactionBlockedAtVerifyRollsBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	tx, err := l.Begin(spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0))
	must(t, err)
	if got := tx.Next(); !reflect.DeepEqual(got, []Phase{PhaseVerify}) {
		t.Fatalf("Next = %v", got)
	}
	must(t, tx.Block(PhaseVerify, reasons.AuthorityChanged, "admitted capabilities differ: hot swap needs strategy Cold"))
	must(t, tx.RollBack())
	must(t, l.Close())
	st, err := Verify(dir, VerifyOptions{})
	must(t, err)
	if st.NextSequence != 2 || st.Recent[0].Reason != "authority_changed: admitted capabilities differ: hot swap needs strategy Cold" {
		t.Fatalf("state = %+v", st)
	}
}

func TestStatusReadsRunBesideAppends(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	done := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-done:
				return
			default:
			}
			s := l.Summary()
			if len(s.Recent) > RecentRecords || s.Records > 0 && s.Recent[len(s.Recent)-1].Sequence != s.Records-1 {
				t.Errorf("inconsistent summary %+v", s)
				return
			}
		}
	}()
	writeScenario(t, l)
	close(done)
	<-readerDone
}
