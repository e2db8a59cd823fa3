package effects

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func fixedNow() time.Time { return time.UnixMilli(1_800_000_000_000).UTC() }

func receiptN(gen string, i int, class Class) Receipt {
	return Receipt{ID: "run-" + strconv.Itoa(i), Owner: "default/stack", Generation: gen, Component: "prompt_system",
		Kind: ReceiptRun, Class: class, StartedAt: fixedNow(), FinishedAt: fixedNow().Add(time.Millisecond), Detail: "completed"}
}

func TestReceiptsSurviveACleanCloseAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "receipts", "uid.jsonl")
	s, err := OpenReceiptStore(path, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := s.Record(receiptN("gen-1", i, Irreversible)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(receiptN("gen-1", 3, Compensatable)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCompensation("gen-1", receiptN("gen-1", 3, Compensatable).ID, CompensationPending); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		s.CountReversible("gen-1", "prompt_system")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := OpenReceiptStore(path, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if clean, _ := again.Clean(); !clean {
		t.Fatal("a cleanly closed file reopened as unclean")
	}
	sum := again.Summary("gen-1")
	if sum.Total != 4 || sum.Irreversible != 3 || sum.Truncated || sum.ReversibleRuns != 5 {
		t.Fatalf("summary after reopen %+v", sum)
	}
	rs := again.Receipts("gen-1")
	if rs[3].Compensation != CompensationPending || rs[0].Owner != "default/stack" || !rs[0].StartedAt.Equal(fixedNow()) {
		t.Fatalf("receipts after reopen %+v", rs)
	}
}

func TestATailCutToTheLastDurableLengthMarksTheEvidenceIncomplete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uid.jsonl")
	s, err := OpenReceiptStore(path, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Record(receiptN("gen-1", 0, Irreversible))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = s.Record(receiptN("gen-1", 1, Irreversible)) // appended, not yet durable
	loaded, err := ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The machine stops: the tail after the last sync is gone (and the
	// manager never closed the file).
	if err := os.Truncate(path, loaded.DurableBytes); err != nil {
		t.Fatal(err)
	}
	cut, err := ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if sum := cut.Summaries["gen-1"]; cut.Clean || sum.Total != 1 {
		t.Fatalf("read after the cut: clean %v summary %+v", cut.Clean, sum)
	}
	reopened, err := OpenReceiptStore(path, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if clean, _ := reopened.Clean(); clean {
		t.Fatal("reopened as clean")
	}
	if sum := reopened.Summary("gen-1"); sum.Total != 1 || !sum.Truncated || !strings.Contains(sum.IncompleteReason, "may be lost") {
		t.Fatalf("the manager loading the cut file: %+v", sum)
	}
	// Incompleteness outlives a later clean stop.
	if err := reopened.Close(); err != nil {
		t.Fatal(err)
	}
	later, err := ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !later.Clean || !later.Summaries["gen-1"].Truncated {
		t.Fatalf("after a clean stop that followed the loss: clean %v summary %+v", later.Clean, later.Summaries["gen-1"])
	}
}

func TestATornLastLineIsCutAndAppendsFollowAWholeLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uid.jsonl")
	s, _ := OpenReceiptStore(path, fixedNow)
	_ = s.Record(receiptN("gen-1", 0, Irreversible))
	_ = s.Sync()
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	_, _ = f.WriteString(`{"type":"receipt","id":"half`)
	f.Close()
	re, err := OpenReceiptStore(path, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := re.Record(receiptN("gen-1", 1, Irreversible)); err != nil {
		t.Fatal(err)
	}
	if err := re.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.CutAt != 0 || got.Summaries["gen-1"].Total != 2 || !got.Summaries["gen-1"].Truncated {
		t.Fatalf("after the torn line: %+v %+v", got, got.Summaries["gen-1"])
	}
}

func TestTheFileIsBoundedAndEvictionSurvivesCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uid.jsonl")
	s, _ := OpenReceiptStore(path, fixedNow)
	// 40 generations × 500 receipts: more than the bounds keep, and more
	// lines than the file may hold before a sync compacts it.
	for g := 0; g < 40; g++ {
		gen := "gen-" + strconv.Itoa(g)
		for i := 0; i < 500; i++ {
			if err := s.Record(receiptN(gen, i, Irreversible)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Bounded while it is written, with no sync at all.
	if st, err := os.Stat(path); err != nil || st.Size() > 2*int64(compactAfterLines)*300 {
		t.Fatalf("the file grew to %d bytes with no sync (%v)", st.Size(), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// 20000 receipts were written: the file was rewritten to what is kept
	// once it reached its bound, and never holds more lines than that.
	if lines := strings.Count(string(b), "\n"); lines > compactAfterLines+2 {
		t.Fatalf("the file holds %d lines after Close, more than its bound %d", lines, compactAfterLines)
	}
	got, err := ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Generations) != MaxReceiptGenerations || got.Generations[0] != "gen-8" {
		t.Fatalf("generations kept: %d, first %s", len(got.Generations), got.Generations[0])
	}
	if sum := got.Summaries["gen-39"]; sum.Total != MaxReceiptsPerGeneration || !sum.Truncated {
		t.Fatalf("gen-39 %+v", sum)
	}
	re, _ := OpenReceiptStore(path, fixedNow)
	defer re.Close()
	if sum := re.Summary("gen-0"); !sum.Truncated || sum.Total != 0 {
		t.Fatalf("an evicted generation after compaction and reopen: %+v", sum)
	}
	t.Logf("file after compaction: %d bytes for %d receipts", len(b), MaxReceiptGenerations*MaxReceiptsPerGeneration)
}
