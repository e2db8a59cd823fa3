package faultfs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/test/faultfs"
)

// Every call the ledger (internal/ledger), the state-dir lock
// (cmd/manager/statedir.go) and the snapshot store make, made through the
// mount, has its effect on the backing directory.
func TestEveryOperationTheLedgerUsesPassesThroughToTheBackingDirectory(t *testing.T) {
	fsys, backing := mount(t)
	mnt := fsys.Mountpoint()

	must(t, os.Mkdir(filepath.Join(mnt, "ledger"), 0o700))
	if st, err := os.Stat(filepath.Join(backing, "ledger")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("mkdir: backing has %v, %v", st, err)
	}
	dirfd, err := unix.Open(filepath.Join(mnt, "ledger"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	must(t, err)
	// The os.File owns the descriptor (its finalizer would close the number
	// again otherwise, whatever it had become by then).
	d := os.NewFile(uintptr(dirfd), "ledger")
	defer d.Close()

	// The ledger creates a segment with O_EXCL and O_APPEND relative to the
	// directory descriptor, then fsyncs the directory.
	seg, err := unix.Openat(dirfd, "ledger-000001.jsonl", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	must(t, err)
	defer unix.Close(seg)
	if _, err := unix.Openat(dirfd, "ledger-000001.jsonl", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o600); err != unix.EEXIST {
		t.Fatalf("second O_EXCL create = %v, want EEXIST", err)
	}
	must(t, unix.Fsync(dirfd))
	for _, line := range []string{"{\"a\":1}\n", "{\"b\":2}\n"} {
		if e := write(t, seg, line); e != 0 {
			t.Fatalf("append: %v", e)
		}
		must(t, unix.Fdatasync(seg))
	}
	must(t, unix.Fsync(seg))
	if got := readFile(t, filepath.Join(backing, "ledger", "ledger-000001.jsonl")); got != "{\"a\":1}\n{\"b\":2}\n" {
		t.Fatalf("backing segment = %q", got)
	}
	var st unix.Stat_t
	must(t, unix.Fstat(seg, &st))
	if st.Size != 16 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Fatalf("fstat through the mount: size %d mode %#o", st.Size, st.Mode)
	}
	must(t, unix.Fstatat(dirfd, "ledger-000001.jsonl", &st, unix.AT_SYMLINK_NOFOLLOW))
	if st.Size != 16 {
		t.Fatalf("fstatat size %d", st.Size)
	}
	buf := make([]byte, 8)
	if n, err := unix.Pread(seg, buf, 8); err != nil || string(buf[:n]) != "{\"b\":2}\n" {
		t.Fatalf("pread = %q, %v", buf[:n], err)
	}
	// A torn tail is truncated; a sealed segment loses its write bit.
	must(t, unix.Ftruncate(seg, 8))
	must(t, unix.Fchmod(seg, 0o400))
	if got := readFile(t, filepath.Join(backing, "ledger", "ledger-000001.jsonl")); got != "{\"a\":1}\n" {
		t.Fatalf("after ftruncate the backing segment = %q", got)
	}
	if st, err := os.Stat(filepath.Join(backing, "ledger", "ledger-000001.jsonl")); err != nil || st.Mode().Perm() != 0o400 {
		t.Fatalf("after fchmod: %v, %v", st, err)
	}

	// listSegments reads the directory, rewinds it and reads it again.
	must(t, os.WriteFile(filepath.Join(mnt, "ledger", "ledger-000002.jsonl"), nil, 0o600))
	first, err := d.ReadDir(-1)
	must(t, err)
	_, err = d.Seek(0, 0)
	must(t, err)
	again, err := d.ReadDir(-1)
	must(t, err)
	names := func(es []os.DirEntry) []string {
		var n []string
		for _, e := range es {
			n = append(n, e.Name())
		}
		slices.Sort(n)
		return n
	}
	want := []string{"ledger-000001.jsonl", "ledger-000002.jsonl"}
	if !slices.Equal(names(first), want) || !slices.Equal(names(again), want) {
		t.Fatalf("readdir = %v, after rewind %v, want %v", names(first), names(again), want)
	}

	// Archive renames with RENAME_NOREPLACE; prune unlinks.
	must(t, os.Mkdir(filepath.Join(mnt, "archive"), 0o700))
	must(t, unix.Renameat2(unix.AT_FDCWD, filepath.Join(mnt, "ledger"), unix.AT_FDCWD, filepath.Join(mnt, "archive", "x-1"), unix.RENAME_NOREPLACE))
	must(t, os.Mkdir(filepath.Join(mnt, "other"), 0o700))
	if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(mnt, "other"), unix.AT_FDCWD, filepath.Join(mnt, "archive", "x-1"), unix.RENAME_NOREPLACE); err != unix.EEXIST {
		t.Fatalf("RENAME_NOREPLACE onto an existing name = %v", err)
	}
	if _, err := os.Stat(filepath.Join(backing, "archive", "x-1", "ledger-000002.jsonl")); err != nil {
		t.Fatalf("rename did not reach the backing directory: %v", err)
	}
	must(t, unix.Unlink(filepath.Join(mnt, "archive", "x-1", "ledger-000002.jsonl")))
	if _, err := os.Stat(filepath.Join(backing, "archive", "x-1", "ledger-000002.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unlink did not reach the backing directory: %v", err)
	}
	must(t, os.Remove(filepath.Join(mnt, "other")))
	must(t, os.RemoveAll(filepath.Join(mnt, "archive")))
	if entries, err := os.ReadDir(backing); err != nil || len(entries) != 0 {
		t.Fatalf("after rmdir and RemoveAll the backing directory holds %v, %v", entries, err)
	}
}

// The snapshot store's temp file, fsync, rename and directory fsync work
// through the mount, and a failed write of a snapshot leaves neither the
// snapshot nor its temporary file.
func TestTheSnapshotStoreWorksThroughTheMountAndAFailedPutLeavesNoFile(t *testing.T) {
	fsys, backing := mount(t)
	store := hotswap.NewSnapshotStore(fsys.Mountpoint())
	const uid = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
	snap := func(n int) hotswap.StoredSnapshot {
		return hotswap.StoredSnapshot{Module: "prompt_system", ImplementationID: "prompt-fast", Lineage: 1,
			Kind: hotswap.SnapshotRollback, TakenUnixMs: int64(1000 + n), State: json.RawMessage(`{"turns":` + strconv.Itoa(n) + `}`)}
	}
	path, err := store.Put(uid, snap(1))
	must(t, err)
	rel, err := filepath.Rel(fsys.Mountpoint(), path)
	must(t, err)
	if _, err := os.Stat(filepath.Join(backing, rel)); err != nil {
		t.Fatalf("the snapshot is not in the backing directory: %v", err)
	}

	fault := fsys.FailWrites(faultfs.Rule{Contains: `"turns":2`, Errno: syscall.ENOSPC})
	if _, err := store.Put(uid, snap(2)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Put with the disk full = %v, want ENOSPC", err)
	}
	if fault.Count() != 1 || !statedir.IsTemporary(filepath.Base(fsys.Failures()[0].Path)) {
		t.Fatalf("the fault fired %d times: %v", fault.Count(), fsys.Failures())
	}
	entries, err := os.ReadDir(filepath.Dir(filepath.Join(backing, rel)))
	must(t, err)
	if len(entries) != 1 || entries[0].Name() != filepath.Base(rel) {
		t.Fatalf("after the failed Put the module's directory holds %v, want only the first snapshot", entries)
	}
	latest, ok, err := store.Latest(uid, "prompt_system")
	if err != nil || !ok || string(latest.State) != `{"turns":1}` {
		t.Fatalf("Latest = %s, %v, %v", latest.State, ok, err)
	}

	_, err = store.Put(uid, snap(3))
	must(t, err)
	must(t, store.Prune(uid, "prompt_system", hotswap.SnapshotRollback, 1))
	all, err := store.List(uid, "prompt_system")
	if err != nil || len(all) != 1 || string(all[0].State) != `{"turns":3}` {
		t.Fatalf("after Prune: %v, %v", all, err)
	}
	must(t, store.RemoveActivation(uid))
	if _, err := os.Stat(filepath.Join(backing, "snapshots", uid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("RemoveActivation left %v", err)
	}
}

// flock through the mount excludes a second descriptor and a second process,
// for files (the state-dir lock) and directories (the ledger's lock).
func TestFlockThroughTheMountExcludesAnotherDescriptorAndAnotherProcess(t *testing.T) {
	fsys, backing := mount(t)
	mnt := fsys.Mountpoint()
	must(t, os.Mkdir(filepath.Join(mnt, "ledger"), 0o700))
	for _, name := range []string{"lock", "ledger"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(mnt, name)
			flags := unix.O_RDONLY | unix.O_CLOEXEC
			if name == "lock" {
				flags = unix.O_RDWR | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC
			}
			holder, err := unix.Open(path, flags, 0o600)
			must(t, err)
			defer func() {
				if holder >= 0 {
					unix.Close(holder)
				}
			}()
			must(t, unix.Flock(holder, unix.LOCK_EX|unix.LOCK_NB))
			if name == "lock" {
				// The manager writes its pid into the lock file it holds.
				must(t, unix.Ftruncate(holder, 0))
				if _, err := unix.Pwrite(holder, []byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
					t.Fatal(err)
				}
				if got := readFile(t, filepath.Join(backing, name)); got != strconv.Itoa(os.Getpid())+"\n" {
					t.Fatalf("the lock file holds %q", got)
				}
			}

			other, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			must(t, err)
			defer unix.Close(other)
			if err := unix.Flock(other, unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
				t.Fatalf("a second descriptor's flock = %v, want EWOULDBLOCK", err)
			}
			if got := runHelper(t, "flock", path); got != strconv.Itoa(int(unix.EWOULDBLOCK)) {
				t.Fatalf("a second process's flock: %q, want errno %d", got, unix.EWOULDBLOCK)
			}
			// The kernel keeps these locks on the mount's inodes: the backing
			// file is not locked.
			if got := runHelper(t, "flock", filepath.Join(backing, name)); got != "0" {
				t.Fatalf("flock of the backing file: %q, want it free", got)
			}

			must(t, unix.Close(holder))
			holder = -1
			must(t, unix.Flock(other, unix.LOCK_EX|unix.LOCK_NB))
			must(t, unix.Flock(other, unix.LOCK_UN))
			if got := runHelper(t, "flock", path); got != "0" {
				t.Fatalf("a second process's flock after the release: %q", got)
			}
		})
	}
}

