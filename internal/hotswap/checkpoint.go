package hotswap

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/providers"
)

// Renewal and checkpoint policy (docs/operations.md, checkpoints and
// renewals).
const (
	// checkpointIdleWait bounds how long a checkpoint waits for the run slot
	// to empty before it skips this round.
	checkpointIdleWait = 2 * time.Second
	// CheckpointsKept is how many checkpoints are kept per module.
	CheckpointsKept = 3
)

// CommittedGeneration is a module's last committed generation as the ledger
// records it: what a restarted manager relaunches.
type CommittedGeneration struct {
	// Name is the Generation object's name.
	Name string
	// Lineage and Attempt identify it.
	Lineage int64
	Attempt int32
	// ImplementationID, ArtifactSHA256 and AuthoritySHA256 are what ran.
	ImplementationID, ArtifactSHA256, AuthoritySHA256 string
	// TransactionID is the transaction that committed it (the one whose
	// process a restarted manager may re-attach).
	TransactionID string
}

// moduleDurability is the crash, renewal and checkpoint state of a module.
type moduleDurability struct {
	crashes      []time.Time
	relaunchAt   time.Time // zero: no relaunch pending
	renewNow     bool      // a queued call did not fit: renew on demand
	renewRetryAt time.Time
	// checkpointDue is when the next checkpoint is due.
	checkpointDue time.Time
	committed     *CommittedGeneration // recovered from the ledger, not running
	// refused is a relaunch refused for a reason that does not pass by
	// itself; cleared by a new spec or a retry request.
	refused *Failure
	// recoveryRefused is why the controller could not hand the committed
	// generation a target after a restart (ModuleTarget.Refused): calls
	// fail at once with it until a target comes.
	recoveryRefused *Failure
}

// durabilityWork runs one due relaunch, renewal or checkpoint (only a
// relaunch when relaunchOnly), and reports whether it did something; next is
// when something will be due.
func (a *activationRuntime) durabilityWork(d *Desired, relaunchOnly bool) (did bool, next time.Time) {
	now := a.c.cfg.Now()
	a.mu.Lock()
	var relaunch, renew, checkpoint *moduleRuntime
	for _, name := range slices.Sorted(maps.Keys(a.modules)) {
		m := a.modules[name]
		g := m.active
		if g == nil {
			continue
		}
		md := &m.dur
		switch {
		case g.proc == nil && !md.relaunchAt.IsZero():
			if !now.Before(md.relaunchAt) {
				relaunch = pick(relaunch, m)
			} else {
				next = earliest(next, md.relaunchAt)
			}
			continue
		case g.proc == nil || g.phase != iteronv1.PhaseActive || relaunchOnly:
			continue
		}
		if due, at := a.renewalDue(m, g, d); due {
			if now.Before(md.renewRetryAt) {
				next = earliest(next, md.renewRetryAt)
			} else {
				renew = pick(renew, m)
			}
		} else {
			next = earliest(next, at)
		}
		if d != nil && d.CheckpointInterval > 0 && g.target.Plan.ProtocolVersion() == 2 {
			if md.checkpointDue.IsZero() {
				md.checkpointDue = now.Add(d.CheckpointInterval)
			}
			if !now.Before(md.checkpointDue) {
				checkpoint = pick(checkpoint, m)
			} else {
				next = earliest(next, md.checkpointDue)
			}
		}
	}
	a.mu.Unlock()
	switch {
	case relaunch != nil:
		a.relaunch(d, relaunch)
		return true, next
	case renew != nil:
		a.renew(d, renew)
		return true, next
	case checkpoint != nil:
		a.checkpoint(d, checkpoint)
		return true, next
	}
	return false, next
}

