package ledger

import (
	"fmt"
	"iteron.dev/operator/internal/reasons"
	"strconv"
	"strings"
)

// RecentRecords is how many records the status summary keeps.
const RecentRecords = 16

// RecordBrief is one record summarized for object status and `ledger show`.
type RecordBrief struct {
	// Sequence is the record's sequence.
	Sequence uint64 `json:"sequence"`
	// TransactionID is its transaction.
	TransactionID string `json:"transactionID"`
	// Module is the module acted on.
	Module string `json:"module"`
	// Phase is the record's phase.
	Phase Phase `json:"phase"`
	// Outcome is the record's outcome.
	Outcome Outcome `json:"outcome"`
	// OldGeneration and NewGeneration are the transaction's generations.
	OldGeneration uint64 `json:"oldGeneration"`
	// NewGeneration is the generation activated, 0 for a retirement.
	NewGeneration uint64 `json:"newGeneration"`
	// Reason is the record's reason, "" when null.
	Reason string `json:"reason,omitempty"`
	// ElapsedMs is the time since the transaction started.
	ElapsedMs uint64 `json:"elapsedMs"`
	// RecordSHA256 is the record's hash.
	RecordSHA256 string `json:"recordSHA256"`
}

func briefOf(r *Record) RecordBrief {
	b := RecordBrief{
		Sequence: r.Sequence, TransactionID: r.TransactionID, Module: r.Module,
		Phase: r.Phase, Outcome: r.Outcome, OldGeneration: r.OldGeneration,
		NewGeneration: r.NewGeneration, ElapsedMs: r.ElapsedMs, RecordSHA256: r.RecordSHA256,
	}
	if r.Reason != nil {
		b.Reason = *r.Reason
	}
	return b
}

// Identity is a transaction's fixed identity: the fields every record of the
// transaction repeats unchanged. (The family's identity also fixes the state
// digests; in SchemaOperator they are write-once instead.)
type Identity struct {
	// TransactionID is the transaction's ID.
	TransactionID string
	// Module is the module acted on.
	Module string
	// CandidateSHA256 is the activation's candidate digest.
	CandidateSHA256 string
	// Old is the generation replaced (zero for a first activation or relaunch).
	Old GenerationRef
	// New is the generation activated (zero for a retirement).
	New GenerationRef
	// AuthoritySHA256 is the admitted capabilities' digest.
	AuthoritySHA256 string
	// StartedUnixMs is when the transaction started.
	StartedUnixMs uint64
	// DeadlineMs is the transaction's deadline.
	DeadlineMs uint64
}

// GenerationRef names one side of a transaction.
type GenerationRef struct {
	// Generation is the lineage number; 0 when the side is absent.
	Generation uint64
	// ImplementationID is the implementation; "" when the side is absent.
	ImplementationID string
	// ArtifactSHA256 is the artifact's digest; "" when the side is absent.
	ArtifactSHA256 string
}

func identityOf(r *Record) Identity {
	return Identity{
		TransactionID: r.TransactionID, Module: r.Module, CandidateSHA256: r.CandidateSHA256,
		Old:             GenerationRef{r.OldGeneration, r.OldImplementationID, r.OldArtifactSHA256},
		New:             GenerationRef{r.NewGeneration, r.NewImplementationID, r.NewArtifactSHA256},
		AuthoritySHA256: r.AuthoritySHA256, StartedUnixMs: r.StartedUnixMs, DeadlineMs: r.DeadlineMs,
	}
}

// OpenTransaction is a transaction with records and no terminal record.
type OpenTransaction struct {
	// Identity is the transaction's fixed identity.
	Identity Identity
	// Kinds are the kinds its identity and phases allow (one, except a swap
	// that has not yet passed quiesce: hot swap or cold replace).
	Kinds []Kind
	// Applied are its applied phases, in order.
	Applied []Phase
	// Blocked is its blocked record, nil when it was not blocked.
	Blocked *RecordBrief
	// Switched reports a durable atomic_switch record: recovery goes forward.
	Switched bool
	// OldStateSHA256 and NewStateSHA256 are the state digests set so far.
	OldStateSHA256 string
	// NewStateSHA256 is the restored state's digest, "" until restore.
	NewStateSHA256 string
	// FirstSequence and LastSequence bound its records.
	FirstSequence uint64
	// LastSequence is the sequence of its last record.
	LastSequence uint64
}

