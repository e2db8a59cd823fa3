package ledger

import (
	"errors"
	"fmt"
	"strings"
)

// Rule names one rejection rule of docs/reference/ledger.md. The strings are
// stable: `kubectl iteron ledger verify` prints them and tests match on them.
type Rule string

// The rejection rules, in the order a record is checked.
const (
	// RuleNotRegularFile: a segment or ledger directory is a symlink or not a
	// regular file (directory), or the file being appended to was replaced.
	RuleNotRegularFile Rule = "not_regular_file"
	// RuleSegmentLayout: the directory's segments are not ledger-000001.jsonl,
	// ledger-000002.jsonl, … without gaps, a sealed segment is empty, or the
	// directory holds something else.
	RuleSegmentLayout Rule = "segment_layout"
	// RuleSegmentTooLarge: a segment exceeds MaxSegmentBytes.
	RuleSegmentTooLarge Rule = "segment_too_large"
	// RuleTornRecord: a segment ends without a newline or with a tail of NUL
	// bytes (a record that was being written when the writer stopped).
	RuleTornRecord Rule = "torn_record"
	// RuleRecordTooLarge: a line exceeds MaxRecordBytes.
	RuleRecordTooLarge Rule = "record_too_large"
	// RuleInvalidJSON: a line is not strict JSON (duplicate key, unknown or
	// missing field, trailing data, invalid UTF-8) or not the record's
	// canonical encoding.
	RuleInvalidJSON Rule = "invalid_json"
	// RuleUnknownSchema: schema_id is neither SchemaFamily nor SchemaOperator.
	RuleUnknownSchema Rule = "unknown_schema"
	// RuleMixedSchemas: two schemas in one ledger.
	RuleMixedSchemas Rule = "mixed_schemas"
	// RuleSequence: a record's sequence is not its position in the ledger
	// (a line deleted, duplicated or moved).
	RuleSequence Rule = "sequence"
	// RuleChain: previous_sha256 is not the previous record's hash.
	RuleChain Rule = "chain"
	// RuleRecordHash: record_sha256 is not the hash of the record.
	RuleRecordHash Rule = "record_hash"
	// RuleInvalidField: a field breaks its format (digest, ID, module, enum,
	// deadline_ms > 0).
	RuleInvalidField Rule = "invalid_field"
	// RuleTransactionID: a transaction_id of SchemaOperator does not have the
	// form <uid8>/<module>/g<lineage>/a<attempt>[/r<n>] or does not match the
	// record's module and generations.
	RuleTransactionID Rule = "transaction_id"
	// RuleGeneration: the generations and old/new fields do not fit any
	// transaction kind of the schema.
	RuleGeneration Rule = "generation"
	// RuleReason: block_kind and reason are not both set on a blocked record
	// and both null elsewhere (but the cleanup_failed drain note), or the
	// reason breaks its bounds or its "<code>: <message>" form.
	RuleReason Rule = "reason"
	// RuleDuplicatePhase: a (transaction_id, phase) pair appears twice.
	RuleDuplicatePhase Rule = "duplicate_phase"
	// RuleIdentityChanged: a transaction's fixed identity differs between its
	// records.
	RuleIdentityChanged Rule = "identity_changed"
	// RuleStateDigest: a write-once state digest was changed or cleared after
	// it was set, or set by the wrong phase (SchemaOperator).
	RuleStateDigest Rule = "state_digest"
	// RulePhaseGrammar: a phase is not a legal next phase of the
	// transaction's kind.
	RulePhaseGrammar Rule = "phase_grammar"
	// RuleOutcome: an outcome that does not fit its phase.
	RuleOutcome Rule = "outcome"
	// RuleRollbackMismatch: a rolled_back record does not repeat its blocked
	// record's block_kind and reason.
	RuleRollbackMismatch Rule = "rollback_mismatch"
	// RuleMissingTerminal: a transaction has no terminal record (allowed only
	// for the last transaction of a SchemaOperator ledger, which recovery
	// closes).
	RuleMissingTerminal Rule = "missing_terminal"
	// RuleSizeChanged: the segment being appended to changed size since the
	// ledger opened it (a second writer).
	RuleSizeChanged Rule = "size_changed"
	// RuleAnchor: the record the caller expected at a sequence (for example
	// the head hash mirrored in object status) is not in the chain.
	RuleAnchor Rule = "anchor"
)

// ErrCorrupt is matched (errors.Is) by every *RuleError: the ledger broke a
// rule of docs/reference/ledger.md. Status reason: ledger_corrupt.
var ErrCorrupt = errors.New("ledger corrupt")