// A write whose bytes contain the rule's text fails with the rule's errno
// and writes nothing; writes before and after it pass.
func TestAWriteContainingTheChosenBytesFailsWithENOSPCOrEIOAndLeavesTheFileUnchanged(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EIO} {
		t.Run(errno.Error(), func(t *testing.T) {
			fsys, backing := mount(t)
			fd := openAppend(t, filepath.Join(fsys.Mountpoint(), "seg.jsonl"))
			fault := fsys.FailWrites(faultfs.Rule{Contains: `"phase":"snapshot"`, Errno: errno})

			if e := write(t, fd, `{"phase":"quiesce"}`+"\n"); e != 0 {
				t.Fatalf("a write without the bytes failed: %v", e)
			}
			select {
			case <-fault.Fired():
				t.Fatal("the fault fired on a write without its bytes")
			default:
			}
			before := readFile(t, filepath.Join(backing, "seg.jsonl"))
			target := `{"phase":"snapshot","old_state_sha256":"sha256:00"}` + "\n"
			if e := write(t, fd, target); e != errno {
				t.Fatalf("the targeted write returned %v, want %v", e, errno)
			}
			if got := readFile(t, filepath.Join(backing, "seg.jsonl")); got != before {
				t.Fatalf("the failed write changed the file: %q, was %q", got, before)
			}
			var st unix.Stat_t
			must(t, unix.Fstat(fd, &st))
			if st.Size != int64(len(before)) {
				t.Fatalf("size through the mount %d after the failed write, want %d", st.Size, len(before))
			}
			if !fault.WaitFired(0) || fault.Count() != 1 {
				t.Fatalf("fault fired %d times", fault.Count())
			}
			// Once: the rule is spent, the same bytes now pass.
			if e := write(t, fd, target); e != 0 {
				t.Fatalf("the write after a one-shot fault failed: %v", e)
			}
			if got := readFile(t, filepath.Join(backing, "seg.jsonl")); got != before+target {
				t.Fatalf("backing = %q", got)
			}

			fails := fsys.Failures()
			if len(fails) != 1 {
				t.Fatalf("failures = %v", fails)
			}
			f := fails[0]
			if f.Op != faultfs.OpWrite || f.Path != "seg.jsonl" || f.Errno != errno || f.Size != len(target) ||
				string(f.Data) != target || f.PID != uint32(os.Getpid()) || f.Offset != int64(len(before)) {
				t.Fatalf("failure = %+v", f)
			}
			t.Log(f)
		})
	}
}

