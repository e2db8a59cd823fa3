package ledger

import (
	"fmt"
	"iteron.dev/operator/internal/reasons"
	"time"
)

// TxnSpec is a transaction's kind and fixed identity, given to Begin. The
// module comes from the ID; started_unix_ms from the ledger's clock.
type TxnSpec struct {
	// Kind is the transaction kind; it fixes the phase grammar.
	Kind Kind
	// ID is the transaction's ID (NewTransactionID). Its lineage must be
	// New.Generation (Old.Generation for a retirement); it carries /r<n> for
	// a renewal or a relaunch, never for a first activation, hot swap or cold
	// replace, and for a retirement when the bare ID is taken.
	ID TransactionID
	// CandidateSHA256 is the activation's candidate digest.
	CandidateSHA256 string
	// Old is the generation replaced; zero for a first activation or a
	// relaunch.
	Old GenerationRef
	// New is the generation activated; zero for a retirement; equal to Old
	// for a renewal; Old.Generation + 1 for a hot swap or cold replace.
	New GenerationRef
	// AuthoritySHA256 is the admitted capabilities' digest.
	AuthoritySHA256 string
	// DeadlineMs is the whole transaction's deadline (> 0).
	DeadlineMs uint64
}

// Appended identifies the last record a Txn wrote (mirrored into Generation
// status).
type Appended struct {
	// Sequence is the record's sequence.
	Sequence uint64
	// RecordSHA256 is the record's hash.
	RecordSHA256 string
}

// Txn is one open transaction. Each method appends one phase record
// durably before it returns, and only if the phase is a legal next phase of
// the transaction's kind: an illegal call returns a *PhaseError and writes
// nothing. Next lists what is legal now.
type Txn struct {
	l        *Ledger
	epoch    uint64
	kind     Kind
	id       Identity
	grammar  grammar
	applied  phaseSet
	blocked  *Record
	switched bool
	oldState string
	newState string
	done     bool
	outcome  Outcome
	last     Appended
	reserve  int64
}

// Begin opens a transaction. It writes nothing: the first record is the
// verify phase (applied, or blocked). A Txn that has written nothing is
// dropped by the next Begin (its handle then returns ErrStale); a Txn with
// records must end (Commit, RollBack or RollbackFailed) before another
// begins. After Open reports an open transaction, Recover must close it
// first.
func (l *Ledger) Begin(spec TxnSpec) (*Txn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return nil, err
	}
	if o := l.v.open; o != nil && !o.terminal {
		return nil, fmt.Errorf("begin %s: %w: %s has no terminal record (call Recover after Open, or end it)", spec.ID, ErrTransactionOpen, o.first.TransactionID)
	}
	if _, ok := sequences[spec.Kind]; !ok {
		return nil, fmt.Errorf("begin %s: unknown transaction kind %d", spec.ID, spec.Kind)
	}
	if err := spec.ID.validate(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	t := &Txn{
		l: l, kind: spec.Kind, grammar: grammarOf(SchemaOperator, []Kind{spec.Kind}),
		id: Identity{
			TransactionID: spec.ID.String(), Module: spec.ID.module, CandidateSHA256: spec.CandidateSHA256,
			Old: spec.Old, New: spec.New, AuthoritySHA256: spec.AuthoritySHA256,
			StartedUnixMs: unixMs(l.opts.Now()), DeadlineMs: spec.DeadlineMs,
		},
	}
	// The first record must pass the reader's rules; check them now so a bad
	// identity fails at Begin, not in the middle of the work.
	probe := t.record(PhaseVerify, OutcomeApplied, nil, nil)
	probe.SchemaID = SchemaOperator
	if err := l.v.checkFields(probe, nil); err != nil {
		return nil, err
	}
	kinds, rerr := l.v.kindsOf(probe)
	if rerr != nil {
		return nil, rerr
	}
	if !containsKind(kinds, spec.Kind) {
		return nil, &RuleError{Rule: RuleGeneration, Sequence: l.v.next, TransactionID: t.id.TransactionID,
			Detail: fmt.Sprintf("generations %d → %d and this transaction_id are those of a %s, not a %s", spec.Old.Generation, spec.New.Generation, kindList(kinds, SchemaOperator), spec.Kind)}
	}
	if _, dup := l.v.seenTxn[t.id.TransactionID]; dup {
		return nil, &RuleError{Rule: RuleDuplicatePhase, Sequence: l.v.next, TransactionID: t.id.TransactionID,
			Detail: "the ledger already holds a transaction with this transaction_id; use the next attempt or renewal number"}
	}
	t.reserve = reserveFor(probe)
	l.epoch++
	t.epoch = l.epoch
	l.pending = t
	return t, nil
}

