package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/internal/effects"
)

// The command against a real API server and a real manager's file is tested
// in test/crash (before and after a restart, after a cut tail); these are
// the failures that need none, and the rendering.
func TestReceiptsUsage(t *testing.T) {
	dir := t.TempDir()
	unreachable := filepath.Join(dir, "unreachable")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: \"t\"}\ncontexts:\n- name: x\n  context: {cluster: c, user: u, namespace: team}\ncurrent-context: x\n"
	if err := os.WriteFile(unreachable, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no activation named is a usage error", []string{"receipts"}, "accepts 1 arg(s), received 0"},
		{"an output other than text or json is a usage error", []string{"receipts", "a", "-o", "yaml"}, `--output must be text or json, not "yaml"`},
		{"an API server that does not answer is exit 2 naming the activation", []string{"receipts", "a", "--kubeconfig", unreachable, "--request-timeout", "5s"}, "activation team/a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tt.args...)
			if code != exitUsage || out != "" || !strings.Contains(errOut, tt.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and a stderr saying %q", code, out, errOut, tt.stderr)
			}
		})
	}
}

func TestReceiptsPrintEvidenceAndFilterByModule(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uid.jsonl")
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	s, err := effects.OpenReceiptStore(path, func() time.Time { return at })
	if err != nil {
		t.Fatal(err)
	}
	rec := func(gen, module, id string, class effects.Class) {
		if err := s.Record(effects.Receipt{ID: id, Owner: "team/stack", Generation: gen, Component: module, Kind: effects.ReceiptRun,
			Class: class, StartedAt: at, FinishedAt: at.Add(time.Millisecond), Detail: "completed"}); err != nil {
			t.Fatal(err)
		}
	}
	rec("stack-prompt-system-g1-1", "prompt_system", "run-1", effects.Irreversible)
	rec("stack-memory-g1-1", "memory", "run-2", effects.Compensatable)
	s.CountReversible("stack-memory-g1-1", "memory")
	s.MarkIncomplete("stack-memory-g1-1", "the manager stopped without closing the receipts file")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	loaded, err := effects.ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var all, memory bytes.Buffer
	printReceipts(&all, receiptsView("team/stack", "uid", loaded, ""))
	printReceipts(&memory, receiptsView("team/stack", "uid", loaded, "memory"))
	t.Logf("all:\n%s\n--module memory:\n%s", all.String(), memory.String())
	for _, want := range []string{"closed cleanly, durable at 2026-12-02T03:00:00.000Z", "stack-prompt-system-g1-1  prompt_system  complete",
		"run-1    stack-prompt-system-g1-1  prompt_system  run   irreversible", "stack-memory-g1-1: evidence incomplete: the manager stopped without closing the receipts file"} {
		if !strings.Contains(all.String(), want) {
			t.Fatalf("the output lacks %q:\n%s", want, all.String())
		}
	}
	if strings.Contains(memory.String(), "prompt_system") || !strings.Contains(memory.String(), "stack-memory-g1-1  memory  INCOMPLETE  1         0             1") {
		t.Fatalf("--module memory:\n%s", memory.String())
	}
}

// TestReceiptsNameAnUnreadableLineAndShowTheOthers: a line that cannot be
// read is printed with the file, its number, offset and why; the receipts
// on the other lines are all shown (text and JSON).
func TestReceiptsNameAnUnreadableLineAndShowTheOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uid.jsonl")
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	s, err := effects.OpenReceiptStore(path, func() time.Time { return at })
	if err != nil {
		t.Fatal(err)
	}
	rec := func(id string) {
		if err := s.Record(effects.Receipt{ID: id, Owner: "team/stack", Generation: "stack-prompt-system-g1-1", Component: "prompt_system",
			Kind: effects.ReceiptRun, Class: effects.Irreversible, StartedAt: at, FinishedAt: at, Detail: "completed"}); err != nil {
			t.Fatal(err)
		}
	}
	rec("run-1")
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("{not json\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rec("run-2")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	loaded, err := effects.ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	view := receiptsView("team/stack", "uid", loaded, "")
	var text bytes.Buffer
	printReceipts(&text, view)
	t.Logf("output:\n%s", text.String())
	want := "unreadable: " + path + " line 4 (byte "
	if !strings.Contains(text.String(), want) || !strings.Contains(text.String(), "not a receipts line") {
		t.Fatalf("the output lacks %q and why:\n%s", want, text.String())
	}
	if !strings.Contains(text.String(), "run-1 ") || !strings.Contains(text.String(), "run-2 ") {
		t.Fatalf("the receipts around the bad line are not both shown:\n%s", text.String())
	}
	if len(view.Unreadable) != 1 || view.Unreadable[0].Line != 4 || len(view.Receipts) != 2 {
		t.Fatalf("JSON view: unreadable %+v, receipts %d", view.Unreadable, len(view.Receipts))
	}
}
