package hotswap

import (
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/providers"
)

// The sandbox's part of the coordinator: what a launch's sandbox applied is
// recorded with the launch (the shadow_load record's note) and shown in its
// Generation's status. Every kind of provider says it the same way.

// noteSandbox keeps what proc's sandbox applied on g (under a.mu).
func (a *activationRuntime) noteSandbox(g *generationRuntime, proc providers.Provider) {
	sp, ok := proc.(providers.Sandboxed)
	if !ok {
		return
	}
	ev, ok := sp.Sandbox()
	if !ok {
		return
	}
	a.mu.Lock()
	g.sandbox = &ev
	a.mu.Unlock()
}

// shadowLoadRecord appends g's shadow_load record, with the note of what
// its process's sandbox applied when it has one.
func (r *txnRun) shadowLoadRecord(g *generationRuntime) func() error {
	return func() error {
		r.a.mu.Lock()
		ev := g.sandbox
		r.a.mu.Unlock()
		if ev == nil {
			return r.txn.ShadowLoad()
		}
		return r.txn.ShadowLoadSandboxed(ev.String())
	}
}

// sandboxStatus is g's status.sandbox: what its current process's sandbox
// applied (or its last one's), with the violations counted so far.
func (g *generationRuntime) sandboxStatus() *iteronv1.SandboxStatus {
	ev := g.sandbox
	var violations map[string]int64
	if sp, ok := g.proc.(providers.Sandboxed); ok && g.proc != nil {
		if live, ok := sp.Sandbox(); ok {
			ev = &live
		}
		violations = sp.SandboxViolations()
	}
	if ev == nil {
		return nil
	}
	return &iteronv1.SandboxStatus{
		Mode: string(ev.Mode), Level: ev.Level.String(), Namespaces: ev.Namespaces, Network: string(ev.Network), Exec: ev.Exec,
		MemoryBytes: ev.Limits.MemoryBytes, CPUMillis: ev.Limits.CPUMillis, Tasks: ev.Limits.Tasks, TmpBytes: ev.Limits.TmpBytes,
		Cgroups: ev.Cgroups, Seccomp: ev.Seccomp, Landlock: int32(ev.Landlock), Launcher: ev.Launcher, Violations: violations,
	}
}
