package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"unicode/utf8"

	"iteron.dev/operator/pkg/strictjson"
)

// Schema names a record grammar. Both schemas share one record layout and one
// hash construction (docs/reference/ledger.md); a file holds records of one
// schema.
type Schema string

const (
	// SchemaFamily is the protocol family's own ledger: swap transactions only,
	// all ten phases, every digest set from the first record.
	SchemaFamily Schema = "iteron-hotswap-ledger/1"
	// SchemaOperator is the schema this operator writes: the family's layout
	// with the transaction kinds of docs/reference/ledger.md, write-once state
	// digests, rollback_failed, the cleanup_failed drain note and an open last
	// transaction that recovery closes forward.
	SchemaOperator Schema = "iteron-operator-ledger/1"
)

// Phase is a record's phase. The nine work phases run in the order declared
// here; committed and rolled_back end a transaction.
type Phase string

// The phases, in the family's order.
const (
	PhaseVerify       Phase = "verify"
	PhaseShadowLoad   Phase = "shadow_load"
	PhaseQuiesce      Phase = "quiesce"
	PhaseSnapshot     Phase = "snapshot"
	PhaseMigrate      Phase = "migrate"
	PhaseRestore      Phase = "restore"
	PhaseReadiness    Phase = "readiness"
	PhaseAtomicSwitch Phase = "atomic_switch"
	PhaseDrain        Phase = "drain"
	PhaseCommitted    Phase = "committed"
	PhaseRolledBack   Phase = "rolled_back"
)

// phaseOrder is the family's phase order; a transaction's phases are a
// subsequence of it (then rolled_back after a blocked record).
var phaseOrder = [...]Phase{
	PhaseVerify, PhaseShadowLoad, PhaseQuiesce, PhaseSnapshot, PhaseMigrate,
	PhaseRestore, PhaseReadiness, PhaseAtomicSwitch, PhaseDrain, PhaseCommitted,
}

func (p Phase) known() bool {
	if p == PhaseRolledBack {
		return true
	}
	for _, q := range phaseOrder {
		if p == q {
			return true
		}
	}
	return false
}

// Outcome is what a record says happened in its phase.
type Outcome string

// The outcomes. OutcomeRollbackFailed exists only in SchemaOperator.
const (
	OutcomeApplied        Outcome = "applied"
	OutcomeBlocked        Outcome = "blocked"
	OutcomeCommitted      Outcome = "committed"
	OutcomeRolledBack     Outcome = "rolled_back"
	OutcomeRollbackFailed Outcome = "rollback_failed"
)

// BlockKind classifies why a transaction was blocked.
type BlockKind string

// The block kinds (docs/reference/ledger.md).
const (
	BlockValidation BlockKind = "validation"
	BlockDependency BlockKind = "dependency"
	BlockProvider   BlockKind = "provider"
	BlockDeadline   BlockKind = "deadline"
)

func (k BlockKind) known() bool {
	switch k {
	case BlockValidation, BlockDependency, BlockProvider, BlockDeadline:
		return true
	}
	return false
}

