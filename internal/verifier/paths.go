package verifier

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/reasons"
)

// checkCanonicalPath is the Go twin of the CRD's CEL path rule, run against
// the same vectors (testdata/path-vectors.json): absolute, filepath.Clean(p)
// == p, no NUL, at most 512 bytes, and not "/" alone.
func checkCanonicalPath(p string) (reason string, ok bool) {
	switch {
	case p == "":
		return "is empty", false
	case len(p) > MaxPathBytes:
		return "is longer than 512 bytes", false
	case strings.IndexByte(p, 0) >= 0:
		return "contains a NUL byte", false
	case !filepath.IsAbs(p):
		return "is not absolute", false
	case p == "/":
		return "is the root directory itself", false
	case filepath.Clean(p) != p:
		return "is not canonical (it cleans to " + filepath.Clean(p) + ")", false
	}
	return "", true
}

// underRoots reports whether canonical path p is one of roots or lies below
// one. Since no component may be a symlink, lexical containment is real
// containment. No roots means no restriction (the offline CLI).
func underRoots(p string, roots []string) bool {
	if len(roots) == 0 {
		return true
	}
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// walkComponents lstat's every component of canonical absolute path p below
// from (a canonical prefix already checked, or "/"), so that the error names
// the exact component that is a symlink, missing, or not a directory. The
// last component is returned as found (its type is the caller's to judge).
func walkComponents(p, from string) (fs.FileInfo, *pathError) {
	cur := from
	rest := strings.TrimPrefix(strings.TrimPrefix(p, from), "/")
	if from == "/" {
		cur = ""
	}
	parts := strings.Split(rest, "/")
	var info fs.FileInfo
	for i, part := range parts {
		cur += "/" + part
		var err error
		info, err = os.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, &pathError{cur, ErrNotFound, cur + " does not exist"}
		case err != nil:
			return nil, &pathError{cur, err, "cannot stat " + cur + ": " + errText(err)}
		case info.Mode()&fs.ModeSymlink != 0:
			return nil, &pathError{cur, ErrSymlink, symlinkDetail(cur)}
		case i < len(parts)-1 && !info.IsDir():
			return nil, &pathError{cur, ErrNotDirectory, cur + " is not a directory"}
		}
	}
	return info, nil
}

// pathError is a failed path check before it is given its field.
type pathError struct {
	path     string
	sentinel error
	detail   string
}

func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// checkEvalSymlinks is the wire format's own test: the path must resolve to
// itself. It backs up the component walk.
func checkEvalSymlinks(p string) *pathError {
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return &pathError{p, ErrNotFound, "cannot resolve " + p + ": " + errText(err)}
	}
	if resolved != p {
		return &pathError{p, ErrSymlink, p + " resolves to " + resolved + " " + PhraseResolvesThroughSymlink}
	}
	return nil
}

// symlinkDetail says that link is a symlink and names what it points at:
// the canonical target when it resolves (that is the path a source could
// name instead), else the link's text as written.
func symlinkDetail(link string) string {
	if target, err := filepath.EvalSymlinks(link); err == nil {
		return link + " " + PhraseSymlinkTo + " " + target
	}
	if text, err := os.Readlink(link); err == nil {
		return link + " " + PhraseSymlinkTo + " " + text + " (which does not resolve)"
	}
	return link + " is a symlink"
}

// CheckNoSymlinks refuses a path the verifier would refuse for a symlink:
// path (made absolute against the working directory) must exist and no
// component of it may be a symlink. The error names the first link and its
// target. The CLI's digest commands use it, so that they never print a
// digest for a catalog or executable the manager will not read.
func CheckNoSymlinks(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if _, pe := walkComponents(abs, "/"); pe != nil {
		return &Error{Code: reasons.VerificationFailed, Detail: pe.detail, Err: pe.sentinel}
	}
	if pe := checkEvalSymlinks(abs); pe != nil {
		return &Error{Code: reasons.VerificationFailed, Detail: pe.detail, Err: pe.sentinel}
	}
	return nil
}

// openNoSymlinks opens path (relative to dirfd, or absolute with
// unix.AT_FDCWD) so that the kernel refuses a symlink at any component
// (openat2 RESOLVE_NO_SYMLINKS) and, with beneath, any escape from dirfd
// (RESOLVE_BENEATH): the check and the open cannot be split by a rename.
// O_NONBLOCK keeps a FIFO swapped in after the walk from blocking the open;
// the caller fstat's the result. On a kernel without openat2 it falls back to
// O_NOFOLLOW, which guards the last component only, behind the walk.
func openNoSymlinks(dirfd int, path string, flags uint64, beneath bool) (*os.File, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	if beneath {
		how.Resolve |= unix.RESOLVE_BENEATH
	}
	fd, err := unix.Openat2(dirfd, path, &how)
	if errors.Is(err, unix.ENOSYS) {
		fd, err = unix.Openat(dirfd, path, int(how.Flags), 0)
	}
	// EAGAIN: a concurrent rename raced a RESOLVE_BENEATH lookup. Retry a
	// few times, never forever.
	for try := 0; try < 8 && (errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN)); try++ {
		fd, err = unix.Openat2(dirfd, path, &how)
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openErrorDetail turns an openat2 failure into words and a sentinel.
func openErrorDetail(path string, err error) (error, string) {
	switch {
	case errors.Is(err, unix.ELOOP):
		return ErrSymlink, path + " contains a symlink (refused by the kernel at open)"
	case errors.Is(err, unix.EXDEV):
		return ErrOutsideAllowedRoots, path + " escapes its root"
	case errors.Is(err, unix.ENOENT):
		return ErrNotFound, path + " does not exist"
	case errors.Is(err, unix.ENOTDIR):
		return ErrNotDirectory, path + " is not a directory"
	}
	return err, "cannot open " + path + ": " + err.Error()
}
