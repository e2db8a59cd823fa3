package ledger

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/statedir"
)

// DefaultRetainSegments is how many sealed segments a ledger keeps when
// Options.RetainSegments is 0.
const DefaultRetainSegments = 8

// maxTxnRecords is the most records one transaction can have: nine applied
// work phases and committed, or up to eight applied phases, a blocked record
// and rolled_back.
const maxTxnRecords = 11

// Options configure a ledger opened for append.
type Options struct {
	// SegmentBytes bounds each segment; 0 means MaxSegmentBytes, the spec's
	// bound, and nothing larger is allowed. A segment is sealed before a
	// transaction that could overflow it.
	SegmentBytes int64
	// RetainSegments is how many sealed segments are kept; 0 means
	// DefaultRetainSegments. An older segment is kept beyond that while it
	// holds some module's last committed transaction (other than a
	// retirement), so a restart always knows what to relaunch.
	RetainSegments int
	// Create makes the directory and its first segment when they do not
	// exist. Without it a missing ledger is an error, so a ledger that
	// vanished is never silently started afresh.
	Create bool
	// Anchor, when set, must be in the chain: the head hash and sequence
	// mirrored into object status.
	Anchor *Anchor
	// Now is the clock for started_unix_ms and elapsed_ms; nil is time.Now.
	Now func() time.Time
	// ObserveSync, when set, is told how long each append's fdatasync took
	// (for the manager's metrics).
	ObserveSync func(time.Duration)
}

// TornTail reports the incomplete record that Open truncated.
type TornTail struct {
	// File is the segment.
	File string
	// Offset is where the tail started: the segment's size after truncation.
	Offset int64
	// Bytes is how many bytes were removed.
	Bytes int64
	// NUL reports a tail of NUL bytes (a crash after the size grew but before
	// the data landed) rather than an unterminated line.
	NUL bool
}

// OpenReport is what Open found.
type OpenReport struct {
	// TornTail is the truncated tail, nil when the ledger ended cleanly.
	TornTail *TornTail
	// State is the replayed state. When State.Open is set, call Recover
	// before Begin.
	State State
}

// Ledger is a hash-chained ledger directory open for append. Every append
// is durable (write, then fdatasync) before it returns. Methods are safe
// for concurrent use; one transaction is open at a time.
type Ledger struct {
	mu   sync.Mutex
	dir  string
	dirf *os.File // locked with flock for the ledger's lifetime
	opts Options

	segNum  int
	segFD   int
	segSize int64
	segDev  uint64
	segIno  uint64
	first   int // oldest retained segment
	// segFirst maps each retained segment to its first sequence.
	segFirst map[int]uint64

	v       *validator
	enc     recordEncoder
	frozen  error
	closed  bool
	pending *Txn
	epoch   uint64
}