// Record is one ledger line. The field order is the family's and the record
// hash depends on it: do not reorder. Every field is always present on the
// wire; BlockKind and Reason are JSON null when unset, as serde writes
// Option::None.
type Record struct {
	// SchemaID is the record's schema; one per file.
	SchemaID Schema `json:"schema_id"`
	// Sequence is the record's index in the ledger, counted across segments
	// from 0.
	Sequence uint64 `json:"sequence"`
	// PreviousSHA256 is the previous record's RecordSHA256, or ZeroSHA256 for
	// the first record of a ledger.
	PreviousSHA256 string `json:"previous_sha256"`
	// RecordSHA256 is "sha256:" over this record's canonical encoding with
	// RecordSHA256 set to "".
	RecordSHA256 string `json:"record_sha256"`
	// TransactionID groups a transaction's records.
	TransactionID string `json:"transaction_id"`
	// Module is the snake_case module the transaction acts on.
	Module string `json:"module"`
	// CandidateSHA256 is the activation's candidate digest.
	CandidateSHA256 string `json:"candidate_sha256"`
	// OldGeneration is the lineage being replaced; 0 when there is none.
	OldGeneration uint64 `json:"old_generation"`
	// OldImplementationID is the replaced implementation; "" when none.
	OldImplementationID string `json:"old_implementation_id"`
	// OldArtifactSHA256 is the replaced artifact's digest; "" when none.
	OldArtifactSHA256 string `json:"old_artifact_sha256"`
	// OldStateSHA256 is the snapshotted state's digest; "" until known.
	OldStateSHA256 string `json:"old_state_sha256"`
	// NewGeneration is the lineage being activated; 0 for a retirement.
	NewGeneration uint64 `json:"new_generation"`
	// NewImplementationID is the activated implementation; "" when none.
	NewImplementationID string `json:"new_implementation_id"`
	// NewArtifactSHA256 is the activated artifact's digest; "" when none.
	NewArtifactSHA256 string `json:"new_artifact_sha256"`
	// NewStateSHA256 is the restored state's digest; "" until known.
	NewStateSHA256 string `json:"new_state_sha256"`
	// AuthoritySHA256 is the digest of the admitted capabilities.
	AuthoritySHA256 string `json:"authority_sha256"`
	// Phase is the phase this record reports.
	Phase Phase `json:"phase"`
	// Outcome is what happened in Phase.
	Outcome Outcome `json:"outcome"`
	// BlockKind is set on blocked and rolled_back records, null elsewhere.
	BlockKind *BlockKind `json:"block_kind"`
	// Reason is set with BlockKind, and on a drain record carrying a
	// cleanup_failed note (SchemaOperator); null elsewhere.
	Reason *string `json:"reason"`
	// StartedUnixMs is when the transaction started.
	StartedUnixMs uint64 `json:"started_unix_ms"`
	// ElapsedMs is the time from StartedUnixMs to this record.
	ElapsedMs uint64 `json:"elapsed_ms"`
	// DeadlineMs is the transaction's deadline, > 0.
	DeadlineMs uint64 `json:"deadline_ms"`
}

// ZeroSHA256 is the PreviousSHA256 of a ledger's first record.
const ZeroSHA256 = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// Bounds of a ledger (docs/reference/ledger.md).
const (
	// MaxRecordBytes bounds one record's canonical encoding, the newline
	// excluded.
	MaxRecordBytes = 16 << 10
	// MaxSegmentBytes bounds one segment file, newlines included.
	MaxSegmentBytes = 16 << 20
	// MaxReasonBytes bounds a reason.
	MaxReasonBytes = 1024
)

// canonicalRecord returns the bytes strictjson.Canonical(r) returns, at a
// small fraction of its cost on the append path, where it runs once per
// record between two fdatasyncs. A Record holds only strings, unsigned
// integers and nullable strings; appendRecordJSON writes them in
// serde_json's form directly, which is Canonical's output whenever every
// string is valid UTF-8 (FuzzParseLine and
// TestTheAppendEncoderWritesStrictjsonCanonicalBytes compare the two).
// A record with a string that is not valid UTF-8 is left to
// strictjson.Canonical, which refuses it.
func canonicalRecord(r *Record) ([]byte, error) {
	var e recordEncoder
	b, err := e.canonical(r)
	return bytes.Clone(b), err
}

// validStrings reports whether every string of r is valid UTF-8.
func validStrings(r *Record) bool {
	for _, s := range [...]string{
		string(r.SchemaID), r.PreviousSHA256, r.RecordSHA256, r.TransactionID, r.Module,
		r.CandidateSHA256, r.OldImplementationID, r.OldArtifactSHA256, r.OldStateSHA256,
		r.NewImplementationID, r.NewArtifactSHA256, r.NewStateSHA256, r.AuthoritySHA256,
		string(r.Phase), string(r.Outcome),
	} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return (r.BlockKind == nil || utf8.ValidString(string(*r.BlockKind))) && (r.Reason == nil || utf8.ValidString(*r.Reason))
}

// appendRecordJSON appends r as serde_json prints the family's record:
// members in declaration order, compact, nil pointers as null.
func appendRecordJSON(b []byte, r *Record) []byte {
	str := func(name, v string) {
		b = append(b, name...)
		b = strictjson.AppendString(b, v)
	}
	num := func(name string, v uint64) {
		b = append(b, name...)
		b = strconv.AppendUint(b, v, 10)
	}
	opt := func(name string, v *string) {
		b = append(b, name...)
		if v == nil {
			b = append(b, "null"...)
		} else {
			b = strictjson.AppendString(b, *v)
		}
	}
	str(`{"schema_id":`, string(r.SchemaID))
	num(`,"sequence":`, r.Sequence)
	str(`,"previous_sha256":`, r.PreviousSHA256)
	str(`,"record_sha256":`, r.RecordSHA256)
	str(`,"transaction_id":`, r.TransactionID)
	str(`,"module":`, r.Module)
	str(`,"candidate_sha256":`, r.CandidateSHA256)
	num(`,"old_generation":`, r.OldGeneration)
	str(`,"old_implementation_id":`, r.OldImplementationID)
	str(`,"old_artifact_sha256":`, r.OldArtifactSHA256)
	str(`,"old_state_sha256":`, r.OldStateSHA256)
	num(`,"new_generation":`, r.NewGeneration)
	str(`,"new_implementation_id":`, r.NewImplementationID)
	str(`,"new_artifact_sha256":`, r.NewArtifactSHA256)
	str(`,"new_state_sha256":`, r.NewStateSHA256)
	str(`,"authority_sha256":`, r.AuthoritySHA256)
	str(`,"phase":`, string(r.Phase))
	str(`,"outcome":`, string(r.Outcome))
	opt(`,"block_kind":`, (*string)(r.BlockKind))
	opt(`,"reason":`, r.Reason)
	num(`,"started_unix_ms":`, r.StartedUnixMs)
	num(`,"elapsed_ms":`, r.ElapsedMs)
	num(`,"deadline_ms":`, r.DeadlineMs)
	return append(b, '}')
}