// CommittedTransaction is a module's last committed transaction: what a
// restarted manager relaunches (nothing, after a retirement).
type CommittedTransaction struct {
	// TransactionID is the transaction's ID.
	TransactionID string
	// Kind is its kind.
	Kind Kind
	// Generation is the module's active generation after it (0 after a
	// retirement).
	Generation uint64
	// ImplementationID and ArtifactSHA256 name what is active after it.
	ImplementationID string
	// ArtifactSHA256 is the active artifact's digest.
	ArtifactSHA256 string
	// StateSHA256 is the state restored into it, "" when none was.
	StateSHA256 string
	// AuthoritySHA256 is the admitted capabilities' digest.
	AuthoritySHA256 string
	// Sequence and RecordSHA256 identify its committed record.
	Sequence uint64
	// RecordSHA256 is the committed record's hash.
	RecordSHA256 string
	// Segment is the segment number holding the committed record.
	Segment int
}

// Anchor is a record the caller knows, such as the head mirrored into
// object status: a replay checks that the record at Sequence has the hash.
type Anchor struct {
	// Sequence is the record's sequence.
	Sequence uint64
	// RecordSHA256 is its hash.
	RecordSHA256 string
}

// State is what a replay established.
type State struct {
	// Schema is the ledger's schema ("" for an empty ledger).
	Schema Schema
	// FirstSegment and LastSegment are the retained segment numbers (0 when
	// a single file was verified).
	FirstSegment int
	// LastSegment is the segment being appended to.
	LastSegment int
	// FirstSequence is the first retained record's sequence.
	FirstSequence uint64
	// NextSequence is the sequence of the next record: the number of records
	// the ledger has ever held.
	NextSequence uint64
	// Records is the number of retained (verified) records.
	Records uint64
	// HeadSHA256 is the last record's hash (ZeroSHA256 when empty): the next
	// record's previous_sha256.
	HeadSHA256 string
	// Open is the open transaction, nil when none.
	Open *OpenTransaction
	// LastCommitted maps each module to its last committed transaction.
	LastCommitted map[string]CommittedTransaction
	// Recent are the last RecentRecords records, oldest first.
	Recent []RecordBrief
	// AnchorVerified reports that the caller's anchor was found in the chain;
	// false without an anchor or when it lies before the retained records.
	AnchorVerified bool
}

// txnState is the replay state of one transaction.
type txnState struct {
	first    Record
	kinds    []Kind
	grammar  grammar
	applied  phaseSet
	seen     uint16
	blocked  *Record
	switched bool
	oldState string
	newState string
	terminal bool
	lastSeq  uint64
}

// validator is the replay state machine. A reader feeds it every record; a
// writer runs each record it is about to write through check, so the writer
// can never write what the reader rejects.
type validator struct {
	schema    Schema
	anchored  bool
	started   bool
	next      uint64
	head      string
	first     uint64
	segment   int
	open      *txnState
	spare     *txnState // check's scratch state, swapped with open by apply
	seenTxn   map[string]struct{}
	committed map[string]CommittedTransaction
	recent    [RecentRecords]RecordBrief
	recentN   int
	anchor    *Anchor
	anchorOK  bool
}

func newValidator(anchor *Anchor) *validator {
	return &validator{head: ZeroSHA256, seenTxn: map[string]struct{}{}, committed: map[string]CommittedTransaction{}, anchor: anchor}
}

func (v *validator) fail(rule Rule, r *Record, format string, args ...any) *RuleError {
	return &RuleError{Rule: rule, Sequence: v.next, TransactionID: r.TransactionID, Detail: fmt.Sprintf(format, args...)}
}