// Open opens (with Options.Create, creates) the ledger directory dir for
// append: it locks the directory against a second writer, replays every
// retained segment, truncates a torn tail of the last segment (only the
// bytes after its last newline, never a complete record) and reports it.
// A ledger that breaks a rule is not repaired: Open returns the *RuleError
// (errors.Is ErrCorrupt) and changes nothing. A family ledger is refused:
// this operator appends only SchemaOperator records. When the last segment
// is sealed (a writer stopped between sealing it and creating the next),
// appends go to a new segment.
func Open(dir string, opts Options) (*Ledger, OpenReport, error) {
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = MaxSegmentBytes
	}
	if opts.SegmentBytes < 0 || opts.SegmentBytes > MaxSegmentBytes {
		return nil, OpenReport{}, fmt.Errorf("ledger options: SegmentBytes %d is not in 1..%d", opts.SegmentBytes, MaxSegmentBytes)
	}
	if opts.RetainSegments == 0 {
		opts.RetainSegments = DefaultRetainSegments
	}
	if opts.RetainSegments < 0 {
		return nil, OpenReport{}, fmt.Errorf("ledger options: RetainSegments %d is negative", opts.RetainSegments)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dirf, err := openDir(dir)
	var ioErr *IOError
	if errors.As(err, &ioErr) && errors.Is(ioErr.Err, unix.ENOENT) && opts.Create {
		if err := mkdirDurable(dir); err != nil {
			return nil, OpenReport{}, err
		}
		dirf, err = openDir(dir)
	}
	if err != nil {
		return nil, OpenReport{}, err
	}
	l := &Ledger{dir: dir, dirf: dirf, opts: opts, segFD: -1}
	ok := false
	defer func() {
		if !ok {
			l.release()
		}
	}()
	if err := unix.Flock(int(dirf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, OpenReport{}, fmt.Errorf("open %s: %w", dir, ErrLocked)
		}
		return nil, OpenReport{}, &IOError{Op: "flock", Path: dir, Err: err}
	}
	nums, err := listSegments(dirf, dir)
	if err != nil {
		return nil, OpenReport{}, err
	}
	if len(nums) == 0 {
		if !opts.Create {
			return nil, OpenReport{}, &RuleError{Rule: RuleSegmentLayout, File: dir, Detail: "the directory holds no segment"}
		}
		if err := l.createSegment(1); err != nil {
			return nil, OpenReport{}, err
		}
		unix.Close(l.segFD)
		l.segFD = -1
		nums = []int{1}
	}
	// A last segment without its owner-write bit was sealed by a writer that
	// stopped before it created the next one: replay it read-only and append
	// to a new segment.
	last := nums[len(nums)-1]
	var lst unix.Stat_t
	sealedLast := unix.Fstatat(l.dirfd(), SegmentName(last), &lst, unix.AT_SYMLINK_NOFOLLOW) == nil &&
		lst.Mode&unix.S_IFMT == unix.S_IFREG && lst.Mode&0o200 == 0
	rp, err := replaySegments(l.dirfd(), dir, nums, opts.Anchor, !sealedLast, nil)
	if err != nil {
		return nil, OpenReport{}, err
	}
	l.segFD = rp.lastFD
	rp.lastFD = -1
	l.segFirst = rp.segFirst
	state, err := rp.finish(nums, true)
	if err != nil {
		return nil, OpenReport{}, err
	}
	if state.Schema == SchemaFamily {
		return nil, OpenReport{}, &RuleError{Rule: RuleMixedSchemas, Sequence: state.NextSequence, File: dir,
			Detail: fmt.Sprintf("a %s ledger is read-only here; this operator appends only %s", SchemaFamily, SchemaOperator)}
	}
	report := OpenReport{}
	l.segNum, l.first = last, nums[0]
	l.segSize, l.segDev, l.segIno = rp.lastSize, rp.lastStat.Dev, rp.lastStat.Ino
	if sealedLast {
		if o := rp.v.open; o != nil && !o.terminal {
			return nil, OpenReport{}, &RuleError{Rule: RuleSegmentLayout, Sequence: rp.v.next, File: filepath.Join(dir, SegmentName(last)), TransactionID: o.first.TransactionID,
				Detail: "the sealed last segment ends inside a transaction; segments are sealed only between transactions"}
		}
		if err := l.createSegment(last + 1); err != nil {
			return nil, OpenReport{}, err
		}
		rp.v.segment = l.segNum
		l.segFirst[l.segNum] = rp.v.next
		state.LastSegment = l.segNum
	}
	if rp.torn != nil {
		path := filepath.Join(dir, SegmentName(l.segNum))
		if err := unix.Ftruncate(l.segFD, rp.torn.offset); err != nil {
			return nil, OpenReport{}, &IOError{Op: "truncate torn tail of", Path: path, Err: err}
		}
		if err := fsyncFD(l.segFD, path); err != nil {
			return nil, OpenReport{}, err
		}
		l.segSize = rp.torn.offset
		report.TornTail = &TornTail{File: path, Offset: rp.torn.offset, Bytes: rp.torn.bytes, NUL: rp.torn.nul}
	}
	// The anchor was for the replay; appends are checked by the chain.
	rp.v.anchor = nil
	l.v = rp.v
	report.State = state
	ok = true
	return l, report, nil
}

// mkdirDurable creates dir (mode 0700) and makes its entry durable.
func mkdirDurable(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return &IOError{Op: "mkdir", Path: dir, Err: err}
	}
	return fsyncDir(filepath.Dir(dir))
}

// fsyncDir is statedir.SyncDir, its error an IOError.
func fsyncDir(path string) error {
	err := statedir.SyncDir(path)
	var pe *fs.PathError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	op := "fsync"
	if pe.Op == "open" {
		op = "open directory"
	}
	return &IOError{Op: op, Path: path, Err: pe.Err}
}

func fsyncFD(fd int, path string) error {
	if _, err := retryEINTR(func() (int, error) { return 0, unix.Fsync(fd) }); err != nil {
		return &IOError{Op: "fsync", Path: path, Err: err}
	}
	return nil
}

func (l *Ledger) dirfd() int { return int(l.dirf.Fd()) }

