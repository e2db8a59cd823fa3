package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// VerifyOptions tune a read-only replay.
type VerifyOptions struct {
	// Anchor, when set, must be in the chain (or before the retained
	// segments): the head mirrored into object status, for example.
	Anchor *Anchor
}

// Verify replays the ledger at path read-only and returns what it
// established. path is a ledger directory (its segments, verified from the
// oldest retained one) or a single file (a complete ledger: its first record
// is sequence 0). Verify never repairs: a torn tail is a *RuleError like any
// other broken rule. An open last transaction is allowed in a
// SchemaOperator ledger and reported in State.Open.
func Verify(path string, opts VerifyOptions) (State, error) {
	return Replay(path, opts, nil)
}

// Replay is Verify that also hands each verified record, in order, to fn
// (which must not keep the pointer). Records before a broken rule have been
// handed over when the error returns.
func Replay(path string, opts VerifyOptions, fn func(*Record) error) (State, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return State{}, &IOError{Op: "lstat", Path: path, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		dir, err := openDir(path)
		if err != nil {
			return State{}, err
		}
		defer dir.Close()
		nums, err := listSegments(dir, path)
		if err != nil {
			return State{}, err
		}
		if len(nums) == 0 {
			return State{}, &RuleError{Rule: RuleSegmentLayout, File: path, Detail: "the directory holds no segment"}
		}
		rp, err := replaySegments(int(dir.Fd()), path, nums, opts.Anchor, false, fn)
		if err != nil {
			return State{}, err
		}
		return rp.finish(nums, false)
	case unix.S_IFREG:
		rp := &replayer{v: newValidator(opts.Anchor), h: newLineHasher(), lastFD: -1, segFirst: map[int]uint64{}}
		if err := rp.segment(unix.AT_FDCWD, "", path, 0, true, false, fn); err != nil {
			return State{}, err
		}
		return rp.finish(nil, false)
	case unix.S_IFLNK:
		return State{}, &RuleError{Rule: RuleNotRegularFile, File: path, Detail: "the ledger is a symlink"}
	default:
		return State{}, &RuleError{Rule: RuleNotRegularFile, File: path, Detail: fmt.Sprintf("the ledger is neither a regular file nor a directory (mode %#o)", st.Mode)}
	}
}

// openDir opens a ledger directory without following a symlink.
func openDir(path string) (*os.File, error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	})
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, &RuleError{Rule: RuleNotRegularFile, File: path, Detail: "the ledger directory is a symlink"}
	case errors.Is(err, unix.ENOTDIR):
		return nil, &RuleError{Rule: RuleNotRegularFile, File: path, Detail: "the ledger directory is not a directory"}
	case err != nil:
		return nil, &IOError{Op: "open directory", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// replayer carries a replay across segments.
type replayer struct {
	v *validator
	h *lineHasher
	// For append: the last segment, left open read-write, its size and
	// identity, and its torn tail.
	lastFD   int
	lastSize int64
	lastStat unix.Stat_t
	torn     *tornTail
	buf      []byte // read buffer, reused across segments
	// segFirst maps each segment to the sequence of its first record (of
	// the record that would follow, when it is empty).
	segFirst map[int]uint64
}

// replaySegments replays the numbered segments of the directory dirfd. With
// forAppend, the last segment is opened read-write for append and kept, and
// its torn tail is returned in the replayer instead of as an error.
func replaySegments(dirfd int, dirPath string, nums []int, anchor *Anchor, forAppend bool, fn func(*Record) error) (*replayer, error) {
	rp := &replayer{v: newValidator(anchor), h: newLineHasher(), lastFD: -1, segFirst: map[int]uint64{}}
	// The oldest retained segment of a pruned ledger starts the chain where
	// retention cut it.
	rp.v.anchored = nums[0] > 1
	for i, n := range nums {
		last := i == len(nums)-1
		if err := rp.segment(dirfd, dirPath, SegmentName(n), n, last, forAppend && last, fn); err != nil {
			rp.close()
			return nil, err
		}
	}
	if rp.v.anchored && !rp.v.started {
		rp.close()
		return nil, &RuleError{Rule: RuleSegmentLayout, File: filepath.Join(dirPath, SegmentName(nums[0])),
			Detail: fmt.Sprintf("the oldest retained segment is %d and holds no record: where the chain continues is unknown", nums[0])}
	}
	return rp, nil
}

// segment replays one segment file.
func (rp *replayer) segment(dirfd int, dirPath, name string, num int, last, forAppend bool, fn func(*Record) error) error {
	flags := unix.O_RDONLY
	if forAppend {
		flags = unix.O_RDWR | unix.O_APPEND
	}
	path := filepath.Join(dirPath, name)
	fd, st, err := openFile(dirfd, dirPath, name, flags)
	if err != nil {
		setSequence(err, rp.v.next)
		return err
	}
	keep := false
	defer func() {
		if !keep {
			unix.Close(fd)
		}
	}()
	rp.v.segment = num
	startNext, started := rp.v.next, rp.v.started
	ss := segmentStream{v: rp.v, h: rp.h, path: path, chunk: readChunk, buf: rp.buf, fn: fn}
	torn, lines, size, err := ss.run(preadAt(fd))
	rp.buf = ss.buf
	if err != nil {
		return err
	}
	// The segment must still be what was read: a writer appending or a
	// truncation during the read is caught here.
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return &IOError{Op: "fstat", Path: path, Err: err}
	}
	if after.Size != size {
		return &RuleError{Rule: RuleSizeChanged, Sequence: rp.v.next, File: path,
			Detail: fmt.Sprintf("the segment changed from %d to %d bytes while it was read", size, after.Size)}
	}
	st.Size = size
	if !started && rp.v.started {
		startNext = rp.v.first
	}
	rp.segFirst[num] = startNext
	if torn != nil && !forAppend {
		return torn.ruleError(rp.v.next, path, lines+1)
	}
	if !last {
		if lines == 0 {
			return &RuleError{Rule: RuleSegmentLayout, Sequence: rp.v.next, File: path, Detail: "a sealed segment is empty"}
		}
		if rp.v.open != nil && !rp.v.open.terminal {
			return &RuleError{Rule: RuleSegmentLayout, Sequence: rp.v.next, File: path, TransactionID: rp.v.open.first.TransactionID,
				Detail: "the segment was sealed inside a transaction; segments are sealed only between transactions"}
		}
	}
	if forAppend {
		keep = true
		rp.lastFD, rp.lastSize, rp.lastStat, rp.torn = fd, st.Size, st, torn
	}
	return nil
}

func setSequence(err error, seq uint64) {
	var re *RuleError
	if errors.As(err, &re) {
		re.Sequence = seq
	}
}

// finish checks the end of the ledger and returns the state.
func (rp *replayer) finish(nums []int, keepOpen bool) (State, error) {
	if err := rp.v.finish(true); err != nil {
		if !keepOpen {
			rp.close()
		}
		return State{}, err
	}
	if err := rp.v.checkAnchor(); err != nil {
		if !keepOpen {
			rp.close()
		}
		return State{}, err
	}
	s := rp.v.state()
	if len(nums) > 0 {
		s.FirstSegment, s.LastSegment = nums[0], nums[len(nums)-1]
	}
	if !keepOpen {
		rp.close()
	}
	return s, nil
}

func (rp *replayer) close() {
	if rp.lastFD >= 0 {
		unix.Close(rp.lastFD)
		rp.lastFD = -1
	}
}
