package hotswap

import (
	"context"
	"fmt"
	"slices"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/survivor"
)

// The phases the transaction kinds share. Each returns a phase for the
// runner; the kinds (first_activation.go, swap.go, renewal.go, relaunch.go,
// retirement.go) list them.

// verifyPhase checks what the kind must check before anything starts.
func (r *txnRun) verifyPhase(check func() *phaseFailure) phase {
	return phase{name: ledger.PhaseVerify, work: func() error {
		if check != nil {
			if pf := check(); pf != nil {
				return pf
			}
		}
		return nil
	}}
}

// shadowLoadPhase spawns and loads g's process, tracked in its scope.
func (r *txnRun) shadowLoadPhase(g *generationRuntime) phase {
	return phase{name: ledger.PhaseShadowLoad, fallback: reasons.ActivationFailed, work: func() error { return r.launch(g) }, record: r.shadowLoadRecord(g)}
}

// quiescePhase stops dispatching and waits for the run in flight, cancelling
// it (with a receipt on owner) when it outlives the quiesce timeout.
func (r *txnRun) quiescePhase(owner *generationRuntime, receiptID func(callID string) string, detail string) phase {
	return phase{name: ledger.PhaseQuiesce, fallback: reasons.DeadlineExceeded, work: func() error {
		cancelled, err := r.m.dispatcher.Pause(r.ctx, r.desired.Swap.QuiesceTimeout)
		for _, cancelled := range cancelled {
			r.a.recordReceipt(owner, effects.Receipt{
				ID: receiptID(cancelled.CallID), Kind: effects.ReceiptQuiesceCancel, Class: effects.Cancelable,
				StartedAt: cancelled.StartedAt, FinishedAt: r.a.c.cfg.Now(),
				Detail: fmt.Sprintf("run %s cancelled after the %s quiesce timeout: %s", cancelled.CallID, r.desired.Swap.QuiesceTimeout, detail),
			})
		}
		return err
	}}
}

// snapshotPhase snapshots the state of from's process (proc) and makes it
// durable as kind before the record; *st receives it.
func (r *txnRun) snapshotPhase(from *generationRuntime, proc func() providers.Provider, kind string, st *providers.State) phase {
	return phase{name: ledger.PhaseSnapshot, fallback: reasons.ProviderFailed,
		work: func() error {
			p := proc()
			if p == nil {
				return &phaseFailure{ledger.PhaseSnapshot, reasons.ProviderFailed, from.name + " has no process to snapshot"}
			}
			sh, err := providers.StateOf(p)
			if err != nil {
				return err
			}
			s, err := sh.Snapshot(r.ctx, from.lineage)
			if err != nil {
				return err
			}
			if _, err := r.a.storeSnapshot(from, s, kind); err != nil {
				return &phaseFailure{ledger.PhaseSnapshot, reasons.ProviderFailed, "the snapshot could not be made durable: " + err.Error()}
			}
			*st = s
			return nil
		},
		record: func() error { return r.txn.Snapshot(st.StateSHA256) },
		durable: func() {
			r.a.mu.Lock()
			from.stateDigest = st.StateSHA256
			r.a.mu.Unlock()
		},
		touched: []*generationRuntime{from},
	}
}

// restorePhase restores *st into g's process.
func (r *txnRun) restorePhase(g *generationRuntime, st *providers.State) phase {
	return phase{name: ledger.PhaseRestore, fallback: reasons.ProviderFailed,
		work: func() error {
			sh, err := providers.StateOf(g.proc)
			if err != nil {
				return err
			}
			return sh.Restore(r.ctx, *st)
		},
		record: func() error { return r.txn.Restore(st.StateSHA256) },
		durable: func() {
			r.a.mu.Lock()
			g.stateDigest = st.StateSHA256
			r.a.mu.Unlock()
		},
	}
}

// readinessPhase proves g's process ready for *st; durableAs, when set,
// makes the restored state durable before the record (a swap's restored
// state: after a durable switch, recovery goes forward with it).
func (r *txnRun) readinessPhase(g *generationRuntime, st *providers.State, durableAs string) phase {
	return phase{name: ledger.PhaseReadiness, fallback: reasons.ProviderFailed, work: func() error {
		sh, err := providers.StateOf(g.proc)
		if err != nil {
			return err
		}
		if err := sh.Readiness(r.ctx, g.lineage, st.StateSHA256); err != nil {
			return err
		}
		if durableAs != "" {
			if _, err := r.a.storeSnapshot(g, *st, durableAs); err != nil {
				return &phaseFailure{ledger.PhaseReadiness, reasons.ProviderFailed, "the restored state could not be made durable: " + err.Error()}
			}
		}
		return nil
	}}
}

