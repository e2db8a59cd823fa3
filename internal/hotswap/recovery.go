package hotswap

import (
	"errors"
	"fmt"
	"strings"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// openLedger opens (creating) the activation's ledger once, closing an
// interrupted transaction forward. A corrupt ledger stops all work until an
// operator resolves it; one that cannot be written is probed with backoff.
func (a *activationRuntime) openLedger() error {
	return a.openLedgerAnchored(nil)
}

// openLedgerAnchored is openLedger with the head the activation's status
// recorded, which must be in the chain.
func (a *activationRuntime) openLedgerAnchored(anchor *ledger.Anchor) error {
	a.mu.Lock()
	if a.led != nil || a.health.unwritable != nil {
		a.mu.Unlock()
		return nil
	}
	if a.ledgerErr != nil {
		err := a.ledgerErr
		a.mu.Unlock()
		return err
	}
	err := a.openAndRecover(anchor)
	if a.ledgerErr != nil {
		a.failCallsWhileLedgerIsCorrupt()
	}
	a.mu.Unlock()
	if err != nil && !errors.Is(err, ledger.ErrCorrupt) {
		// Not corrupt: the file system refused (disk full, I/O error). The
		// worker probes until it opens.
		a.ledgerUnwritable(err)
		return nil
	}
	return err
}

// openAndRecover replays the ledger, closes an interrupted transaction
// forward and learns what it recorded. Caller holds a.mu.
func (a *activationRuntime) openAndRecover(anchor *ledger.Anchor) error {
	led, report, err := ledger.OpenActivation(a.c.cfg.StateDir, a.key.UID, ledger.Options{Create: true, Now: a.c.cfg.Now, ObserveSync: a.observeSync, Anchor: anchor})
	if err != nil {
		if errors.Is(err, ledger.ErrCorrupt) {
			a.ledgerErr = err
		}
		return err
	}
	if report.TornTail != nil {
		a.log("ledger had a torn tail; truncated", "file", report.TornTail.File, "bytes", report.TornTail.Bytes)
	}
	// An interrupted transaction is closed as the pending close recorded
	// when its append failed, else by the ledger's rule.
	if err := a.closeOpen(led, report.State.Open, nil); err != nil {
		_ = led.Close()
		if errors.Is(err, ledger.ErrCorrupt) {
			a.ledgerErr = err
		}
		return err
	}
	if err := a.recoverFromLedger(led); err != nil {
		_ = led.Close()
		a.ledgerErr = err
		return err
	}
	a.led, a.opened = led, true
	return nil
}

// recoverFromLedger learns, from a ledger opened after a restart, each
// module's last committed generation (to relaunch it), the /r<n> numbers
// already used, and the attempts that failed (never retried for the same
// spec unless they were cut short by the host). Caller holds a.mu.
func (a *activationRuntime) recoverFromLedger(led *ledger.Ledger) error {
	st := led.State()
	for module, c := range st.LastCommitted {
		if c.Generation == 0 || c.Kind == ledger.KindRetirement {
			continue
		}
		id, err := ledger.ParseTransactionID(c.TransactionID)
		if err != nil {
			return err
		}
		m := a.module(module)
		m.dur.committed = &CommittedGeneration{
			Name:    iteronv1.GenerationName(a.key.Name, module, int64(c.Generation), int32(id.Attempt())),
			Lineage: int64(c.Generation), Attempt: int32(id.Attempt()),
			ImplementationID: c.ImplementationID, ArtifactSHA256: c.ArtifactSHA256, AuthoritySHA256: c.AuthoritySHA256,
			TransactionID: c.TransactionID,
		}
		// Calls wait for its re-attach or relaunch (retry at their deadline).
		m.dispatcher.SetRecovering(a.recoveryOf(m))
	}
	if st.Records == 0 {
		return nil
	}
	blocked := map[string]*ledger.Record{}
	_, err := ledger.Replay(led.Dir(), ledger.VerifyOptions{}, func(r *ledger.Record) error {
		id, err := ledger.ParseTransactionID(r.TransactionID)
		if err != nil {
			return err
		}
		name := iteronv1.GenerationName(a.key.Name, r.Module, int64(id.Lineage()), int32(id.Attempt()))
		a.rCounts[name] = max(a.rCounts[name], id.Renewal())
		if r.Outcome == ledger.OutcomeBlocked {
			rec := *r
			blocked[r.TransactionID] = &rec
		}
		if r.Phase == ledger.PhaseRolledBack && id.Renewal() == 0 && r.NewGeneration != 0 {
			// A first activation, hot swap or cold replace that rolled back:
			// that attempt failed. One the host cut short (a restart, a
			// ledger that could not be written) is retried without a request.
			code, msg := reasons.ProviderFailed, ""
			if b := blocked[r.TransactionID]; b != nil && b.Reason != nil {
				code, msg, _ = strings.Cut(*b.Reason, ": ")
			}
			a.failed[name] = Failure{Module: r.Module, GenerationName: name, Code: code, Message: truncateMessage(msg),
				Retryable: msg == ledger.RecoveryMessage || code == reasons.LedgerUnwritable}
		}
		return nil
	})
	return err
}

// recoveryOf says what is being recovered of module m — its committed
// generation re-attached or relaunched after a manager restart, or its
// active generation relaunched after its process ended — or "" when nothing
// is: what a call that waited out its deadline is told (recovering).
// Caller holds a.mu.
func (a *activationRuntime) recoveryOf(m *moduleRuntime) string {
	if c := m.dur.committed; c != nil && m.active == nil {
		return fmt.Sprintf("activation %s/%s is being recovered: module %s's last committed generation %s is being re-attached or relaunched", a.key.Namespace, a.key.Name, m.name, c.Name)
	}
	if g := m.active; g != nil && g.proc == nil && g.phase != iteronv1.PhaseFailed {
		cause := g.relaunchCause
		if cause == "" {
			cause = "the manager restarted"
		}
		return fmt.Sprintf("module %s's generation %s is being relaunched (%s)", m.name, g.name, cause)
	}
	return ""
}

// callsWait lets calls to m wait in its queue again after an answer that
// failed them at once passed (a ledger that accepts appends again, a new
// spec for a refused relaunch): as a recovery when one is under way.
// Caller holds a.mu.
func (a *activationRuntime) callsWait(m *moduleRuntime) {
	if why := a.recoveryOf(m); why != "" {
		m.dispatcher.SetRecovering(why)
		return
	}
	m.dispatcher.SetAvailable()
}

// failCallsWhileLedgerIsCorrupt makes every module's calls fail at once with
// ledger_corrupt: nothing is done for the activation until an operator
// resolves its ledger. Caller holds a.mu.
func (a *activationRuntime) failCallsWhileLedgerIsCorrupt() {
	code, msg := a.ledgerProblem()
	for _, m := range a.modules {
		if m.active == nil || m.active.proc == nil {
			m.dispatcher.SetUnavailable(code, fmt.Sprintf("module %s cannot serve: %s", m.name, msg))
		}
	}
}
