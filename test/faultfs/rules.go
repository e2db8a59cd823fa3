package faultfs

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Op is a kind of operation a rule can fail.
type Op string

// The operations rules can fail.
const (
	// OpWrite is a write(2) (or pwrite, writev) to a file.
	OpWrite Op = "write"
	// OpFsync is an fsync(2) or fdatasync(2) of a file or a directory.
	OpFsync Op = "fsync"
)

// Persistence says what a rule does after it first fires.
type Persistence int

const (
	// Once fails one operation; the rule is then spent.
	Once Persistence = iota
	// EveryMatch fails every later operation the rule matches (by Path and
	// Contains; the Nth count no longer applies) until Heal.
	EveryMatch
	// Everything fails every later operation of the rule's kind on the whole
	// file system, matching or not, until Heal: a disk that stays full, a
	// device that stays dead.
	Everything
)

// DataPrefix is how many bytes of a failed write a Failure keeps.
const DataPrefix = 256

// Rule chooses operations to fail. The zero Rule fails the first operation
// of its kind with EIO.
type Rule struct {
	// Path, when set, limits the rule to files whose path relative to the
	// mount root matches this path.Match pattern, e.g.
	// "ledgers/*/ledger-*.jsonl". A pattern without "/" is also matched
	// against the file's base name, so "ledger-*.jsonl" matches a segment in
	// any directory. The path is the file's name at the time of the
	// operation ("" for a file unlinked while open).
	Path string
	// Contains, when set, limits the rule to writes whose bytes contain it,
	// e.g. `"phase":"snapshot"`, which is in the one line the ledger writes
	// for that record. Only for OpWrite.
	Contains string
	// Nth makes the rule fire on the Nth operation it matches (1-based);
	// 0 means the first.
	Nth int
	// Errno is what the operation returns; 0 means EIO. ENOSYS is refused:
	// the kernel would take it to mean "not implemented" and stop sending
	// fsyncs.
	Errno syscall.Errno
	// Persist says what happens after the rule fires; Once by default.
	Persist Persistence
}

// Failure records one operation a rule failed.
type Failure struct {
	// Op is the operation.
	Op Op
	// Path is the file's path relative to the mount root.
	Path string
	// Errno is what the operation returned.
	Errno syscall.Errno
	// Offset is where a write was to start (the kernel's offset; an
	// O_APPEND write starts at the file's end).
	Offset int64
	// Size is how many bytes the write carried.
	Size int
	// Data is the first DataPrefix bytes the write carried.
	Data []byte
	// Datasync reports an fdatasync (rather than an fsync).
	Datasync bool
	// Dir reports an fsync of a directory.
	Dir bool
	// PID is the process that made the call (the kernel names the calling
	// thread; this is its thread group, the process, when it could still be
	// looked up).
	PID uint32
	// At is when it failed.
	At time.Time
}

// String describes the failure for a test log.
func (f Failure) String() string {
	switch f.Op {
	case OpWrite:
		return fmt.Sprintf("write %q (%d bytes at %d, pid %d): %v; data %q", f.Path, f.Size, f.Offset, f.PID, f.Errno, f.Data)
	default:
		what := "fsync"
		if f.Datasync {
			what = "fdatasync"
		}
		if f.Dir {
			what += " of directory"
		}
		return fmt.Sprintf("%s %q (pid %d): %v", what, f.Path, f.PID, f.Errno)
	}
}

// Fault is a rule in force, returned by FailWrites and FailFsyncs to watch
// it fire.
type Fault struct {
	op   Op
	rule Rule
	// The fields below are guarded by the FS's mutex.
	matched int  // matching operations counted towards Nth
	count   int  // operations failed
	tripped bool // has fired (EveryMatch, Everything keep failing)
	spent   bool // fires no more (Once after firing, or healed)
	fired   chan struct{}
	fsys    *FS
}

// Fired is closed when the rule first fails an operation.
func (f *Fault) Fired() <-chan struct{} { return f.fired }

// Count is how many operations the rule has failed.
func (f *Fault) Count() int {
	f.fsys.mu.Lock()
	defer f.fsys.mu.Unlock()
	return f.count
}

// WaitFired waits up to timeout for the rule to fire and reports whether it
// did.
func (f *Fault) WaitFired(timeout time.Duration) bool {
	// Fired first: with both ready, select would choose at random.
	select {
	case <-f.fired:
		return true
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.fired:
		return true
	case <-t.C:
		return false
	}
}

