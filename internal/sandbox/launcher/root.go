package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// devices are the device files of the private /dev, bound from the host's.
var devices = []string{"null", "zero", "full", "random", "urandom"}

// DeviceFiles are the private /dev's device files by path (what Landlock
// lets a provider read and write).
func DeviceFiles() []string {
	out := make([]string, len(devices))
	for i, d := range devices {
		out[i] = "/dev/" + d
	}
	return out
}

// attach is a detached copy of a host path, to be attached in the new root.
type attach struct {
	fd   int
	dst  string
	file bool
}

// buildRoot replaces the launcher's root (in its own mount namespace) with
// a tmpfs holding only what r lists: the read-only system paths, the
// artifact root read-only, a private size-bounded /tmp, a private /dev with
// a few device files, a /proc of the new PID namespace and, when given, the
// scratch directory read-write. The tmpfs itself ends read-only.
//
// Every host path is cloned (open_tree) before anything is mounted over
// it, so a source under the directory the new root is built on is still
// reachable; nothing is ever mounted on the host's side (propagation is cut
// first).
func buildRoot(r *Root) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making / a slave: %w", err)
	}
	var (
		attaches []attach
		links    [][2]string // target, link path
	)
	defer func() {
		for _, a := range attaches {
			unix.Close(a.fd)
		}
	}()
	clone := func(src, dst string, recursive, file bool, attr uint64) error {
		flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
		if recursive {
			flags |= unix.AT_RECURSIVE
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, src, flags)
		if err != nil {
			return fmt.Errorf("open_tree %s: %w", src, err)
		}
		attaches = append(attaches, attach{fd: fd, dst: dst, file: file})
		if attr != 0 {
			setFlags := uint(unix.AT_EMPTY_PATH)
			if recursive {
				setFlags |= unix.AT_RECURSIVE
			}
			if err := unix.MountSetattr(fd, "", setFlags, &unix.MountAttr{Attr_set: attr}); err != nil {
				return fmt.Errorf("mount_setattr %s: %w", src, err)
			}
		}
		return nil
	}
	ro := uint64(unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	for _, p := range r.ReadOnly {
		fi, err := os.Lstat(p)
		if err != nil {
			continue // a system path this host does not have
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			links = append(links, [2]string{target, p})
			continue
		}
		if err := clone(p, p, true, !fi.IsDir(), ro); err != nil {
			return err
		}
	}
	if err := clone(r.ArtifactRoot, r.ArtifactRoot, false, false, ro); err != nil {
		return err
	}
	if r.Scratch != "" {
		attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if !r.Exec {
			attr |= unix.MOUNT_ATTR_NOEXEC
		}
		if err := clone(r.Scratch, r.ScratchTarget, false, false, attr); err != nil {
			return err
		}
	}
	for _, d := range devices {
		if err := clone("/dev/"+d, "/dev/"+d, false, true, uint64(unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)); err != nil {
			return err
		}
	}

	// The new root is built on a directory every system has; in this mount
	// namespace only.
	base := "/tmp"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = "/dev"
	}
	if err := unix.Mount("iteron-root", base, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,nr_inodes=4096,mode=755"); err != nil {
		return fmt.Errorf("mounting the root tmpfs: %w", err)
	}
	at := func(p string) string { return filepath.Join(base, p) }
	for _, d := range []string{"/proc", "/tmp", "/dev"} {
		if err := os.MkdirAll(at(d), 0o755); err != nil {
			return err
		}
	}
	tmpFlags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if !r.Exec {
		tmpFlags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("tmp", at("/tmp"), "tmpfs", tmpFlags, "mode=1777,size="+strconv.FormatInt(r.TmpBytes, 10)); err != nil {
		return fmt.Errorf("mounting the private /tmp: %w", err)
	}
	// The private /tmp and /proc first: an artifact root under /tmp (a
	// test's) is attached on top of the private /tmp, not hidden by it.
	if err := unix.Mount("proc", at("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc of the new PID namespace: %w", err)
	}
	for _, l := range links {
		if err := os.MkdirAll(filepath.Dir(at(l[1])), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(l[0], at(l[1])); err != nil {
			return err
		}
	}
	for _, a := range attaches {
		dst := at(a.dst)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if a.file {
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		} else if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.MoveMount(a.fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching %s: %w", a.dst, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, at("/dev/"+name)); err != nil {
			return err
		}
	}
	if err := os.Chdir(base); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}); err != nil {
		return fmt.Errorf("making the root read-only: %w", err)
	}
	return nil
}
