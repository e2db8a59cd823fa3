package statedir

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEveryPathLiesInTheStateDirectory(t *testing.T) {
	d := Dir("/var/lib/iteron/state")
	ledger, err := d.Ledger("0b9d-uid")
	if err != nil {
		t.Fatal(err)
	}
	receipts, err := d.Receipts("0b9d-uid")
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		d.Lock():             "/var/lib/iteron/state/lock",
		d.SurvivorLock():     "/var/lib/iteron/state/survivor.lock",
		d.SurvivorSocket():   "/var/lib/iteron/state/survivor.sock",
		d.ProcessRecords():   "/var/lib/iteron/state/procs",
		d.RuntimeRecords():   "/var/lib/iteron/state/runtimes",
		d.RuntimeSockets():   "/var/lib/iteron/state/rt",
		d.Ledgers():          "/var/lib/iteron/state/ledgers",
		d.LedgerArchive():    "/var/lib/iteron/state/ledgers/archive",
		ledger:               "/var/lib/iteron/state/ledgers/0b9d-uid",
		receipts:             "/var/lib/iteron/state/receipts/0b9d-uid.jsonl",
		d.Snapshots():        "/var/lib/iteron/state/snapshots",
		d.PendingCloses():    "/var/lib/iteron/state/pending",
		d.PendingClose("u1"): "/var/lib/iteron/state/pending/u1.json",
		d.Attachments():      "/var/lib/iteron/state/attached",
		d.Attached("u1"):     "/var/lib/iteron/state/attached/u1.json",
		d.Scratch():          "/var/lib/iteron/state/scratch",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

func TestAUIDThatIsNotAPlainNameIsRefusedAsAPath(t *testing.T) {
	for _, uid := range []string{"", ".", "..", "a/b", "../x", "-x", "archive", "a b", "é", strings.Repeat("a", 129)} {
		if err := CheckUID(uid); err == nil || !strings.Contains(err.Error(), "activation uid") {
			t.Errorf("CheckUID(%q) = %v, want an error naming the activation uid", uid, err)
		}
		if p, err := Dir("/s").Ledger(uid); err == nil {
			t.Errorf("Ledger(%q) = %s, want an error", uid, p)
		}
		if p, err := Dir("/s").Receipts(uid); err == nil {
			t.Errorf("Receipts(%q) = %s, want an error", uid, p)
		}
	}
	for _, uid := range []string{"a", "0b9d5c2e-7f3a-4b1c-9d2e-1f0a3b4c5d6e", strings.Repeat("Z", 128)} {
		if err := CheckUID(uid); err != nil {
			t.Errorf("CheckUID(%q) = %v", uid, err)
		}
	}
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFileReplacesTheFileWholeWithItsMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.json")
	for _, data := range []string{"first\n", "the second, longer\n", "3\n"} {
		if err := WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Fatalf("read %q, %v; want %q", got, err, data)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Fatalf("the directory holds %v; want only a.json", names)
	}
}

func TestAFailedWriteLeavesTheOldFileAndNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.json")
	if err := WriteFile(path, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("the encoder failed")
	err := WriteFileWith(path, 0o600, func(w io.Writer) error {
		io.WriteString(w, "half of the new")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the writer's error", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old\n" {
		t.Fatalf("the file holds %q after a failed write; want the old bytes", got)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Fatalf("the directory holds %v after a failed write; want only a.json", names)
	}
}

func TestAWriteIntoAMissingDirectoryFailsNamingIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	err := WriteFile(filepath.Join(dir, "a.json"), []byte("x"), 0o600)
	var pe *fs.PathError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("err = %v, want a path error naming %s", err, dir)
	}
	if err := SyncDir(dir); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("SyncDir of a missing directory: %v", err)
	}
}

func TestATemporaryFileIsToldFromTheFilesItBecomes(t *testing.T) {
	for name, want := range map[string]bool{
		".12-34.json.5678.tmp": true,
		"12-34.json":           false,
		"12-34.json.tmp":       false, // not WriteFile's: a file of its own
		".hidden":              false,
	} {
		if got := IsTemporary(name); got != want {
			t.Errorf("IsTemporary(%q) = %v, want %v", name, got, want)
		}
	}
	// What WriteFile leaves while it writes is one of them.
	dir := t.TempDir()
	var seen []string
	WriteFileWith(filepath.Join(dir, "12-34.json"), 0o600, func(io.Writer) error {
		seen = entries(t, dir)
		return nil
	})
	if len(seen) != 1 || !IsTemporary(seen[0]) {
		t.Fatalf("while writing, the directory held %v; want one temporary file", seen)
	}
}

func TestMkdirAllMakesEveryMissingParentAndRefusesAFile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "c")
	if err := MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("stat %s: %v, %v; want a 0700 directory", dir, fi, err)
	}
	if err := MkdirAll(dir); err != nil {
		t.Fatalf("a second MkdirAll: %v", err)
	}
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(file); err == nil {
		t.Fatal("MkdirAll over a file succeeded")
	}
	if err := MkdirAll(filepath.Join(file, "x")); err == nil {
		t.Fatal("MkdirAll below a file succeeded")
	}
}

func TestRemoveOfAMissingFileIsNotAnError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a")
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after Remove: %v", err)
	}
}
