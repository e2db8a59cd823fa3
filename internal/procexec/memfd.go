package procexec

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

// MaxExecutableBytes bounds an executable (DESIGN §5).
const MaxExecutableBytes = 256 << 20

// hashBufferBytes is the fixed streaming buffer of every artifact hash.
const hashBufferBytes = 64 << 10

// shebangBytes is how much of a script the kernel reads for its #! line
// (BINPRM_BUF_SIZE).
const shebangBytes = 256

// sealedCopy copies the executable at path into a memfd while hashing it,
// refuses it unless its digest is want, checks a #! interpreter against the
// allowlist, then seals the memfd (no write, grow, shrink or further seal)
// and returns a read-only descriptor of it: the bytes verified are the bytes
// that will run, whatever happens to the file afterwards. interpreter is ""
// for a binary.
func sealedCopy(path, want string, interpreters []string) (exe *os.File, interpreter string, err error) {
	src, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "opening the executable: " + err.Error(), Err: err, Reason: ReasonVerificationFailed}
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: err.Error(), Err: err}
	}
	if !fi.Mode().IsRegular() {
		return nil, "", &Fault{Kind: KindRefused, Op: OpSpawn, Detail: fmt.Sprintf("%s is not a regular file", path), Reason: ReasonVerificationFailed}
	}
	if fi.Size() > MaxExecutableBytes {
		return nil, "", &Fault{Kind: KindRefused, Op: OpSpawn, Detail: fmt.Sprintf("%s is %d bytes, more than %d", path, fi.Size(), MaxExecutableBytes), Reason: ReasonVerificationFailed}
	}
	mfd, err := unix.MemfdCreate("iteron-provider", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 6.3 know no MFD_EXEC; their memfds are executable.
		mfd, err = unix.MemfdCreate("iteron-provider", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "memfd_create: " + err.Error(), Err: err}
	}
	mem := os.NewFile(uintptr(mfd), "iteron-provider")
	defer mem.Close()

	h := sha256.New()
	var head []byte
	buf := make([]byte, hashBufferBytes)
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > MaxExecutableBytes {
				return nil, "", &Fault{Kind: KindRefused, Op: OpSpawn, Detail: fmt.Sprintf("%s grew past %d bytes while being copied", path, MaxExecutableBytes), Reason: ReasonVerificationFailed}
			}
			if len(head) < shebangBytes {
				head = append(head, buf[:min(n, shebangBytes-len(head))]...)
			}
			h.Write(buf[:n])
			if _, err := mem.Write(buf[:n]); err != nil {
				return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "copying into the memfd: " + err.Error(), Err: err}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "reading the executable: " + rerr.Error(), Err: rerr}
		}
	}
	got := strictjson.DigestPrefix + hex.EncodeToString(h.Sum(nil))
	if got != want {
		return nil, "", &Fault{Kind: KindRefused, Op: OpSpawn, Reason: ReasonVerificationFailed,
			Detail: fmt.Sprintf("artifact digest mismatch: %s hashes to %s, the plan says %s", path, got, want)}
	}
	interpreter, ferr := checkInterpreter(head, interpreters)
	if ferr != nil {
		return nil, "", ferr
	}
	if err := mem.Chmod(0o555); err != nil {
		return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "chmod memfd: " + err.Error(), Err: err}
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, seals|unix.F_SEAL_EXEC); err != nil {
		// F_SEAL_EXEC (no later chmod) is 6.3+; the rest is what matters.
		if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "sealing the memfd: " + err.Error(), Err: err}
		}
	}
	// Exec refuses a file open for writing (ETXTBSY): hand the child a
	// read-only descriptor of the same sealed memory, and close this one.
	ro, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(mem.Fd())), os.O_RDONLY, 0)
	if err != nil {
		return nil, "", &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "reopening the memfd read-only: " + err.Error(), Err: err}
	}
	return ro, interpreter, nil
}

// checkInterpreter returns the interpreter of a #! script, refusing one that
// is not an absolute, clean path on the allowlist.
func checkInterpreter(head []byte, allow []string) (string, *Fault) {
	if !bytes.HasPrefix(head, []byte("#!")) {
		return "", nil
	}
	line := head[2:]
	nl := bytes.IndexByte(line, '\n')
	if nl < 0 {
		return "", &Fault{Kind: KindRefused, Op: OpSpawn, Reason: ReasonVerificationFailed,
			Detail: fmt.Sprintf("the #! line is longer than the %d bytes the kernel reads", shebangBytes)}
	}
	line = bytes.TrimLeft(line[:nl], " \t")
	end := bytes.IndexAny(line, " \t")
	if end < 0 {
		end = len(line)
	}
	interp := string(bytes.TrimRight(line[:end], "\r"))
	if interp == "" || !filepath.IsAbs(interp) || filepath.Clean(interp) != interp || !slices.Contains(allow, interp) {
		return "", &Fault{Kind: KindRefused, Op: OpSpawn, Reason: ReasonVerificationFailed,
			Detail: fmt.Sprintf("interpreter %q is not on the allowlist %q", interp, allow)}
	}
	return interp, nil
}

// rehash hashes the file at path again (after the process started) through
// the fixed buffer and reports whether it still has digest want.
func rehash(path, want string) error {
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