// check validates r, whose recomputed hash is hash, as the next record, and
// returns the transaction state after it, for apply. It changes nothing
// else: the state lives in v's spare txnState until apply installs it or the
// next check overwrites it.
func (v *validator) check(r *Record, hash string) (*txnState, *RuleError) {
	switch {
	case r.SchemaID != SchemaFamily && r.SchemaID != SchemaOperator:
		return nil, v.fail(RuleUnknownSchema, r, "schema_id %q is not %s or %s", r.SchemaID, SchemaOperator, SchemaFamily)
	case v.schema != "" && r.SchemaID != v.schema:
		return nil, v.fail(RuleMixedSchemas, r, "schema_id %s in a ledger of %s", r.SchemaID, v.schema)
	}
	if v.started || !v.anchored {
		if r.Sequence != v.next {
			return nil, v.fail(RuleSequence, r, "sequence is %d, the record's position is %d", r.Sequence, v.next)
		}
		if r.PreviousSHA256 != v.head {
			return nil, v.fail(RuleChain, r, "previous_sha256 is %s, the previous record's hash is %s", r.PreviousSHA256, v.head)
		}
	} else if !validDigest(r.PreviousSHA256) {
		return nil, v.fail(RuleChain, r, "previous_sha256 %q is not a digest", r.PreviousSHA256)
	}
	if r.RecordSHA256 != hash {
		return nil, v.fail(RuleRecordHash, r, "record_sha256 is %s, the record hashes to %s", r.RecordSHA256, hash)
	}
	// Fields equal to the open transaction's first record were checked
	// when it started.
	var known *Record
	if v.open != nil && !v.open.terminal && v.open.first.TransactionID == r.TransactionID {
		known = &v.open.first
	}
	if err := v.checkFields(r, known); err != nil {
		return nil, err
	}

	if v.spare == nil {
		v.spare = new(txnState)
	}
	t := v.spare
	if v.open != nil && !v.open.terminal {
		*t = *v.open
		if r.TransactionID != t.first.TransactionID {
			err := v.fail(RuleMissingTerminal, r, "transaction %s has no terminal record before transaction %s starts", t.first.TransactionID, r.TransactionID)
			err.TransactionID = t.first.TransactionID
			return nil, err
		}
		if field, was, is := identityDiff(r.SchemaID, &t.first, r); field != "" {
			return nil, v.fail(RuleIdentityChanged, r, "%s changed from %s to %s inside the transaction", field, was, is)
		}
	} else {
		if _, dup := v.seenTxn[r.TransactionID]; dup {
			return nil, v.fail(RuleDuplicatePhase, r, "(%s, %s) repeats a phase of an earlier transaction with the same transaction_id", r.TransactionID, r.Phase)
		}
		kinds, err := v.kindsOf(r)
		if err != nil {
			return nil, err
		}
		*t = txnState{first: *r, kinds: kinds, grammar: grammarOf(r.SchemaID, kinds)}
		if r.SchemaID == SchemaFamily {
			t.oldState, t.newState = r.OldStateSHA256, r.NewStateSHA256
		}
	}
	if err := v.checkStates(t, r); err != nil {
		return nil, err
	}
	if bit := uint16(1) << phaseIndex(r.Phase); t.seen&bit != 0 {
		return nil, v.fail(RuleDuplicatePhase, r, "(%s, %s) appears twice", r.TransactionID, r.Phase)
	}
	if err := v.checkGrammar(t, r); err != nil {
		return nil, err
	}
	if v.anchor != nil && r.Sequence == v.anchor.Sequence && r.RecordSHA256 != v.anchor.RecordSHA256 {
		return nil, v.fail(RuleAnchor, r, "the record at sequence %d hashes to %s, the anchor says %s", r.Sequence, r.RecordSHA256, v.anchor.RecordSHA256)
	}

	// The transition.
	t.seen |= uint16(1) << phaseIndex(r.Phase)
	t.lastSeq = r.Sequence
	switch r.Outcome {
	case OutcomeApplied:
		t.applied = t.applied.add(r.Phase)
		if r.Phase == PhaseAtomicSwitch {
			t.switched = true
		}
	case OutcomeBlocked:
		blocked := *r
		t.blocked = &blocked
	case OutcomeCommitted, OutcomeRolledBack, OutcomeRollbackFailed:
		if r.Outcome == OutcomeCommitted {
			t.applied = t.applied.add(r.Phase)
		}
		t.terminal = true
	}
	return t, nil
}