// switchPhase swaps the module's route to route in one pointer swap. A
// transaction without a quiesce pauses first. undo puts back what routed
// before; durable is what the durable switch makes true.
func (r *txnRun) switchPhase(route func() dispatch.Route, durable func()) phase {
	var previous *dispatch.Route
	return phase{name: ledger.PhaseAtomicSwitch, fallback: reasons.ActivationFailed,
		work: func() error {
			if !r.m.dispatcher.Paused() {
				if _, err := r.m.dispatcher.Pause(r.ctx, 0); err != nil {
					return err
				}
			}
			next := route()
			prev, err := r.m.dispatcher.Switch(next)
			previous = prev
			if err != nil {
				return err
			}
			// The route is a resource of the generation it sends calls to:
			// disposing that generation withdraws it if it still routes.
			r.a.trackRoute(next, r.m)
			return nil
		},
		undo: func() {
			back := dispatch.Route{}
			if previous != nil {
				back = *previous
			}
			_, _ = r.m.dispatcher.Switch(back)
		},
		durable: func() {
			if durable != nil {
				durable()
			}
			// The switch is durable: the routed process is the one a
			// restarted manager re-attaches (if the transaction's close
			// keeps it).
			r.a.noteAttached(r.m.name, r.gen, r.txn.Identity().TransactionID)
		},
	}
}

// committedPhase ends the transaction; done is what commits in memory.
func (r *txnRun) committedPhase(done func()) phase {
	return phase{name: ledger.PhaseCommitted, durable: func() {
		r.a.mu.Lock()
		r.gen.step = iteronv1.StepCommitted
		r.a.mu.Unlock()
		if done != nil {
			done()
		}
	}}
}

// launch starts and loads a generation's process, tracked in its scope.
// A process launched ahead for g (prelaunch.go) is taken instead of
// starting one: its launch or load error is this phase's.
func (r *txnRun) launch(g *generationRuntime) error {
	var proc providers.Provider
	var aheadErr error
	loaded := false
	if ahead := r.a.takeAhead(g); ahead != nil {
		if ahead.proc == nil {
			return fail(ledger.PhaseShadowLoad, ahead.err, reasons.ActivationFailed)
		}
		proc, aheadErr, loaded = ahead.proc, ahead.err, true
	} else {
		tag := survivor.Tag{ActivationUID: r.a.key.UID, Module: r.m.name, Generation: g.name, Transaction: r.txn.Identity().TransactionID}
		p, err := r.a.c.cfg.Launch(r.ctx, providers.LaunchRequest{Plan: g.target.Plan, Tag: tag, Epoch: g.target.Epoch})
		if err != nil {
			return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
		}
		proc = p
	}
	r.a.mu.Lock()
	g.proc = proc
	g.lastPid = proc.Pid()
	g.procStartedAt = proc.StartedAt()
	r.a.mu.Unlock()
	r.a.noteSandbox(g, proc)
	if err := trackProcess(r.ctx, g.scope, proc); err != nil {
		// Track disposed it at once (the scope was closed): the error says
		// whether closing it failed too.
		return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
	}
	if loaded {
		if aheadErr != nil {
			return fail(ledger.PhaseShadowLoad, aheadErr, reasons.ActivationFailed)
		}
		return nil
	}
	if err := proc.Load(r.ctx); err != nil {
		return fail(ledger.PhaseShadowLoad, err, reasons.ActivationFailed)
	}
	return nil
}

// captureStderr keeps g's process's stderr tail for its status.
func (r *txnRun) captureStderr(g *generationRuntime) {
	r.a.mu.Lock()
	proc := g.proc
	r.a.mu.Unlock()
	if proc == nil {
		return
	}
	tail, dropped := proc.StderrTail()
	r.a.mu.Lock()
	g.stderrTail, g.stderrDropped = tail, dropped
	r.a.mu.Unlock()
}

// markFailed marks a target generation Failed: it is not retried until the
// controller hands a new attempt (at once when the failure was not the
// provider's: the ledger could not be written).
func (r *txnRun) markFailed(pf *phaseFailure, what string) {
	r.a.mu.Lock()
	g := r.gen
	r.a.setPhase(g, iteronv1.PhaseFailed)
	g.step = iteronv1.StepRolledBack
	g.reason, g.message = string(pf.code), truncateMessage(fmt.Sprintf("%s %s at %s: %s", g.name, what, pf.phase, pf.message))
	g.proc = nil
	r.a.failed[g.name] = Failure{Module: r.m.name, GenerationName: g.name, Code: string(pf.code), Message: g.message,
		Retryable: pf.code == reasons.LedgerUnwritable}
	r.a.mu.Unlock()
	r.log("transaction rolled back", "module", r.m.name, "generation", g.name, "phase", pf.phase, "reason", pf.code, "message", pf.message)
}