// Remove takes this rule out of force; the others stay.
func (f *Fault) Remove() {
	f.fsys.mu.Lock()
	defer f.fsys.mu.Unlock()
	f.spent = true
}

// FailWrites puts a rule for writes in force and returns it. Rules are
// checked in the order they were added; the first that fires fails the
// write, and rules after it do not count that write. It panics on a rule
// that could never be right (a negative Nth, ENOSYS).
func (fsys *FS) FailWrites(r Rule) *Fault { return fsys.add(OpWrite, r) }

// FailFsyncs puts a rule for fsync and fdatasync (of files and directories)
// in force and returns it. Contains must be empty: an fsync carries no bytes.
func (fsys *FS) FailFsyncs(r Rule) *Fault {
	if r.Contains != "" {
		panic("faultfs: Rule.Contains applies to writes only")
	}
	return fsys.add(OpFsync, r)
}

func (fsys *FS) add(op Op, r Rule) *Fault {
	if r.Nth < 0 {
		panic(fmt.Sprintf("faultfs: Rule.Nth %d is negative", r.Nth))
	}
	if r.Errno == syscall.ENOSYS {
		panic("faultfs: ENOSYS would make the kernel stop sending the operation")
	}
	if r.Errno == 0 {
		r.Errno = syscall.EIO
	}
	if r.Path != "" {
		if _, err := path.Match(r.Path, ""); err != nil {
			panic(fmt.Sprintf("faultfs: Rule.Path %q: %v", r.Path, err))
		}
	}
	f := &Fault{op: op, rule: r, fired: make(chan struct{}), fsys: fsys}
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	fsys.rules = append(fsys.rules, f)
	return f
}

// Heal takes every rule out of force: the disk has room again. The log of
// failures is kept.
func (fsys *FS) Heal() {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	for _, f := range fsys.rules {
		f.spent = true
	}
	fsys.rules = nil
}

// Failures returns every operation a rule has failed, oldest first.
func (fsys *FS) Failures() []Failure {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	out := make([]Failure, len(fsys.failures))
	copy(out, fsys.failures)
	return out
}

// opInfo describes one operation for the rules.
type opInfo struct {
	op       Op
	path     string
	data     []byte // writes
	size     int
	offset   int64
	datasync bool
	dir      bool
	pid      uint32
}

func (r *Rule) matches(o *opInfo) bool {
	if r.Path != "" && !matchPath(r.Path, o.path) {
		return false
	}
	return r.Contains == "" || bytes.Contains(o.data, []byte(r.Contains))
}

func matchPath(pattern, p string) bool {
	if ok, _ := path.Match(pattern, p); ok {
		return true
	}
	if !strings.Contains(pattern, "/") {
		ok, _ := path.Match(pattern, path.Base(p))
		return ok && p != ""
	}
	return false
}

// decide runs the rules over one operation and returns the errno to fail it
// with, or 0 to pass it through. It runs before the backing file is touched.
func (fsys *FS) decide(o *opInfo) syscall.Errno {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	for _, f := range fsys.rules {
		if f.op != o.op || f.spent {
			continue
		}
		switch {
		case f.tripped && f.rule.Persist == Everything:
		case !f.rule.matches(o):
			continue
		case f.tripped:
		default:
			f.matched++
			if f.matched < max(f.rule.Nth, 1) {
				continue
			}
		}
		return fsys.fire(f, o)
	}
	return 0
}

// fire fails o by f; fs.mu is held.
func (fsys *FS) fire(f *Fault, o *opInfo) syscall.Errno {
	f.count++
	if !f.tripped {
		f.tripped = true
		close(f.fired)
	}
	if f.rule.Persist == Once {
		f.spent = true
	}
	fl := Failure{Op: o.op, Path: o.path, Errno: f.rule.Errno, Offset: o.offset, Size: o.size,
		Datasync: o.datasync, Dir: o.dir, PID: processOf(o.pid), At: time.Now()}
	if o.op == OpWrite {
		fl.Data = bytes.Clone(o.data[:min(len(o.data), DataPrefix)])
	}
	fsys.failures = append(fsys.failures, fl)
	return f.rule.Errno
}

// processOf returns the process (thread group) of thread tid, or tid when it
// is gone.
func processOf(tid uint32) uint32 {
	data, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return tid
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
				return uint32(n)
			}
		}
	}
	return tid
}