// checkFields checks each field's format and the pairing of phase, outcome,
// block kind and reason, which need no history.
func (v *validator) checkFields(r *Record, known *Record) *RuleError {
	if known == nil {
		known = &Record{}
	}
	family := r.SchemaID == SchemaFamily
	optionalDigest := func(name, d, knownD string) *RuleError {
		if d == knownD && d != "" {
			return nil
		}
		if d != "" && !validDigest(d) || family && d == "" {
			return v.fail(RuleInvalidField, r, "%s %q is not sha256: and 64 lowercase hex", name, d)
		}
		return nil
	}
	optionalID := func(name, id, knownID string) *RuleError {
		if id == knownID && id != "" {
			return nil
		}
		if id != "" && !validID(id) || family && id == "" {
			return v.fail(RuleInvalidField, r, "%s %q is not 1-128 bytes of [A-Za-z0-9._-/:@+]", name, id)
		}
		return nil
	}
	switch {
	case r.TransactionID != known.TransactionID && !validID(r.TransactionID):
		return v.fail(RuleInvalidField, r, "transaction_id %q is not 1-128 bytes of [A-Za-z0-9._-/:@+]", r.TransactionID)
	case r.Module != known.Module && !validModule(r.Module):
		return v.fail(RuleInvalidField, r, "module %q does not match ^[a-z][a-z0-9_]{0,47}$", r.Module)
	case r.CandidateSHA256 != known.CandidateSHA256 && !validDigest(r.CandidateSHA256):
		return v.fail(RuleInvalidField, r, "candidate_sha256 %q is not sha256: and 64 lowercase hex", r.CandidateSHA256)
	case r.AuthoritySHA256 != known.AuthoritySHA256 && !validDigest(r.AuthoritySHA256):
		return v.fail(RuleInvalidField, r, "authority_sha256 %q is not sha256: and 64 lowercase hex", r.AuthoritySHA256)
	case r.DeadlineMs == 0:
		return v.fail(RuleInvalidField, r, "deadline_ms is 0, must be > 0")
	case !r.Phase.known():
		return v.fail(RuleInvalidField, r, "phase %q is not a phase", r.Phase)
	case r.BlockKind != nil && !r.BlockKind.known():
		return v.fail(RuleInvalidField, r, "block_kind %q is not validation, dependency, provider or deadline", *r.BlockKind)
	}
	oldState, newState := known.OldStateSHA256, known.NewStateSHA256
	if v.open != nil && known == &v.open.first {
		oldState, newState = v.open.oldState, v.open.newState
	}
	for _, f := range [...]struct{ name, value, known string }{
		{"old_artifact_sha256", r.OldArtifactSHA256, known.OldArtifactSHA256},
		{"old_state_sha256", r.OldStateSHA256, oldState},
		{"new_artifact_sha256", r.NewArtifactSHA256, known.NewArtifactSHA256},
		{"new_state_sha256", r.NewStateSHA256, newState},
	} {
		if err := optionalDigest(f.name, f.value, f.known); err != nil {
			return err
		}
	}
	if err := optionalID("old_implementation_id", r.OldImplementationID, known.OldImplementationID); err != nil {
		return err
	}
	if err := optionalID("new_implementation_id", r.NewImplementationID, known.NewImplementationID); err != nil {
		return err
	}

	// The outcome must fit the phase.
	fits := false
	switch r.Phase {
	case PhaseCommitted:
		fits = r.Outcome == OutcomeCommitted
	case PhaseRolledBack:
		fits = r.Outcome == OutcomeRolledBack || r.Outcome == OutcomeRollbackFailed && !family
	default:
		fits = r.Outcome == OutcomeApplied || r.Outcome == OutcomeBlocked
	}
	if !fits {
		return v.fail(RuleOutcome, r, "outcome %q does not fit phase %s", r.Outcome, r.Phase)
	}

	// Block kind and reason.
	if r.Reason != nil {
		reason := *r.Reason
		if len(reason) == 0 || len(reason) > MaxReasonBytes {
			return v.fail(RuleReason, r, "reason is %d bytes, must be 1-%d", len(reason), MaxReasonBytes)
		}
		if i := strings.IndexAny(reason, "\n\r\x00"); i >= 0 {
			return v.fail(RuleReason, r, "reason has %q at byte %d", reason[i], i)
		}
	}
	switch {
	case r.Phase == PhaseRolledBack:
		// Checked against the blocked record (rollback_mismatch).
	case r.Outcome == OutcomeBlocked:
		if r.BlockKind == nil || r.Reason == nil {
			return v.fail(RuleReason, r, "a blocked record sets both block_kind and reason")
		}
		if !family {
			code, _, ok := parseReason(*r.Reason)
			kind, blocks := BlockKindOf(code)
			switch {
			case !ok:
				return v.fail(RuleReason, r, "reason %q is not \"<code>: <message>\" with a code of docs/reference/reasons.md", *r.Reason)
			case !blocks:
				return v.fail(RuleReason, r, "reason code %s cannot block a transaction", code)
			case kind != *r.BlockKind:
				return v.fail(RuleReason, r, "reason code %s has block_kind %s, the record says %s", code, kind, *r.BlockKind)
			}
		}
	case r.BlockKind != nil:
		return v.fail(RuleReason, r, "block_kind is set on a %s record with outcome %s", r.Phase, r.Outcome)
	case r.Reason != nil && !family && r.Phase == PhaseShadowLoad && r.Outcome == OutcomeApplied:
		if !strings.HasPrefix(*r.Reason, SandboxNotePrefix) || len(*r.Reason) == len(SandboxNotePrefix) {
			return v.fail(RuleReason, r, "a shadow_load note must be \"sandbox: <evidence>\", not %q", *r.Reason)
		}
	case r.Reason != nil:
		if family || r.Phase != PhaseDrain || r.Outcome != OutcomeApplied {
			return v.fail(RuleReason, r, "reason is set on a %s record with outcome %s without block_kind", r.Phase, r.Outcome)
		}
		if code, _, ok := parseReason(*r.Reason); !ok || code != reasons.CleanupFailed {
			return v.fail(RuleReason, r, "a drain note must be \"cleanup_failed: <message>\", not %q", *r.Reason)
		}
	}
	return nil
}

