// Package sandboxtest gives the tests of the packages that launch providers
// (procexec, pkgruntime, survivor, hotswap, the suites) a real sandbox below
// a cgroup of the test's own, whose bounds no bug in the sandbox's can get
// past, removed after the test.
package sandboxtest

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/cgroups"
)

// GuardLimits bound everything a test's sandbox starts.
var GuardLimits = cgroups.Limits{MemoryBytes: 2 << 30, Tasks: 2048}

// Guard makes a cgroup of the test's own below this process's cgroups,
// bounded by GuardLimits, and returns the layout below it. It skips the
// test unless it runs as root on a machine with the memory, cpu and pids
// controllers.
func Guard(tb testing.TB) *cgroups.Layout {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("the sandbox's tests need root (cgroups, namespaces)")
	}
	own, err := cgroups.Detect()
	if err != nil {
		tb.Fatal(err)
	}
	if missing := own.Missing(); len(missing) > 0 {
		tb.Skipf("this machine's cgroups lack %v", missing)
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name())
	l, remove, err := own.Below("iteron-test-guard-"+strconv.Itoa(os.Getpid()), name, GuardLimits)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := remove(); err != nil {
			tb.Errorf("removing the guard cgroup: %v", err)
		}
	})
	return l
}

// New makes a Sandbox with the launcher at launcher and policy p, below a
// Guard cgroup, with scratch directories in a fresh directory; it is
// closed after the test.
func New(tb testing.TB, p sandbox.Policy, launcher string) *sandbox.Sandbox {
	tb.Helper()
	scratch := tb.TempDir()
	sb, err := sandbox.New(sandbox.Config{Policy: p, Launcher: launcher, Cgroups: Guard(tb), ScratchDir: scratch})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := sb.Close(); err != nil {
			tb.Errorf("closing the sandbox: %v", err)
		}
	})
	return sb
}

// LeftCgroups returns the cgroups in sb's tree that belong to no launcher
// started ahead (one path per hierarchy and group): what a provider or
// runtime left behind. The launchers started ahead are refilled in the
// background, so a group is reported only once it has stayed unaccounted
// for up to a few seconds (a refill's group is created, then listed in
// Capacity.Ready).
func LeftCgroups(tb testing.TB, sb *sandbox.Sandbox) []string {
	tb.Helper()
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left = left[:0]
		c := sb.Capacity()
		for _, dir := range c.Tree {
			entries, _ := os.ReadDir(dir) // a hierarchy gone has nothing left in it
			for _, e := range entries {
				if e.IsDir() && !slices.Contains(c.Ready, e.Name()) {
					left = append(left, filepath.Join(dir, e.Name()))
				}
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}
