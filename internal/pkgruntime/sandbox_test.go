package pkgruntime

import (
	"path/filepath"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/sandboxtest"
	"iteron.dev/operator/test/pkgruntimetest"
)

func TestASandboxedRuntimeServesThroughItsInheritedSocketAloneAndLeavesNothing(t *testing.T) {
	sb := sandboxtest.New(t, sandbox.Policy{Mode: sandbox.ModeEnforce}, providertest.SandboxLauncher(t))
	dir := t.TempDir()
	l, err := NewLauncher(LaunchConfig{ProviderUID: 65534, ProviderGID: 65534, RecordDir: filepath.Join(dir, "records"),
		SocketDir: shortDir(t), KillTimeout: 5 * time.Second, Sandbox: sb})
	if err != nil {
		t.Fatal(err)
	}
	root, pin := laidOut(t, pkgruntimetest.KV, binaries[pkgruntimetest.KV])
	r, err := l.Launch(ctxT(t), pin, root)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := r.Sandbox()
	if !ok || ev.Network != sandbox.NetworkNone || ev.Level != sandbox.LevelIsolated {
		t.Errorf("evidence %s: want an isolated runtime with no network (it admitted nothing)", ev)
	}
	if resp, _, err := r.Conn().Invoke(ctxT(t), kvCall("put", "k", str("v"))); err != nil || !resp.GetOk() {
		t.Fatalf("put through the inherited socket: %v %v", resp, err)
	}
	td := r.Stop(5 * time.Second)
	if len(td.Unreaped) != 0 || !td.Exit.Success() {
		t.Fatalf("teardown %+v: want SIGTERM forwarded by the launcher and a graceful end", td)
	}
	if rec, socks := pkgruntimetest.DirNames(t, l.cfg.RecordDir), pkgruntimetest.DirNames(t, l.cfg.SocketDir); len(rec)+len(socks) != 0 {
		t.Fatalf("left behind: records %v, socket dirs %v", rec, socks)
	}
	// cgroup control files are files; a group is a directory (the
	// launchers started ahead have theirs).
	for _, d := range sandboxtest.LeftCgroups(t, sb) {
		t.Errorf("a runtime's cgroup is left: %s", d)
	}
}
