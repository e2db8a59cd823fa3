package hotswap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/strictjson"
)

// A transaction that a failed append interrupted ends in memory at once
// (pending close), but its last records can only be written once the ledger
// accepts appends again — possibly by another manager, after a restart. How
// it ended is therefore kept durably outside the ledger, in
// <state-dir>/pending/<uid>.json, and every replay of that ledger (the
// probe, or a manager's start) closes the open transaction as the file says
// instead of by the ledger's own rule, which knows only what was durable.
// A rollback after a durable switch is done only once its file is durable:
// otherwise the ledger's rule (forward after a durable switch) would revive
// the generation the rollback disposed.

// maxPendingBytes bounds a pending close file.
const maxPendingBytes = 8 << 10

// How a pending close ends its transaction.
const (
	// closeRolledBackHow: blocked(phase, code) + rolled_back.
	closeRolledBackHow = "rolled_back"
	// closeRollbackFailedHow: blocked(phase, code) + rollback_failed (a
	// post-switch rollback that could not restore the old generation).
	closeRollbackFailedHow = "rollback_failed"
	// closeForwardHow: the records the transaction still lacks (drain
	// where its kind has one, committed).
	closeForwardHow = "forward"
)

// pendingClose is how an interrupted transaction is closed.
type pendingClose struct {
	// TransactionID is the open transaction it closes.
	TransactionID string `json:"transaction_id"`
	// Close is closeRolledBackHow, closeRollbackFailedHow or
	// closeForwardHow.
	Close string `json:"close"`
	// Phase, Code and Message are the blocked record's (not for forward).
	Phase   string `json:"phase,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// rolledBack is the pending close of a failure: blocked(pf) + rolled_back,
// or rollback_failed when a post-switch rollback failed.
func rolledBack(transactionID string, pf *phaseFailure, afterSwitch bool, rollbackErr error) *pendingClose {
	p := &pendingClose{TransactionID: transactionID, Close: closeRolledBackHow, Phase: string(pf.phase), Code: string(pf.code), Message: pf.message}
	if afterSwitch && rollbackErr != nil {
		p.Close = closeRollbackFailedHow
	}
	return p
}

// apply closes tx, resumed after a replay, with what remains of the
// records p names.
func (p *pendingClose) apply(tx *ledger.Txn) error {
	if p.Close == closeForwardHow {
		for _, next := range tx.Next() {
			if next == ledger.PhaseDrain {
				if err := tx.Drain(); err != nil {
					return err
				}
				break
			}
		}
		return tx.Commit()
	}
	if next := tx.Next(); !(len(next) == 1 && next[0] == ledger.PhaseRolledBack) {
		phase := ledger.Phase(p.Phase)
		if !containsPhase(next, phase) {
			// The failed phase's record never became durable or the
			// transaction moved on: block the phase that comes next.
			phase = next[0]
		}
		if err := tx.Block(phase, ledger.ReasonCode(p.Code), p.Message); err != nil {
			return err
		}
	}
	if p.Close == closeRollbackFailedHow {
		return tx.RollbackFailed()
	}
	return tx.RollBack()
}

func containsPhase(ps []ledger.Phase, p ledger.Phase) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// pendingPath is the pending close file of an activation.
func pendingPath(stateDir, uid string) string {
	return statedir.Dir(stateDir).PendingClose(uid)
}

// writePending makes p durable for the activation uid.
func writePending(stateDir, uid string, p *pendingClose) error {
	if err := statedir.MkdirAll(statedir.Dir(stateDir).PendingCloses()); err != nil {
		return err
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return statedir.WriteFile(pendingPath(stateDir, uid), data, 0o600)
}

// readPending returns the activation's pending close, nil when there is
// none.
func readPending(stateDir, uid string) (*pendingClose, error) {
	data, err := os.ReadFile(pendingPath(stateDir, uid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p pendingClose
	if err := strictjson.Decode(data, &p, maxPendingBytes); err != nil {
		return nil, fmt.Errorf("pending close %s: %w", pendingPath(stateDir, uid), err)
	}
	switch p.Close {
	case closeRolledBackHow, closeRollbackFailedHow, closeForwardHow:
	default:
		return nil, fmt.Errorf("pending close %s: close %q is not rolled_back, rollback_failed or forward", pendingPath(stateDir, uid), p.Close)
	}
	return &p, nil
}

// removePending deletes the activation's pending close, durably.
func removePending(stateDir, uid string) error {
	return statedir.Remove(pendingPath(stateDir, uid))
}

// keepPending makes an activation's pending close durable and keeps it in
// memory.
func (a *activationRuntime) keepPending(p *pendingClose) error {
	a.mu.Lock()
	a.health.pending = p
	a.mu.Unlock()
	return writePending(a.c.cfg.StateDir, a.key.UID, p)
}

// closeLater records that an append failed (err) and how the interrupted
// transaction is to be closed once the ledger accepts appends again. A
// pending close that cannot be written to disk is still kept in memory
// (the probe uses it); only a restart before then falls back on the
// ledger's rule.
func (a *activationRuntime) closeLater(err error, p *pendingClose) {
	a.ledgerUnwritable(err)
	if werr := a.keepPending(p); werr != nil {
		a.log("the pending close could not be written; it is kept in memory", "transaction", p.TransactionID, "error", werr.Error())
	}
}

// closeOpen closes the open transaction a replay of led found: as the
// pending close says when it names that transaction, else by the ledger's
// own rule. The pending close is removed once the ledger holds the close.
func (a *activationRuntime) closeOpen(led *ledger.Ledger, open *ledger.OpenTransaction, pending *pendingClose) error {
	if pending == nil {
		p, err := readPending(a.c.cfg.StateDir, a.key.UID)
		if err != nil {
			a.log("ignoring an unreadable pending close", "error", err.Error())
		}
		pending = p
	}
	if open != nil {
		var (
			rec *ledger.Recovery
			err error
			how = "by the ledger's recovery rule"
		)
		if pending != nil && open.Identity.TransactionID == pending.TransactionID {
			rec, err = led.CloseOpen(pending.apply)
			how = "as recorded when the append failed: " + pending.Close
		} else {
			rec, err = led.Recover()
		}
		if err != nil {
			return err
		}
		if rec != nil {
			a.log("closed an interrupted transaction", "transaction", rec.TransactionID, "outcome", rec.Outcome, "how", how)
		}
	}
	if err := removePending(a.c.cfg.StateDir, a.key.UID); err != nil {
		a.log("the pending close could not be removed", "error", err.Error())
	}
	return nil
}
