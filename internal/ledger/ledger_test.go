package ledger

import (
	"errors"
	"iteron.dev/operator/internal/reasons"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestScenarioWrittenByThePackageVerifies(t *testing.T) {
	dir := writeSegment(t, scenarioBytes(t))
	st, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if st.Schema != SchemaOperator || st.Open != nil || st.FirstSequence != 0 {
		t.Fatalf("state = %+v", st)
	}
	lines := splitLines(scenarioBytes(t))
	if st.NextSequence != uint64(len(lines)) || st.Records != uint64(len(lines)) {
		t.Fatalf("NextSequence = %d, Records = %d, want %d", st.NextSequence, st.Records, len(lines))
	}
	recs := decodeLines(t, lines)
	if st.HeadSHA256 != recs[len(recs)-1].RecordSHA256 {
		t.Fatalf("head = %s, want the last record's hash", st.HeadSHA256)
	}
	ps, ok := st.LastCommitted["prompt_system"]
	if !ok || ps.Kind != KindRenewal || ps.Generation != 2 || ps.ImplementationID != "prompt-smart" || ps.StateSHA256 != dg("state g2 later") {
		t.Fatalf("prompt_system last committed = %+v", ps)
	}
	ca, ok := st.LastCommitted["context_assembly"]
	if !ok || ca.Kind != KindRetirement || ca.Generation != 0 {
		t.Fatalf("context_assembly last committed = %+v", ca)
	}
	if len(st.Recent) != RecentRecords || st.Recent[RecentRecords-1].Sequence != st.NextSequence-1 {
		t.Fatalf("recent = %+v", st.Recent)
	}
	// The rolled-back swap repeats its block, and the drain note is there.
	blocked := recs[seqOf(t, recs, "prompt_system/g3/a1", PhaseMigrate)]
	rolled := recs[seqOf(t, recs, "prompt_system/g3/a1", PhaseRolledBack)]
	if *blocked.Reason != `provider_failed: migrate: field "budget" missing` || *blocked.BlockKind != BlockProvider ||
		*rolled.Reason != *blocked.Reason || *rolled.BlockKind != BlockProvider || rolled.Outcome != OutcomeRolledBack {
		t.Fatalf("blocked = %+v, rolled back = %+v", blocked, rolled)
	}
	drain := recs[seqOf(t, recs, "prompt_system/g2/a1/r1", PhaseDrain)]
	if drain.BlockKind != nil || drain.Reason == nil || !strings.HasPrefix(*drain.Reason, "cleanup_failed: ") {
		t.Fatalf("drain note = %+v", drain)
	}
}

func TestEveryKindCommitsAndReplaysToTheSameState(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	writeScenario(t, l)
	live := l.State()
	must(t, l.Close())
	replayed, err := Verify(dir, VerifyOptions{})
	must(t, err)
	replayed.FirstSegment, replayed.LastSegment = live.FirstSegment, live.LastSegment
	if !reflect.DeepEqual(live, replayed) {
		t.Fatalf("live state\n%+v\nreplayed state\n%+v", live, replayed)
	}
	l2, report, err := Open(dir, Options{})
	must(t, err)
	defer l2.Close()
	if report.TornTail != nil || !reflect.DeepEqual(report.State, live) {
		t.Fatalf("reopen report = %+v", report)
	}
}

func TestAnIllegalPhaseIsRefusedAndWritesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	seg := filepath.Join(dir, SegmentName(1))
	size := func() int64 {
		fi, err := os.Stat(seg)
		must(t, err)
		return fi.Size()
	}
	cold, err := l.Begin(spec(t, KindColdReplace, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0))
	must(t, err)
	must(t, cold.Verify())
	must(t, cold.ShadowLoad())
	must(t, cold.Quiesce())
	before := size()

	cases := []struct {
		name   string
		call   func() error
		detail string
	}{
		{"a cold replace cannot snapshot", func() error { return cold.Snapshot(dg("s")) }, ""},
		{"a cold replace cannot migrate", cold.Migrate, ""},
		{"a phase cannot repeat", cold.Quiesce, ""},
		{"committed cannot come before the switch", cold.Commit, ""},
		{"committed cannot be blocked", func() error { return cold.Block(PhaseCommitted, reasons.ProviderFailed, "x") }, "committed"},
		{"rolled_back needs a blocked record", cold.RollBack, "only a blocked transaction rolls back"},
		{"permission_denied cannot block", func() error { return cold.Block(PhaseAtomicSwitch, reasons.PermissionDenied, "x") }, "cannot block"},
		{"cleanup_failed cannot block", func() error { return cold.Block(PhaseAtomicSwitch, reasons.CleanupFailed, "x") }, "cannot block"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var pe *PhaseError
			if !errors.As(err, &pe) {
				t.Fatalf("error = %v, want *PhaseError", err)
			}
			if !reflect.DeepEqual(pe.Allowed, []Phase{PhaseAtomicSwitch}) || !strings.Contains(pe.Error(), tc.detail) {
				t.Fatalf("error = %v (allowed %v)", err, pe.Allowed)
			}
			if got := size(); got != before {
				t.Fatalf("segment grew from %d to %d bytes", before, got)
			}
		})
	}
	must(t, cold.Block(PhaseAtomicSwitch, reasons.DeadlineExceeded, "switch missed the deadline"))
	var pe *PhaseError
	if err := cold.RollbackFailed(); !errors.As(err, &pe) || !strings.Contains(err.Error(), "durable atomic_switch") {
		t.Fatalf("RollbackFailed before the switch = %v", err)
	}
	if err := cold.Drain(); !errors.As(err, &pe) || !reflect.DeepEqual(pe.Allowed, []Phase{PhaseRolledBack}) {
		t.Fatalf("Drain after a block = %v", err)
	}
	must(t, cold.RollBack())
	if err := cold.Commit(); !errors.As(err, &pe) || len(pe.Allowed) != 0 {
		t.Fatalf("Commit after the end = %v", err)
	}
	if cold.Outcome() != OutcomeRolledBack {
		t.Fatalf("outcome = %q", cold.Outcome())
	}
}

