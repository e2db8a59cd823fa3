package verifier

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

const (
	// MaxArtifactBytes bounds an executable (256 MiB).
	MaxArtifactBytes = 256 << 20
	// HashBufferBytes is the fixed buffer every artifact is hashed through.
	HashBufferBytes = 64 << 10
)

// hashOpenFile hashes f from its current offset through one fixed 64 KiB
// buffer, failing as soon as more than limit bytes arrive (a file that grows
// while it is read). It returns the "sha256:" digest and the byte count.
func hashOpenFile(f *os.File, limit int64) (string, int64, error) {
	h := sha256.New()
	buf := make([]byte, HashBufferBytes)
	var total int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > limit {
				return "", total, fmt.Errorf("more than %d bytes: %w", limit, ErrTooLarge)
			}
			h.Write(buf[:n])
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", total, err
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), total, nil
}

// ArtifactDigest returns the "sha256:" digest of the regular file at path,
// as the verifier computes it: opened without following a symlink in its
// last component, at most 256 MiB, hashed through a fixed 64 KiB buffer. It
// is what `kubectl iteron digest artifact` prints; the verifier itself also
// refuses symlinks at every component and anything outside the artifact
// root.
func ArtifactDigest(path string) (string, error) {
	f, err := openNoSymlinksLast(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	digest, _, err := hashRegular(f, path)
	return digest, err
}

func openNoSymlinksLast(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s is a symlink: %w", path, ErrSymlink)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// hashFailure is a rejected artifact: a sentinel and the words for it.
type hashFailure struct {
	sentinel error
	detail   string
}

func (h *hashFailure) Error() string { return h.detail }

// Unwrap returns the sentinel, so that errors.Is sees the kind of failure.
func (h *hashFailure) Unwrap() error { return h.sentinel }

// hashRegular checks that the open file is a regular file within the bound,
// then hashes it. Its rejections are *hashFailure.
func hashRegular(f *os.File, path string) (string, int64, error) {
	info, err := f.Stat()
	if err != nil {
		return "", 0, &hashFailure{err, "cannot stat " + path + ": " + err.Error()}
	}
	if !info.Mode().IsRegular() {
		return "", 0, &hashFailure{ErrNotRegularFile, fmt.Sprintf("%s is not a regular file (%s)", path, info.Mode().Type())}
	}
	if info.Size() > MaxArtifactBytes {
		return "", 0, &hashFailure{ErrTooLarge, fmt.Sprintf("%s is %d bytes, over the 256 MiB bound", path, info.Size())}
	}
	digest, n, err := hashOpenFile(f, MaxArtifactBytes)
	if errors.Is(err, ErrTooLarge) {
		return "", n, &hashFailure{ErrTooLarge, fmt.Sprintf("%s grew past the 256 MiB bound while it was read", path)}
	}
	if err != nil {
		return "", n, &hashFailure{err, "cannot read " + path + ": " + err.Error()}
	}
	return digest, n, nil
}
