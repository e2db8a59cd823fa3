package spawn

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/pkg/strictjson"
)

// MaxExecutableBytes bounds an executable (docs/security.md).
const MaxExecutableBytes = 256 << 20

// hashBufferBytes is the fixed streaming buffer of every artifact hash.
const hashBufferBytes = 64 << 10

// shebangBytes is how much of a script the kernel reads for its #! line
// (BINPRM_BUF_SIZE).
const shebangBytes = 256

// sealedCopy copies the executable at path into a memfd, seals it (no
// write, grow, shrink or further seal), hashes what the memfd holds, and
// refuses it unless the digest is want. It returns a read-only descriptor
// of the sealed memfd, its size and its first bytes (for the #! check):
// the bytes verified are the bytes that will run, whatever happens to the
// file afterwards.
func sealedCopy(path, want string) (exe *os.File, size int64, head []byte, err error) {
	src, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, nil, &SealError{Verification: true, Detail: "opening the executable: " + err.Error(), Err: err}
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return nil, 0, nil, &SealError{Detail: err.Error(), Err: err}
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, nil, &SealError{Refused: true, Detail: fmt.Sprintf("%s is not a regular file", path)}
	}
	if fi.Size() > MaxExecutableBytes {
		return nil, 0, nil, &SealError{Refused: true, Detail: fmt.Sprintf("%s is %d bytes, more than %d", path, fi.Size(), MaxExecutableBytes)}
	}
	mfd, err := unix.MemfdCreate("iteron-provider", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 6.3 know no MFD_EXEC; their memfds are executable.
		mfd, err = unix.MemfdCreate("iteron-provider", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, 0, nil, &SealError{Detail: "memfd_create: " + err.Error(), Err: err}
	}
	mem := os.NewFile(uintptr(mfd), "iteron-provider")
	defer mem.Close()

	// Copy in the kernel (sendfile: no pass through user memory), seal, and
	// only then hash what the memfd holds: the digest is of the very bytes
	// that will run, and nothing can change them after the seal.
	want64 := fi.Size()
	var copied int64
	for copied < want64 {
		n, err := unix.Sendfile(mfd, int(src.Fd()), nil, int(min(want64-copied, 1<<30)))
		if err != nil && err != unix.EINTR && err != unix.EAGAIN {
			return nil, 0, nil, &SealError{Detail: "copying into the memfd: " + err.Error(), Err: err}
		}
		if n == 0 && err == nil {
			break // the file shrank while being copied: the digest will say so
		}
		copied += int64(n)
	}
	if err := mem.Chmod(0o555); err != nil {
		return nil, 0, nil, &SealError{Detail: "chmod memfd: " + err.Error(), Err: err}
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, seals|unix.F_SEAL_EXEC); err != nil {
		// F_SEAL_EXEC (no later chmod) is 6.3+; the rest is what matters.
		if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			return nil, 0, nil, &SealError{Detail: "sealing the memfd: " + err.Error(), Err: err}
		}
	}
	var got string
	got, head, err = hashSealed(mfd, copied)
	if err != nil {
		return nil, 0, nil, &SealError{Detail: "hashing the memfd: " + err.Error(), Err: err}
	}
	if got != want {
		return nil, 0, nil, &SealError{Refused: true,
			Detail: fmt.Sprintf("artifact digest mismatch: %s hashes to %s, the plan says %s", path, got, want)}
	}
	// Exec refuses a file open for writing (ETXTBSY): hand the child a
	// read-only descriptor of the same sealed memory, and close this one.
	ro, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(mem.Fd())), os.O_RDONLY, 0)
	if err != nil {
		return nil, 0, nil, &SealError{Detail: "reopening the memfd read-only: " + err.Error(), Err: err}
	}
	return ro, copied, head, nil
}

// CheckInterpreter returns the interpreter of a #! script, refusing one that
// is not an absolute, clean path on the allowlist.
func CheckInterpreter(head []byte, allow []string) (string, *SealError) {
	if !bytes.HasPrefix(head, []byte("#!")) {
		return "", nil
	}
	line := head[2:]
	nl := bytes.IndexByte(line, '\n')
	if nl < 0 {
		return "", &SealError{Refused: true,
			Detail: fmt.Sprintf("the #! line is longer than the %d bytes the kernel reads", shebangBytes)}
	}
	line = bytes.TrimLeft(line[:nl], " \t")
	end := bytes.IndexAny(line, " \t")
	if end < 0 {
		end = len(line)
	}
	interp := string(bytes.TrimRight(line[:end], "\r"))
	if interp == "" || !filepath.IsAbs(interp) || filepath.Clean(interp) != interp || !slices.Contains(allow, interp) {
		return "", &SealError{Refused: true,
			Detail: fmt.Sprintf("interpreter %q is not on the allowlist %q", interp, allow)}
	}
	return interp, nil
}

// Rehash hashes the file at path again (after the process started) through
// the fixed buffer and reports whether it still has digest want.
func Rehash(path, want string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("reopening %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, io.LimitReader(f, MaxExecutableBytes+1), make([]byte, hashBufferBytes))
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if n > MaxExecutableBytes {
		return fmt.Errorf("%s grew past %d bytes", path, MaxExecutableBytes)
	}
	if got := strictjson.DigestPrefix + hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s now hashes to %s, verified as %s", path, got, want)
	}
	return nil
}

// hashSealed hashes the first size bytes of a sealed memfd through a
// read-only mapping (no copy), and returns its first bytes for the #!
// check.
func hashSealed(fd int, size int64) (digest string, head []byte, err error) {
	if size == 0 {
		sum := sha256.Sum256(nil)
		return strictjson.DigestPrefix + hex.EncodeToString(sum[:]), nil, nil
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return "", nil, err
	}
	defer unix.Munmap(m)
	h := sha256.New()
	for off := 0; off < len(m); off += hashBufferBytes {
		h.Write(m[off:min(off+hashBufferBytes, len(m))])
	}
	return strictjson.DigestPrefix + hex.EncodeToString(h.Sum(nil)), bytes.Clone(m[:min(len(m), shebangBytes)]), nil
}
