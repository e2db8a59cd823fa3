// Package statedir is the state directory of the manager and of the
// survivor (--state-dir): it names every path under it
// (docs/reference/state.md) and owns the one durable write and the one
// directory fsync that every writer there uses — the ledger, snapshots,
// receipts, pending closes, attachments, process records and the artifact
// store. It imports nothing of this module, so whatever needs a path (the
// CLI, doctor, the survivor) finds it here rather than in the package that
// writes it.
package statedir

import (
	"fmt"
	"path/filepath"
)

// Names of the entries directly under the state directory.
const (
	// LockFile is the manager's lock: flocked for its lifetime.
	LockFile = "lock"
	// SurvivorLockFile is the survivor's own lock.
	SurvivorLockFile = "survivor.lock"
	// SurvivorSocket is the survivor's control socket (in the state dir, mode
	// 0700, owned by root: only root on the node reaches it).
	SurvivorSocket = "survivor.sock"
	// ProcessRecordsDir holds one record per live provider process group.
	ProcessRecordsDir = "procs"
	// RuntimeRecordsDir holds one record per live package runtime.
	RuntimeRecordsDir = "runtimes"
	// RuntimeSocketsDir holds the package runtimes' sockets.
	RuntimeSocketsDir = "rt"
	// LedgersDir holds one ledger directory per activation.
	LedgersDir = "ledgers"
	// ArchiveDir, under LedgersDir, holds the ledgers of deleted
	// activations.
	ArchiveDir = "archive"
	// SnapshotsDir holds durable state snapshots per activation and module.
	SnapshotsDir = "snapshots"
	// ReceiptsDir holds one effect-receipts file per activation.
	ReceiptsDir = "receipts"
	// PendingDir holds the pending close of an activation whose
	// transaction closed without its ledger record.
	PendingDir = "pending"
	// AttachedDir holds, per activation, the survivor-held processes the
	// manager attached.
	AttachedDir = "attached"
	// ScratchDir holds the sandbox's private scratch directories per
	// activation and generation.
	ScratchDir = "scratch"
)

// Dir is a state directory: each method returns the path of one thing in
// it. An activation's files are named by its UID, which is checked first
// (CheckUID) wherever it becomes a path component.
type Dir string

// Lock is the manager's lock file.
func (d Dir) Lock() string { return d.join(LockFile) }

// SurvivorLock is the survivor's lock file.
func (d Dir) SurvivorLock() string { return d.join(SurvivorLockFile) }

// SurvivorSocket is the survivor's control socket.
func (d Dir) SurvivorSocket() string { return d.join(SurvivorSocket) }

// ProcessRecords is the directory of provider process records.
func (d Dir) ProcessRecords() string { return d.join(ProcessRecordsDir) }

// RuntimeRecords is the directory of package runtime records.
func (d Dir) RuntimeRecords() string { return d.join(RuntimeRecordsDir) }

// RuntimeSockets is the directory of package runtime sockets.
func (d Dir) RuntimeSockets() string { return d.join(RuntimeSocketsDir) }

// Ledgers is the directory of every activation's ledger.
func (d Dir) Ledgers() string { return d.join(LedgersDir) }

// LedgerArchive is the directory of archived ledgers.
func (d Dir) LedgerArchive() string { return d.join(LedgersDir, ArchiveDir) }

// Ledger is the ledger directory of one activation.
func (d Dir) Ledger(uid string) (string, error) {
	if err := CheckUID(uid); err != nil {
		return "", err
	}
	return d.join(LedgersDir, uid), nil
}

// Receipts is the receipts file of one activation.
func (d Dir) Receipts(uid string) (string, error) {
	if err := CheckUID(uid); err != nil {
		return "", err
	}
	return d.join(ReceiptsDir, uid+".jsonl"), nil
}

// Snapshots is the directory of every activation's snapshots.
func (d Dir) Snapshots() string { return d.join(SnapshotsDir) }

// PendingCloses is the directory of pending closes.
func (d Dir) PendingCloses() string { return d.join(PendingDir) }

// PendingClose is the pending close file of one activation.
func (d Dir) PendingClose(uid string) string { return d.join(PendingDir, uid+".json") }

// Attachments is the directory of attachment files.
func (d Dir) Attachments() string { return d.join(AttachedDir) }

// Attached is the attachment file of one activation.
func (d Dir) Attached(uid string) string { return d.join(AttachedDir, uid+".json") }

// Scratch is the root of the sandbox's scratch directories.
func (d Dir) Scratch() string { return d.join(ScratchDir) }

func (d Dir) join(elem ...string) string {
	return filepath.Join(append([]string{string(d)}, elem...)...)
}

// CheckUID accepts a Kubernetes object UID as a path component: 1–128
// bytes of [A-Za-z0-9-] starting with an alphanumeric, which can be
// neither a component with a meaning ("." "..") nor the ledgers' archive
// directory.
func CheckUID(uid string) error {
	ok := len(uid) > 0 && len(uid) <= 128 && uid != ArchiveDir && uid[0] != '-'
	for i := 0; ok && i < len(uid); i++ {
		c := uid[i]
		ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'
	}
	if !ok {
		return fmt.Errorf("activation uid %q is not 1-128 bytes of [A-Za-z0-9-] starting with a letter or digit", uid)
	}
	return nil
}