// RuleError is a broken rule: which rule, at which sequence, where in which
// file, and why. From Open, Verify and Replay it means the ledger is corrupt
// and nothing was repaired; from an append it means the record was refused
// and nothing was written.
type RuleError struct {
	// Rule is the rule broken.
	Rule Rule
	// Sequence is the ledger position of the offending record (its expected
	// sequence, which a moved record does not carry), or of the record that
	// would follow when the problem is at the end of the ledger.
	Sequence uint64
	// File is the segment file, "" when the problem is not in one file.
	File string
	// Line is the 1-based line in File, 0 when not at a line.
	Line int
	// TransactionID is the transaction concerned, "" when none is known.
	TransactionID string
	// Detail says what was found and what was expected.
	Detail string
}

// Error says where, which rule at which sequence, and why.
func (e *RuleError) Error() string {
	var b strings.Builder
	b.WriteString("ledger")
	if e.File != "" {
		b.WriteString(" ")
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, " line %d", e.Line)
		}
	}
	fmt.Fprintf(&b, ": rule %s at sequence %d", e.Rule, e.Sequence)
	if e.TransactionID != "" {
		fmt.Fprintf(&b, " (transaction %s)", e.TransactionID)
	}
	b.WriteString(": ")
	b.WriteString(e.Detail)
	return b.String()
}

// Is makes errors.Is(err, ErrCorrupt) true for every rule error.
func (e *RuleError) Is(target error) bool { return target == ErrCorrupt }

// ErrFrozen is matched by every error of a ledger that refuses appends after
// an I/O error or a detected foreign change: a later fsync may falsely
// succeed after an EIO, so only a reopen, which replays the file, can tell
// what is durable.
var ErrFrozen = errors.New("ledger refuses appends until it is reopened and replayed")

// FrozenError reports an append refused by a frozen ledger, with the error
// that froze it.
type FrozenError struct {
	// Cause is the error that froze the ledger.
	Cause error
}

// Error names the refusal and its cause.
func (e *FrozenError) Error() string { return fmt.Sprintf("%v (frozen by: %v)", ErrFrozen, e.Cause) }

// Is makes errors.Is(err, ErrFrozen) true.
func (e *FrozenError) Is(target error) bool { return target == ErrFrozen }

// Unwrap returns the cause.
func (e *FrozenError) Unwrap() error { return e.Cause }

// IOError is a failed system call on a ledger file or directory.
type IOError struct {
	// Op is the operation (open, write, fdatasync, fsync, …).
	Op string
	// Path is the file or directory.
	Path string
	// Err is the system error.
	Err error
}

// Error names the operation, the path and the system error.
func (e *IOError) Error() string { return fmt.Sprintf("ledger %s %s: %v", e.Op, e.Path, e.Err) }

// Unwrap returns the system error.
func (e *IOError) Unwrap() error { return e.Err }

// PhaseError is an append the transaction's grammar does not allow; nothing
// was written.
type PhaseError struct {
	// TransactionID is the transaction.
	TransactionID string
	// Kind is its kind.
	Kind Kind
	// Phase is the phase that was refused.
	Phase Phase
	// Outcome is the outcome that was refused.
	Outcome Outcome
	// Allowed are the phases that could come next.
	Allowed []Phase
	// Detail says why, when it is not only the order.
	Detail string
}

// Error names the transaction, the refused phase and what may come next.
func (e *PhaseError) Error() string {
	msg := fmt.Sprintf("ledger transaction %s (%s): %s %s is not allowed", e.TransactionID, e.Kind, e.Phase, e.Outcome)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if len(e.Allowed) > 0 {
		names := make([]string, len(e.Allowed))
		for i, p := range e.Allowed {
			names[i] = string(p)
		}
		msg += "; allowed next: " + strings.Join(names, ", ")
	} else {
		msg += "; the transaction is finished"
	}
	return msg
}

// ErrTransactionOpen is returned by Begin while another transaction has
// records and no terminal record, and by Begin and Recover misuse.
var ErrTransactionOpen = errors.New("a transaction is open")

// ErrClosed is returned by a closed ledger.
var ErrClosed = errors.New("ledger is closed")

// ErrLocked is returned by Open when another Ledger (in this or another
// process) has the directory open for append.
var ErrLocked = errors.New("ledger directory is locked by another writer")

// ErrStale is returned by a Txn whose ledger began another transaction,
// recovered, or was closed.
var ErrStale = errors.New("transaction handle is no longer current")
