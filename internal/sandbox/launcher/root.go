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

// rootBuilder is a private root under construction. It is built on /dev
// of the launcher's own mount namespace (a directory every system has and
// under which no artifact root lies), so that the host's paths stay in
// sight until the launch attaches its own and pivots.
type rootBuilder struct {
	base string
}

// attach is a detached copy of a host path, to be attached in the new root.
type attach struct {
	fd   int
	dst  string
	file bool
}

// clone copies src (recursively) as a detached mount with attr set.
func clone(src, dst string, recursive, file bool, attr uint64) (attach, error) {
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, flags)
	if err != nil {
		return attach{}, fmt.Errorf("open_tree %s: %w", src, err)
	}
	if attr != 0 {
		setFlags := uint(unix.AT_EMPTY_PATH)
		if recursive {
			setFlags |= unix.AT_RECURSIVE
		}
		if err := unix.MountSetattr(fd, "", setFlags, &unix.MountAttr{Attr_set: attr}); err != nil {
			unix.Close(fd)
			return attach{}, fmt.Errorf("mount_setattr %s: %w", src, err)
		}
	}
	return attach{fd: fd, dst: dst, file: file}, nil
}

const roAttr = uint64(unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)

// cloneReadOnly clones the node paths readOnly (a symlink is kept as a
// symlink; a missing path is skipped).
func cloneReadOnly(readOnly []string) (attaches []attach, links [][2]string, err error) {
	for _, p := range readOnly {
		fi, err := os.Lstat(p)
		if err != nil {
			continue // a path this host does not have
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return attaches, links, err
			}
			links = append(links, [2]string{target, p})
			continue
		}
		a, err := clone(p, p, true, !fi.IsDir(), roAttr)
		if err != nil {
			return attaches, links, err
		}
		attaches = append(attaches, a)
	}
	return attaches, links, nil
}

// prepareRoot starts the private root: the node's paths readOnly, a
// private /dev and a /proc of the launcher's PID namespace, on a tmpfs
// mounted over /dev in this mount namespace only (propagation is cut
// first: nothing is ever mounted on the host's side).
func prepareRoot(readOnly []string) (*rootBuilder, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return nil, fmt.Errorf("making / a slave: %w", err)
	}
	attaches, links, err := cloneReadOnly(readOnly)
	defer func() {
		for _, a := range attaches {
			unix.Close(a.fd)
		}
	}()
	if err != nil {
		return nil, err
	}
	for _, d := range devices {
		a, err := clone("/dev/"+d, "/dev/"+d, false, true, uint64(unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC))
		if err != nil {
			return nil, err
		}
		attaches = append(attaches, a)
	}
	r := &rootBuilder{base: "/dev"}
	if err := unix.Mount("iteron-root", r.base, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,nr_inodes=4096,mode=755"); err != nil {
		return nil, fmt.Errorf("mounting the root tmpfs: %w", err)
	}
	for _, d := range []string{"/proc", "/tmp", "/dev"} {
		if err := os.MkdirAll(r.at(d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := unix.Mount("proc", r.at("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mounting /proc of the new PID namespace: %w", err)
	}
	if err := r.link(links); err != nil {
		return nil, err
	}
	if err := r.attach(attaches); err != nil {
		return nil, err
	}
	attaches = nil
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, r.at("/dev/"+name)); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *rootBuilder) at(p string) string { return filepath.Join(r.base, p) }

func (r *rootBuilder) link(links [][2]string) error {
	for _, l := range links {
		if err := os.MkdirAll(filepath.Dir(r.at(l[1])), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(l[0], r.at(l[1])); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

// attach attaches detached copies in the new root (and closes them).
func (r *rootBuilder) attach(attaches []attach) error {
	defer func() {
		for _, a := range attaches {
			unix.Close(a.fd)
		}
	}()
	for _, a := range attaches {
		dst := r.at(a.dst)
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
	return nil
}

// finish adds the launch's part of the root — its private, size-bounded
// /tmp, its artifact root read-only, its scratch directory read-write, the
// node paths only it needs — pivots into the root and makes it read-only.
func (r *rootBuilder) finish(c *Root) error {
	attaches, links, err := cloneReadOnly(c.ReadOnly)
	if err != nil {
		return err
	}
	a, err := clone(c.ArtifactRoot, c.ArtifactRoot, false, false, roAttr)
	if err != nil {
		return err
	}
	attaches = append(attaches, a)
	if c.Scratch != "" {
		attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if !c.Exec {
			attr |= unix.MOUNT_ATTR_NOEXEC
		}
		a, err := clone(c.Scratch, c.ScratchTarget, false, false, attr)
		if err != nil {
			return err
		}
		attaches = append(attaches, a)
	}
	// The private /tmp first: an artifact root under /tmp (a test's) is
	// attached on top of it, not hidden by it.
	tmpFlags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if !c.Exec {
		tmpFlags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("tmp", r.at("/tmp"), "tmpfs", tmpFlags, "mode=1777,size="+strconv.FormatInt(c.TmpBytes, 10)); err != nil {
		return fmt.Errorf("mounting the private /tmp: %w", err)
	}
	if err := r.link(links); err != nil {
		return err
	}
	if err := r.attach(attaches); err != nil {
		return err
	}
	if err := os.Chdir(r.base); err != nil {
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
