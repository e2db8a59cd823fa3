package effects

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadReceiptsFile reads arbitrary bytes as a receipts file: it either
// refuses them with an error or returns bounded evidence in which no
// irreversible receipt is rolled back, and a manager opening the same bytes
// agrees on what is kept.
func FuzzReadReceiptsFile(f *testing.F) {
	open := `{"type":"open","format":"iteron-receipts/1","at_unix_ms":1}` + "\n"
	rec := `{"type":"receipt","id":"run-1","owner":"ns/a","generation":"g1","component":"m","kind":"run","class":"irreversible","started_unix_ms":1,"finished_unix_ms":2,"compensation":"none","detail":"completed"}` + "\n"
	for _, seed := range []string{
		"", open, open + rec, open + rec + `{"type":"sync","at_unix_ms":3}` + "\n",
		open + rec + `{"type":"closed","at_unix_ms":3}` + "\n",
		open + rec + `{"type":"compensation","generation":"g1","id":"run-1","compensation":"rolled_back"}` + "\n",
		open + `{"type":"incomplete","generation":"g1","reason":"lost"}` + "\n" + `{"type":"reversible","generation":"g1","component":"m","runs":7}` + "\n",
		open + `{"type":"evicted","generation":"g0"}` + "\n" + rec[:40],
		open + `{"type":"receipt","id":"x","generation":"g","class":"weird"}` + "\n",
		`{"type":"open","format":"other/1"}` + "\n", open + `{"type":"nope"}` + "\n", open + `{"type":"sync","extra":1}` + "\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "r.jsonl")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadReceiptsFile(path)
		if err != nil {
			if _, oerr := OpenReceiptStore(path, fixedNow); oerr == nil {
				t.Fatalf("ReadReceiptsFile refused (%v) what OpenReceiptStore accepted", err)
			}
			return
		}
		if len(got.Generations) > MaxReceiptGenerations {
			t.Fatalf("%d generations kept", len(got.Generations))
		}
		for _, g := range got.Generations {
			rs := got.Receipts[g]
			if len(rs) > MaxReceiptsPerGeneration {
				t.Fatalf("%s keeps %d receipts", g, len(rs))
			}
			for _, r := range rs {
				if r.Class == Irreversible && r.Compensation == CompensationRolledBack {
					t.Fatalf("irreversible receipt %s reported rolled back", r.ID)
				}
			}
		}
		s, err := OpenReceiptStore(path, fixedNow)
		if err != nil {
			t.Fatalf("OpenReceiptStore refused what ReadReceiptsFile read: %v", err)
		}
		for _, g := range got.Generations {
			if n, m := len(s.Receipts(g)), len(got.Receipts[g]); n != m {
				t.Fatalf("%s: the manager keeps %d receipts, the reader %d", g, n, m)
			}
			if !got.Clean && !s.Summary(g).Truncated {
				t.Fatalf("%s: a file not closed cleanly opened with complete evidence", g)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadReceiptsFile(path); err != nil {
			t.Fatalf("the file the manager closed does not read back: %v", err)
		}
	})
}