// kindsOf checks the first record of a transaction and infers its kinds.
func (v *validator) kindsOf(r *Record) ([]Kind, *RuleError) {
	if r.SchemaID == SchemaFamily {
		if r.OldGeneration == 0 || r.NewGeneration != r.OldGeneration+1 {
			return nil, v.fail(RuleGeneration, r, "a family swap needs old_generation > 0 and new_generation = old_generation + 1, not %d → %d", r.OldGeneration, r.NewGeneration)
		}
		return []Kind{KindHotSwap}, nil
	}
	if err := v.checkSide(r, "old", r.OldGeneration, r.OldImplementationID, r.OldArtifactSHA256, r.OldStateSHA256); err != nil {
		return nil, err
	}
	if err := v.checkSide(r, "new", r.NewGeneration, r.NewImplementationID, r.NewArtifactSHA256, r.NewStateSHA256); err != nil {
		return nil, err
	}
	id, err := ParseTransactionID(r.TransactionID)
	if err != nil {
		return nil, v.fail(RuleTransactionID, r, "%v", err)
	}
	if id.module != r.Module {
		return nil, v.fail(RuleTransactionID, r, "transaction_id names module %s, the record module %s", id.module, r.Module)
	}
	var kinds []Kind
	lineage := r.NewGeneration
	old, nw := r.OldGeneration, r.NewGeneration
	switch {
	case old == 0 && nw == 0:
		return nil, v.fail(RuleGeneration, r, "old_generation and new_generation are both 0")
	case old == 0:
		kinds = []Kind{KindFirstActivation}
		if id.renewal > 0 {
			kinds = []Kind{KindRelaunch}
		}
	case nw == 0:
		kinds, lineage = []Kind{KindRetirement}, old
	case nw == old:
		if r.NewImplementationID != r.OldImplementationID || r.NewArtifactSHA256 != r.OldArtifactSHA256 {
			return nil, v.fail(RuleGeneration, r, "a renewal (new_generation = old_generation = %d) keeps the implementation and artifact", old)
		}
		kinds = []Kind{KindRenewal}
	case nw == old+1:
		kinds = []Kind{KindHotSwap, KindColdReplace}
	default:
		return nil, v.fail(RuleGeneration, r, "new_generation %d is neither 0, old_generation %d, nor old_generation + 1", nw, old)
	}
	if id.lineage != lineage {
		return nil, v.fail(RuleTransactionID, r, "transaction_id has lineage g%d, the %s transaction's generation is %d", id.lineage, kinds[0], lineage)
	}
	// A retirement is one more transaction on the generation whose
	// activation already used the bare ID, so it may carry /r<n>; renewals
	// carry it always, swaps never.
	wantRenewal := kinds[0] == KindRelaunch || kinds[0] == KindRenewal
	if (id.renewal > 0) != wantRenewal && kinds[0] != KindFirstActivation && kinds[0] != KindRetirement {
		if wantRenewal {
			return nil, v.fail(RuleTransactionID, r, "a %s transaction_id ends in /r<n>", kinds[0])
		}
		return nil, v.fail(RuleTransactionID, r, "a %s transaction_id has no /r<n>", kinds[0])
	}
	return kinds, nil
}

