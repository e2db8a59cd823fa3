package verifier

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTheKernelRefusesWhatTheWalkChecks checks the open itself, not the
// lstat walk before it: a symlink swapped in after the walk, or a path
// escaping the root, is refused at open.
func TestTheKernelRefusesWhatTheWalkChecks(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "real")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		dirfd    func() int
		path     string
		beneath  bool
		sentinel error
	}{
		{"a symlinked directory component is refused", func() int { return unix.AT_FDCWD }, filepath.Join(dir, "link", "file"), false, ErrSymlink},
		{"a symlink as the last component is refused", func() int { return unix.AT_FDCWD }, filepath.Join(dir, "link"), false, ErrSymlink},
		{"a path escaping its root is refused", func() int {
			f, err := os.Open(real)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return int(f.Fd())
		}, "../real/file", true, ErrOutsideAllowedRoots},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := openNoSymlinks(tc.dirfd(), tc.path, 0, tc.beneath)
			if err == nil {
				f.Close()
				t.Fatalf("opened %s", tc.path)
			}
			if sentinel, _ := openErrorDetail(tc.path, err); !errors.Is(sentinel, tc.sentinel) {
				t.Fatalf("open error %v maps to %v, want %v", err, sentinel, tc.sentinel)
			}
		})
	}
	f, err := openNoSymlinks(unix.AT_FDCWD, filepath.Join(real, "file"), 0, false)
	if err != nil {
		t.Fatalf("a plain path: %v", err)
	}
	f.Close()
}

// TestCheckNoSymlinksNamesTheLinkAndItsTarget: the CLI's digest commands
// refuse what the verifier refuses, and say where the link points, since
// that is the path a source could name instead.
func TestCheckNoSymlinksNamesTheLinkAndItsTarget(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	realDir := filepath.Join(dir, "real")
	if err := os.Mkdir(realDir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(realDir, "catalog.json")
	if err := os.WriteFile(file, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	fileLink := filepath.Join(realDir, "link.json")
	dirLink := filepath.Join(dir, "dir-link")
	dangling := filepath.Join(dir, "dangling")
	for link, target := range map[string]string{fileLink: "catalog.json", dirLink: realDir, dangling: "nowhere"} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, path, detail string
		sentinel           error
	}{
		{"a regular file reached through no link passes", file, "", nil},
		{"a symlinked file is refused, naming its target", fileLink, fileLink + " is a symlink to " + file, ErrSymlink},
		{"a symlinked directory above the file is refused, naming that component", filepath.Join(dirLink, "catalog.json"), dirLink + " is a symlink to " + realDir, ErrSymlink},
		{"a dangling link is refused with its text", dangling, dangling + " is a symlink to nowhere (which does not resolve)", ErrSymlink},
		{"a missing file is not found", filepath.Join(dir, "absent"), "does not exist", ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckNoSymlinks(tc.path)
			if tc.sentinel == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("got %v, want %v with %q", err, tc.sentinel, tc.detail)
			}
		})
	}
}
