package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/strictjson"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.jsonl")

const goldenPath = "testdata/golden.jsonl"

// writeGolden writes the golden transactions: a first activation that
// restores a durable snapshot, and a hot swap blocked at restore whose
// reason carries what canonical encoding must not escape (<&>, U+2028,
// non-ASCII) and what it must ('"' and '\').
func writeGolden(t testing.TB, l *Ledger) {
	tx, err := l.Begin(spec(t, KindFirstActivation, "prompt_system", gen(0, ""), gen(1, "prompt-fast"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Restore(dg("state g1")))
	must(t, tx.Readiness())
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())
	tx, err = l.Begin(spec(t, KindHotSwap, "prompt_system", gen(1, "prompt-fast"), gen(2, "prompt-smart"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	must(t, tx.ShadowLoad())
	must(t, tx.Quiesce())
	must(t, tx.Snapshot(dg("state g1 later")))
	must(t, tx.Migrate())
	must(t, tx.Block(PhaseRestore, reasons.SchemaMismatch, "state <&> café\u2028line \"q\" back\\slash"))
	must(t, tx.RollBack())
}

// TestGoldenRecordsHashIndependently recomputes every record hash of the
// golden file from its canonical line with crypto/sha256 and byte slicing
// alone, checks member order with encoding/json's tokenizer, and checks
// that the package still writes exactly these bytes.
func TestGoldenRecordsHashIndependently(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	writeGolden(t, l)
	must(t, l.Close())
	written, err := os.ReadFile(filepath.Join(dir, SegmentName(1)))
	must(t, err)
	if *update {
		must(t, os.WriteFile(goldenPath, written, 0o644))
	}
	golden, err := os.ReadFile(goldenPath)
	must(t, err)
	if !bytes.Equal(written, golden) {
		t.Fatalf("the package no longer writes %s (run go test -run Golden -update after checking why):\n%s", goldenPath, written)
	}

	wantMembers := []string{"schema_id", "sequence", "previous_sha256", "record_sha256", "transaction_id", "module",
		"candidate_sha256", "old_generation", "old_implementation_id", "old_artifact_sha256", "old_state_sha256",
		"new_generation", "new_implementation_id", "new_artifact_sha256", "new_state_sha256", "authority_sha256",
		"phase", "outcome", "block_kind", "reason", "started_unix_ms", "elapsed_ms", "deadline_ms"}
	prev := "sha256:" + hex.EncodeToString(make([]byte, 32))
	lines := bytes.Split(bytes.TrimSuffix(golden, []byte("\n")), []byte("\n"))
	if len(lines) != 13 {
		t.Fatalf("golden has %d lines, want 13", len(lines))
	}
	for i, line := range lines {
		// Member order, by encoding/json's tokenizer.
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		var members []string
		values := map[string]any{}
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("line %d: %v %v", i, tok, err)
		}
		for dec.More() {
			tok, err := dec.Token()
			must(t, err)
			name := tok.(string)
			var v any
			must(t, dec.Decode(&v))
			members = append(members, name)
			values[name] = v
		}
		if !equalStrings(members, wantMembers) {
			t.Fatalf("line %d members %v", i, members)
		}
		if seq := values["sequence"].(json.Number).String(); seq != itoa(i) {
			t.Fatalf("line %d sequence %s", i, seq)
		}
		if values["previous_sha256"] != prev {
			t.Fatalf("line %d previous_sha256 %v, want %s", i, values["previous_sha256"], prev)
		}
		// The hash, by slicing the value out of the line.
		marker := []byte(`"record_sha256":"`)
		at := bytes.Index(line, marker) + len(marker)
		claimed := string(line[at : at+71])
		blank := append(append([]byte(nil), line[:at]...), line[at+71:]...)
		sum := sha256.Sum256(blank)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != claimed || values["record_sha256"] != claimed {
			t.Fatalf("line %d: record_sha256 %s, recomputed %s", i, claimed, got)
		}
		prev = claimed
	}
	// Bytes serde_json writes and Go's encoding/json would not.
	for _, want := range [][]byte{
		[]byte("<&> café\u2028line"), []byte(`\"q\" back\\slash`),
		[]byte(`"block_kind":null,"reason":null`), []byte(`"block_kind":"validation","reason":"schema_mismatch: state`),
	} {
		if !bytes.Contains(golden, want) {
			t.Errorf("golden lacks %q", want)
		}
	}
	if _, err := Verify(goldenPath, VerifyOptions{}); err != nil {
		t.Fatalf("Verify(golden): %v", err)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestTheAppendEncoderWritesStrictjsonCanonicalBytes covers the strings on
// which encoding/json and serde_json differ: the append encoder must fall
// back to strictjson.Canonical for them, and refuse what Canonical refuses.
func TestTheAppendEncoderWritesStrictjsonCanonicalBytes(t *testing.T) {
	base := decodeLines(t, splitLines(scenarioBytes(t)))[18] // a blocked record
	cases := []struct{ name, reason string }{
		{"plain ASCII", "provider_failed: exit 1"},
		{"html characters", "provider_failed: <a href=\"x\">&amp;</a>"},
		{"line and paragraph separators", "provider_failed: a\u2028b\u2029c"},
		{"short control escapes", "provider_failed: \b\f\t"},
		{"other control characters", "provider_failed: \x01\x1f"},
		{"DEL and C1 controls", "provider_failed: \x7f\u0085"},
		{"non-ASCII", "provider_failed: café 😀"},
		{"backslash and quote", `provider_failed: \"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			r.Reason = strp(tc.reason)
			got, err := canonicalRecord(&r)
			must(t, err)
			want, err := strictjson.Canonical(&r)
			must(t, err)
			if !bytes.Equal(got, want) {
				t.Fatalf("canonicalRecord = %s\nCanonical       = %s", got, want)
			}
		})
	}
	r := base
	r.Reason = strp("provider_failed: \xff")
	if _, err := canonicalRecord(&r); err == nil {
		t.Fatal("invalid UTF-8 was encoded")
	}
}