func (v *validator) checkSide(r *Record, side string, gen uint64, impl, artifact, state string) *RuleError {
	if gen == 0 {
		if impl != "" || artifact != "" || state != "" {
			return v.fail(RuleGeneration, r, "%s_generation is 0 but the %s implementation, artifact or state is set", side, side)
		}
		return nil
	}
	if impl == "" || artifact == "" {
		return v.fail(RuleGeneration, r, "%s_generation is %d but %s_implementation_id or %s_artifact_sha256 is empty", side, gen, side, side)
	}
	return nil
}

// identityDiff returns the first identity field in which b differs from a.
// Equal identities, the common case, are compared without formatting.
func identityDiff(schema Schema, a, b *Record) (field, was, is string) {
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	switch {
	case a.Module != b.Module:
		return "module", a.Module, b.Module
	case a.CandidateSHA256 != b.CandidateSHA256:
		return "candidate_sha256", a.CandidateSHA256, b.CandidateSHA256
	case a.OldGeneration != b.OldGeneration:
		return "old_generation", u(a.OldGeneration), u(b.OldGeneration)
	case a.OldImplementationID != b.OldImplementationID:
		return "old_implementation_id", a.OldImplementationID, b.OldImplementationID
	case a.OldArtifactSHA256 != b.OldArtifactSHA256:
		return "old_artifact_sha256", a.OldArtifactSHA256, b.OldArtifactSHA256
	case a.NewGeneration != b.NewGeneration:
		return "new_generation", u(a.NewGeneration), u(b.NewGeneration)
	case a.NewImplementationID != b.NewImplementationID:
		return "new_implementation_id", a.NewImplementationID, b.NewImplementationID
	case a.NewArtifactSHA256 != b.NewArtifactSHA256:
		return "new_artifact_sha256", a.NewArtifactSHA256, b.NewArtifactSHA256
	case a.AuthoritySHA256 != b.AuthoritySHA256:
		return "authority_sha256", a.AuthoritySHA256, b.AuthoritySHA256
	case a.StartedUnixMs != b.StartedUnixMs:
		return "started_unix_ms", u(a.StartedUnixMs), u(b.StartedUnixMs)
	case a.DeadlineMs != b.DeadlineMs:
		return "deadline_ms", u(a.DeadlineMs), u(b.DeadlineMs)
	case schema == SchemaFamily && a.OldStateSHA256 != b.OldStateSHA256:
		return "old_state_sha256", a.OldStateSHA256, b.OldStateSHA256
	case schema == SchemaFamily && a.NewStateSHA256 != b.NewStateSHA256:
		return "new_state_sha256", a.NewStateSHA256, b.NewStateSHA256
	}
	return "", "", ""
}

