package hotswap

import (
	"errors"
	"fmt"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// A ledger append that fails (disk full, I/O error) freezes the ledger: a
// later fsync may falsely succeed after an EIO, so only a replay can tell
// what is durable. The activation is then ledger_unwritable:
//
//   - the transaction that failed ended by the runner's policy (what it
//     started is disposed, what served before serves), and how to close it
//     in the ledger is kept as the pending close;
//   - modules that serve keep serving; transactions that need the ledger
//     (swaps, renewals, relaunches, retirements, the finalizer) wait;
//   - the worker probes with backoff: it reopens the ledger (a replay), and
//     writes the pending close; once both succeed the activation is healthy
//     again and the waiting work goes on. No restart is needed.

// Probe backoff while the ledger is unwritable.
const (
	firstLedgerProbe = time.Second
	maxLedgerProbe   = 30 * time.Second
	// ledgerBackoffMemory keeps the backoff growing when the ledger fails
	// again this soon after it healed (a disk that fills up again).
	ledgerBackoffMemory = time.Minute
)

// ledgerHealth is an activation's ledger state beyond "open". Guarded by
// the activation's mutex.
type ledgerHealth struct {
	// unwritable is the append error that froze the ledger; nil while it
	// accepts appends.
	unwritable error
	since      time.Time
	probeAt    time.Time
	probes     int
	healedAt   time.Time
	// lastProbe is why the last probe failed.
	lastProbe error
	// pending closes the transaction the failure interrupted, as it truly
	// ended, once the ledger accepts appends again.
	pending *pendingClose
}

// ledgerUnwritable records that an append failed. The first error is kept:
// later ones are its consequences (the ledger refuses while frozen).
func (a *activationRuntime) ledgerUnwritable(err error) {
	now := a.c.cfg.Now()
	a.mu.Lock()
	h := &a.health
	first := h.unwritable == nil
	if first {
		h.unwritable = err
		h.since = now
		if now.Sub(h.healedAt) > ledgerBackoffMemory {
			h.probes = 0
		}
		h.probeAt = now.Add(probeBackoff(h.probes))
		// Nothing can be prepared until the ledger accepts appends: a
		// module nothing serves answers with that at once.
		_, msg := a.ledgerProblem()
		for _, m := range a.modules {
			if notServing(m.active) && m.dispatcher.Unavailable() == nil {
				m.dispatcher.SetUnavailable(reasons.LedgerUnwritable, fmt.Sprintf("module %s has no generation that can serve: %s", m.name, msg))
			}
		}
	}
	a.mu.Unlock()
	if first {
		a.log("ledger append failed: the ledger refuses appends until it is replayed; transactions wait, serving modules keep serving", "error", err.Error())
		a.notify()
	}
}

func probeBackoff(probes int) time.Duration {
	return min(firstLedgerProbe<<min(probes, 16), maxLedgerProbe)
}

// ledgerWritable reports whether transactions may run; when they may not,
// when the next probe is due.
func (a *activationRuntime) ledgerWritable() (bool, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.health.unwritable == nil {
		return true, time.Time{}
	}
	return false, a.health.probeAt
}

// probeLedger reopens a frozen ledger (replaying it) and writes the pending
// close. It reports whether the ledger accepts appends again.
func (a *activationRuntime) probeLedger() bool {
	a.mu.Lock()
	if a.health.unwritable == nil {
		a.mu.Unlock()
		return true
	}
	old := a.led
	a.led = nil
	pending := a.health.pending
	opened := a.opened
	a.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	var err error
	if opened {
		err = a.reopenLedger(pending)
	} else {
		// It never opened (the file system refused at start): this is the
		// first replay, with everything a start learns from it.
		a.mu.Lock()
		err = a.openAndRecover(nil)
		a.mu.Unlock()
	}
	now := a.c.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	h := &a.health
	if err != nil && errors.Is(err, ledger.ErrCorrupt) {
		// The replay found the ledger corrupt: that needs an operator.
		a.ledgerErr, h.unwritable, h.pending = err, nil, nil
		a.failCallsWhileLedgerIsCorrupt()
		a.log("the ledger replay after an append failure found it corrupt", "error", err.Error())
		return false
	}
	if err != nil {
		h.probes++
		h.probeAt = now.Add(probeBackoff(h.probes))
		h.lastProbe = err
		a.log("the ledger is still unwritable", "error", err.Error(), "nextProbe", h.probeAt)
		return false
	}
	a.log("the ledger accepts appends again; waiting work resumes", "unwritableFor", now.Sub(h.since).Round(time.Millisecond))
	h.unwritable, h.lastProbe, h.pending, h.healedAt = nil, nil, nil, now
	for _, m := range a.modules {
		// A renewal that waited for the ledger runs now.
		m.dur.renewRetryAt = time.Time{}
		if g := m.active; g != nil && g.proc == nil && g.reason == reasons.LedgerUnwritable {
			// A relaunch that waited for the ledger runs now.
			g.message = truncateMessage(fmt.Sprintf("%s is relaunched now that the ledger accepts appends again", g.name))
			m.dur.relaunchAt = now
		}
		if ce := m.dispatcher.Unavailable(); ce != nil && ce.Code == reasons.LedgerUnwritable {
			a.callsWait(m)
		}
	}
	return true
}

// reopenLedger opens the activation's ledger again (a replay) and closes the
// interrupted transaction: as pending says, or by the ledger's own recovery
// rule when nothing is pending.
func (a *activationRuntime) reopenLedger(pending *pendingClose) error {
	led, report, err := ledger.OpenActivation(a.c.cfg.StateDir, a.key.UID, ledger.Options{Create: true, Now: a.c.cfg.Now, ObserveSync: a.observeSync})
	if err != nil {
		return err
	}
	if report.TornTail != nil {
		a.log("ledger had a torn tail; truncated", "file", report.TornTail.File, "bytes", report.TornTail.Bytes)
	}
	if err := a.closeOpen(led, report.State.Open, pending); err != nil {
		_ = led.Close()
		return err
	}
	a.mu.Lock()
	a.led = led
	a.mu.Unlock()
	return nil
}

// ledgerProblem is what is wrong with the ledger, if anything. Caller
// holds a.mu.
func (a *activationRuntime) ledgerProblem() (code, message string) {
	switch h := a.health; {
	case a.ledgerErr != nil:
		return reasons.LedgerCorrupt, "the ledger is unusable; the manager does not act on this activation until an operator resolves it: " + a.ledgerErr.Error()
	case h.unwritable != nil:
		msg := fmt.Sprintf("a ledger append failed: %v; transactions wait and modules that serve keep serving; the manager replays the ledger and resumes once writes succeed", h.unwritable)
		if h.lastProbe != nil {
			msg += fmt.Sprintf(" (%d tries so far, the last: %s)", h.probes, firstLine(h.lastProbe.Error()))
		}
		return reasons.LedgerUnwritable, msg
	}
	return "", ""
}

// notServing explains a module with no generation able to serve. Caller
// holds a.mu.
func notServing(g *generationRuntime) bool {
	return g == nil || g.proc == nil || g.phase == iteronv1.PhaseFailed
}
