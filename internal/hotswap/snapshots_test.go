package hotswap

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iteron.dev/operator/internal/statedir"
)

func TestSnapshotStoreKeepsStateDurableAndContentAddressed(t *testing.T) {
	store := NewSnapshotStore(t.TempDir())
	path, err := store.Put("uid-1", StoredSnapshot{Module: "prompt_system", ImplementationID: "counter-v1", Lineage: 1, Kind: SnapshotRollback, TakenUnixMs: 1, State: []byte(`{"b": 2, "a": 1}`)})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), `"state":{"a":1,"b":2}`) {
		t.Fatalf("stored %s (%v); want the canonical state", data, err)
	}
	snap, ok, err := store.Latest("uid-1", "prompt_system")
	if err != nil || !ok || snap.Lineage != 1 || !strings.HasSuffix(path, strings.TrimPrefix(snap.StateSHA256, "sha256:")+"-rollback.json") {
		t.Fatalf("Latest = %+v %v %v", snap, ok, err)
	}
	got, err := store.Get("uid-1", "prompt_system", snap.StateSHA256, SnapshotRollback)
	if err != nil || string(got.State) != `{"a":1,"b":2}` {
		t.Fatalf("Get = %s %v", got.State, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range entries {
		if statedir.IsTemporary(e.Name()) {
			t.Fatalf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestSnapshotStoreRefusesAClaimedDigestThatDiffers(t *testing.T) {
	store := NewSnapshotStore(t.TempDir())
	_, err := store.Put("uid-1", StoredSnapshot{Module: "m", Kind: SnapshotCheckpoint, StateSHA256: "sha256:" + strings.Repeat("0", 64), State: []byte(`{}`)})
	if err == nil || !strings.Contains(err.Error(), "claimed") {
		t.Fatalf("Put with a wrong digest: %v", err)
	}
	if all, _ := store.List("uid-1", "m"); len(all) != 0 {
		t.Fatalf("a refused snapshot was stored: %+v", all)
	}
}

func TestSnapshotStoreDetectsATamperedFile(t *testing.T) {
	store := NewSnapshotStore(t.TempDir())
	path, err := store.Put("uid-1", StoredSnapshot{Module: "m", Kind: SnapshotCheckpoint, State: []byte(`{"count":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), `"count":1`, `"count":9`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Latest("uid-1", "m"); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Latest over a tampered file: %v; want corrupt", err)
	}
}

func TestSnapshotStorePrunesOldCheckpoints(t *testing.T) {
	store := NewSnapshotStore(t.TempDir())
	for i := range 5 {
		if _, err := store.Put("uid-1", StoredSnapshot{Module: "m", Kind: SnapshotCheckpoint, TakenUnixMs: int64(i + 1), State: []byte(`{"n":` + string(rune('0'+i)) + `}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Put("uid-1", StoredSnapshot{Module: "m", Kind: SnapshotRollback, TakenUnixMs: 100, State: []byte(`{"n":"r"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := store.Prune("uid-1", "m", SnapshotCheckpoint, 2); err != nil {
		t.Fatal(err)
	}
	all, err := store.List("uid-1", "m")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, s := range all {
		kinds = append(kinds, s.Kind+":"+string(s.State))
	}
	if got := strings.Join(kinds, " "); got != `checkpoint:{"n":3} checkpoint:{"n":4} rollback:{"n":"r"}` {
		t.Fatalf("after prune: %s", got)
	}
}

func TestAReaderNeverSeesMoreCheckpointsThanKeptNorAFilePrunedUnderIt(t *testing.T) {
	store := NewSnapshotStore(t.TempDir())
	const keep, writes = 3, 200
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range writes {
			if _, err := store.PutKeeping("uid-1", StoredSnapshot{Module: "m", Kind: SnapshotCheckpoint, TakenUnixMs: int64(i + 1), State: []byte(fmt.Sprintf(`{"n":%d}`, i))}, keep); err != nil {
				t.Errorf("checkpoint %d: %v", i, err)
				return
			}
		}
	}()
	reads := 0
	for running := true; running; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		all, err := store.List("uid-1", "m")
		if err != nil {
			<-done
			t.Fatalf("read %d while checkpointing: %v", reads, err)
		}
		if len(all) > keep {
			<-done
			t.Fatalf("read %d saw %d checkpoints; at most %d are kept", reads, len(all), keep)
		}
	}
	all, err := store.List("uid-1", "m")
	if err != nil || len(all) != keep || string(all[keep-1].State) != fmt.Sprintf(`{"n":%d}`, writes-1) {
		t.Fatalf("after %d checkpoints: %d kept, newest %s (%v); want %d ending with n=%d", writes, len(all), all[len(all)-1].State, err, keep, writes-1)
	}
}