// checkStates enforces SchemaOperator's write-once state digests: "" until
// the snapshot (old) or restore (new) record sets it, then unchanged.
func (v *validator) checkStates(t *txnState, r *Record) *RuleError {
	if r.SchemaID == SchemaFamily {
		return nil
	}
	check := func(name string, set *string, got string, setter Phase) *RuleError {
		setting := r.Phase == setter && r.Outcome == OutcomeApplied
		switch {
		case *set != "" && got != *set:
			return v.fail(RuleStateDigest, r, "%s changed from %s to %q after it was set", name, *set, got)
		case *set == "" && got != "" && !setting:
			return v.fail(RuleStateDigest, r, "%s is set by a %s %s record; only the %s record sets it", name, r.Phase, r.Outcome, setter)
		case *set == "" && setting && got == "":
			return v.fail(RuleStateDigest, r, "the %s record does not set %s", setter, name)
		}
		*set = got
		return nil
	}
	if err := check("old_state_sha256", &t.oldState, r.OldStateSHA256, PhaseSnapshot); err != nil {
		return err
	}
	return check("new_state_sha256", &t.newState, r.NewStateSHA256, PhaseRestore)
}

// checkGrammar checks the record's phase and outcome against the
// transaction's history.
func (v *validator) checkGrammar(t *txnState, r *Record) *RuleError {
	if r.Phase == PhaseRolledBack {
		if t.blocked == nil {
			return v.fail(RulePhaseGrammar, r, "rolled_back without a blocked record")
		}
		if r.Outcome == OutcomeRollbackFailed && !t.switched {
			return v.fail(RuleOutcome, r, "rollback_failed without a durable atomic_switch: nothing was switched, so the old generation was never left")
		}
		if !sameOptional((*string)(r.BlockKind), (*string)(t.blocked.BlockKind)) || !sameOptional(r.Reason, t.blocked.Reason) {
			return v.fail(RuleRollbackMismatch, r, "rolled_back has block_kind %s and reason %s, the blocked record %s and %s",
				optional((*string)(r.BlockKind)), optional(r.Reason), optional((*string)(t.blocked.BlockKind)), optional(t.blocked.Reason))
		}
		return nil
	}
	if t.blocked != nil {
		return v.fail(RulePhaseGrammar, r, "%s after the blocked %s record; only rolled_back may follow", r.Phase, t.blocked.Phase)
	}
	if !t.grammar.allows(t.applied, r.Phase) {
		return v.fail(RulePhaseGrammar, r, "%s after %s; the %s grammar allows %s", r.Phase, phaseList(t.applied.phases()), kindList(t.kinds, r.SchemaID), phaseList(t.grammar.next(t.applied)))
	}
	return nil
}

func sameOptional(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func optional(s *string) string {
	if s == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *s)
}

func phaseList(ps []Phase) string {
	if len(ps) == 0 {
		return "nothing"
	}
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

func kindList(ks []Kind, schema Schema) string {
	if schema == SchemaFamily {
		return "family swap"
	}
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.String()
	}
	return strings.Join(names, " or ")
}

// apply installs a record that check accepted, with t the state check
// returned.
func (v *validator) apply(r *Record, t *txnState) {
	if !v.started {
		v.started = true
		v.schema = r.SchemaID
		v.first = r.Sequence
		v.next = r.Sequence
	}
	if v.open == nil || v.open.terminal {
		v.seenTxn[r.TransactionID] = struct{}{}
	}
	if t.terminal {
		// A committed SwapKind is decided by its phases now.
		if r.Outcome == OutcomeCommitted {
			v.committed[r.Module] = v.committedOf(t, r)
		}
	}
	// Two txnStates alternate: a replay is a long run of records.
	v.open, v.spare = t, v.open
	if v.anchor != nil && v.anchor.Sequence == r.Sequence && v.anchor.RecordSHA256 == r.RecordSHA256 {
		v.anchorOK = true
	}
	v.next = r.Sequence + 1
	v.head = r.RecordSHA256
	v.recent[v.recentN%RecentRecords] = briefOf(r)
	v.recentN++
}

