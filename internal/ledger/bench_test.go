package ledger

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/pkg/strictjson"
)

// benchDir is where durable benchmarks write: $ITERON_BENCH_DIR, or a temp
// dir (ext4 on these machines; a tmpfs would make fdatasync free and the
// ratios meaningless).
func benchDir(b *testing.B) string {
	if d := os.Getenv("ITERON_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "ledger-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

// swapRecords builds, without writing, the records of count hot swaps of
// prompt_system (10 records each), chained from sequence 0.
func swapRecords(tb testing.TB, count int) [][]byte {
	var lines [][]byte
	prev := ZeroSHA256
	seq := uint64(0)
	for k := 1; k <= count; k++ {
		old, nw := gen(uint64(k), "prompt-impl-a"), gen(uint64(k+1), "prompt-impl-b")
		id := mustID(tb, "prompt_system", uint64(k+1), 1, 0).String()
		oldState, newState := "", ""
		for i, p := range phaseOrder {
			if p == PhaseSnapshot {
				oldState = dg("state " + id)
			}
			if p == PhaseRestore {
				newState = dg("state new " + id)
			}
			outcome := OutcomeApplied
			if p == PhaseCommitted {
				outcome = OutcomeCommitted
			}
			r := Record{
				SchemaID: SchemaOperator, Sequence: seq, PreviousSHA256: prev, TransactionID: id,
				Module: "prompt_system", CandidateSHA256: dg("candidate"),
				OldGeneration: old.Generation, OldImplementationID: old.ImplementationID, OldArtifactSHA256: old.ArtifactSHA256, OldStateSHA256: oldState,
				NewGeneration: nw.Generation, NewImplementationID: nw.ImplementationID, NewArtifactSHA256: nw.ArtifactSHA256, NewStateSHA256: newState,
				AuthoritySHA256: dg("authority"), Phase: p, Outcome: outcome,
				StartedUnixMs: 1_760_000_000_000 + uint64(k)*1000, ElapsedMs: uint64(i * 40), DeadlineMs: 30000,
			}
			line, digest, err := encodeRecord(&r)
			if err != nil {
				tb.Fatal(err)
			}
			lines = append(lines, line)
			prev = digest
			seq++
		}
	}
	return lines
}

// BenchmarkDurableAppend measures three ways of making ledger records
// durable, interleaved record by record in one run so that the shared disk's
// latency swings hit all three alike:
//   - raw: write of the line the ledger just wrote (the same bytes) +
//     fdatasync on an O_APPEND file, the floor;
//   - ledger: one Txn phase append (encode, rule check, size check, write,
//     fdatasync);
//   - group16: 16 lines in one write and one fdatasync, once per 16 records
//     (measured only: the coordinator appends and syncs record by record).
//
// fdatasync latency here has a long tail, so the metrics are medians of the
// per-operation times: ns per record of each, ledger/raw throughput ratio
// (median raw ÷ median ledger; goal ≥ 0.9) and group16/ledger (median ledger
// ÷ median group16 per record: the headroom; goal ≥ 10).
func BenchmarkDurableAppend(b *testing.B) {
	dir := benchDir(b)
	lines := swapRecords(b, 2)[:16]
	rawFD, err := unix.Open(filepath.Join(dir, "raw.jsonl"), unix.O_CREAT|unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(rawFD)
	groupFD, err := unix.Open(filepath.Join(dir, "group.jsonl"), unix.O_CREAT|unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(groupFD)
	var group []byte
	for _, l := range lines {
		group = append(append(group, l...), '\n')
	}
	l, _, err := Open(filepath.Join(dir, "ledger"), Options{Create: true})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()

	lineage := uint64(1)
	var tx *Txn
	step := 0
	appendOne := func() {
		if tx == nil {
			var err error
			tx, err = l.Begin(spec(b, KindHotSwap, "prompt_system", gen(lineage, "prompt-impl-a"), gen(lineage+1, "prompt-impl-b"), 1, 0))
			if err != nil {
				b.Fatal(err)
			}
			lineage++
			step = 0
		}
		var err error
		switch phaseOrder[step] {
		case PhaseSnapshot:
			err = tx.Snapshot(dg("old state"))
		case PhaseRestore:
			err = tx.Restore(dg("new state"))
		case PhaseCommitted:
			err = tx.Commit()
			tx = nil
		default:
			err = tx.step(phaseOrder[step], OutcomeApplied, nil, nil, "", "")
		}
		if err != nil {
			b.Fatal(err)
		}
		step++
	}
	// lastLine is the ledger's latest record as written; the raw loop writes
	// exactly those bytes. Reading it back is not timed.
	var lastLine []byte
	var rawCPU, ledCPU time.Duration
	ledgerAppend := func() time.Duration {
		before := l.segSize
		c0 := cpuTime(b)
		t0 := time.Now()
		appendOne()
		d := time.Since(t0)
		ledCPU += cpuTime(b) - c0
		lastLine = make([]byte, l.segSize-before)
		if _, err := unix.Pread(l.segFD, lastLine, before); err != nil {
			b.Fatal(err)
		}
		return d
	}
	rawWrite := func() time.Duration {
		c0 := cpuTime(b)
		t0 := time.Now()
		if err := writeAll(rawFD, lastLine); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(rawFD); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		rawCPU += cpuTime(b) - c0
		return d
	}
	ledgerAppend() // warm-up, and the first line for raw
	ledCPU = 0

	raw := make([]time.Duration, 0, 16*b.N)
	led := make([]time.Duration, 0, 16*b.N)
	grp := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		for i := range 16 {
			// Alternate which goes first, so neither always follows the other.
			if i%2 == 0 {
				raw = append(raw, rawWrite())
				led = append(led, ledgerAppend())
			} else {
				led = append(led, ledgerAppend())
				raw = append(raw, rawWrite())
			}
			if i == 7 {
				t3 := time.Now()
				if err := writeAll(groupFD, group); err != nil {
					b.Fatal(err)
				}
				if err := unix.Fdatasync(groupFD); err != nil {
					b.Fatal(err)
				}
				grp = append(grp, time.Since(t3))
			}
		}
	}
	b.StopTimer()
	rawP50, ledP50, grpP50 := median(raw), median(led), median(grp)/16
	b.ReportMetric(float64(rawP50), "raw-ns/record")
	b.ReportMetric(float64(ledP50), "ledger-ns/record")
	b.ReportMetric(float64(grpP50), "group16-ns/record")
	b.ReportMetric(float64(rawP50)/float64(ledP50), "ledger/raw")
	b.ReportMetric(float64(ledP50)/float64(grpP50), "group16/ledger")
	b.ReportMetric(float64(rawCPU.Nanoseconds())/float64(len(raw)), "raw-cpu-ns/record")
	b.ReportMetric(float64(ledCPU.Nanoseconds())/float64(len(led)), "ledger-cpu-ns/record")
}

// cpuTime is the process's user + system CPU time: on a machine whose cores
// are shared, the work done, which wall time is not.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchLedger writes a two-segment ledger of 2000 hot swaps (20,000
// records, about 12 MB per segment).
func benchLedger(b *testing.B) (string, int) {
	dir := filepath.Join(benchDir(b), "ledger")
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	lines := swapRecords(b, 2000)
	half := len(lines) / 2
	for i, part := range [][][]byte{lines[:half], lines[half:]} {
		if err := os.WriteFile(filepath.Join(dir, SegmentName(i+1)), joinLines(part), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return dir, len(lines)
}

// BenchmarkReplayVerify measures Verify of a two-segment, 20,000-record
// ledger from disk (page cache warm): records per second (goal ≥ 500k/s).
// Beside it, in the same run: the same lines through the generic strict path
// (strictjson.Decode, strictjson.Canonical, SHA-256 over a blanked copy) and
// SHA-256 alone, the floor of any verifier.
func BenchmarkReplayVerify(b *testing.B) {
	dir, n := benchLedger(b)
	if st, err := Verify(dir, VerifyOptions{}); err != nil || st.NextSequence != uint64(n) {
		b.Fatalf("bench ledger: %v", err)
	}
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		c0 := cpuTime(b)
		for range b.N {
			if _, err := Verify(dir, VerifyOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
		b.ReportMetric(float64(n*b.N)/(cpuTime(b)-c0).Seconds(), "records/cpu-s")
	})
	lines := swapRecords(b, 200)
	b.Run("generic-strict-decode-canonical-hash", func(b *testing.B) {
		c0 := cpuTime(b)
		for range b.N {
			for _, line := range lines {
				var r Record
				if err := strictjson.Decode(line, &r, MaxRecordBytes); err != nil {
					b.Fatal(err)
				}
				claimed := r.RecordSHA256
				r.RecordSHA256 = ""
				canon, err := strictjson.Canonical(&r)
				if err != nil {
					b.Fatal(err)
				}
				if strictjson.Digest(canon) != claimed {
					b.Fatal("hash mismatch")
				}
			}
		}
		b.ReportMetric(float64(len(lines)*b.N)/b.Elapsed().Seconds(), "records/s")
		b.ReportMetric(float64(len(lines)*b.N)/(cpuTime(b)-c0).Seconds(), "records/cpu-s")
	})
	b.Run("sha256-only", func(b *testing.B) {
		c0 := cpuTime(b)
		for range b.N {
			for _, line := range lines {
				sha256.Sum256(line)
			}
		}
		b.ReportMetric(float64(len(lines)*b.N)/b.Elapsed().Seconds(), "records/s")
		b.ReportMetric(float64(len(lines)*b.N)/(cpuTime(b)-c0).Seconds(), "records/cpu-s")
	})
}
