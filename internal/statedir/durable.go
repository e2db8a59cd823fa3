package statedir

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// TemporarySuffix ends the name of a file WriteFile has not yet renamed
// into place: one left behind was being written when its writer stopped.
const TemporarySuffix = ".tmp"

// IsTemporary says whether a directory entry is a file being written by
// WriteFile (or left behind by one interrupted), not a file of its own.
func IsTemporary(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, TemporarySuffix)
}

// WriteFile replaces path with data durably: the bytes go to a temporary
// file in path's directory, which is fsynced, closed and renamed over path,
// and then the directory is fsynced. A crash at any point leaves either the
// old file or the new one, never a mix; a failed write removes its
// temporary file and leaves the old file as it was. The file has mode perm.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return WriteFileWith(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFileWith is WriteFile with the bytes written by write (buffered),
// for a file encoded as a stream.
func WriteFileWith(path string, perm os.FileMode, write func(io.Writer) error) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".*"+TemporarySuffix)
	if err != nil {
		return err
	}
	name := tmp.Name()
	err = fill(tmp, perm, write)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, path)
	}
	if err != nil {
		os.Remove(name)
		return err
	}
	return SyncDir(dir)
}

func fill(f *os.File, perm os.FileMode, write func(io.Writer) error) error {
	if err := f.Chmod(perm); err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	if err := write(w); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}

// SyncDir fsyncs a directory, so that the entries created, renamed or
// removed in it are durable. Its error is an *os.PathError naming the
// directory.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Remove removes path and makes the removal durable (its directory
// fsynced). A path that does not exist is not an error and syncs nothing.
func Remove(path string) error {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// MkdirAll makes dir (mode 0700) and its missing parents, and makes each
// new entry durable: a directory made here survives a crash with the files
// written into it next.
func MkdirAll(dir string) error {
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if fi, serr := os.Stat(dir); errors.Is(err, os.ErrExist) && serr == nil && fi.IsDir() {
			return nil // made meanwhile by another writer
		}
		return err
	}
	return SyncDir(parent)
}
