package pkgruntime

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/test/pkgruntimetest"
)

// laidOut copies binary into a fresh artifact root the provider uid can
// traverse and returns the root and a pin for it (the pin of name's runtime).
func laidOut(t *testing.T, name, binary string) (string, Pin) {
	t.Helper()
	root := providertest.Dir(t)
	digest := pkgruntimetest.Install(t, root, binary)
	pin := pinFor(name)
	pin.Manifest.Executable, pin.Manifest.ArtifactSHA256 = "runtime", digest
	return root, pin
}

func newLauncher(t *testing.T) *Launcher {
	t.Helper()
	dir := t.TempDir()
	l, err := NewLauncher(LaunchConfig{ProviderUID: 65534, ProviderGID: 65534, RecordDir: filepath.Join(dir, "records"),
		SocketDir: shortDir(t), KillTimeout: 5 * time.Second, SealCacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// shortDir is a directory whose socket paths stay under 107 bytes.
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "pkgrt-l-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	v := procStatusQuiet(pid, field)
	if v == "" {
		t.Fatalf("/proc/%d/status has no %s", pid, field)
	}
	return v
}

func TestALaunchedRuntimeRunsSealedAloneAndUnprivilegedAndLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runtimes are launched as uid 65534: run as root")
	}
	l := newLauncher(t)
	root, pin := laidOut(t, pkgruntimetest.KV, binaries[pkgruntimetest.KV])
	r, err := l.Launch(ctxT(t), pin, root)
	if err != nil {
		t.Fatal(err)
	}
	pid := r.Pid()
	proc := "/proc/" + strconv.Itoa(pid)
	if env, _ := os.ReadFile(proc + "/environ"); len(env) != 0 {
		t.Errorf("environment %q, want empty", env)
	}
	if uid := procStatus(t, pid, "Uid"); uid != "65534" {
		t.Errorf("uid %s, want 65534", uid)
	}
	if nnp := procStatus(t, pid, "NoNewPrivs"); nnp != "1" {
		t.Errorf("NoNewPrivs %s, want 1", nnp)
	}
	if cwd, _ := os.Readlink(proc + "/cwd"); cwd != root {
		t.Errorf("cwd %s, want the artifact root %s", cwd, root)
	}
	if pgid, _ := syscall.Getpgid(pid); pgid != pid {
		t.Errorf("pgid %d, want its own group %d", pgid, pid)
	}
	// Descriptors 4 and 5 are the runtime's to close once it has read the key
	// and taken the listener (the SDK does): their numbers may be reused by
	// then, so only 0-3 are checked by what they are.
	for fd, want := range map[int]string{0: "/dev/null", 1: "/dev/null", 2: "pipe:", 3: "/memfd:iteron-provider"} {
		if got, _ := os.Readlink(proc + "/fd/" + strconv.Itoa(fd)); !strings.HasPrefix(got, want) {
			t.Errorf("fd %d is %q, want %s…", fd, got, want)
		}
	}
	if len(pkgruntimetest.DirNames(t, l.cfg.RecordDir)) != 1 || len(pkgruntimetest.DirNames(t, l.cfg.SocketDir)) != 1 {
		t.Fatalf("records %v, socket dirs %v: want one of each while it runs", pkgruntimetest.DirNames(t, l.cfg.RecordDir), pkgruntimetest.DirNames(t, l.cfg.SocketDir))
	}
	// It serves through the handshaken connection.
	if resp, _, err := r.Conn().Invoke(ctxT(t), kvCall("put", "k", str("v"))); err != nil || !resp.GetOk() {
		t.Fatalf("put: %v %v", resp, err)
	}
	select {
	case <-r.Exited():
		t.Fatal("Exited is closed while the runtime runs and serves")
	default:
	}
	td := r.Stop(5 * time.Second)
	if len(td.Unreaped) != 0 || !td.Exit.Success() {
		t.Fatalf("teardown %+v: want the runtime to end by itself on SIGTERM (the SDK stops gracefully)", td)
	}
	if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the group is still there: %v", err)
	}
	if rec, socks := pkgruntimetest.DirNames(t, l.cfg.RecordDir), pkgruntimetest.DirNames(t, l.cfg.SocketDir); len(rec)+len(socks) != 0 {
		t.Fatalf("left behind: records %v, socket dirs %v", rec, socks)
	}
	t.Logf("pid %d: uid 65534, NoNewPrivs, empty environment, own group, fds 0-3 as documented; stopped: %v in %v", pid, td.Exit, td.Reaped.Round(time.Millisecond))
}

func TestALaunchThatFailsLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runtimes are launched as uid 65534: run as root")
	}
	wrongProof, err := pkgruntimetest.BuildSeedWithFault(t.TempDir(), "wrong-proof")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, code, field string
		setup             func(t *testing.T) (string, Pin)
	}{
		{"bytes that are not the pinned digest are never spawned", "verification_failed", "executable", func(t *testing.T) (string, Pin) {
			root, pin := laidOut(t, pkgruntimetest.KV, binaries[pkgruntimetest.KV])
			pin.Manifest.ArtifactSHA256 = strings.Repeat("0", 64)
			return root, pin
		}},
		{"a runtime whose proof is wrong is killed", "activation_failed", "handshake.authentication_proof", func(t *testing.T) (string, Pin) {
			return laidOut(t, pkgruntimetest.Seed, wrongProof)
		}},
		{"a runtime that answers another revision is killed", "activation_failed", "handshake.package_revision_id", func(t *testing.T) (string, Pin) {
			root, pin := laidOut(t, pkgruntimetest.KV, binaries[pkgruntimetest.KV])
			pin.Manifest.PackageRevisionID = "kv-2.0.0"
			return root, pin
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLauncher(t)
			root, pin := c.setup(t)
			r, err := l.Launch(ctxT(t), pin, root)
			if err == nil {
				r.Kill()
				t.Fatal("launched")
			}
			wantError(t, err, c.code, c.field, "")
			if rec, socks := pkgruntimetest.DirNames(t, l.cfg.RecordDir), pkgruntimetest.DirNames(t, l.cfg.SocketDir); len(rec)+len(socks) != 0 {
				t.Fatalf("left behind: records %v, socket dirs %v", rec, socks)
			}
			for _, pid := range pidsOfUID(t, 65534) {
				if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); strings.Contains(exe, "memfd:iteron-provider") && isChildOfUs(pid) {
					t.Fatalf("process %d (%s) is still running", pid, exe)
				}
			}
		})
	}
}

func pidsOfUID(t *testing.T, uid int) []int {
	es, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if procStatusQuiet(pid, "Uid") == strconv.Itoa(uid) {
			out = append(out, pid)
		}
	}
	return out
}

func procStatusQuiet(pid int, field string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}

func isChildOfUs(pid int) bool { return procStatusQuiet(pid, "PPid") == strconv.Itoa(os.Getpid()) }

func TestARuntimeThatExitsIsSeenAndReaped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runtimes are launched as uid 65534: run as root")
	}
	crash, err := pkgruntimetest.BuildSeedWithFault(t.TempDir(), "crash-invoke")
	if err != nil {
		t.Fatal(err)
	}
	l := newLauncher(t)
	root, pin := laidOut(t, pkgruntimetest.Seed, crash)
	r, err := l.Launch(ctxT(t), pin, root)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = r.Conn().Invoke(ctxT(t), kvCall("get", "k", nil))
	wantError(t, err, "provider_failed", "invoke", "")
	select {
	case <-r.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the crash was not seen")
	}
	// Torn down without a Kill from its owner (who may never call one: a
	// generation failed by its crash budget): reaped, not left a zombie, its
	// record and socket directory removed.
	pid := r.Pid()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		if errors.Is(err, os.ErrNotExist) && len(pkgruntimetest.DirNames(t, l.cfg.RecordDir))+len(pkgruntimetest.DirNames(t, l.cfg.SocketDir)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after its exit: /proc/%d (%v, state %q), records %v, socket dirs %v", pid, err, procStatusQuiet(pid, "State"),
				pkgruntimetest.DirNames(t, l.cfg.RecordDir), pkgruntimetest.DirNames(t, l.cfg.SocketDir))
		}
	}
	td := r.Kill() // the teardown's report, again
	if !td.Exit.Exited || td.Exit.Code != 3 {
		t.Fatalf("exit %v, want exit status 3", td.Exit)
	}
	if rec := pkgruntimetest.DirNames(t, l.cfg.RecordDir); len(rec) != 0 {
		t.Fatalf("records left: %v", rec)
	}
}
