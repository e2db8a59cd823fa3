package hotswap

import (
	"context"
	"fmt"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/survivor"
)

// Re-attaching after a manager restart (docs/survivor.md): the survivor
// still runs the providers the previous manager launched. A module's last
// committed generation is adopted — its process serves on, no transaction,
// no ledger record, same pid and state — when the survivor's process is the
// one the ledger says is Active; anything else is released (killed) and
// the module relaunched from its newest durable snapshot as before.

// noteAttached records durably which process serves module now (g's, as
// launched by transaction txn), or that none does (g nil). Only with a
// survivor; a failure is logged: the next manager then relaunches instead
// of re-attaching.
func (a *activationRuntime) noteAttached(module string, g *generationRuntime, txn string) {
	owner := a.c.cfg.Owner
	if owner == nil {
		return
	}
	var rec *providers.AttachedRecord
	if g != nil {
		a.mu.Lock()
		proc := g.proc
		a.mu.Unlock()
		held, ok := proc.(providers.SurvivorHeld)
		if !ok {
			return
		}
		info := held.Remote().Info()
		rec = &providers.AttachedRecord{Transaction: txn, Generation: g.name, Pid: info.Pid, StartTime: info.StartTime, BootID: info.BootID,
			ImplementationID: info.ImplementationID, ManifestSHA256: info.ManifestSHA256, ArtifactSHA256: info.ArtifactSHA256, AuthoritySHA256: info.AuthoritySHA256}
	}
	if err := owner.NoteAttached(a.key.UID, module, rec); err != nil {
		a.log("cannot record the module's process for re-attachment (a restarted manager will relaunch it instead)", "module", module, "error", err.Error())
	}
}

// reattach tries to adopt the survivor's process of module m's last
// committed generation c for generation g (whose verified target is t). It
// returns the adopted provider, or nil and why not (every candidate
// process has then been released).
func (a *activationRuntime) reattach(m *moduleRuntime, g *generationRuntime, t ModuleTarget, c CommittedGeneration, d *Desired) (providers.Provider, string) {
	owner := a.c.cfg.Owner
	cands := owner.Candidates(a.key.UID, m.name)
	if len(cands) == 0 {
		return nil, "the survivor holds no process of the module"
	}
	recs, err := providers.ReadAttached(a.c.cfg.StateDir, a.key.UID)
	if err != nil {
		for _, rp := range cands {
			owner.Release(rp, "the manager's attachment record is unreadable: "+err.Error())
		}
		return nil, "the attachment record is unreadable: " + err.Error()
	}
	rec, haveRec := recs[m.name]
	want := survivor.Tag{ActivationUID: a.key.UID, Module: m.name, Generation: c.Name, Transaction: c.TransactionID}
	var chosen *survivor.RemoteProcess
	why := ""
	for _, rp := range cands {
		reason := a.notAdoptable(rp.Info(), want, t, c, rec, haveRec)
		switch {
		case reason == "" && chosen == nil && owner.Claim(rp):
			chosen = rp
		case reason == "":
			owner.Release(rp, "another process of the module was re-attached")
		default:
			owner.Release(rp, reason)
			why = reason
		}
	}
	if chosen == nil {
		return nil, why
	}
	// A run the previous manager started may still be in progress: its
	// outcome is kept by the survivor for the gateway; the process is
	// adopted once it ended, bounded by the transaction deadline.
	ctx, cancel := context.WithTimeout(context.Background(), max(d.Swap.Deadline, 5*time.Second))
	defer cancel()
	for {
		if err := chosen.Refresh(ctx); err != nil {
			a.log("re-attach: the survivor's process did not answer; relaunching instead", "module", m.name, "pid", chosen.Pid(), "error", err.Error())
			go chosen.Close()
			return nil, "the process did not answer: " + err.Error()
		}
		info := chosen.Info()
		if !info.Alive {
			return nil, "the process ended meanwhile"
		}
		if info.ActiveRun == "" {
			break
		}
		select {
		case <-ctx.Done():
			go chosen.Close()
			return nil, "a run of the previous manager (" + info.ActiveRun + ") did not end within the transaction deadline"
		case <-time.After(20 * time.Millisecond):
		}
	}
	chosen.SetPlan(t.Plan)
	return owner.Adopt(chosen), ""
}

// notAdoptable says why a survivor's process is not the one to re-attach
// ("" when it is): the ledger's last committed transaction must have
// launched it, its plan must be the verified target's and the ledger's,
// and its pid, start time and boot must be those this manager recorded
// durably when it became the module's active process.
func (a *activationRuntime) notAdoptable(info survivor.ProcessInfo, want survivor.Tag, t ModuleTarget, c CommittedGeneration, rec providers.AttachedRecord, haveRec bool) string {
	switch {
	case info.Tag != want:
		return fmt.Sprintf("launched by transaction %s of %s; the ledger's last committed transaction of the module is %s of %s", info.Tag.Transaction, info.Tag.Generation, want.Transaction, want.Generation)
	case info.Matches(want, t.Plan) != nil:
		return "not the verified target: " + info.Matches(want, t.Plan).Error()
	case info.ImplementationID != c.ImplementationID || info.ArtifactSHA256 != c.ArtifactSHA256 || info.AuthoritySHA256 != c.AuthoritySHA256:
		return "its plan differs from the ledger's committed record"
	case !haveRec:
		return "the manager has no attachment record of the module"
	case rec.Transaction != info.Tag.Transaction || rec.Pid != info.Pid || rec.StartTime != info.StartTime || rec.BootID != info.BootID ||
		rec.ArtifactSHA256 != info.ArtifactSHA256 || rec.ManifestSHA256 != info.ManifestSHA256 || rec.AuthoritySHA256 != info.AuthoritySHA256:
		return fmt.Sprintf("the survivor's process (pid %d, start time %d, boot %s, transaction %s) is not the one the manager's attachment record names (pid %d, start time %d, boot %s, transaction %s)",
			info.Pid, info.StartTime, info.BootID, info.Tag.Transaction, rec.Pid, rec.StartTime, rec.BootID, rec.Transaction)
	case info.BootID != procexec.BootID():
		return "the process was started in another boot of the node"
	}
	return ""
}

// adopt makes g, whose process was re-attached, the module's active
// generation: routed, watched, serving. Nothing is recorded in the ledger:
// nothing changed.
func (a *activationRuntime) adopt(d *Desired, m *moduleRuntime, g *generationRuntime, c CommittedGeneration, proc providers.Provider) {
	a.mu.Lock()
	g.proc = proc
	g.lastPid, g.procStartedAt = proc.Pid(), proc.StartedAt()
	g.committedAuthority = c.AuthoritySHA256
	g.txnID = c.TransactionID
	g.step = iteronv1.StepCommitted
	if g.activatedAt.IsZero() {
		g.activatedAt = a.c.cfg.Now()
	}
	scope := g.scope
	a.mu.Unlock()
	if err := trackProcess(context.Background(), scope, proc); err != nil {
		a.log("re-attach: the generation's scope refused its process", "module", m.name, "error", err.Error())
	}
	m.dispatcher.PauseNow()
	if err := a.switchRoute(m, g); err != nil {
		a.log("re-attach: the module's dispatcher refused the route", "module", m.name, "error", err.Error())
	}
	a.mu.Lock()
	a.activate(m, g, d)
	a.mu.Unlock()
	m.dispatcher.Resume()
	a.log("generation re-attached: its process kept running in the survivor", "module", m.name, "generation", g.name, "pid", g.lastPid, "transaction", c.TransactionID)
	a.notify(g.name)
}