// recordHashField is the member that the record hash blanks out. In a
// canonical line it is the fourth member; nothing before it can contain this
// text (a schema name, a number and a digest precede it).
var recordHashField = []byte(`,"record_sha256":"`)

// encodeRecord returns r's canonical line (without the newline) with its
// record_sha256 computed; r.RecordSHA256 is ignored and r is not changed.
// The line is strictjson.Canonical's bytes with the digest spliced into the
// blanked field, the exact construction a reader inverts.
func encodeRecord(r *Record) ([]byte, string, error) {
	var e recordEncoder
	line, digest, err := e.encode(r)
	return bytes.Clone(line), digest, err
}

// recordEncoder encodes records into buffers it reuses, so the append path
// allocates only the digest string.
type recordEncoder struct {
	blank, line []byte
	h           lineHasher
}

// encode returns r's line in a buffer valid until the next call.
func (e *recordEncoder) encode(r *Record) ([]byte, string, error) {
	blank := *r
	blank.RecordSHA256 = ""
	canon, err := e.canonical(&blank)
	if err != nil {
		return nil, "", fmt.Errorf("encode record %d: %w", r.Sequence, err)
	}
	at := bytes.Index(canon, recordHashField)
	if at < 0 {
		return nil, "", fmt.Errorf("encode record %d: no record_sha256 member in %q", r.Sequence, canon)
	}
	valueAt := at + len(recordHashField)
	if e.h.h == nil {
		e.h = *newLineHasher()
	}
	// The blank line is the line without the digest's bytes.
	digest := e.h.digest(canon, hashSpan{start: valueAt, end: valueAt})
	e.line = append(e.line[:0], canon[:valueAt]...)
	e.line = append(e.line, digest...)
	e.line = append(e.line, canon[valueAt:]...)
	return e.line, digest, nil
}

func (e *recordEncoder) canonical(r *Record) ([]byte, error) {
	if !validStrings(r) {
		return strictjson.Canonical(r)
	}
	e.blank = appendRecordJSON(e.blank[:0], r)
	return e.blank, nil
}

// hashSpan locates the record_sha256 value inside a canonical line: the
// bytes [start, end) are the digest text between the quotes.
type hashSpan struct{ start, end int }

// lineHasher recomputes record hashes from canonical lines, reusing one
// SHA-256 state and one output buffer across records.
type lineHasher struct {
	h   hash.Hash
	sum [sha256.Size]byte
	hex [len(strictjson.DigestPrefix) + 2*sha256.Size]byte
}

func newLineHasher() *lineHasher {
	h := &lineHasher{h: sha256.New()}
	copy(h.hex[:], strictjson.DigestPrefix)
	return h
}

// matches reports whether the line hashes to digest, without allocating.
func (h *lineHasher) matches(line []byte, span hashSpan, digest string) bool {
	h.sum256(line, span)
	hex.Encode(h.hex[len(strictjson.DigestPrefix):], h.sum[:])
	return string(h.hex[:]) == digest
}

func (h *lineHasher) sum256(line []byte, span hashSpan) {
	h.h.Reset()
	h.h.Write(line[:span.start])
	h.h.Write(line[span.end:])
	h.h.Sum(h.sum[:0])
}

// digest is SHA-256 over the line with the record_sha256 value removed (the
// record with record_sha256 = ""), without copying the line.
func (h *lineHasher) digest(line []byte, span hashSpan) string {
	h.sum256(line, span)
	hex.Encode(h.hex[len(strictjson.DigestPrefix):], h.sum[:])
	return string(h.hex[:])
}