func pick(cur, m *moduleRuntime) *moduleRuntime {
	if cur == nil {
		return m
	}
	return cur
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// renewalMargin is the lifetime a renewal needs: the swap deadline plus the
// quiesce timeout.
func renewalMargin(d *Desired, runtimeDeadline time.Duration) time.Duration {
	if d == nil {
		return 0
	}
	// A process lives at most its runtime deadline. A margin as long as
	// that would make every process due for renewal as soon as it starts
	// (a renewal storm): half the lifetime is the most a renewal is given.
	return min(d.Swap.Deadline+d.Swap.QuiesceTimeout, runtimeDeadline/2)
}

// renewalDue reports whether the active process must be renewed now, and
// otherwise when it will be. Caller holds a.mu.
func (a *activationRuntime) renewalDue(m *moduleRuntime, g *generationRuntime, d *Desired) (bool, time.Time) {
	b := g.proc.Budget()
	if b.Ending() {
		// A call that found it dying asked for this renewal before its
		// crash watch saw the exit; the watch relaunches it instead.
		return false, a.c.cfg.Now().Add(100 * time.Millisecond)
	}
	margin := renewalMargin(d, g.target.Plan.RuntimeDeadline())
	if m.dur.renewNow || b.Lifetime <= margin || b.StdinBytes < providers.RenewalStdinReserve || b.StateOperations < providers.RenewalStateOpsReserve {
		return true, time.Time{}
	}
	return false, a.c.cfg.Now().Add(b.Lifetime - margin)
}

// activate marks a generation Active on a module with a fresh process: the
// crash watch, the renewal margin and the on-demand renewal hook. Caller
// holds a.mu.
func (a *activationRuntime) activate(m *moduleRuntime, g *generationRuntime, d *Desired) {
	m.active = g
	a.setPhase(g, iteronv1.PhaseActive)
	g.reason, g.message = "", ""
	if g.activatedAt.IsZero() {
		g.activatedAt = a.c.cfg.Now()
	}
	m.dur.renewNow = false
	m.dur.committed = nil
	m.dur.refused = nil
	m.dispatcher.SetAvailable()
	if g.proc != nil {
		g.proc.SetRenewalMargin(renewalMargin(d, g.target.Plan.RuntimeDeadline()))
		if g.watched != g.proc {
			g.watched = g.proc
			a.watchProcess(m, g, g.proc)
		}
	}
	m.dispatcher.SetOnNoFit(func() {
		a.mu.Lock()
		m.dur.renewNow = true
		a.mu.Unlock()
		a.poke()
	})
}

// checkpoint makes the active generation's state durable between runs.
func (a *activationRuntime) checkpoint(d *Desired, m *moduleRuntime) {
	a.mu.Lock()
	g := m.active
	proc := g.proc
	m.dur.checkpointDue = a.c.cfg.Now().Add(d.CheckpointInterval)
	a.mu.Unlock()
	if proc == nil {
		return
	}
	if err := a.takeCheckpoint(m, g, proc, checkpointIdleWait); err != nil {
		a.log("checkpoint skipped", "module", m.name, "generation", g.name, "error", err.Error())
	}
}

// takeCheckpoint pauses the module between runs, snapshots its state, makes
// it durable and resumes.
func (a *activationRuntime) takeCheckpoint(m *moduleRuntime, g *generationRuntime, proc providers.Provider, idleWait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.target.Plan.RuntimeDeadline())
	defer cancel()
	wasPaused := m.dispatcher.Paused()
	if !m.dispatcher.PauseWhenIdle(ctx, idleWait) {
		return fmt.Errorf("a run kept the slot busy for %s", idleWait)
	}
	if !wasPaused {
		defer m.dispatcher.Resume()
	}
	sh, err := providers.StateOf(proc)
	if err != nil {
		return err
	}
	st, err := sh.Snapshot(ctx, g.lineage)
	if err != nil {
		return err
	}
	path, err := a.c.snapshots.PutKeeping(a.key.UID, a.storedSnapshot(g, st, SnapshotCheckpoint), CheckpointsKept)
	if path == "" {
		return err
	}
	if err != nil {
		// The checkpoint is durable; only older ones were left behind, and
		// the next checkpoint prunes them.
		a.log("old checkpoints not pruned", "module", m.name, "error", err.Error())
	}
	a.mu.Lock()
	g.stateDigest = st.StateSHA256
	g.checkpoint = &CheckpointInfo{StateSHA256: st.StateSHA256, At: a.c.cfg.Now()}
	a.mu.Unlock()
	// The receipts recorded up to the checkpoint are durable with it.
	a.syncReceipts()
	a.notify(g.name)
	return nil
}
