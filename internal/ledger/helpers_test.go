package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/strictjson"
)

// testUID is an activation UID as Kubernetes mints them.
const testUID = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"

// fakeClock advances 7 ms at every reading, so elapsed_ms varies and the
// golden file is reproducible.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.UnixMilli(1_760_000_000_000)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(7 * time.Millisecond)
	return c.now
}

// dg is a digest of a name, for readable fixtures.
func dg(name string) string { return strictjson.Digest([]byte(name)) }

func mustID(t testing.TB, module string, lineage, attempt, renewal uint64) TransactionID {
	t.Helper()
	id, err := NewTransactionID(testUID, module, lineage, attempt, renewal)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func gen(n uint64, impl string) GenerationRef {
	if n == 0 {
		return GenerationRef{}
	}
	return GenerationRef{Generation: n, ImplementationID: impl, ArtifactSHA256: dg("artifact " + impl)}
}

func spec(t testing.TB, kind Kind, module string, old, nw GenerationRef, attempt, renewal uint64) TxnSpec {
	t.Helper()
	lineage := nw.Generation
	if kind == KindRetirement {
		lineage = old.Generation
	}
	return TxnSpec{
		Kind: kind, ID: mustID(t, module, lineage, attempt, renewal),
		CandidateSHA256: dg("candidate"), Old: old, New: nw,
		AuthoritySHA256: dg("authority [read_only]"), DeadlineMs: 30000,
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func openNew(t testing.TB, dir string, opts Options) *Ledger {
	t.Helper()
	opts.Create = true
	if opts.Now == nil {
		opts.Now = newFakeClock().Now
	}
	l, _, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// writeScenario writes, through the package, a ledger that exercises every
// kind: a first activation, a hot swap, a hot swap blocked at migrate and
// rolled back, a renewal whose drain needed a kill, a relaunch with
// restore, a cold replace, and a retirement with snapshot.
func writeScenario(t testing.TB, l *Ledger) {
	t.Helper()
	ps := "prompt_system"
	ca := "context_assembly"

	tx, err := l.Begin(spec(t, KindFirstActivation, ps, gen(0, ""), gen(1, "prompt-fast"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())

	tx, err = l.Begin(spec(t, KindHotSwap, ps, gen(1, "prompt-fast"), gen(2, "prompt-smart"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.Snapshot(dg("state g1")))
	must(t, tx.Migrate())
	must(t, tx.Restore(dg("state g2")))
	must(t, tx.Readiness())
	must(t, tx.AtomicSwitch())
	must(t, tx.Drain())
	must(t, tx.Commit())

	tx, err = l.Begin(spec(t, KindHotSwap, ps, gen(2, "prompt-smart"), gen(3, "prompt-next"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.Snapshot(dg("state g2")))
	must(t, tx.Block(PhaseMigrate, reasons.ProviderFailed, "migrate: field \"budget\" missing"))
	must(t, tx.RollBack())

	tx, err = l.Begin(spec(t, KindRenewal, ps, gen(2, "prompt-smart"), gen(2, "prompt-smart"), 1, 1))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.Snapshot(dg("state g2 later")))
	must(t, tx.Restore(dg("state g2 later")))
	must(t, tx.Readiness())
	must(t, tx.AtomicSwitch())
	must(t, tx.DrainCleanupFailed("old process ignored stop; killed after 5000 ms"))
	must(t, tx.Commit())

	tx, err = l.Begin(spec(t, KindRelaunch, ca, gen(0, ""), gen(1, "ctx-basic"), 1, 1))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Restore(dg("ctx state")))
	must(t, tx.Readiness())
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())

	tx, err = l.Begin(spec(t, KindColdReplace, ca, gen(1, "ctx-basic"), gen(2, "ctx-v1"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.AtomicSwitch())
	must(t, tx.Drain())
	must(t, tx.Commit())

	tx, err = l.Begin(spec(t, KindRetirement, ca, gen(2, "ctx-v1"), gen(0, ""), 1, 1))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.Quiesce())
	must(t, tx.Snapshot(dg("ctx final")))
	must(t, tx.Drain())
	must(t, tx.Commit())
}

var scenarioOnce struct {
	sync.Once
	data []byte
}

// scenarioBytes is the segment writeScenario produces, written once per
// test binary on a real file.
func scenarioBytes(t testing.TB) []byte {
	scenarioOnce.Do(func() {
		dir := filepath.Join(t.TempDir(), "ledger")
		l := openNew(t, dir, Options{})
		writeScenario(t, l)
		must(t, l.Close())
		data, err := os.ReadFile(filepath.Join(dir, SegmentName(1)))
		must(t, err)
		scenarioOnce.data = data
	})
	if scenarioOnce.data == nil {
		t.Fatal("scenario failed in an earlier test")
	}
	return bytes.Clone(scenarioOnce.data)
}

// splitLines splits a segment into its lines (without newlines).
func splitLines(data []byte) [][]byte {
	lines := bytes.SplitAfter(data, []byte("\n"))
	out := make([][]byte, 0, len(lines))
	for _, l := range lines {
		if len(l) > 0 {
			out = append(out, bytes.TrimSuffix(l, []byte("\n")))
		}
	}
	return out
}

func joinLines(lines [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// decodeLines parses canonical lines into records.
func decodeLines(t testing.TB, lines [][]byte) []Record {
	t.Helper()
	recs := make([]Record, len(lines))
	for i, l := range lines {
		if _, _, err := parseLine(&recs[i], l, nil, 0); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
	}
	return recs
}

// rechain re-encodes records with fresh hashes and links (and, with
// resequence, sequences equal to positions), so that a tamper is caught
// only by the rule it targets.
func rechain(t testing.TB, recs []Record, resequence bool) [][]byte {
	t.Helper()
	prev := ZeroSHA256
	lines := make([][]byte, len(recs))
	for i := range recs {
		r := recs[i]
		if resequence {
			r.Sequence = uint64(i)
		}
		r.PreviousSHA256 = prev
		line, digest, err := encodeRecord(&r)
		must(t, err)
		lines[i] = line
		prev = digest
	}
	return lines
}

// seqOf finds the record of a transaction's phase (the first match).
func seqOf(t testing.TB, recs []Record, txnPrefix string, phase Phase) int {
	t.Helper()
	for i, r := range recs {
		if strings.HasSuffix(r.TransactionID, txnPrefix) && r.Phase == phase {
			return i
		}
	}
	t.Fatalf("no %s record for transaction *%s", phase, txnPrefix)
	return -1
}

// writeSegment writes data as segment 1 of a fresh ledger directory.
func writeSegment(t testing.TB, data []byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ledger")
	must(t, os.Mkdir(dir, 0o700))
	must(t, os.WriteFile(filepath.Join(dir, SegmentName(1)), data, 0o600))
	return dir
}

func asRuleError(t testing.TB, err error) *RuleError {
	t.Helper()
	var re *RuleError
	if !errors.As(err, &re) {
		t.Fatalf("error = %v (%T), want a *RuleError", err, err)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("errors.Is(%v, ErrCorrupt) = false", err)
	}
	return re
}

func strp(s string) *string { return &s }

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }
