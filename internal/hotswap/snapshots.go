package hotswap

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

// MaxSnapshotBytes bounds a stored snapshot file: 512 KiB of state (the
// protocol's bound) plus its envelope.
const MaxSnapshotBytes = 600 << 10

// StoredSnapshot is a durable snapshot of one module's state, stored
// content-addressed by its state digest.
type StoredSnapshot struct {
	// Module is the module the state belongs to.
	Module string `json:"module"`
	// ImplementationID is the implementation whose state it is.
	ImplementationID string `json:"implementation_id"`
	// Lineage is the state's generation (lineage number).
	Lineage int64 `json:"lineage"`
	// StateSchema is the module's lifecycle/snapshot contract.
	StateSchema protocol.ContractRef `json:"state_schema"`
	// StateSHA256 is "sha256:" over the canonical state; the file name.
	StateSHA256 string `json:"state_sha256"`
	// Kind says why it was taken: rollback, restored, checkpoint, retirement.
	Kind string `json:"kind"`
	// TakenUnixMs is when it became durable.
	TakenUnixMs int64 `json:"taken_unix_ms"`
	// State is the state object, canonical JSON.
	State json.RawMessage `json:"state"`
}

// protocolState is the stored snapshot as the protocol's State, ready to
// restore.
func (s StoredSnapshot) protocolState() protocol.State {
	return protocol.State{
		Module: s.Module, ImplementationID: s.ImplementationID, RunID: protocol.LineageRunID(s.Module),
		Generation: uint64(s.Lineage), StateSchema: s.StateSchema, StateSHA256: s.StateSHA256, State: jsontext.Value(s.State),
	}
}

// Snapshot kinds.
const (
	SnapshotRollback   = "rollback"
	SnapshotRestored   = "restored"
	SnapshotCheckpoint = "checkpoint"
	SnapshotRetirement = "retirement"
)

// SnapshotStore keeps durable snapshots under
// <state-dir>/snapshots/<activation-uid>/<module>/<hex digest>.json, written
// to a temporary file, fsynced, renamed into place and the directory fsynced:
// a snapshot file either exists whole or not at all.
type SnapshotStore struct {
	root string
	// mu makes a write and the pruning that follows it one step for
	// readers in this process: a List never sees a checkpoint over the kept
	// count, nor fails on a file pruned while it read the directory.
	mu sync.RWMutex
}

// NewSnapshotStore returns the store rooted at <stateDir>/snapshots.
func NewSnapshotStore(stateDir string) *SnapshotStore {
	return &SnapshotStore{root: statedir.Dir(stateDir).Snapshots()}
}

func (s *SnapshotStore) dir(activationUID, module string) string {
	return filepath.Join(s.root, activationUID, module)
}

// Put makes a snapshot durable. It recomputes the digest from the state and
// refuses a snapshot whose claimed digest differs.
func (s *SnapshotStore) Put(activationUID string, snap StoredSnapshot) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.put(activationUID, snap)
}

// PutKeeping makes a snapshot durable and then keeps only the newest keep
// snapshots of its kind, as one step for readers of this store. When only the
// pruning fails, the snapshot is durable: path is set and err says what was
// left behind.
func (s *SnapshotStore) PutKeeping(activationUID string, snap StoredSnapshot, keep int) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	path, err := s.put(activationUID, snap)
	if err != nil {
		return "", err
	}
	if err := s.prune(activationUID, snap.Module, snap.Kind, keep); err != nil {
		return path, fmt.Errorf("prune %s snapshots of %s: %w", snap.Kind, snap.Module, err)
	}
	return path, nil
}

func (s *SnapshotStore) put(activationUID string, snap StoredSnapshot) (string, error) {
	canonical, err := strictjson.CanonicalValue(snap.State)
	if err != nil {
		return "", fmt.Errorf("snapshot of %s: state is not valid JSON: %w", snap.Module, err)
	}
	digest := strictjson.Digest(canonical)
	if snap.StateSHA256 != "" && snap.StateSHA256 != digest {
		return "", fmt.Errorf("snapshot of %s: claimed %s, state hashes to %s", snap.Module, snap.StateSHA256, digest)
	}
	snap.StateSHA256 = digest
	snap.State = canonical
	if snap.TakenUnixMs == 0 {
		snap.TakenUnixMs = time.Now().UnixMilli()
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return "", err
	}
	if len(data) > MaxSnapshotBytes {
		return "", fmt.Errorf("snapshot of %s is %d bytes, over the %d-byte bound", snap.Module, len(data), MaxSnapshotBytes)
	}
	dir := s.dir(activationUID, snap.Module)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	name := strings.TrimPrefix(digest, strictjson.DigestPrefix) + "-" + snap.Kind + ".json"
	path := filepath.Join(dir, name)
	if err := statedir.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("store snapshot of %s: %w", snap.Module, err)
	}
	return path, nil
}

// Latest returns the newest durable snapshot of a module (by time taken),
// verifying its digest; ok is false when there is none.
func (s *SnapshotStore) Latest(activationUID, module string) (snap StoredSnapshot, ok bool, err error) {
	all, err := s.List(activationUID, module)
	if err != nil || len(all) == 0 {
		return StoredSnapshot{}, false, err
	}
	return all[len(all)-1], true, nil
}

// Get returns the stored snapshot with the given state digest and kind.
func (s *SnapshotStore) Get(activationUID, module, digest, kind string) (StoredSnapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	path := filepath.Join(s.dir(activationUID, module), strings.TrimPrefix(digest, strictjson.DigestPrefix)+"-"+kind+".json")
	return readSnapshot(path)
}

// List returns a module's snapshots, oldest first, each verified.
func (s *SnapshotStore) List(activationUID, module string) ([]StoredSnapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.list(activationUID, module)
}

func (s *SnapshotStore) list(activationUID, module string) ([]StoredSnapshot, error) {
	entries, err := os.ReadDir(s.dir(activationUID, module))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []StoredSnapshot
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		snap, err := readSnapshot(filepath.Join(s.dir(activationUID, module), e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, snap)
	}
	slices.SortStableFunc(out, func(a, b StoredSnapshot) int {
		if c := cmp.Compare(a.TakenUnixMs, b.TakenUnixMs); c != 0 {
			return c
		}
		return cmp.Compare(a.Lineage, b.Lineage)
	})
	return out, nil
}

// Prune keeps the newest keep snapshots of a kind for a module and removes
// the rest.
func (s *SnapshotStore) Prune(activationUID, module, kind string, keep int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prune(activationUID, module, kind, keep)
}

func (s *SnapshotStore) prune(activationUID, module, kind string, keep int) error {
	all, err := s.list(activationUID, module)
	if err != nil {
		return err
	}
	var ofKind []StoredSnapshot
	for _, snap := range all {
		if snap.Kind == kind {
			ofKind = append(ofKind, snap)
		}
	}
	for i := 0; i < len(ofKind)-keep; i++ {
		name := strings.TrimPrefix(ofKind[i].StateSHA256, strictjson.DigestPrefix) + "-" + kind + ".json"
		if err := os.Remove(filepath.Join(s.dir(activationUID, module), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return statedir.SyncDir(s.dir(activationUID, module))
}

// ActivationUIDs lists the activations that have snapshots.
func (s *SnapshotStore) ActivationUIDs() ([]string, error) {
	entries, err := os.ReadDir(s.root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var uids []string
	for _, e := range entries {
		if e.IsDir() {
			uids = append(uids, e.Name())
		}
	}
	return uids, nil
}

// RemoveActivation deletes every snapshot of an activation.
func (s *SnapshotStore) RemoveActivation(activationUID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return os.RemoveAll(filepath.Join(s.root, activationUID))
}

func readSnapshot(path string) (StoredSnapshot, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return StoredSnapshot{}, err
	}
	defer f.Close()
	data, err := strictjson.ReadBounded(f, MaxSnapshotBytes)
	if err != nil {
		return StoredSnapshot{}, fmt.Errorf("read snapshot %s: %w", path, err)
	}
	var snap StoredSnapshot
	if err := strictjson.Decode(data, &snap, MaxSnapshotBytes); err != nil {
		return StoredSnapshot{}, fmt.Errorf("snapshot %s: %w", path, err)
	}
	digest, err := strictjson.DigestOfValue(snap.State)
	if err != nil || digest != snap.StateSHA256 {
		return StoredSnapshot{}, fmt.Errorf("snapshot %s: state hashes to %s, recorded %s: the file is corrupt", path, digest, snap.StateSHA256)
	}
	return snap, nil
}

// RemoveActivationState archives a deleted activation's ledger (bounded
// archives under ledgers/archive) and removes its snapshots, its pending
// close and its generations' sandbox scratch directories. Call it once the
// coordinator has retired and forgotten the activation.
func RemoveActivationState(stateDir, activationUID string, now time.Time) error {
	if _, err := ledger.Archive(stateDir, activationUID, now, 0); err != nil {
		return err
	}
	if err := removePending(stateDir, activationUID); err != nil {
		return err
	}
	if err := providers.RemoveAttached(stateDir, activationUID); err != nil {
		return err
	}
	if err := removeReceipts(stateDir, activationUID); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(statedir.Dir(stateDir).Scratch(), activationUID)); err != nil {
		return err
	}
	return NewSnapshotStore(stateDir).RemoveActivation(activationUID)
}