// route is the dispatcher route of a generation. Runs of a provider
// admitted irreversible_external or trust_mutating effects leave a receipt.
//
// Runs on the activation's worker, with or without a.mu held: the worker is
// the only writer of g.scope and g.proc, so it reads them without the lock.
func (a *activationRuntime) route(g *generationRuntime) dispatch.Route {
	return a.routeTo(g, g.proc, g.scope)
}

// routeTo is g's route served by proc, whose resources scope holds (a
// renewal routes to its fresh process, in its own scope, before it becomes
// g's).
func (a *activationRuntime) routeTo(g *generationRuntime, proc providers.Provider, scope *effects.EffectScope) dispatch.Route {
	var backend dispatch.Backend = &countingBackend{Backend: proc, a: a, g: g}
	if class, ok := receiptClass(g.target.Plan.AdmittedCapabilities()); ok {
		backend = &receiptBackend{Backend: proc, a: a, g: g, class: class}
	}
	route := dispatch.Route{Lineage: g.lineage, Name: g.name, Epoch: g.target.Epoch, Revision: g.target.Revision, Backend: backend, Scope: scope}
	if pb, ok := proc.(dispatch.PackageBackend); ok {
		route.Package = pb
		if m, ok := g.target.Plan.PackageRuntime(); ok {
			route.Slots = int(m.Limits.MaxConcurrentInvocations)
		}
	}
	return route
}

// receiptClass is the effect class of a provider's runs, by its admitted
// capabilities: irreversible_external runs are Irreversible (never reported
// as rolled back), trust_mutating runs Compensatable.
func receiptClass(admitted []string) (effects.Class, bool) {
	switch {
	case slices.Contains(admitted, "irreversible_external"):
		return effects.Irreversible, true
	case slices.Contains(admitted, "trust_mutating"):
		return effects.Compensatable, true
	}
	return 0, false
}

// receiptBackend records a receipt for every run of a provider whose runs
// have effects that cannot simply be undone.
type receiptBackend struct {
	dispatch.Backend
	a     *activationRuntime
	g     *generationRuntime
	class effects.Class
}

func (b *receiptBackend) Run(ctx context.Context, req dispatch.RunRequest, observe func(dispatch.Observation)) (dispatch.Observation, error) {
	started := b.a.c.cfg.Now()
	obs, err := b.Backend.Run(ctx, req, observe)
	detail := "completed"
	if err != nil {
		detail = "ended without a terminal observation: " + firstLine(err.Error())
	}
	b.a.recordReceipt(b.g, effects.Receipt{ID: "run-" + req.ID, Kind: effects.ReceiptRun, Class: b.class, StartedAt: started, FinishedAt: b.a.c.cfg.Now(), Detail: detail})
	return obs, err
}

// ref is the generation as the ledger names it: from its plan, or from the
// ledger's own record for a committed generation with no plan in hand.
func (g *generationRuntime) ref() ledger.GenerationRef {
	if c := g.recovered; c != nil {
		return ledger.GenerationRef{Generation: uint64(g.lineage), ImplementationID: c.ImplementationID, ArtifactSHA256: c.ArtifactSHA256}
	}
	return ledger.GenerationRef{Generation: uint64(g.lineage), ImplementationID: g.target.Plan.ImplementationID(), ArtifactSHA256: g.target.Plan.ArtifactSHA256()}
}

// authority is the generation's authority digest.
func (g *generationRuntime) authority() string {
	if c := g.recovered; c != nil {
		return c.AuthoritySHA256
	}
	return g.target.Plan.AuthoritySHA256()
}

// newGeneration makes a generation for a target, Preparing; register adds
// it to its module once its transaction has begun.
func (a *activationRuntime) newGeneration(m *moduleRuntime, t ModuleTarget) *generationRuntime {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &generationRuntime{
		name: t.GenerationName, module: m.name, lineage: t.Lineage, attempt: t.Attempt, target: t,
		phase: iteronv1.PhasePreparing, step: iteronv1.StepVerify, startedAt: a.c.cfg.Now(),
		scope: effects.NewScope(t.GenerationName), rCount: a.rCounts[t.GenerationName],
	}
}

// register makes a generation visible in status. Caller holds a.mu.
func (m *moduleRuntime) register(g *generationRuntime) { m.remember(g) }

// beginFailed handles a transaction that could not begin: the ledger
// refused (frozen or closed). Nothing was started.
func (a *activationRuntime) beginFailed(module string, err error) {
	a.log("cannot begin a transaction", "module", module, "error", err.Error())
	a.ledgerUnwritable(err)
}