func (v *validator) committedOf(t *txnState, r *Record) CommittedTransaction {
	kind := t.kinds[0]
	if len(t.kinds) > 1 && !t.applied.has(PhaseMigrate) {
		kind = KindColdReplace
	}
	return CommittedTransaction{
		TransactionID: r.TransactionID, Kind: kind, Generation: r.NewGeneration,
		ImplementationID: r.NewImplementationID, ArtifactSHA256: r.NewArtifactSHA256,
		StateSHA256: t.newState, AuthoritySHA256: r.AuthoritySHA256,
		Sequence: r.Sequence, RecordSHA256: r.RecordSHA256, Segment: v.segment,
	}
}

// finish checks the end of the ledger: only a SchemaOperator ledger may end
// inside a transaction, and only when allowOpen.
func (v *validator) finish(allowOpen bool) *RuleError {
	if v.open == nil || v.open.terminal {
		return nil
	}
	if v.schema == SchemaFamily || !allowOpen {
		return &RuleError{Rule: RuleMissingTerminal, Sequence: v.open.lastSeq, TransactionID: v.open.first.TransactionID,
			Detail: fmt.Sprintf("the ledger ends inside transaction %s (last phase %s)", v.open.first.TransactionID, lastPhase(v.open))}
	}
	return nil
}

// checkAnchor reports an anchor the replay did not reach: the ledger lost
// records the caller saw.
func (v *validator) checkAnchor() *RuleError {
	if v.anchor == nil || v.anchorOK || v.started && v.anchor.Sequence < v.first {
		return nil
	}
	return &RuleError{Rule: RuleAnchor, Sequence: v.next, Detail: fmt.Sprintf(
		"the anchor is record %d (%s) but the ledger ends before it, at sequence %d: records were lost", v.anchor.Sequence, v.anchor.RecordSHA256, v.next)}
}

func lastPhase(t *txnState) Phase {
	if t.blocked != nil {
		return t.blocked.Phase
	}
	applied := t.applied.phases()
	if len(applied) == 0 {
		return ""
	}
	return applied[len(applied)-1]
}

// state returns the replay state.
func (v *validator) state() State {
	s := State{
		Schema: v.schema, FirstSequence: v.first, NextSequence: v.next, Records: v.next - v.first,
		HeadSHA256: v.head, AnchorVerified: v.anchorOK,
		LastCommitted: make(map[string]CommittedTransaction, len(v.committed)),
	}
	for m, c := range v.committed {
		s.LastCommitted[m] = c
	}
	n := min(v.recentN, RecentRecords)
	s.Recent = make([]RecordBrief, 0, n)
	for i := v.recentN - n; i < v.recentN; i++ {
		s.Recent = append(s.Recent, v.recent[i%RecentRecords])
	}
	if v.open != nil && !v.open.terminal {
		s.Open = v.open.public()
	}
	return s
}

func (t *txnState) public() *OpenTransaction {
	o := &OpenTransaction{
		Identity: identityOf(&t.first), Kinds: append([]Kind(nil), t.kinds...),
		Applied: t.applied.phases(), Switched: t.switched,
		OldStateSHA256: t.oldState, NewStateSHA256: t.newState,
		FirstSequence: t.first.Sequence, LastSequence: t.lastSeq,
	}
	if len(o.Kinds) > 1 {
		// After quiesce, the phase that follows tells a hot swap (snapshot)
		// from a cold replace (atomic_switch).
		if t.applied.has(PhaseSnapshot) {
			o.Kinds = []Kind{KindHotSwap}
		} else if t.applied.has(PhaseAtomicSwitch) {
			o.Kinds = []Kind{KindColdReplace}
		}
	}
	if t.blocked != nil {
		b := briefOf(t.blocked)
		o.Blocked = &b
	}
	return o
}