// Nth counts matching writes only, and fails exactly the Nth.
func TestOnlyTheNthMatchingWriteFails(t *testing.T) {
	fsys, backing := mount(t)
	fd := openAppend(t, filepath.Join(fsys.Mountpoint(), "f"))
	fault := fsys.FailWrites(faultfs.Rule{Contains: "match", Nth: 3, Errno: syscall.ENOSPC})
	var want strings.Builder
	for i := 1; i <= 5; i++ {
		other := "other " + strconv.Itoa(i) + "\n"
		if e := write(t, fd, other); e != 0 {
			t.Fatalf("%q failed: %v", other, e)
		}
		want.WriteString(other)
		line := "match " + strconv.Itoa(i) + "\n"
		e := write(t, fd, line)
		switch {
		case i == 3 && e != syscall.ENOSPC:
			t.Fatalf("the third match returned %v, want ENOSPC", e)
		case i != 3 && e != 0:
			t.Fatalf("match %d failed: %v", i, e)
		case i != 3:
			want.WriteString(line)
		}
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != want.String() {
		t.Fatalf("backing = %q, want %q", got, want.String())
	}
	if fault.Count() != 1 || string(fsys.Failures()[0].Data) != "match 3\n" {
		t.Fatalf("count %d, failures %v", fault.Count(), fsys.Failures())
	}
}

// EveryMatch keeps failing the matching writes, Everything every write,
// until Heal; then writes pass again.
func TestAPersistentRuleKeepsFailingUntilHeal(t *testing.T) {
	t.Run("EveryMatch", func(t *testing.T) {
		fsys, backing := mount(t)
		fd := openAppend(t, filepath.Join(fsys.Mountpoint(), "f"))
		fault := fsys.FailWrites(faultfs.Rule{Contains: "x", Errno: syscall.EIO, Persist: faultfs.EveryMatch})
		for i, c := range []struct {
			data string
			want syscall.Errno
		}{{"a\n", 0}, {"x1\n", syscall.EIO}, {"b\n", 0}, {"x2\n", syscall.EIO}, {"x3\n", syscall.EIO}} {
			if e := write(t, fd, c.data); e != c.want {
				t.Fatalf("write %d %q = %v, want %v", i, c.data, e, c.want)
			}
		}
		fsys.Heal()
		if e := write(t, fd, "x4\n"); e != 0 {
			t.Fatalf("after Heal: %v", e)
		}
		if got := readFile(t, filepath.Join(backing, "f")); got != "a\nb\nx4\n" {
			t.Fatalf("backing = %q", got)
		}
		if fault.Count() != 3 || len(fsys.Failures()) != 3 {
			t.Fatalf("count %d, failures %v", fault.Count(), fsys.Failures())
		}
	})
	t.Run("Everything", func(t *testing.T) {
		fsys, backing := mount(t)
		seg := openAppend(t, filepath.Join(fsys.Mountpoint(), "seg"))
		other := openAppend(t, filepath.Join(fsys.Mountpoint(), "other"))
		fault := fsys.FailWrites(faultfs.Rule{Path: "seg", Contains: "snapshot", Errno: syscall.ENOSPC, Persist: faultfs.Everything})
		if e := write(t, other, "before\n"); e != 0 {
			t.Fatalf("before the disk filled: %v", e)
		}
		if e := write(t, seg, "snapshot\n"); e != syscall.ENOSPC {
			t.Fatalf("the targeted write = %v", e)
		}
		// The disk stays full for every file and every write.
		for _, fd := range []int{seg, other} {
			if e := write(t, fd, "anything\n"); e != syscall.ENOSPC {
				t.Fatalf("a write on the full disk = %v, want ENOSPC", e)
			}
		}
		f, err := os.Create(filepath.Join(fsys.Mountpoint(), "new"))
		must(t, err)
		if _, err := f.WriteString("new\n"); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("a new file's write on the full disk = %v", err)
		}
		// Fsync is another kind of operation: not failed.
		must(t, f.Sync())
		must(t, f.Close())
		fsys.Heal()
		if e := write(t, seg, "snapshot\n"); e != 0 {
			t.Fatalf("after Heal: %v", e)
		}
		if got := readFile(t, filepath.Join(backing, "seg")); got != "snapshot\n" {
			t.Fatalf("seg = %q", got)
		}
		if got := readFile(t, filepath.Join(backing, "other")); got != "before\n" {
			t.Fatalf("other = %q", got)
		}
		if fault.Count() != 4 {
			t.Fatalf("count %d: %v", fault.Count(), fsys.Failures())
		}
	})
}