// createSegment creates segment n, empty, and makes its entry durable.
func (l *Ledger) createSegment(n int) error {
	if n > maxSegment {
		return fmt.Errorf("ledger %s: segment number %d exceeds %d", l.dir, n, maxSegment)
	}
	name := SegmentName(n)
	path := filepath.Join(l.dir, name)
	fd, err := retryEINTR(func() (int, error) {
		return unix.Openat(l.dirfd(), name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	})
	if err != nil {
		return &IOError{Op: "create", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return &IOError{Op: "fstat", Path: path, Err: err}
	}
	if err := fsyncFD(l.dirfd(), l.dir); err != nil {
		unix.Close(fd)
		return err
	}
	l.segFD, l.segNum, l.segSize, l.segDev, l.segIno = fd, n, 0, st.Dev, st.Ino
	return nil
}

// Close releases the ledger: the segment, the directory and its lock. An open
// transaction stays open in the file; the next Open reports it.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.pending = nil
	return l.release()
}

func (l *Ledger) release() error {
	var errs []error
	if l.segFD >= 0 {
		if err := unix.Close(l.segFD); err != nil {
			errs = append(errs, &IOError{Op: "close", Path: l.segPath(), Err: err})
		}
		l.segFD = -1
	}
	if l.dirf != nil {
		// Closing the descriptor drops the flock.
		if err := l.dirf.Close(); err != nil {
			errs = append(errs, &IOError{Op: "close", Path: l.dir, Err: err})
		}
		l.dirf = nil
	}
	return errors.Join(errs...)
}

func (l *Ledger) segPath() string { return filepath.Join(l.dir, SegmentName(l.segNum)) }

// Dir is the ledger directory.
func (l *Ledger) Dir() string { return l.dir }

// State returns the current state: what a replay of the ledger would
// establish now.
func (l *Ledger) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.v.state()
	s.FirstSegment, s.LastSegment = l.first, l.segNum
	return s
}

// Err returns the error that froze the ledger, nil while it accepts appends.
func (l *Ledger) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.frozen
}

// usable reports why the ledger cannot append.
func (l *Ledger) usable() error {
	switch {
	case l.closed:
		return ErrClosed
	case l.frozen != nil:
		return &FrozenError{Cause: l.frozen}
	}
	return nil
}

// freeze makes the ledger refuse appends until reopened.
func (l *Ledger) freeze(err error) error {
	if l.frozen == nil {
		l.frozen = err
	}
	l.pending = nil
	return err
}

// append writes r durably as the next record: it fills sequence, chain and
// hash, runs the record through the reader's rules (a refused record is
// never written and leaves the ledger usable), seals the segment first if r
// starts a transaction that could overflow it, checks that nobody else
// changed the segment, writes the line with one O_APPEND write and
// fdatasyncs it. Any I/O error or foreign change freezes the ledger.
func (l *Ledger) append(r *Record, reserve int64) error {
	r.SchemaID = SchemaOperator
	r.Sequence = l.v.next
	r.PreviousSHA256 = l.v.head
	line, digest, err := l.enc.encode(r)
	if err != nil {
		return err
	}
	r.RecordSHA256 = digest
	if len(line) > MaxRecordBytes {
		return &RuleError{Rule: RuleRecordTooLarge, Sequence: r.Sequence, TransactionID: r.TransactionID,
			Detail: fmt.Sprintf("record is %d bytes, at most %d", len(line), MaxRecordBytes)}
	}
	next, rerr := l.v.check(r, digest)
	if rerr != nil {
		rerr.File = l.segPath()
		return rerr
	}
	startsTxn := l.v.open == nil || l.v.open.terminal
	if startsTxn && l.segSize > 0 && l.segSize+reserve > l.opts.SegmentBytes {
		if err := l.seal(); err != nil {
			return l.freeze(err)
		}
	}
	if l.segSize+int64(len(line))+1 > l.opts.SegmentBytes {
		return &RuleError{Rule: RuleSegmentTooLarge, Sequence: r.Sequence, File: l.segPath(), TransactionID: r.TransactionID,
			Detail: fmt.Sprintf("the record (%d bytes) does not fit the segment (%d of %d bytes used) and a segment is sealed only between transactions", len(line)+1, l.segSize, l.opts.SegmentBytes)}
	}
	if err := l.checkUnchanged(); err != nil {
		return l.freeze(err)
	}
	line = append(line, '\n') // the encoder's buffer, reused
	if err := writeAll(l.segFD, line); err != nil {
		return l.freeze(&IOError{Op: "write", Path: l.segPath(), Err: err})
	}
	// The size is ours from here on, whether or not the sync succeeds: a
	// reopen replays what really is in the file.
	l.segSize += int64(len(line))
	syncStart := time.Now()
	if _, err := retryEINTR(func() (int, error) { return 0, unix.Fdatasync(l.segFD) }); err != nil {
		return l.freeze(&IOError{Op: "fdatasync", Path: l.segPath(), Err: err})
	}
	if l.opts.ObserveSync != nil {
		l.opts.ObserveSync(time.Since(syncStart))
	}
	l.v.apply(r, next)
	return nil
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := retryEINTR(func() (int, error) { return unix.Write(fd, b) })
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("write wrote nothing")
		}
		b = b[n:]
	}
	return nil
}

