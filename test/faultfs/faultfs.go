package faultfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// MaxWrite is the largest write the kernel sends as one request (it splits
// a larger write(2)); 1 MiB is the kernel's default cap (256 pages).
const MaxWrite = 1 << 20

// DebugEnv, set to anything in the environment of the test process, makes
// every mount log each FUSE request and reply.
const DebugEnv = "FAULTFS_DEBUG"

// fsType is the mount's type ("fuse." + fsType in the mount table); the
// source names the mounting process, so a stale mount can be told from a
// live one.
const fsType = "faultfs"

// Bounds on waiting for the kernel and the server: a test never waits on a
// FUSE server without one.
const (
	mountTimeout = 10 * time.Second
	stopTimeout  = 10 * time.Second
)

// FS is a mounted fault-injecting file system.
type FS struct {
	backing    string
	mountpoint string
	conn       uint32 // the FUSE connection's number (the mount's minor device)
	server     *fuse.Server
	served     chan struct{} // closed when the server's Serve returns

	mu       sync.Mutex
	rules    []*Fault
	failures []Failure

	unmountOnce sync.Once
	unmountErr  error
}

// Supported reports why FUSE cannot be mounted here: no /dev/fuse, or not
// root (there is no fusermount helper; the mount is made with mount(2)
// directly, which needs CAP_SYS_ADMIN). Nil means Mount should work.
func Supported() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("faultfs: no FUSE device: %w", err)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("faultfs: mounting FUSE with mount(2) needs root; running as uid %d", os.Geteuid())
	}
	return nil
}

// RequireEnv, set to 1 (.ci/run does), turns SkipUnlessSupported's skip
// into a failure: where the FUSE tests must run, a machine that cannot run
// them fails loudly instead of passing without them.
const RequireEnv = "ITERON_REQUIRE_FUSE"

// SkipUnlessSupported skips t when Supported reports FUSE cannot be used
// here, saying why — or, with ITERON_REQUIRE_FUSE=1, fails it.
func SkipUnlessSupported(t testing.TB) {
	t.Helper()
	err := Supported()
	switch {
	case err == nil:
	case os.Getenv(RequireEnv) == "1":
		t.Fatalf("%v; %s=1 requires the FUSE tests to run here", err, RequireEnv)
	default:
		t.Skipf("%v (%s=1 makes this a failure)", err, RequireEnv)
	}
}

// ForTest mounts a faultfs of backing on a fresh directory under
// t.TempDir() and unmounts it in t.Cleanup (which runs when the test fails
// too). It skips the test when FUSE cannot be used (SkipUnlessSupported),
// and fails it when the mount fails anyway.
func ForTest(t testing.TB, backing string) *FS {
	t.Helper()
	SkipUnlessSupported(t)
	// The mount point's TempDir cleanup was registered first, so it runs
	// after the unmount.
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Mount(backing, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("faultfs: %v", err)
		}
	})
	return f
}

// Over makes dir (creating it) a faultfs mount over a fresh backing
// directory under t.TempDir(), for a test that needs one directory of a
// tree on a failing file system (a state dir's ledgers): what the test
// writes there lands in the backing directory until a rule says otherwise.
// It skips the test when FUSE cannot be used (SkipUnlessSupported), and
// unmounts in t.Cleanup — after the cleanups registered later (a manager
// that writes there), since cleanups run last-in first-out.
func Over(t testing.TB, dir string) *FS {
	t.Helper()
	SkipUnlessSupported(t)
	backing := filepath.Join(t.TempDir(), "backing")
	for _, d := range []string{backing, dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Mount(backing, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("faultfs: unmount %s: %v", dir, err)
		}
	})
	return f
}

// Mount mounts a faultfs at mountpoint (an existing directory) that passes
// everything through to backing (an existing directory) until a rule says
// otherwise. It first removes mounts of faultfs left by test processes that
// died without unmounting. Call Unmount when done, from t.Cleanup (or use
// ForTest).
func Mount(backing, mountpoint string) (*FS, error) {
	if err := Supported(); err != nil {
		return nil, err
	}
	var err error
	if backing, err = filepath.Abs(backing); err != nil {
		return nil, err
	}
	if mountpoint, err = filepath.Abs(mountpoint); err != nil {
		return nil, err
	}
	if st, err := os.Stat(backing); err != nil {
		return nil, fmt.Errorf("faultfs: backing directory: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("faultfs: backing %s is not a directory", backing)
	}
	removeStaleMounts()

	fsys := &FS{backing: backing, mountpoint: mountpoint, served: make(chan struct{})}
	loop, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("faultfs: %w", err)
	}
	ln := loop.(*fs.LoopbackNode)
	root := &node{LoopbackNode: ln, fsys: fsys}
	ln.RootData.RootNode = root
	// Zero timeouts: every lookup and stat asks the server, which asks the
	// backing directory, so nothing the kernel remembers can disagree with
	// it (the ledger compares fstat's size with what it wrote).
	var zero time.Duration
	opts := &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			// mount(2) directly: there is no fusermount helper on these
			// machines, and a fallback to it would only hide mount(2)'s own
			// error behind "fusermount not found".
			DirectMountStrict: true,
			Name:              fsType,
			FsName:            fsType + ":" + strconv.Itoa(os.Getpid()),
			MaxWrite:          MaxWrite,
			// With FUSE passthrough the kernel would read and write the
			// backing file itself; the file handles do not offer it either.
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
			// Splicing a 1 MiB read needs a pipe larger than the default
			// pipe-max-size; go-fuse would log and fall back on every one.
			DisableSplice: true,
			Debug:         os.Getenv(DebugEnv) != "",
		},
	}
	server, err := fuse.NewServer(fs.NewNodeFS(root, opts), mountpoint, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("faultfs: mount %s on %s: %w", backing, mountpoint, err)
	}
	fsys.server = server
	go func() {
		server.Serve()
		close(fsys.served)
	}()
	mounted := make(chan error, 1)
	go func() { mounted <- server.WaitMount() }()
	select {
	case err = <-mounted:
	case <-time.After(mountTimeout):
		err = fmt.Errorf("the server did not answer the kernel's first requests in %v", mountTimeout)
	}
	if err == nil {
		var st unix.Stat_t
		if err = unix.Stat(mountpoint, &st); err == nil {
			if unix.Major(st.Dev) != 0 {
				err = fmt.Errorf("mount point device %d:%d is not a FUSE connection", unix.Major(st.Dev), unix.Minor(st.Dev))
			}
			fsys.conn = unix.Minor(st.Dev)
		}
	}
	if err != nil {
		uerr := fsys.Unmount()
		return nil, errors.Join(fmt.Errorf("faultfs: mount %s on %s: %w", backing, mountpoint, err), uerr)
	}
	return fsys, nil
}