// A path rule fails writes to the chosen files only: a pattern with "/"
// against the path from the mount root, one without against the base name.
func TestAPathRuleFailsWritesToTheChosenFilesOnly(t *testing.T) {
	fsys, backing := mount(t)
	mnt := fsys.Mountpoint()
	must(t, os.MkdirAll(filepath.Join(mnt, "ledgers", "uid1"), 0o700))
	must(t, os.MkdirAll(filepath.Join(mnt, "snapshots", "uid1"), 0o700))
	fsys.FailWrites(faultfs.Rule{Path: "ledgers/*/ledger-*.jsonl", Errno: syscall.EIO, Persist: faultfs.EveryMatch})
	fsys.FailWrites(faultfs.Rule{Path: "*.tmp", Errno: syscall.ENOSPC, Persist: faultfs.EveryMatch})
	for _, c := range []struct {
		rel  string
		want syscall.Errno
	}{
		{"ledgers/uid1/ledger-000001.jsonl", syscall.EIO},
		{"ledgers/uid1/notes.txt", 0},
		{"ledger-000001.jsonl", 0},
		{"snapshots/uid1/a.tmp", syscall.ENOSPC},
		{"b.tmp", syscall.ENOSPC},
		{"snapshots/uid1/a.json", 0},
	} {
		fd := openAppend(t, filepath.Join(mnt, c.rel))
		if e := write(t, fd, "data\n"); e != c.want {
			t.Errorf("write to %s = %v, want %v", c.rel, e, c.want)
		}
		want := "data\n"
		if c.want != 0 {
			want = ""
		}
		if got := readFile(t, filepath.Join(backing, c.rel)); got != want {
			t.Errorf("%s holds %q, want %q", c.rel, got, want)
		}
	}
}