func TestBeginRefusesAnIdentityThatIsNotItsKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	cases := []struct {
		name string
		spec TxnSpec
		rule Rule
	}{
		{"a hot swap that skips a lineage", spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(3, "b"), 1, 0), RuleGeneration},
		{"a first activation with an old generation", func() TxnSpec {
			s := spec(t, KindFirstActivation, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0)
			return s
		}(), RuleGeneration},
		{"a renewal that changes the implementation", spec(t, KindRenewal, "prompt_system", gen(2, "a"), gen(2, "b"), 1, 1), RuleGeneration},
		{"a renewal without /r", spec(t, KindRenewal, "prompt_system", gen(2, "a"), gen(2, "a"), 1, 0), RuleTransactionID},
		{"a hot swap with /r", spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 1), RuleTransactionID},
		{"a lineage that is not the new generation", func() TxnSpec {
			s := spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0)
			s.ID = mustID(t, "prompt_system", 1, 1, 0)
			return s
		}(), RuleTransactionID},
		{"a candidate that is not a digest", func() TxnSpec {
			s := spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0)
			s.CandidateSHA256 = "sha256:ABC"
			return s
		}(), RuleInvalidField},
		{"a zero deadline", func() TxnSpec {
			s := spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0)
			s.DeadlineMs = 0
			return s
		}(), RuleInvalidField},
		{"a side with a generation and no artifact", func() TxnSpec {
			s := spec(t, KindHotSwap, "prompt_system", gen(1, "a"), gen(2, "b"), 1, 0)
			s.New.ArtifactSHA256 = ""
			return s
		}(), RuleGeneration},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.Begin(tc.spec)
			if re := asRuleError(t, err); re.Rule != tc.rule {
				t.Fatalf("Begin error = %v, want rule %s", err, tc.rule)
			}
		})
	}
	if st := l.State(); st.NextSequence != 0 {
		t.Fatalf("refused transactions wrote %d records", st.NextSequence)
	}
}

