package crash

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lfGroup is one provider process group a manager started on a node, as its
// durable process record named it the moment it appeared.
type lfGroup struct {
	pgid   int
	impl   string
	module string
	seen   time.Time
}

func (g lfGroup) String() string { return fmt.Sprintf("%d(%s)", g.pgid, g.impl) }

// lfGroups watches a node's process-record directory with inotify, so
// that every provider group any manager of the node starts is known, even
// one that lives a few milliseconds (a shadow disposed when its
// shadow_load record could not be written): polling could miss it, the
// kernel's event queue does not.
type lfGroups struct {
	mu     sync.Mutex
	groups []lfGroup
	err    error
}

// lfWatchGroups starts watching <state-dir>/procs (created if needed, as
// the manager creates it) until the test ends.
func lfWatchGroups(t *testing.T, dir string) *lfGroups {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		t.Fatalf("inotify watch %s: %v", dir, err)
	}
	// Non-blocking, so the runtime's poller serves Read and Close ends it.
	f := os.NewFile(uintptr(fd), "inotify:"+dir)
	w := &lfGroups{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) {
					w.mu.Lock()
					w.err = err
					w.mu.Unlock()
				}
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				// struct inotify_event: wd, mask, cookie, len, name[len].
				mask := binary.NativeEndian.Uint32(buf[off+4:])
				size := int(binary.NativeEndian.Uint32(buf[off+12:]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+size], "\x00"))
				off += unix.SizeofInotifyEvent + size
				if mask&unix.IN_Q_OVERFLOW != 0 {
					w.mu.Lock()
					w.err = errors.New("inotify queue overflow: groups may be missing")
					w.mu.Unlock()
				}
				w.record(dir, name)
			}
		}
	}()
	t.Cleanup(func() {
		f.Close()
		<-done
	})
	return w
}

// record notes the group of a record file name "<pid>-<start>.json".
func (w *lfGroups) record(dir, name string) {
	var pid int
	var start uint64
	if !strings.HasSuffix(name, ".json") {
		return
	}
	if _, err := fmt.Sscanf(name, "%d-%d.json", &pid, &start); err != nil {
		return
	}
	g := lfGroup{pgid: pid, seen: time.Now()}
	// The record names the group and the implementation; a group that is
	// already gone took its record with it (its leader's pid is the pgid).
	if data, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
		var r struct {
			PGID             int    `json:"pgid"`
			Module           string `json:"module"`
			ImplementationID string `json:"implementation_id"`
		}
		if json.Unmarshal(data, &r) == nil && r.PGID > 0 {
			g.pgid, g.impl, g.module = r.PGID, r.ImplementationID, r.Module
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, have := range w.groups {
		if have.pgid == g.pgid {
			return
		}
	}
	w.groups = append(w.groups, g)
}

// all is every group seen so far, oldest first.
func (w *lfGroups) all(t *testing.T) []lfGroup {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatalf("watching provider groups: %v", w.err)
	}
	return slices.Clone(w.groups)
}

// live is the groups seen that still have a live process (any member, not
// only the leader), with their members.
func (w *lfGroups) live(t *testing.T) map[int][]int {
	t.Helper()
	out := map[int][]int{}
	for _, g := range w.all(t) {
		if m := groupMembers(g.pgid); len(m) > 0 {
			out[g.pgid] = m
		}
	}
	return out
}

// waitOnly waits (bounded) until the only live groups are want (none when
// want is empty) and reports how long that took; it fails naming every
// group that is left, with its members' command lines.
func (w *lfGroups) waitOnly(t *testing.T, what string, want ...int) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		live := w.live(t)
		ok := len(live) == len(want)
		for _, p := range want {
			if _, in := live[p]; !in {
				ok = false
			}
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > 10*time.Second {
			var b strings.Builder
			for pgid, members := range live {
				fmt.Fprintf(&b, "\n  group %d:", pgid)
				for _, pid := range members {
					cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
					fmt.Fprintf(&b, " %d %q", pid, strings.ReplaceAll(string(cmd), "\x00", " "))
				}
			}
			t.Fatalf("%s: live provider groups %v, want exactly %v; all groups seen %v; left:%s", what, keysOf(live), want, w.all(t), b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func keysOf(m map[int][]int) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
