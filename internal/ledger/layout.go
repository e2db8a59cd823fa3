package ledger

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/statedir"
)

// Layout under the manager's state directory (docs/reference/state.md):
//
//	<state-dir>/ledgers/<activation-uid>/ledger-000001.jsonl, …   one ledger per activation
//	<state-dir>/ledgers/archive/<activation-uid>-<unix-ms>/         archived ledgers
//
// A re-created activation of the same name has a new UID and so a new
// ledger; the old one is archived when its activation is deleted or its
// ledger is found corrupt.
// The paths are statedir's.
const (
	// DefaultArchivesKept bounds the archives Archive keeps when keep is 0.
	DefaultArchivesKept = 16
)

// ActivationDir returns <stateDir>/ledgers/<activationUID>, the ledger
// directory of one activation.
func ActivationDir(stateDir, activationUID string) (string, error) {
	dir, err := statedir.Dir(stateDir).Ledger(activationUID)
	if err != nil {
		return "", fmt.Errorf("ledger: %w", err)
	}
	return dir, nil
}

// OpenActivation opens the ledger of one activation; with opts.Create it
// creates <stateDir>/ledgers and the activation's directory as needed.
func OpenActivation(stateDir, activationUID string, opts Options) (*Ledger, OpenReport, error) {
	dir, err := ActivationDir(stateDir, activationUID)
	if err != nil {
		return nil, OpenReport{}, err
	}
	if opts.Create {
		if err := ensureDir(statedir.Dir(stateDir).Ledgers()); err != nil {
			return nil, OpenReport{}, err
		}
	}
	return Open(dir, opts)
}

// ensureDir creates dir (not its parents) if missing, durably.
func ensureDir(dir string) error {
	var st unix.Stat_t
	err := unix.Lstat(dir, &st)
	if err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return &RuleError{Rule: RuleNotRegularFile, File: dir, Detail: "not a directory (or a symlink)"}
		}
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return &IOError{Op: "lstat", Path: dir, Err: err}
	}
	return mkdirDurable(dir)
}

// ActivationUIDs lists the activations that have a ledger under stateDir,
// sorted: what a starting manager replays.
func ActivationUIDs(stateDir string) ([]string, error) {
	root := statedir.Dir(stateDir).Ledgers()
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &IOError{Op: "read directory", Path: root, Err: err}
	}
	var uids []string
	for _, e := range entries {
		if statedir.CheckUID(e.Name()) != nil {
			continue
		}
		uids = append(uids, e.Name())
	}
	return uids, nil
}

// Archive moves the ledger of an activation (deleted, or whose ledger is
// corrupt) to <stateDir>/ledgers/archive/<activationUID>-<unix ms>/, makes
// the move durable, and removes the oldest archives beyond keep (0 means
// DefaultArchivesKept). It returns the archive's path. The ledger must be
// closed. A missing ledger is not an error: it returns "".
func Archive(stateDir, activationUID string, now time.Time, keep int) (string, error) {
	src, err := ActivationDir(stateDir, activationUID)
	if err != nil {
		return "", err
	}
	if keep <= 0 {
		keep = DefaultArchivesKept
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", nil
		}
		return "", &IOError{Op: "lstat", Path: src, Err: err}
	}
	archive := statedir.Dir(stateDir).LedgerArchive()
	if err := ensureDir(archive); err != nil {
		return "", err
	}
	// Millisecond names can collide when one UID is archived twice in a
	// millisecond; take the next free one.
	ms := now.UnixMilli()
	var dst string
	for {
		dst = filepath.Join(archive, activationUID+"-"+strconv.FormatInt(ms, 10))
		if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err == nil {
			break
		} else if !errors.Is(err, unix.EEXIST) {
			return "", &IOError{Op: "rename to " + dst, Path: src, Err: err}
		}
		ms++
	}
	if err := fsyncDir(filepath.Dir(src)); err != nil {
		return "", err
	}
	if err := fsyncDir(archive); err != nil {
		return "", err
	}
	return dst, pruneArchives(archive, keep)
}

// pruneArchives removes the oldest archives (by their unix-ms suffix) beyond
// keep.
func pruneArchives(archive string, keep int) error {
	entries, err := os.ReadDir(archive)
	if err != nil {
		return &IOError{Op: "read directory", Path: archive, Err: err}
	}
	type entry struct {
		name string
		ms   int64
	}
	var all []entry
	for _, e := range entries {
		i := strings.LastIndexByte(e.Name(), '-')
		if i < 0 {
			continue
		}
		ms, err := strconv.ParseInt(e.Name()[i+1:], 10, 64)
		if err != nil {
			continue
		}
		all = append(all, entry{e.Name(), ms})
	}
	if len(all) <= keep {
		return nil
	}
	slices.SortFunc(all, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.ms, b.ms), strings.Compare(a.name, b.name))
	})
	for _, e := range all[:len(all)-keep] {
		if err := os.RemoveAll(filepath.Join(archive, e.name)); err != nil {
			return &IOError{Op: "remove old archive", Path: filepath.Join(archive, e.name), Err: err}
		}
	}
	return fsyncDir(archive)
}

// Summary is the ledger mirrored into object status: bounded, whatever the
// ledger's length.
type Summary struct {
	// HeadSHA256 is the last record's hash.
	HeadSHA256 string `json:"headSHA256"`
	// Records is the number of records the ledger has held (the next
	// sequence).
	Records uint64 `json:"records"`
	// Recent are the last RecentRecords records, oldest first.
	Recent []RecordBrief `json:"recent"`
}

// Summary returns the status summary of a replayed state.
func (s State) Summary() Summary {
	return Summary{HeadSHA256: s.HeadSHA256, Records: s.NextSequence, Recent: append([]RecordBrief(nil), s.Recent...)}
}

// Summary returns the ledger's current status summary.
func (l *Ledger) Summary() Summary { return l.State().Summary() }
