package spawn

import (
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// exeCache keeps sealed memfds by artifact digest. A sealed memfd whose
// content hashed to a digest can never hold other bytes, so any later plan
// with that digest may run it without reading and hashing the file again:
// the bytes verified are still the bytes that run, and the file on disk is
// still re-hashed after every start (tampering is still a fault). This is
// what makes renewals and relaunches of the same artifact cheap. The cache
// is bounded in bytes, least recently used first out.
type exeCache struct {
	mu      sync.Mutex
	max     int64
	size    int64
	entries map[string]*cachedExe
	order   []string // least recently used first
}

type cachedExe struct {
	f    *os.File // read-only descriptor of the sealed memfd
	size int64
	head []byte // the first bytes, for the #! check under the current allowlist
}

func newExeCache(max int64) *exeCache {
	return &exeCache{max: max, entries: map[string]*cachedExe{}}
}

// get returns a fresh descriptor (the caller closes it) of the sealed memfd
// with digest, and its first bytes.
func (c *exeCache) get(digest string) (*os.File, []byte, bool) {
	if c == nil || c.max <= 0 {
		return nil, nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[digest]
	if !ok {
		return nil, nil, false
	}
	fd, err := unix.FcntlInt(e.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, false
	}
	c.touch(digest)
	return os.NewFile(uintptr(fd), e.f.Name()), e.head, true
}

// put keeps a duplicate of f (a sealed memfd of size bytes with digest),
// evicting the least recently used entries to stay within the bound.
func (c *exeCache) put(digest string, f *os.File, size int64, head []byte) {
	if c == nil || c.max <= 0 || size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[digest]; ok {
		c.touch(digest)
		return
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return
	}
	for c.size+size > c.max && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		c.size -= c.entries[old].size
		c.entries[old].f.Close()
		delete(c.entries, old)
	}
	c.entries[digest] = &cachedExe{f: os.NewFile(uintptr(fd), f.Name()), size: size, head: slices.Clone(head)}
	c.order = append(c.order, digest)
	c.size += size
}

func (c *exeCache) touch(digest string) {
	if i := slices.Index(c.order, digest); i >= 0 {
		c.order = append(append(c.order[:i:i], c.order[i+1:]...), digest)
	}
}

// len is the number of cached executables.
func (c *exeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
