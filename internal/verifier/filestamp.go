package verifier

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// FileStamp is a file a verification read, as it was just before it was
// read: its canonical path, device, inode, size, mtime and ctime. A caller
// that keeps a verification's result (the activation reconciler does, per
// spec) uses it to tell, without reading or hashing anything, whether the
// file may have changed since.
type FileStamp struct {
	// Path is the canonical absolute path that was verified.
	Path string
	key  fileKey
	// racy marks a file changed within racyWindow of its stamp: a second
	// change in the same timestamp tick could keep the same key, so the
	// stamp never vouches for it (digestcache.go, the "racy git" problem).
	racy bool
}

// Unchanged reports whether the file at Path is still the one that was
// verified: reached through no symlink at any component (as the verifier
// requires), a regular file with the same device, inode, size, mtime and
// ctime. Any write, truncation, rename over it or chmod moves its ctime,
// which no unprivileged process can set back. It opens the file and fstat's
// it; nothing is read.
func (s FileStamp) Unchanged() bool {
	if s.racy || s.Path == "" {
		return false
	}
	f, err := openNoSymlinks(unix.AT_FDCWD, s.Path, 0, false)
	if err != nil {
		return false
	}
	defer f.Close()
	k, ok := statKey(f)
	return ok && k == s.key
}

// stampOf is the stamp of the open file f at path, taken before it is read
// (a change while or after it is read then moves the ctime past the stamp).
// A file whose status cannot be had gets a stamp that vouches for nothing.
func stampOf(f *os.File, path string) FileStamp {
	k, ok := statKey(f)
	if !ok {
		return FileStamp{Path: path, racy: true}
	}
	changed := time.Unix(k.ctimeSec, k.ctimeNsec)
	return FileStamp{Path: path, key: k, racy: time.Since(changed) < racyWindow}
}

// RacyWindow is how long after its last change a file's stamp vouches for
// it (FileStamp.Unchanged is false until then): longer than any file
// system's timestamp granularity.
const RacyWindow = racyWindow
