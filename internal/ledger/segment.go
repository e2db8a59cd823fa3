package ledger

import (
	"bytes"
	"errors"
	"fmt"
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

// readAll reads the whole file open as fd, at most MaxSegmentBytes.
func readAll(fd int, path string, size int64) ([]byte, error) {
	buf := make([]byte, size, size+1)
	off := 0
	for off < len(buf) {
		n, err := retryEINTR(func() (int, error) { return unix.Pread(fd, buf[off:], int64(off)) })
		if err != nil {
			return nil, &IOError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			// The file shrank while it was read.
			return nil, &RuleError{Rule: RuleSizeChanged, File: path, Detail: fmt.Sprintf("the segment shrank from %d to %d bytes while it was read", size, off)}
		}
		off += n
	}
	var probe [1]byte
	if n, _ := unix.Pread(fd, probe[:], int64(off)); n > 0 {
		return nil, &RuleError{Rule: RuleSizeChanged, File: path, Detail: fmt.Sprintf("the segment grew beyond %d bytes while it was read", size)}
	}
	return buf, nil
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

// segmentReplay feeds one segment's complete lines to v and returns its
// torn tail, if any. fn, when not nil, sees each accepted record.
func segmentReplay(v *validator, h *lineHasher, data []byte, path string, fn func(*Record) error) (*tornTail, int, error) {
	complete := data
	var torn *tornTail
	if nl := bytes.LastIndexByte(data, '\n'); nl+1 < len(data) {
		complete = data[:nl+1]
		tail := data[nl+1:]
		torn = &tornTail{offset: int64(nl + 1), bytes: int64(len(tail)), nul: len(bytes.Trim(tail, "\x00")) == 0}
	}
	var prev *Record
	var cur Record
	line := 0
	for len(complete) > 0 {
		nl := bytes.IndexByte(complete, '\n')
		text := complete[:nl]
		complete = complete[nl+1:]
		line++
		r, span, rerr := parseLine(text, prev)
		if rerr != nil {
			rerr.Sequence, rerr.File, rerr.Line = v.next, path, line
			return nil, line, rerr
		}
		hash := h.digest(text, span)
		next, rerr := v.check(&r, hash)
		if rerr != nil {
			rerr.File, rerr.Line = path, line
			return nil, line, rerr
		}
		v.apply(&r, next)
		if fn != nil {
			if err := fn(&r); err != nil {
				return nil, line, err
			}
		}
		cur = r
		prev = &cur
	}
	return torn, line, nil
}

func (t *tornTail) ruleError(seq uint64, path string, line int) *RuleError {
	what := "an unterminated last line"
	if t.nul {
		what = "a tail of NUL bytes"
	}
	return &RuleError{Rule: RuleTornRecord, Sequence: seq, File: path, Line: line,
		Detail: fmt.Sprintf("%s (%d bytes at offset %d): a record that was being written when the writer stopped; opening the ledger for append truncates it, verify never repairs", what, t.bytes, t.offset)}
}
