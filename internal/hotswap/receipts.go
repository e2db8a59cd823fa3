package hotswap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/statedir"
)

// Receipts survive a manager restart in one bounded file per activation
// (docs/reference/receipts.md): appended as each receipt is recorded, made
// durable with each checkpoint and when the manager stops. A file the last
// manager did not close (it was killed, or the machine stopped) reports the
// evidence of every generation in it incomplete.

// openReceipts opens the activation's receipts file. A file that cannot be
// opened leaves an in-memory store whose evidence is reported incomplete,
// with the reason.
func (a *activationRuntime) openReceipts() {
	path, err := statedir.Dir(a.c.cfg.StateDir).Receipts(a.key.UID)
	if err == nil {
		var s *effects.ReceiptStore
		if s, err = effects.OpenReceiptStore(path, a.c.cfg.Now); err == nil {
			a.receipts = s
			if clean, at := s.Clean(); !clean {
				a.receiptsLoss = fmt.Sprintf("the manager before the one started at %s stopped without closing the receipts file (last durable at %s): receipts recorded after that may be lost",
					a.c.started.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339Nano))
				a.log("receipts file was not closed cleanly: the evidence it holds is incomplete", "file", path)
			}
			return
		}
	}
	a.receipts = effects.NewReceiptStore()
	a.receiptsLoss = "the receipts file could not be opened: " + firstLine(err.Error())
	a.log("receipts kept in memory only", "error", err.Error())
}

// syncReceipts makes the receipts recorded so far durable.
func (a *activationRuntime) syncReceipts() {
	if err := a.receipts.Sync(); err != nil {
		a.log("receipts could not be made durable", "error", err.Error())
	}
}

// closeReceipts makes the receipts durable and closes the file: the manager
// stops cleanly.
func (a *activationRuntime) closeReceipts() error {
	return a.receipts.Close()
}

// recordReceipt stores a receipt for a generation.
func (a *activationRuntime) recordReceipt(g *generationRuntime, rc effects.Receipt) {
	rc.Owner = a.key.Namespace + "/" + a.key.Name
	rc.Generation = g.name
	rc.Component = g.module
	if err := a.receipts.Record(rc); err != nil {
		a.log("receipt not recorded", "generation", g.name, "error", err.Error())
		return
	}
	// The Generation's receipt counts change now, not at its next
	// transaction or checkpoint.
	a.c.cfg.Notify(Notification{Namespace: a.key.Namespace, Name: a.key.Name, Generations: []string{g.name}, GenerationsOnly: true})
}

// removeReceipts removes an activation's receipts file with its state.
func removeReceipts(stateDir, activationUID string) error {
	path, err := statedir.Dir(stateDir).Receipts(activationUID)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// countingBackend counts the runs of a provider whose effects are
// reversible: a count per generation, no write per call.
type countingBackend struct {
	dispatch.Backend
	a *activationRuntime
	g *generationRuntime
}

func (b *countingBackend) Run(ctx context.Context, req dispatch.RunRequest, observe func(dispatch.Observation)) (dispatch.Observation, error) {
	obs, err := b.Backend.Run(ctx, req, observe)
	b.a.receipts.CountReversible(b.g.name, b.g.module)
	return obs, err
}

// rollbackEvidence is what a rollback of g must say about its evidence:
// receipts that are incomplete (evicted, lost with a manager that did not
// stop cleanly) mean the rollback cannot be claimed clean, and irreversible
// effects stand whatever the rollback does. Compensatable effects are
// marked pending: nothing compensates them automatically. "" when the
// evidence is complete and holds nothing that a rollback leaves behind.
func (a *activationRuntime) rollbackEvidence(g *generationRuntime) string {
	sum := a.receipts.Summary(g.name)
	var notes []string
	if sum.Truncated {
		why := sum.IncompleteReason
		if why == "" {
			why = "receipts were evicted beyond the retention bounds"
		}
		notes = append(notes, fmt.Sprintf("evidence incomplete (%s): this rollback is not claimed clean", why))
	}
	if sum.Irreversible > 0 {
		notes = append(notes, fmt.Sprintf("%d irreversible effect(s) of %s stand and are not rolled back", sum.Irreversible, g.name))
	}
	pending := 0
	for _, r := range a.receipts.Receipts(g.name) {
		if r.Class == effects.Compensatable && r.Compensation == effects.CompensationNone {
			if err := a.receipts.SetCompensation(g.name, r.ID, effects.CompensationPending); err == nil {
				pending++
			}
		}
	}
	if pending > 0 {
		notes = append(notes, fmt.Sprintf("%d compensatable effect(s) of %s await compensation", pending, g.name))
	}
	return joinNotes(notes...)
}