// Mountpoint is where the file system is mounted: give it to the process
// under test.
func (fsys *FS) Mountpoint() string { return fsys.mountpoint }

// Backing is the backing directory: inspect the result there.
func (fsys *FS) Backing() string { return fsys.backing }

// Unmount removes the mount. When something still uses it (an open
// descriptor, a working directory, a caller stuck in a request), it detaches
// it lazily and aborts the FUSE connection: a descriptor still open then
// fails with ENOTCONN, nothing can wait on the server any more, and the
// server stops. Every wait is bounded. It is idempotent: later calls return
// the first call's result. An error means the mount may still be there.
func (fsys *FS) Unmount() error {
	fsys.unmountOnce.Do(func() { fsys.unmountErr = fsys.unmount() })
	return fsys.unmountErr
}

func (fsys *FS) unmount() error {
	err := unix.Unmount(fsys.mountpoint, 0)
	if err == nil {
		return fsys.waitServed(stopTimeout)
	}
	// EBUSY: something uses the mount. EINVAL: it is no longer a mount point
	// (someone unmounted it); the connection may still be alive through
	// descriptors opened before, so it is aborted all the same.
	if derr := unix.Unmount(fsys.mountpoint, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) && !errors.Is(derr, unix.ENOENT) {
		return fmt.Errorf("faultfs: unmount %s: %v; lazy unmount: %w", fsys.mountpoint, err, derr)
	}
	if fsys.conn == 0 {
		// The mount failed before the connection was known: the server saw
		// no requests to wait on.
		return fsys.waitServed(time.Second)
	}
	if aerr := abortConnection(fsys.conn); aerr != nil {
		// Detached but not aborted: the server serves the descriptors still
		// open until they are closed. The mount itself is gone.
		return nil
	}
	return fsys.waitServed(stopTimeout)
}

func (fsys *FS) waitServed(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-fsys.served:
		return nil
	case <-t.C:
		if mounted(fsys.mountpoint) {
			return fmt.Errorf("faultfs: %s is still mounted and its server did not stop in %v", fsys.mountpoint, timeout)
		}
		return nil
	}
}

// abortConnection aborts FUSE connection conn through the fusectl file
// system: every request then fails and the server's reads return ENODEV.
// fusectl is mounted on a temporary directory when it is not at its usual
// place.
func abortConnection(conn uint32) error {
	name := strconv.FormatUint(uint64(conn), 10)
	ctl := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(ctl, name)); err != nil {
		dir, err := os.MkdirTemp("", "faultfs-fusectl-")
		if err != nil {
			return err
		}
		defer os.Remove(dir)
		if err := unix.Mount("fusectl", dir, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mount fusectl: %w", err)
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		ctl = dir
	}
	err := os.WriteFile(filepath.Join(ctl, name, "abort"), []byte("1"), 0)
	if errors.Is(err, os.ErrNotExist) {
		// The connection ended on its own meanwhile.
		return nil
	}
	return err
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	mountpoint, fstype, source string
}

func mountTable() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "36 35 98:0 /root /mnt opts [optional fields] - fstype source superopts"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 2 {
			continue
		}
		out = append(out, mountEntry{mountpoint: unescapeMountinfo(a[4]), fstype: b[0], source: unescapeMountinfo(b[1])})
	}
	return out
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mounted(mountpoint string) bool {
	for _, m := range mountTable() {
		if m.mountpoint == mountpoint {
			return true
		}
	}
	return false
}

// removeStaleMounts detaches faultfs mounts whose process has died: a test
// binary killed by go test's timeout never ran its cleanups. A mount is
// taken for stale only when its process is gone and the mount answers
// ENOTCONN (its connection died with the process), so a live mount of
// another process is never touched.
func removeStaleMounts() {
	for _, m := range mountTable() {
		if m.fstype != "fuse."+fsType {
			continue
		}
		pidText, ok := strings.CutPrefix(m.source, fsType+":")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
			continue
		}
		// A dead connection answers at once; a stat that hangs would mean a
		// live server after all, and is left behind.
		dead := make(chan bool, 1)
		go func() {
			var st unix.Stat_t
			dead <- errors.Is(unix.Stat(m.mountpoint, &st), unix.ENOTCONN)
		}()
		select {
		case d := <-dead:
			if d {
				_ = unix.Unmount(m.mountpoint, unix.MNT_DETACH)
			}
		case <-time.After(2 * time.Second):
		}
	}
}
