package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// writeLedger writes a real ledger through the package: a first activation
// and a hot swap blocked at migrate, then an open renewal when open is set.
func writeLedger(t *testing.T, open bool) (dir string, head ledger.Summary) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "ledger")
	l, _, err := ledger.Open(dir, ledger.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	id := func(lineage, renewal uint64) ledger.TransactionID {
		x, err := ledger.NewTransactionID("0a1b2c3d-0000-4000-8000-000000000000", "prompt_system", lineage, 1, renewal)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	g := func(n uint64, impl string) ledger.GenerationRef {
		return ledger.GenerationRef{Generation: n, ImplementationID: impl, ArtifactSHA256: "sha256:" + strings.Repeat(impl[:1], 64)}
	}
	base := ledger.TxnSpec{CandidateSHA256: "sha256:" + strings.Repeat("c", 64), AuthoritySHA256: "sha256:" + strings.Repeat("d", 64), DeadlineMs: 30000}
	steps := func(errs ...error) {
		t.Helper()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	s := base
	s.Kind, s.ID, s.New = ledger.KindFirstActivation, id(1, 0), g(1, "a")
	tx, err := l.Begin(s)
	steps(err, tx.Verify(), tx.ShadowLoad(), tx.AtomicSwitch(), tx.Commit())
	s = base
	s.Kind, s.ID, s.Old, s.New = ledger.KindHotSwap, id(2, 0), g(1, "a"), g(2, "b")
	tx, err = l.Begin(s)
	steps(err, tx.Verify(), tx.ShadowLoad(), tx.Quiesce(), tx.Snapshot("sha256:"+strings.Repeat("e", 64)),
		tx.Block(ledger.PhaseMigrate, reasons.ProviderFailed, "migrate refused the state"), tx.RollBack())
	if open {
		s = base
		s.Kind, s.ID, s.Old, s.New = ledger.KindRenewal, id(1, 1), g(1, "a"), g(1, "a")
		tx, err = l.Begin(s)
		steps(err, tx.Verify(), tx.ShadowLoad())
	}
	return dir, l.Summary()
}

func TestLedgerVerify(t *testing.T) {
	dir, sum := writeLedger(t, false)
	seg := filepath.Join(dir, ledger.SegmentName(1))

	tampered := filepath.Join(t.TempDir(), "tampered.jsonl")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tampered, bytes.Replace(data, []byte(`"phase":"shadow_load"`), []byte(`"phase":"shadow_loaf"`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(t.TempDir(), "torn.jsonl")
	if err := os.WriteFile(torn, append(bytes.Clone(data), `{"schema_id":"iteron-`...), 0o600); err != nil {
		t.Fatal(err)
	}
	openDir, _ := writeLedger(t, true)

	cases := []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderr     string
		noStdout   bool
		noRepaired string
	}{
		{name: "a ledger directory verifies", args: []string{"ledger", "verify", dir}, code: 0,
			stdout: "ok: " + dir + ": iteron-operator-ledger/1, 10 records (sequences 0..9) in segments 1..1, head " + sum.HeadSHA256},
		{name: "a segment file verifies", args: []string{"ledger", "verify", seg}, code: 0, stdout: "10 records"},
		{name: "the status head as an anchor is found", args: []string{"ledger", "verify", "--anchor", "9=" + sum.HeadSHA256, dir}, code: 0, stdout: "anchor: found in the chain"},
		{name: "an anchor not in the chain fails", args: []string{"ledger", "verify", "--anchor", "3=" + sum.HeadSHA256, dir}, code: 1, stderr: "rule anchor at sequence 3"},
		{name: "a malformed anchor is a usage error", args: []string{"ledger", "verify", "--anchor", "head", dir}, code: 2, stderr: "--anchor"},
		{name: "a changed byte names the rule and the sequence", args: []string{"ledger", "verify", tampered}, code: 1,
			stderr: "line 2: rule record_hash at sequence 1", noStdout: true},
		{name: "a torn tail is rejected, not repaired", args: []string{"ledger", "verify", torn}, code: 1,
			stderr: "rule torn_record at sequence 10", noRepaired: torn},
		{name: "an open last transaction is reported", args: []string{"ledger", "verify", openDir}, code: 0,
			stdout: "open transaction: 0a1b2c3d/prompt_system/g1/a1/r1 (renewal) after shadow_load; a restarted manager will roll it back"},
		{name: "a missing ledger fails", args: []string{"ledger", "verify", filepath.Join(dir, "nope")}, code: 1, stderr: "no such file"},
		{name: "no argument is a usage error", args: []string{"ledger", "verify"}, code: 2, stderr: "accepts 1 arg"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before []byte
			if tc.noRepaired != "" {
				before, _ = os.ReadFile(tc.noRepaired)
			}
			code, stdout, stderr := runCLI(t, "", tc.args...)
			if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s\nwant exit %d, stdout ∋ %q, stderr ∋ %q", code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
			if tc.noStdout && stdout != "" {
				t.Fatalf("stdout on failure: %s", stdout)
			}
			if tc.noRepaired != "" {
				if after, _ := os.ReadFile(tc.noRepaired); !bytes.Equal(before, after) {
					t.Fatal("verify changed the file")
				}
			}
		})
	}
}

func TestLedgerShow(t *testing.T) {
	dir, _ := writeLedger(t, false)
	code, stdout, stderr := runCLI(t, "", "ledger", "show", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 12 { // header, 10 records, the ok line
		t.Fatalf("show printed %d lines:\n%s", len(lines), stdout)
	}
	for _, want := range []string{"SEQ", "TRANSACTION", "PHASE", "OUTCOME", "GEN", "REASON"} {
		if !strings.Contains(lines[0], want) {
			t.Fatalf("header %q lacks %s", lines[0], want)
		}
	}
	blocked := strings.Fields(lines[9])
	if blocked[0] != "8" || blocked[2] != "migrate" || blocked[3] != "blocked" || blocked[4] != "1→2" || !strings.Contains(lines[9], "provider_failed: migrate refused the state") {
		t.Fatalf("blocked row = %q", lines[9])
	}

	code, stdout, _ = runCLI(t, "", "ledger", "show", "--tail", "3", dir)
	if rows := strings.Split(strings.TrimSpace(stdout), "\n"); code != 0 || len(rows) != 5 || !strings.HasPrefix(rows[1], "7 ") {
		t.Fatalf("show --tail 3: exit %d\n%s", code, stdout)
	}

	// A corrupt ledger shows what verified, then fails with the rule.
	seg := filepath.Join(dir, ledger.SegmentName(1))
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines2 := bytes.SplitAfter(data, []byte("\n"))
	if err := os.WriteFile(seg, bytes.Join(append(lines2[:4:4], lines2[5:]...), nil), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, "", "ledger", "show", dir)
	if rows := strings.Split(strings.TrimSpace(stdout), "\n"); code != 1 || len(rows) != 5 || !strings.Contains(stderr, "rule sequence at sequence 4") {
		t.Fatalf("show of a corrupt ledger: exit %d\nstdout:\n%s\nstderr: %s", code, stdout, stderr)
	}
}
