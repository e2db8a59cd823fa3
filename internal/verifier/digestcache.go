package verifier

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// digestCache remembers the digest of executables it hashed, by the file's
// identity and change times, so that verifying the same unchanged artifact
// again (a new spec that keeps most of its sources, a spec with a failing
// source verified again at every reconcile, a relaunch: 28 executables of a
// few MiB each) does not read and hash it again. The activation reconciler
// also keeps a whole verification while its spec and files are unchanged
// (FileStamp).
//
// An entry is trusted only if the file cannot have changed since: the key
// holds the device, inode, size, mtime and ctime (any write, truncation,
// rename over it or chmod moves ctime, which no unprivileged caller can set
// back), the file had the same status before and after it was hashed, and
// its ctime was at least racyWindow old when it was hashed — a file changed
// again within the same timestamp tick would otherwise keep its key (the
// "racy git" problem). A launch never relies on it: the executor seals a
// copy of the executable and checks that copy's digest against the plan.
type digestCache struct {
	mu      sync.Mutex
	entries map[fileKey]string
}

// fileKey identifies one version of a file.
type fileKey struct {
	dev, ino            uint64
	size                int64
	mtimeSec, mtimeNsec int64
	ctimeSec, ctimeNsec int64
}

// digestCacheEntries bounds the cache (one entry per artifact version).
const digestCacheEntries = 4096

// racyWindow is how old a file's last change must be for its digest to be
// remembered (far more than any file system's timestamp granularity).
const racyWindow = 2 * time.Second

func newDigestCache() *digestCache { return &digestCache{entries: map[fileKey]string{}} }

func statKey(f *os.File) (fileKey, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fileKey{}, false
	}
	return fileKey{dev: st.Dev, ino: st.Ino, size: st.Size,
		mtimeSec: st.Mtim.Sec, mtimeNsec: st.Mtim.Nsec, ctimeSec: st.Ctim.Sec, ctimeNsec: st.Ctim.Nsec}, true
}

// digest returns the digest of the open regular file f (path names it in
// errors): remembered when f is unchanged since it was hashed, else hashed
// by hashRegular.
func (c *digestCache) digest(f *os.File, path string) (string, error) {
	before, ok := statKey(f)
	if ok {
		c.mu.Lock()
		d, hit := c.entries[before]
		c.mu.Unlock()
		if hit {
			return d, nil
		}
	}
	d, _, err := hashRegular(f, path)
	if err != nil || !ok {
		return d, err
	}
	after, ok := statKey(f)
	changed := time.Unix(after.ctimeSec, after.ctimeNsec)
	if !ok || after != before || time.Since(changed) < racyWindow {
		return d, nil
	}
	c.mu.Lock()
	if len(c.entries) >= digestCacheEntries {
		clear(c.entries)
	}
	c.entries[before] = d
	c.mu.Unlock()
	return d, nil
}