// An fsync rule fails fsync and fdatasync of the chosen file, and of a
// directory, with its errno; the data written before stays in the file.
func TestAFailedFsyncReturnsEIOToFsyncFdatasyncAndADirectoryFsync(t *testing.T) {
	fsys, backing := mount(t)
	mnt := fsys.Mountpoint()
	must(t, os.Mkdir(filepath.Join(mnt, "d"), 0o700))
	fd := openAppend(t, filepath.Join(mnt, "d", "seg"))
	if e := write(t, fd, "record\n"); e != 0 {
		t.Fatal(e)
	}
	fault := fsys.FailFsyncs(faultfs.Rule{Path: "d/seg", Persist: faultfs.EveryMatch})
	if err := unix.Fdatasync(fd); err != unix.EIO {
		t.Fatalf("fdatasync = %v, want EIO", err)
	}
	if err := unix.Fsync(fd); err != unix.EIO {
		t.Fatalf("fsync = %v, want EIO", err)
	}
	if got := readFile(t, filepath.Join(backing, "d", "seg")); got != "record\n" {
		t.Fatalf("after the failed syncs the file holds %q", got)
	}
	// Another file and the directory are not this rule's.
	other := openAppend(t, filepath.Join(mnt, "d", "other"))
	must(t, unix.Fsync(other))
	dirfd, err := unix.Open(filepath.Join(mnt, "d"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(dirfd)
	must(t, unix.Fsync(dirfd))

	fsys.FailFsyncs(faultfs.Rule{Path: "d", Errno: syscall.ENOSPC})
	if err := unix.Fsync(dirfd); err != unix.ENOSPC {
		t.Fatalf("directory fsync = %v, want ENOSPC", err)
	}
	fsys.Heal()
	must(t, unix.Fdatasync(fd))
	must(t, unix.Fsync(dirfd))

	fails := fsys.Failures()
	if fault.Count() != 2 || len(fails) != 3 {
		t.Fatalf("count %d, failures %v", fault.Count(), fails)
	}
	if f := fails[0]; f.Op != faultfs.OpFsync || f.Path != "d/seg" || !f.Datasync || f.Dir || f.Errno != syscall.EIO {
		t.Fatalf("first failure %+v", f)
	}
	if f := fails[1]; f.Datasync || f.Dir {
		t.Fatalf("second failure %+v", f)
	}
	if f := fails[2]; f.Path != "d" || !f.Dir || f.Errno != syscall.ENOSPC {
		t.Fatalf("third failure %+v", f)
	}
}

// Another process writing through the mount gets the errno from its own
// write(2), and the log names that process: a Go program (the test binary
// as a helper, multi-threaded like the manager) and dd from a shell.
func TestAWriteFromAChildProcessSeesTheErrno(t *testing.T) {
	fsys, backing := mount(t)
	path := filepath.Join(fsys.Mountpoint(), "seg.jsonl")
	must(t, os.WriteFile(path, []byte("first\n"), 0o600))
	fault := fsys.FailWrites(faultfs.Rule{Contains: "snapshot", Errno: syscall.ENOSPC, Persist: faultfs.EveryMatch})

	out := runHelper(t, "append", path, `{"phase":"snapshot"}`)
	pid, errno, _ := strings.Cut(out, " ")
	if errno != strconv.Itoa(int(syscall.ENOSPC)) {
		t.Fatalf("the Go child's write: %q, want errno %d", out, syscall.ENOSPC)
	}
	if fails := fsys.Failures(); len(fails) != 1 || strconv.Itoa(int(fails[0].PID)) != pid {
		t.Fatalf("failures %v, want one from the child, pid %s", fails, pid)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dd := func(line string) (string, error) {
		cmd := exec.CommandContext(ctx, "sh", "-c", `printf '%s\n' "$1" | dd of="$2" oflag=append conv=notrunc status=none`, "sh", line, path)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := dd(`{"phase":"snapshot"}`)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(out, "No space left on device") {
		t.Fatalf("dd's write: %v, output %q; want a failure with ENOSPC", err, out)
	}
	if fault.Count() != 2 {
		t.Fatalf("fault fired %d times", fault.Count())
	}
	if got := readFile(t, filepath.Join(backing, "seg.jsonl")); got != "first\n" {
		t.Fatalf("backing = %q", got)
	}
	if out, err := dd(`{"phase":"migrate"}`); err != nil {
		t.Fatalf("dd's next write: %v %q", err, out)
	}
	if got := readFile(t, filepath.Join(backing, "seg.jsonl")); got != "first\n{\"phase\":\"migrate\"}\n" {
		t.Fatalf("backing = %q", got)
	}
}

// Nothing is cached between the writer and the backing file: a write is in
// the backing file when write(2) returns, and a change made beside the mount
// is seen through it at once (stat, read, and an O_APPEND write lands after
// it).
func TestWritesAndStatsReachTheBackingFileWithoutCaching(t *testing.T) {
	fsys, backing := mount(t)
	path := filepath.Join(fsys.Mountpoint(), "f")
	fd := openAppend(t, path)
	if e := write(t, fd, "one\n"); e != 0 {
		t.Fatal(e)
	}
	// No fsync, no close: the bytes are already in the backing file.
	if got := readFile(t, filepath.Join(backing, "f")); got != "one\n" {
		t.Fatalf("backing right after write(2) = %q", got)
	}

	b, err := os.OpenFile(filepath.Join(backing, "f"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = b.WriteString("beside\n")
	must(t, err)
	must(t, b.Close())
	var st unix.Stat_t
	must(t, unix.Fstat(fd, &st))
	if st.Size != int64(len("one\nbeside\n")) {
		t.Fatalf("fstat through the mount = %d after a change beside it", st.Size)
	}
	if got := readFile(t, path); got != "one\nbeside\n" {
		t.Fatalf("read through the mount = %q", got)
	}
	if e := write(t, fd, "two\n"); e != 0 {
		t.Fatal(e)
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != "one\nbeside\ntwo\n" {
		t.Fatalf("the O_APPEND write did not land at the end: %q", got)
	}

	// A write as large as a snapshot is one request: a rule on its last
	// bytes fails all of it.
	fsys.FailWrites(faultfs.Rule{Contains: "END", Errno: syscall.ENOSPC})
	big := strings.Repeat("s", 600<<10) + "END\n"
	if e := write(t, fd, big); e != syscall.ENOSPC {
		t.Fatalf("a %d-byte write = %v, want ENOSPC", len(big), e)
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != "one\nbeside\ntwo\n" {
		t.Fatalf("the failed large write left %d bytes", len(got))
	}
}

// Unmount with a file still open detaches the mount at once; the open
// descriptor then fails instead of hanging, and a second Unmount is a no-op.
func TestUnmountWithAnOpenFileStillRemovesTheMount(t *testing.T) {
	fsys, backing := mount(t)
	fd := openAppend(t, filepath.Join(fsys.Mountpoint(), "f"))
	if e := write(t, fd, "kept\n"); e != 0 {
		t.Fatal(e)
	}
	start := time.Now()
	must(t, fsys.Unmount())
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Unmount took %v", d)
	}
	if inMountTable(t, fsys.Mountpoint()) {
		t.Fatal("the mount is still in the mount table")
	}
	done := make(chan error, 1)
	go func() {
		_, err := unix.Write(fd, []byte("late\n"))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a write on the unmounted file system succeeded")
		}
		t.Logf("write after Unmount: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("a write after Unmount hangs")
	}
	must(t, fsys.Unmount())
	if got := readFile(t, filepath.Join(backing, "f")); got != "kept\n" {
		t.Fatalf("backing = %q", got)
	}
}

// A mount left behind by a test process that died (go test's timeout kills
// a test binary past its cleanups) is removed by the next Mount.
func TestAMountLeftByADeadProcessIsRemovedByTheNextMount(t *testing.T) {
	faultfs.SkipUnlessSupported(t)
	backing, stale := t.TempDir(), filepath.Join(t.TempDir(), "stale")
	must(t, os.Mkdir(stale, 0o755))
	// If this test fails half-way, do not leave the mount for the next run.
	t.Cleanup(func() { _ = unix.Unmount(stale, unix.MNT_DETACH) })
	cmd, line := startHelper(t, "mount", backing, stale)
	if line != "mounted" {
		t.Fatalf("helper: %q", line)
	}
	if !inMountTable(t, stale) {
		t.Fatal("the helper's mount is not in the mount table")
	}
	must(t, cmd.Process.Kill())
	_ = cmd.Wait()
	if !inMountTable(t, stale) {
		t.Fatal("the dead helper's mount vanished by itself; nothing to test")
	}
	var st unix.Stat_t
	if err := unix.Stat(stale, &st); err != unix.ENOTCONN {
		t.Fatalf("stat of the dead mount = %v, want ENOTCONN", err)
	}

	mount(t)
	if inMountTable(t, stale) {
		t.Fatal("Mount left the dead process's mount in place")
	}
}

// A chosen write reaches the rules even in an unusual shape: pwrite at an
// offset and writev of several buffers.
func TestPwriteAndWritevPassTheRules(t *testing.T) {
	fsys, backing := mount(t)
	path := filepath.Join(fsys.Mountpoint(), "f")
	must(t, os.WriteFile(path, []byte("0123456789"), 0o600))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	fsys.FailWrites(faultfs.Rule{Contains: "BAD", Errno: syscall.EIO, Persist: faultfs.EveryMatch})
	if _, err := unix.Pwrite(fd, []byte("BAD"), 2); err != unix.EIO {
		t.Fatalf("pwrite = %v", err)
	}
	if _, err := unix.Pwritev(fd, [][]byte{[]byte("xB"), []byte("AD")}, 2); err != unix.EIO {
		t.Fatalf("pwritev with the bytes split across buffers = %v", err)
	}
	if _, err := unix.Pwrite(fd, []byte("ok"), 2); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != "01ok456789" {
		t.Fatalf("backing = %q", got)
	}
	if n := len(fsys.Failures()); n != 2 || !bytes.Equal(fsys.Failures()[1].Data, []byte("xBAD")) {
		t.Fatalf("failures %v", fsys.Failures())
	}
}

// copy_file_range (what io.Copy between two files uses) falls back to
// writes the rules see, instead of a server-side copy that would bypass
// them.
func TestACopyBetweenFilesOnTheMountPassesTheRules(t *testing.T) {
	fsys, backing := mount(t)
	src := filepath.Join(fsys.Mountpoint(), "src")
	must(t, os.WriteFile(src, []byte("state {\"turns\":2}\n"), 0o600))
	copyTo := func(name string) error {
		in, err := os.Open(src)
		must(t, err)
		defer in.Close()
		out, err := os.Create(filepath.Join(fsys.Mountpoint(), name))
		must(t, err)
		defer out.Close()
		_, err = io.Copy(out, in)
		return err
	}
	fsys.FailWrites(faultfs.Rule{Contains: "turns", Errno: syscall.ENOSPC})
	if err := copyTo("dst"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("copy with the disk full = %v, want ENOSPC", err)
	}
	if got := readFile(t, filepath.Join(backing, "dst")); got != "" {
		t.Fatalf("the failed copy wrote %q", got)
	}
	must(t, copyTo("dst2"))
	if got := readFile(t, filepath.Join(backing, "dst2")); got != "state {\"turns\":2}\n" {
		t.Fatalf("the copy wrote %q", got)
	}
}

// The kernel splits a write larger than MaxWrite into pieces: a rule that
// matches a later piece fails that piece only, and write(2) returns the
// short count of the pieces before it, which are in the backing file.
func TestAWriteLargerThanMaxWriteIsFailedFromThePieceTheRuleMatches(t *testing.T) {
	fsys, backing := mount(t)
	fd := openAppend(t, filepath.Join(fsys.Mountpoint(), "f"))
	fault := fsys.FailWrites(faultfs.Rule{Contains: "END", Errno: syscall.ENOSPC})
	big := []byte(strings.Repeat("s", faultfs.MaxWrite+faultfs.MaxWrite/2) + "END\n")
	n, err := unix.Write(fd, big)
	if err != nil || n <= 0 || n >= len(big) || fault.Count() != 1 {
		t.Fatalf("write of %d bytes = %d, %v (fault fired %d times); want a short count", len(big), n, err, fault.Count())
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != string(big[:n]) {
		t.Fatalf("the backing file holds %d bytes, want the %d written", len(got), n)
	}
	t.Logf("a %d-byte write wrote %d bytes before the failing piece", len(big), n)
}
