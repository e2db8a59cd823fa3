package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Segment files are named ledger-000001.jsonl, ledger-000002.jsonl, …; the
// highest-numbered one is appended to, the others are sealed.
const (
	segmentPrefix = "ledger-"
	segmentSuffix = ".jsonl"
	segmentDigits = 6
	maxSegment    = 999999
)

// SegmentName returns the file name of segment n (n ≥ 1).
func SegmentName(n int) string {
	return fmt.Sprintf("%s%0*d%s", segmentPrefix, segmentDigits, n, segmentSuffix)
}

// parseSegmentName returns n for "ledger-<n, 6 digits>.jsonl".
func parseSegmentName(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, segmentPrefix)
	if !ok {
		return 0, false
	}
	digits, ok = strings.CutSuffix(digits, segmentSuffix)
	if !ok || len(digits) != segmentDigits {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

// listSegments returns the segment numbers in the directory open as dir, in
// order, and checks that they are consecutive and that nothing else is there.
func listSegments(dir *os.File, dirPath string) ([]int, error) {
	entries, err := dir.ReadDir(-1)
	if err != nil {
		return nil, &IOError{Op: "read directory", Path: dirPath, Err: err}
	}
	// ReadDir continues from the last position; rewind for the next caller.
	if _, err := dir.Seek(0, 0); err != nil {
		return nil, &IOError{Op: "rewind directory", Path: dirPath, Err: err}
	}
	var nums []int
	for _, e := range entries {
		n, ok := parseSegmentName(e.Name())
		if !ok {
			return nil, &RuleError{Rule: RuleSegmentLayout, File: filepath.Join(dirPath, e.Name()),
				Detail: fmt.Sprintf("%q is not a segment (%s%0*d%s); a ledger directory holds only segments", e.Name(), segmentPrefix, segmentDigits, 1, segmentSuffix)}
		}
		nums = append(nums, n)
	}
	slices.Sort(nums)
	for i := 1; i < len(nums); i++ {
		if nums[i] != nums[i-1]+1 {
			return nil, &RuleError{Rule: RuleSegmentLayout, File: filepath.Join(dirPath, SegmentName(nums[i])),
				Detail: fmt.Sprintf("segment %d follows segment %d: segments in between are missing", nums[i], nums[i-1])}
		}
	}
	return nums, nil
}

// openFile opens name relative to dirfd without following a symlink and
// without blocking on a FIFO, and checks that it is a regular file of at most
// MaxSegmentBytes.
func openFile(dirfd int, dirPath, name string, flags int) (int, unix.Stat_t, error) {
	path := filepath.Join(dirPath, name)
	var st unix.Stat_t
	fd, err := retryEINTR(func() (int, error) {
		return unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	})
	if errors.Is(err, unix.ELOOP) {
		return -1, st, &RuleError{Rule: RuleNotRegularFile, File: path, Detail: "the segment is a symlink"}
	}
	if err != nil {
		return -1, st, &IOError{Op: "open", Path: path, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, &IOError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, st, &RuleError{Rule: RuleNotRegularFile, File: path, Detail: fmt.Sprintf("the segment is not a regular file (mode %#o)", st.Mode)}
	}
	if st.Size > MaxSegmentBytes {
		unix.Close(fd)
		return -1, st, &RuleError{Rule: RuleSegmentTooLarge, File: path, Detail: fmt.Sprintf("the segment is %d bytes, at most %d", st.Size, MaxSegmentBytes)}
	}
	return fd, st, nil
}

func retryEINTR[T any](f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
}

// tornTail describes bytes after a segment's last newline.
type tornTail struct {
	offset int64 // where the tail starts: the size after truncation
	bytes  int64
	nul    bool // every tail byte is NUL
}

// readChunk is how much of a segment a replay reads at a time: memory stays
// bounded (a chunk and one record) whatever the segment's size.
const readChunk = 1 << 20

// readAtFunc reads like io.ReaderAt; (0, nil) or io.EOF means the end.
type readAtFunc func(p []byte, off int64) (int, error)

// preadAt reads a file descriptor.
func preadAt(fd int) readAtFunc {
	return func(p []byte, off int64) (int, error) {
		return retryEINTR(func() (int, error) { return unix.Pread(fd, p, off) })
	}
}

// segmentStream replays one segment read through readAt, chunk bytes at a
// time, into v. run returns the torn tail (the bytes after the last
// newline), if any, the number of complete lines and the bytes read. buf,
// when long enough, is reused. fn, when not nil, sees each accepted record.
type segmentStream struct {
	v     *validator
	h     *lineHasher
	path  string
	chunk int
	buf   []byte
	fn    func(*Record) error
}

func (ss *segmentStream) run(readAt readAtFunc) (torn *tornTail, lines int, size int64, err error) {
	torn, lines, err = ss.lines(readAt, &size)
	return torn, lines, size, err
}

func (ss *segmentStream) lines(readAt readAtFunc, size *int64) (*tornTail, int, error) {
	if need := ss.chunk + MaxRecordBytes + 1; len(ss.buf) < need {
		ss.buf = make([]byte, need)
	}
	buf := ss.buf
	var (
		pending    int   // bytes of an unterminated line at the front of buf
		droppedNUL int64 // NUL bytes of an overlong unterminated tail, counted, not kept
		pos        int64 // file offset of the next read
		line       int
		prevPlain  uint32
		// Two records alternate, the one being read and the previous one,
		// whose strings the next record shares.
		recs [2]Record
		prev *Record
	)
	for {
		if pos > MaxSegmentBytes {
			return nil, line, &RuleError{Rule: RuleSegmentTooLarge, Sequence: ss.v.next, File: ss.path,
				Detail: fmt.Sprintf("the segment grew beyond %d bytes while it was read", MaxSegmentBytes)}
		}
		n, err := readAt(buf[pending:pending+ss.chunk], pos)
		if n == 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, line, &IOError{Op: "read", Path: ss.path, Err: err}
			}
			break
		}
		pos += int64(n)
		*size = pos
		data := buf[:pending+n]
		start := 0
		for {
			nl := bytes.IndexByte(data[start:], '\n')
			if nl < 0 {
				break
			}
			text := data[start : start+nl]
			start += nl + 1
			line++
			if droppedNUL > 0 {
				return nil, line, &RuleError{Rule: RuleRecordTooLarge, Sequence: ss.v.next, File: ss.path, Line: line,
					Detail: fmt.Sprintf("a line of more than %d bytes starting with NUL bytes", MaxRecordBytes)}
			}
			cur := &recs[line%2]
			span, plain, rerr := parseLine(cur, text, prev, prevPlain)
			if rerr != nil {
				rerr.Sequence, rerr.File, rerr.Line = ss.v.next, ss.path, line
				return nil, line, rerr
			}
			hash := cur.RecordSHA256
			if !ss.h.matches(text, span, hash) {
				hash = ss.h.digest(text, span)
			}
			next, rerr := ss.v.check(cur, hash)
			if rerr != nil {
				rerr.File, rerr.Line = ss.path, line
				return nil, line, rerr
			}
			ss.v.apply(cur, next)
			if ss.fn != nil {
				if err := ss.fn(cur); err != nil {
					return nil, line, err
				}
			}
			prev, prevPlain = cur, plain
		}
		rest := data[start:]
		if len(rest) > MaxRecordBytes {
			if !allNUL(rest) {
				return nil, line, &RuleError{Rule: RuleRecordTooLarge, Sequence: ss.v.next, File: ss.path, Line: line + 1,
					Detail: fmt.Sprintf("a line of more than %d bytes", MaxRecordBytes)}
			}
			// A long run of NULs may be a torn tail; count it, keep nothing.
			droppedNUL += int64(len(rest))
			rest = rest[:0]
		}
		pending = copy(buf, rest)
	}
	if pending == 0 && droppedNUL == 0 {
		return nil, line, nil
	}
	tail := droppedNUL + int64(pending)
	return &tornTail{offset: pos - tail, bytes: tail, nul: allNUL(buf[:pending])}, line, nil
}

func allNUL(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func (t *tornTail) ruleError(seq uint64, path string, line int) *RuleError {
	what := "an unterminated last line"
	if t.nul {
		what = "a tail of NUL bytes"
	}
	return &RuleError{Rule: RuleTornRecord, Sequence: seq, File: path, Line: line,
		Detail: fmt.Sprintf("%s (%d bytes at offset %d): a record that was being written when the writer stopped; opening the ledger for append truncates it, verify never repairs", what, t.bytes, t.offset)}
}