func containsKind(ks []Kind, k Kind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// reserveFor bounds the bytes a transaction with this identity can write:
// maxTxnRecords records with every optional field at its largest (both state
// digests, the longest block kind, a reason whose every byte needs an
// escape, 20-digit numbers).
func reserveFor(r *Record) int64 {
	probe := *r
	probe.OldStateSHA256, probe.NewStateSHA256 = ZeroSHA256, ZeroSHA256
	probe.Sequence, probe.ElapsedMs, probe.PreviousSHA256, probe.RecordSHA256 = ^uint64(0), ^uint64(0), ZeroSHA256, ZeroSHA256
	kind := BlockValidation
	probe.BlockKind = &kind
	line := appendRecordJSON(nil, &probe)
	// A reason escapes to at most two bytes per byte (FormatReason leaves no
	// control character), plus its quotes, replacing "null".
	longest := len(line) + 2*MaxReasonBytes + 2 - len("null")
	return maxTxnRecords * int64(longest+1)
}

// record builds the next record of the transaction (chain fields are filled
// by the ledger).
func (t *Txn) record(phase Phase, outcome Outcome, kind *BlockKind, reason *string) *Record {
	now := unixMs(t.l.opts.Now())
	elapsed := uint64(0)
	if now > t.id.StartedUnixMs {
		elapsed = now - t.id.StartedUnixMs
	}
	id := t.id
	return &Record{
		TransactionID: id.TransactionID, Module: id.Module, CandidateSHA256: id.CandidateSHA256,
		OldGeneration: id.Old.Generation, OldImplementationID: id.Old.ImplementationID,
		OldArtifactSHA256: id.Old.ArtifactSHA256, OldStateSHA256: t.oldState,
		NewGeneration: id.New.Generation, NewImplementationID: id.New.ImplementationID,
		NewArtifactSHA256: id.New.ArtifactSHA256, NewStateSHA256: t.newState,
		AuthoritySHA256: id.AuthoritySHA256, Phase: phase, Outcome: outcome,
		BlockKind: kind, Reason: reason, StartedUnixMs: id.StartedUnixMs,
		ElapsedMs: elapsed, DeadlineMs: id.DeadlineMs,
	}
}

// allowed returns the phases that may be written next.
func (t *Txn) allowed() []Phase {
	switch {
	case t.done:
		return nil
	case t.blocked != nil:
		return []Phase{PhaseRolledBack}
	}
	return t.grammar.next(t.applied)
}

// step appends one record after checking the writer's grammar (the exact
// kind), then lets the ledger check it against the reader's rules.
func (t *Txn) step(phase Phase, outcome Outcome, kind *BlockKind, reason *string, oldState, newState string) error {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	refuse := func(detail string) error {
		return &PhaseError{TransactionID: t.id.TransactionID, Kind: t.kind, Phase: phase, Outcome: outcome, Allowed: t.allowed(), Detail: detail}
	}
	if t.done {
		return refuse("the transaction has ended")
	}
	if err := l.usable(); err != nil {
		return err
	}
	if t.epoch != l.epoch || l.pending != t {
		return fmt.Errorf("transaction %s: %w", t.id.TransactionID, ErrStale)
	}
	if !containsPhase(t.allowed(), phase) {
		return refuse("")
	}
	switch {
	case outcome == OutcomeBlocked && phase == PhaseCommitted:
		return refuse("committed cannot be blocked; block the phase that failed")
	case outcome == OutcomeRollbackFailed && !t.switched:
		return refuse("rollback_failed is only for a rollback after a durable atomic_switch")
	}
	r := t.record(phase, outcome, kind, reason)
	if oldState != "" {
		r.OldStateSHA256 = oldState
	}
	if newState != "" {
		r.NewStateSHA256 = newState
	}
	if err := l.append(r, t.reserve); err != nil {
		return err
	}
	t.oldState, t.newState = r.OldStateSHA256, r.NewStateSHA256
	t.last = Appended{Sequence: r.Sequence, RecordSHA256: r.RecordSHA256}
	switch outcome {
	case OutcomeApplied:
		t.applied = t.applied.add(phase)
		if phase == PhaseAtomicSwitch {
			t.switched = true
		}
	case OutcomeBlocked:
		t.blocked = r
	default:
		t.done, t.outcome = true, outcome
		if outcome == OutcomeCommitted {
			t.applied = t.applied.add(phase)
		}
		l.pending = nil
	}
	return nil
}

// Verify records the verify phase (sources, authority, versions checked).
func (t *Txn) Verify() error { return t.step(PhaseVerify, OutcomeApplied, nil, nil, "", "") }

// ShadowLoad records the new process spawned and loaded.
func (t *Txn) ShadowLoad() error { return t.step(PhaseShadowLoad, OutcomeApplied, nil, nil, "", "") }

// SandboxNotePrefix starts the note of a shadow_load record whose process
// was started in a sandbox.
const SandboxNotePrefix = "sandbox: "

// ShadowLoadSandboxed records the new process spawned and loaded with the
// note "sandbox: <evidence>": what its sandbox applied (internal/sandbox's
// Evidence, one line). An empty evidence is ShadowLoad.
func (t *Txn) ShadowLoadSandboxed(evidence string) error {
	if evidence == "" {
		return t.ShadowLoad()
	}
	note := SandboxNotePrefix + evidence
	return t.step(PhaseShadowLoad, OutcomeApplied, nil, &note, "", "")
}

// Quiesce records dispatching stopped and the in-flight run finished or
// cancelled.
func (t *Txn) Quiesce() error { return t.step(PhaseQuiesce, OutcomeApplied, nil, nil, "", "") }

// Snapshot records the old generation's state snapshotted, with its digest
// (old_state_sha256, write-once).
func (t *Txn) Snapshot(oldStateSHA256 string) error {
	if oldStateSHA256 == "" {
		return t.refuseEmpty(PhaseSnapshot, "old_state_sha256")
	}
	return t.step(PhaseSnapshot, OutcomeApplied, nil, nil, oldStateSHA256, "")
}

// Migrate records the state migrated to the new lineage.
func (t *Txn) Migrate() error { return t.step(PhaseMigrate, OutcomeApplied, nil, nil, "", "") }

// Restore records the state restored into the new process, with its digest
// (new_state_sha256, write-once).
func (t *Txn) Restore(newStateSHA256 string) error {
	if newStateSHA256 == "" {
		return t.refuseEmpty(PhaseRestore, "new_state_sha256")
	}
	return t.step(PhaseRestore, OutcomeApplied, nil, nil, "", newStateSHA256)
}

// Readiness records the new process ready for the restored state.
func (t *Txn) Readiness() error { return t.step(PhaseReadiness, OutcomeApplied, nil, nil, "", "") }

// AtomicSwitch records the switch to the new generation. From here on a
// recovery goes forward and a failed rollback is rollback_failed.
func (t *Txn) AtomicSwitch() error {
	return t.step(PhaseAtomicSwitch, OutcomeApplied, nil, nil, "", "")
}

// Drain records the old process stopped and reaped.
func (t *Txn) Drain() error { return t.step(PhaseDrain, OutcomeApplied, nil, nil, "", "") }

// DrainCleanupFailed records the drain of an old process that had to be
// killed, with the note "cleanup_failed: <message>"; the transaction still
// commits.
func (t *Txn) DrainCleanupFailed(message string) error {
	reason := FormatReason(reasons.CleanupFailed, message)
	return t.step(PhaseDrain, OutcomeApplied, nil, &reason, "", "")
}

// Commit ends the transaction with committed.
func (t *Txn) Commit() error { return t.step(PhaseCommitted, OutcomeCommitted, nil, nil, "", "") }

// Block records that phase failed: a blocked record with code's block kind
// and the reason "<code>: <message>" (FormatReason). Only RollBack or
// RollbackFailed may follow.
func (t *Txn) Block(phase Phase, code ReasonCode, message string) error {
	kind, ok := BlockKindOf(code)
	if !ok {
		return &PhaseError{TransactionID: t.id.TransactionID, Kind: t.kind, Phase: phase, Outcome: OutcomeBlocked,
			Allowed: t.Next(), Detail: fmt.Sprintf("reason code %q cannot block a transaction", code)}
	}
	reason := FormatReason(code, message)
	return t.step(phase, OutcomeBlocked, &kind, &reason, "", "")
}

// RollBack ends a blocked transaction with rolled_back, repeating the
// block's kind and reason: the old generation serves (or, after the switch,
// serves again).
func (t *Txn) RollBack() error { return t.end(OutcomeRolledBack) }

// RollbackFailed ends a transaction blocked after its switch whose rollback
// could not restore the old generation: outcome rollback_failed.
func (t *Txn) RollbackFailed() error { return t.end(OutcomeRollbackFailed) }

func (t *Txn) end(outcome Outcome) error {
	t.l.mu.Lock()
	blocked := t.blocked
	t.l.mu.Unlock()
	if blocked == nil {
		return &PhaseError{TransactionID: t.id.TransactionID, Kind: t.kind, Phase: PhaseRolledBack, Outcome: outcome,
			Allowed: t.Next(), Detail: "only a blocked transaction rolls back"}
	}
	return t.step(PhaseRolledBack, outcome, blocked.BlockKind, blocked.Reason, "", "")
}

func (t *Txn) refuseEmpty(phase Phase, field string) error {
	return &PhaseError{TransactionID: t.id.TransactionID, Kind: t.kind, Phase: phase, Outcome: OutcomeApplied,
		Allowed: t.Next(), Detail: field + " is required"}
}

// Next returns the phases that may be written now, in the family's order.
func (t *Txn) Next() []Phase {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return t.allowed()
}

// Kind is the transaction's kind.
func (t *Txn) Kind() Kind { return t.kind }

// Identity is the transaction's fixed identity.
func (t *Txn) Identity() Identity { return t.id }

// Switched reports a durable atomic_switch record.
func (t *Txn) Switched() bool {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return t.switched
}

// Outcome is the terminal outcome, "" while the transaction is open.
func (t *Txn) Outcome() Outcome {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return t.outcome
}

// Last is the last record the transaction wrote.
func (t *Txn) Last() Appended {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return t.last
}

// Recovery reports how Recover closed an interrupted transaction.
type Recovery struct {
	// TransactionID is the transaction closed.
	TransactionID string
	// Outcome is committed (the switch, or a retirement's drain, was durable:
	// the new state stands) or rolled_back (the last committed generation
	// stands).
	Outcome Outcome
	// Appended are the records written, in order.
	Appended []RecordBrief
}

// Resume returns the open transaction a replay found, as a Txn that
// continues where its records stopped, or nil when nothing is open. The
// caller closes it as it truly ended (a host that rolled back in memory
// writes blocked + rolled_back even after the switch); Recover closes it by
// the ledger's own rule when the caller knows nothing more.
func (l *Ledger) Resume() (*Txn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return nil, err
	}
	o := l.v.open
	if o == nil || o.terminal {
		return nil, nil
	}
	t := &Txn{
		l: l, kind: o.kinds[0], id: identityOf(&o.first), grammar: grammarOf(SchemaOperator, o.kinds),
		applied: o.applied, blocked: o.blocked, switched: o.switched,
		oldState: o.oldState, newState: o.newState,
	}
	t.reserve = reserveFor(&o.first)
	l.epoch++
	t.epoch = l.epoch
	l.pending = t
	return t, nil
}