func TestBeginRefusesASecondTransactionAndAReusedID(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	s := spec(t, KindFirstActivation, "prompt_system", gen(0, ""), gen(1, "a"), 1, 0)
	idle, err := l.Begin(s)
	must(t, err)
	// A transaction that wrote nothing is dropped by the next Begin.
	tx, err := l.Begin(s)
	must(t, err)
	if err := idle.Verify(); !errors.Is(err, ErrStale) {
		t.Fatalf("Verify on a dropped handle = %v, want ErrStale", err)
	}
	must(t, tx.Verify())
	other := spec(t, KindFirstActivation, "context_assembly", gen(0, ""), gen(1, "c"), 1, 0)
	if _, err := l.Begin(other); !errors.Is(err, ErrTransactionOpen) {
		t.Fatalf("Begin while a transaction has records = %v, want ErrTransactionOpen", err)
	}
	must(t, tx.ShadowLoad())
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())
	_, err = l.Begin(s)
	if re := asRuleError(t, err); re.Rule != RuleDuplicatePhase {
		t.Fatalf("Begin with a used transaction_id = %v", err)
	}
}

func TestFormatReasonFitsTheLedgerBounds(t *testing.T) {
	long := strings.Repeat("é", 600) // 1200 bytes
	cases := []struct {
		name, message, want string
	}{
		{"a plain message", "process exited 1", "provider_failed: process exited 1"},
		{"an empty message says so", "", "provider_failed: no detail"},
		{"control characters become spaces", "a\nb\rc\x00d\te", "provider_failed: a b c d e"},
		{"invalid utf-8 is replaced", "bad \xff byte", "provider_failed: bad \uFFFD byte"},
		{"html and separators stay literal", "<&>\u2028", "provider_failed: <&>\u2028"},
		{"a long message is cut at a character boundary", long, "provider_failed: " + strings.Repeat("é", (MaxReasonBytes-len("provider_failed: "))/2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := FormatReason(reasons.ProviderFailed, tc.message)
			if got != tc.want {
				t.Fatalf("FormatReason = %q, want %q", got, tc.want)
			}
			if len(got) > MaxReasonBytes || strings.ContainsAny(got, "\n\r\x00") {
				t.Fatalf("reason %q breaks the bounds", got)
			}
		})
	}
}

func TestTransactionIDsHaveTheirFormat(t *testing.T) {
	id, err := NewTransactionID(testUID, "prompt_system", 3, 2, 0)
	must(t, err)
	if id.String() != "3f2a9c1e/prompt_system/g3/a2" {
		t.Fatalf("id = %s", id)
	}
	id, err = NewTransactionID(testUID, "prompt_system", 3, 2, 4)
	must(t, err)
	if id.String() != "3f2a9c1e/prompt_system/g3/a2/r4" {
		t.Fatalf("id = %s", id)
	}
	back, err := ParseTransactionID(id.String())
	if err != nil || back != id {
		t.Fatalf("ParseTransactionID(%s) = %+v, %v", id, back, err)
	}
	longest, err := NewTransactionID(testUID, strings.Repeat("m", 48), ^uint64(0), ^uint64(0), ^uint64(0))
	must(t, err)
	if n := len(longest.String()); n > MaxTransactionIDBytes {
		t.Fatalf("the longest id is %d bytes", n)
	}
	bad := []struct{ name, uid, module string }{
		{"an upper-case uid", "3F2A9C1E-0000", "prompt_system"},
		{"a short uid", "3f2a", "prompt_system"},
		{"a module with a dash", testUID, "prompt-system"},
	}
	for _, tc := range bad {
		if _, err := NewTransactionID(tc.uid, tc.module, 1, 1, 0); err == nil {
			t.Errorf("%s: NewTransactionID accepted it", tc.name)
		}
	}
	if _, err := NewTransactionID(testUID, "prompt_system", 0, 1, 0); err == nil {
		t.Error("lineage 0 accepted")
	}
	for _, s := range []string{"3f2a9c1e/prompt_system/g01/a1", "3f2a9c1e/prompt_system/g1", "3f2a9c1e/prompt_system/g1/a1/r0", "3f2a9c1e/prompt_system/g1/a1/x2", "3f2a9c1e/prompt_system/g+1/a1"} {
		if _, err := ParseTransactionID(s); err == nil {
			t.Errorf("ParseTransactionID(%q) accepted it", s)
		}
	}
}
