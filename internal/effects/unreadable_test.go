package effects

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAnUnreadableLineIsReportedAndTheOtherReceiptsAreStillRead: a receipts
// file with a bad line between good ones. Reading it (kubectl iteron
// receipts, doctor) names each bad line — number, offset, why — and still
// shows every receipt on the other lines; a manager that opens it keeps
// those receipts and marks the evidence incomplete, naming the lines.
func TestAnUnreadableLineIsReportedAndTheOtherReceiptsAreStillRead(t *testing.T) {
	tests := []struct {
		name string
		bad  string
		why  string
	}{
		{"a line that is not JSON", "{not json\n", "not a receipts line"},
		{"a line of an unknown type", `{"type":"payment"}` + "\n", `unknown line type "payment"`},
		{"a receipt of an unknown class", `{"type":"receipt","id":"x","generation":"gen-1","class":"refundable"}` + "\n", `unknown class "refundable"`},
		{"a line with an unknown field", `{"type":"sync","at_unix_ms":1,"extra":true}` + "\n", `unknown field "extra"`},
		{"a line over the bound", `{"type":"sync","detail":"` + strings.Repeat("x", maxReceiptLineBytes) + "\"}\n", "over the bound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "uid.jsonl")
			s, err := OpenReceiptStore(path, fixedNow)
			if err != nil {
				t.Fatal(err)
			}
			_ = s.Record(receiptN("gen-1", 0, Irreversible))
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			// The bad line goes in the middle: a receipt follows it.
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString(tc.bad); err != nil {
				t.Fatal(err)
			}
			f.Close()
			before, _ := os.ReadFile(path)
			badLine := strings.Count(string(before), "\n")
			badOffset := int64(len(before) - len(tc.bad))
			if err := appendReceiptLine(path, receiptN("gen-1", 1, Irreversible)); err != nil {
				t.Fatal(err)
			}

			got, err := ReadReceiptsFile(path)
			if err != nil {
				t.Fatalf("reading a file with one bad line failed as a whole: %v", err)
			}
			if got.Summaries["gen-1"].Total != 2 || len(got.Receipts["gen-1"]) != 2 {
				t.Fatalf("receipts around the bad line: %+v; want both", got.Receipts["gen-1"])
			}
			if len(got.Unreadable) != 1 {
				t.Fatalf("unreadable lines %+v; want the one", got.Unreadable)
			}
			u := got.Unreadable[0]
			if u.Line != badLine || u.Offset != badOffset || !strings.Contains(u.Why, tc.why) {
				t.Fatalf("reported %q; want line %d at byte %d, saying %q", u, badLine, badOffset, tc.why)
			}
			after, _ := os.ReadFile(path)
			if string(after) != string(before)+string(after[len(before):]) {
				t.Fatal("reading the file changed it")
			}

			m, err := OpenReceiptStore(path, fixedNow)
			if err != nil {
				t.Fatalf("a manager could not open a file with one bad line: %v", err)
			}
			defer m.Close()
			sum := m.Summary("gen-1")
			if sum.Total != 2 || !sum.Truncated || !strings.Contains(sum.IncompleteReason, u.String()) {
				t.Fatalf("the manager's view: %+v; want both receipts, incomplete, naming %q", sum, u)
			}
		})
	}
}

// appendReceiptLine appends r as a whole receipt line, as a store does.
func appendReceiptLine(path string, r Receipt) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return writeLine(f, receiptToLine(r))
}
