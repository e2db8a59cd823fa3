package spawn

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Sealed is a sealed memfd holding an executable whose bytes hash to
// Digest: the bytes that were verified, which nothing can change any more.
// A manager that hands its providers to a survivor (docs/survivor.md)
// seals the executable itself and passes this descriptor over SCM_RIGHTS,
// never a path; the survivor checks it with OpenSealed and launches it with
// Executor.LaunchSealed.
type Sealed struct {
	f      *os.File // read-only descriptor of the sealed memfd
	size   int64
	head   []byte
	digest string
}

// requiredSeals are the seals a memfd must carry to be run: no write, no
// growth, no shrinking.
const requiredSeals = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK

// SealExecutable copies the executable at path into a sealed memfd while
// hashing what the memfd holds, and refuses it (a *SealError, Refused)
// unless its digest is want.
func SealExecutable(path, want string) (*Sealed, error) {
	f, size, head, err := sealedCopy(path, want)
	if err != nil {
		return nil, err
	}
	return &Sealed{f: f, size: size, head: head, digest: want}, nil
}

// OpenSealed takes a descriptor received from elsewhere (the manager) and
// returns it as a Sealed executable only if it is a memfd sealed against
// write, growth and shrinking, at most MaxExecutableBytes, whose bytes hash
// to want. It takes ownership of f (closed on refusal).
func OpenSealed(f *os.File, want string) (*Sealed, error) {
	refuse := func(why string, err error) (*Sealed, error) {
		f.Close()
		return nil, &SealError{Refused: true, Detail: "the executable handed over: " + why, Err: err}
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return refuse("is not a sealable memfd (F_GET_SEALS: "+err.Error()+"); a path or another file is never run", err)
	}
	if seals&requiredSeals != requiredSeals {
		return refuse(fmt.Sprintf("is a memfd without the seals write, grow and shrink (seals %#x)", seals), nil)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return refuse("fstat: "+err.Error(), err)
	}
	if st.Size > MaxExecutableBytes {
		return refuse(fmt.Sprintf("is %d bytes, more than %d", st.Size, MaxExecutableBytes), nil)
	}
	got, head, err := digestOfSealed(f, st)
	if err != nil {
		return refuse("hashing it: "+err.Error(), err)
	}
	if got != want {
		return refuse(fmt.Sprintf("hashes to %s, the plan says %s", got, want), nil)
	}
	return &Sealed{f: f, size: st.Size, head: head, digest: want}, nil
}

// sealedDigests remembers the digest of each sealed memfd already hashed
// (by device and inode): its bytes can never change, so a memfd handed over
// again (every renewal and relaunch of the same artifact) is not hashed
// again. Bounded; the oldest entries go first.
var sealedDigests = struct {
	sync.Mutex
	m     map[[2]uint64]sealedDigest
	order [][2]uint64
}{m: map[[2]uint64]sealedDigest{}}

type sealedDigest struct {
	digest string
	head   []byte
}

const maxSealedDigests = 256

func digestOfSealed(f *os.File, st unix.Stat_t) (string, []byte, error) {
	key := [2]uint64{st.Dev, st.Ino}
	sealedDigests.Lock()
	d, ok := sealedDigests.m[key]
	sealedDigests.Unlock()
	if ok {
		return d.digest, d.head, nil
	}
	got, head, err := hashSealed(int(f.Fd()), st.Size)
	if err != nil {
		return "", nil, err
	}
	sealedDigests.Lock()
	if _, ok := sealedDigests.m[key]; !ok {
		sealedDigests.m[key] = sealedDigest{got, head}
		sealedDigests.order = append(sealedDigests.order, key)
		for len(sealedDigests.order) > maxSealedDigests {
			delete(sealedDigests.m, sealedDigests.order[0])
			sealedDigests.order = sealedDigests.order[1:]
		}
	}
	sealedDigests.Unlock()
	return got, head, nil
}

// File is the read-only descriptor of the sealed memfd (for SCM_RIGHTS);
// it stays owned by s.
func (s *Sealed) File() *os.File { return s.f }

// Digest is the digest the bytes were checked against.
func (s *Sealed) Digest() string { return s.digest }

// Head is the executable's first bytes (at most 256, what the kernel reads
// for a #! line).
func (s *Sealed) Head() []byte { return s.head }

// Size is the executable's size in bytes.
func (s *Sealed) Size() int64 { return s.size }

// Close closes the descriptor.
func (s *Sealed) Close() error { return s.f.Close() }

// Dup returns a second Sealed sharing the same sealed memory (a fresh
// descriptor the caller closes).
func (s *Sealed) Dup() (*Sealed, error) {
	fd, err := unix.FcntlInt(s.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &Sealed{f: os.NewFile(uintptr(fd), s.f.Name()), size: s.size, head: s.head, digest: s.digest}, nil
}

// SealCache keeps sealed executables by digest, bounded in bytes (least
// recently used first out), so that a renewal or relaunch of an artifact
// already sealed copies and hashes nothing.
type SealCache struct{ c *exeCache }

// NewSealCache returns a cache of at most maxBytes of executables (0 keeps
// none).
func NewSealCache(maxBytes int64) *SealCache { return &SealCache{c: newExeCache(maxBytes)} }

// Len is the number of executables the cache holds.
func (sc *SealCache) Len() int { return sc.c.len() }

// Seal returns a sealed copy of the executable at path with digest want: a
// cached one (a fresh descriptor) or a new one, then kept. The caller closes
// the result.
func (sc *SealCache) Seal(path, want string) (*Sealed, error) {
	return sc.seal(path, want, false, nil)
}

// SealRunnable is Seal for an executable about to run under the #!
// interpreter allowlist interpreters: a new copy whose interpreter is
// refused is closed and never kept, and a cached one is checked again (the
// allowlist may have changed since it was kept).
func (sc *SealCache) SealRunnable(path, want string, interpreters []string) (*Sealed, error) {
	return sc.seal(path, want, true, interpreters)
}

func (sc *SealCache) seal(path, want string, runnable bool, interpreters []string) (*Sealed, error) {
	check := func(s *Sealed) error {
		if !runnable {
			return nil
		}
		if _, err := CheckInterpreter(s.head, interpreters); err != nil {
			s.Close()
			return err
		}
		return nil
	}
	if f, head, ok := sc.c.get(want); ok {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return nil, err
		}
		s := &Sealed{f: f, size: st.Size, head: head, digest: want}
		if err := check(s); err != nil {
			return nil, err
		}
		return s, nil
	}
	s, err := SealExecutable(path, want)
	if err != nil {
		return nil, err
	}
	if err := check(s); err != nil {
		return nil, err
	}
	sc.c.put(want, s.f, s.size, s.head)
	return s, nil
}
