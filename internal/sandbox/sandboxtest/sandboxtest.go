// Package sandboxtest gives the tests of the packages that launch providers
// (procexec, pkgruntime, survivor, hotswap, the suites) a real sandbox below
// a cgroup of the test's own, whose bounds no bug in the sandbox's can get
// past, removed after the test.
package sandboxtest

import (
	"os"
	"strconv"
	"strings"
	"testing"

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
