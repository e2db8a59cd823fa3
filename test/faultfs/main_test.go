package faultfs_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/test/faultfs"
)

// helperEnv makes the test binary a child helper instead of running tests:
// a second process for flock, for an append, and for a mount left behind by
// a dead process.
const helperEnv = "FAULTFS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "flock":
		os.Exit(helperFlock(os.Args[len(os.Args)-1]))
	case "append":
		os.Exit(helperAppend(os.Args[len(os.Args)-2], os.Args[len(os.Args)-1]))
	case "mount":
		os.Exit(helperMount(os.Args[len(os.Args)-2], os.Args[len(os.Args)-1]))
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// helperFlock tries a non-blocking exclusive flock on path and prints the
// errno ("0" when it got the lock).
func helperFlock(path string) int {
	f, err := os.Open(path)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		fmt.Println(err)
		return 1
	}
	fmt.Println(int(errno))
	return 0
}

// helperAppend appends line to path with one write(2), as the ledger does,
// and prints its pid and the write's errno ("0" when it wrote).
func helperAppend(path, line string) int {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(line+"\n"))
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		fmt.Println(err)
		return 1
	}
	fmt.Println(os.Getpid(), int(errno))
	return 0
}

// helperMount mounts backing on mnt, says so, and waits to be killed
// without unmounting, as a test binary killed by go test's timeout would.
func helperMount(backing, mnt string) int {
	if _, err := faultfs.Mount(backing, mnt); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("mounted")
	time.Sleep(time.Minute)
	return 1
}

// runHelper runs the test binary as helper mode with args and returns its
// first line of output, bounded in time.
func runHelper(t *testing.T, mode string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper %s %v: %v\n%s", mode, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// startHelper starts a long-running helper and waits (bounded) for its
// first line.
func startHelper(t *testing.T, mode string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		return cmd, l
	case <-time.After(20 * time.Second):
		t.Fatalf("helper %s said nothing in 20s", mode)
		return nil, ""
	}
}

// mount mounts a fresh backing directory and returns the file system and
// the backing directory.
func mount(t *testing.T) (*faultfs.FS, string) {
	t.Helper()
	backing := filepath.Join(t.TempDir(), "backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	return faultfs.ForTest(t, backing), backing
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return string(b)
}

// openAppend opens path as the ledger opens a segment for append.
func openAppend(t testing.TB, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	must(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// write is one write(2) and its errno (0 when it wrote everything).
func write(t testing.TB, fd int, s string) syscall.Errno {
	t.Helper()
	n, err := unix.Write(fd, []byte(s))
	if err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			t.Fatalf("write: %v", err)
		}
		if n > 0 {
			t.Fatalf("write failed with %v after %d bytes", errno, n)
		}
		return errno
	}
	if n != len(s) {
		t.Fatalf("short write: %d of %d bytes", n, len(s))
	}
	return 0
}

func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return 0
}

// inMountTable reports whether mountpoint is in this process's mount table.
func inMountTable(t testing.TB, mountpoint string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == mountpoint {
			return true
		}
	}
	return false
}