// Recover closes the open transaction a replay found
// (docs/reference/ledger.md) forward: a blocked one with rolled_back; one
// whose atomic_switch (or, for a retirement, drain) is durable with drain (if
// missing) and committed; any other with blocked(<next phase>, provider,
// "provider_failed: host restarted") and rolled_back. It returns nil when
// nothing is open. The processes of the interrupted transaction are gone with
// the manager that ran them; the caller relaunches from State.LastCommitted
// afterwards.
func (l *Ledger) Recover() (*Recovery, error) {
	return l.CloseOpen(func(t *Txn) error {
		switch {
		case t.blocked != nil:
			return t.RollBack()
		case t.switched || t.applied.has(PhaseDrain):
			if !t.applied.has(PhaseDrain) {
				if err := t.Drain(); err != nil {
					return err
				}
			}
			return t.Commit()
		default:
			next := t.grammar.next(t.applied)
			if err := t.Block(next[0], reasons.ProviderFailed, RecoveryMessage); err != nil {
				return err
			}
			return t.RollBack()
		}
	})
}

// CloseOpen resumes the open transaction a replay found and closes it with
// close, which must end it; it reports what was appended, or nil when
// nothing was open.
func (l *Ledger) CloseOpen(close func(*Txn) error) (*Recovery, error) {
	l.mu.Lock()
	first := l.v.next
	l.mu.Unlock()
	t, err := l.Resume()
	if err != nil || t == nil {
		return nil, err
	}
	if err := close(t); err != nil {
		return nil, fmt.Errorf("recover transaction %s: %w", t.id.TransactionID, err)
	}
	if t.Outcome() == "" {
		return nil, fmt.Errorf("recover transaction %s: it is still open after closing", t.id.TransactionID)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	rec := &Recovery{TransactionID: t.id.TransactionID, Outcome: t.outcome}
	s := l.v.state()
	for _, b := range s.Recent {
		if b.Sequence >= first {
			rec.Appended = append(rec.Appended, b)
		}
	}
	return rec, nil
}

// unixMs converts a time to the ledger's millisecond timestamps.
func unixMs(t time.Time) uint64 { return uint64(max(t.UnixMilli(), 0)) }