// checkUnchanged is the size-unchanged check: the segment has exactly the
// bytes this ledger wrote, and the name still refers to it.
func (l *Ledger) checkUnchanged() error {
	var st unix.Stat_t
	if err := unix.Fstat(l.segFD, &st); err != nil {
		return &IOError{Op: "fstat", Path: l.segPath(), Err: err}
	}
	if st.Size != l.segSize {
		return &RuleError{Rule: RuleSizeChanged, Sequence: l.v.next, File: l.segPath(),
			Detail: fmt.Sprintf("the segment is %d bytes, this ledger wrote %d: another writer changed it", st.Size, l.segSize)}
	}
	var lst unix.Stat_t
	err := unix.Fstatat(l.dirfd(), SegmentName(l.segNum), &lst, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return &RuleError{Rule: RuleNotRegularFile, Sequence: l.v.next, File: l.segPath(), Detail: "the segment was removed"}
	case err != nil:
		return &IOError{Op: "lstat", Path: l.segPath(), Err: err}
	case lst.Mode&unix.S_IFMT != unix.S_IFREG:
		return &RuleError{Rule: RuleNotRegularFile, Sequence: l.v.next, File: l.segPath(), Detail: fmt.Sprintf("the segment was replaced by something that is not a regular file (mode %#o)", lst.Mode)}
	case lst.Dev != l.segDev || lst.Ino != l.segIno:
		return &RuleError{Rule: RuleNotRegularFile, Sequence: l.v.next, File: l.segPath(), Detail: "the segment was replaced by another file"}
	}
	return nil
}

// seal closes the current segment for good and starts the next: the sealed
// file is made read-only and fsynced, the next one created, the directory
// fsynced, then segments beyond the retention are removed.
func (l *Ledger) seal() error {
	if err := l.checkUnchanged(); err != nil {
		return err
	}
	path := l.segPath()
	if err := unix.Fchmod(l.segFD, 0o400); err != nil {
		return &IOError{Op: "chmod sealed segment", Path: path, Err: err}
	}
	if err := fsyncFD(l.segFD, path); err != nil {
		return err
	}
	if err := unix.Close(l.segFD); err != nil {
		l.segFD = -1
		return &IOError{Op: "close sealed segment", Path: path, Err: err}
	}
	l.segFD = -1
	if err := l.createSegment(l.segNum + 1); err != nil {
		return err
	}
	l.v.segment = l.segNum
	l.segFirst[l.segNum] = l.v.next
	return l.prune()
}

// prune removes the oldest sealed segments beyond the retention, except one
// that holds a module's last committed transaction (and so everything after
// it, since the chain must stay contiguous).
func (l *Ledger) prune() error {
	removed := false
	for l.segNum-l.first > l.opts.RetainSegments {
		pinned := false
		for _, c := range l.v.committed {
			if c.Kind != KindRetirement && c.Segment <= l.first {
				pinned = true
				break
			}
		}
		if pinned {
			break
		}
		name := SegmentName(l.first)
		if err := unix.Unlinkat(l.dirfd(), name, 0); err != nil {
			return &IOError{Op: "remove retired segment", Path: filepath.Join(l.dir, name), Err: err}
		}
		// Keep the live state equal to what a replay of the retained
		// segments establishes.
		for m, c := range l.v.committed {
			if c.Segment <= l.first {
				delete(l.v.committed, m)
			}
		}
		delete(l.segFirst, l.first)
		l.first++
		l.v.first = l.segFirst[l.first]
		removed = true
	}
	if removed {
		return fsyncFD(l.dirfd(), l.dir)
	}
	return nil
}
