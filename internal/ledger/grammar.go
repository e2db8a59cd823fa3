package ledger

import (
	"strings"
	"unicode/utf8"
)

// Kind is a transaction kind of DESIGN §8. The record layout has no kind
// field: a reader infers the kind from the generations and the
// transaction_id (see kindsOf), so every kind is distinguishable on the wire
// except hot swap from cold replace before the phase after quiesce.
type Kind int

// The transaction kinds.
const (
	// KindFirstActivation activates a module that has no active generation.
	KindFirstActivation Kind = iota + 1
	// KindRelaunch restarts a committed generation after a crash or a manager
	// restart, restoring its newest durable snapshot.
	KindRelaunch
	// KindHotSwap replaces a v2 generation by the next lineage, migrating state.
	KindHotSwap
	// KindRenewal moves a generation into a fresh process, same implementation
	// and lineage (v2: state moves without migrate; v1: the cold phases).
	KindRenewal
	// KindColdReplace replaces a generation by the next lineage without moving
	// state.
	KindColdReplace
	// KindRetirement stops a module's generation for good.
	KindRetirement
)

var kindNames = map[Kind]string{
	KindFirstActivation: "first_activation",
	KindRelaunch:        "relaunch",
	KindHotSwap:         "hot_swap",
	KindRenewal:         "renewal",
	KindColdReplace:     "cold_replace",
	KindRetirement:      "retirement",
}

// String returns the kind's snake_case name.
func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return "unknown_kind"
}

// sequences lists, per kind, every complete phase sequence of SchemaOperator
// (spec/wire.md §5); optional steps appear as two sequences.
var sequences = map[Kind][][]Phase{
	KindFirstActivation: {
		{PhaseVerify, PhaseShadowLoad, PhaseAtomicSwitch, PhaseCommitted},
		{PhaseVerify, PhaseShadowLoad, PhaseRestore, PhaseReadiness, PhaseAtomicSwitch, PhaseCommitted},
	},
	KindRelaunch: {
		{PhaseVerify, PhaseShadowLoad, PhaseAtomicSwitch, PhaseCommitted},
		{PhaseVerify, PhaseShadowLoad, PhaseRestore, PhaseReadiness, PhaseAtomicSwitch, PhaseCommitted},
	},
	KindHotSwap: {
		phaseOrder[:],
	},
	KindRenewal: {
		{PhaseVerify, PhaseShadowLoad, PhaseQuiesce, PhaseSnapshot, PhaseRestore, PhaseReadiness, PhaseAtomicSwitch, PhaseDrain, PhaseCommitted},
		{PhaseVerify, PhaseShadowLoad, PhaseQuiesce, PhaseAtomicSwitch, PhaseDrain, PhaseCommitted},
	},
	KindColdReplace: {
		{PhaseVerify, PhaseShadowLoad, PhaseQuiesce, PhaseAtomicSwitch, PhaseDrain, PhaseCommitted},
	},
	KindRetirement: {
		{PhaseVerify, PhaseQuiesce, PhaseDrain, PhaseCommitted},
		{PhaseVerify, PhaseQuiesce, PhaseSnapshot, PhaseDrain, PhaseCommitted},
	},
}

// familySequences is the family schema's one sequence: all ten phases.
var familySequences = [][]Phase{phaseOrder[:]}

// grammar is the set of phase sequences a transaction may follow.
type grammar [][]Phase

func grammarOf(schema Schema, kinds []Kind) grammar {
	if schema == SchemaFamily {
		return familySequences
	}
	var g grammar
	for _, k := range kinds {
		g = append(g, sequences[k]...)
	}
	return g
}

// next returns the phases that may follow the applied phases done, in the
// family's order, without duplicates.
func (g grammar) next(done []Phase) []Phase {
	var out []Phase
	for _, seq := range g {
		if len(seq) <= len(done) || !hasPrefix(seq, done) {
			continue
		}
		p := seq[len(done)]
		if !containsPhase(out, p) {
			out = append(out, p)
		}
	}
	// Keep the family's order so "the next phase" is deterministic.
	ordered := out[:0:0]
	for _, p := range phaseOrder {
		if containsPhase(out, p) {
			ordered = append(ordered, p)
		}
	}
	return ordered
}

func hasPrefix(seq, prefix []Phase) bool {
	for i, p := range prefix {
		if seq[i] != p {
			return false
		}
	}
	return true
}

func containsPhase(ps []Phase, p Phase) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// ReasonCode is an error reason of DESIGN §8's table; a reason is written as
// "<code>: <message>".
type ReasonCode string

// The reason codes of DESIGN §8.
const (
	ReasonUnsupportedVersion    ReasonCode = "unsupported_version"
	ReasonVerificationFailed    ReasonCode = "verification_failed"
	ReasonSchemaMismatch        ReasonCode = "schema_mismatch"
	ReasonDependencyUnsatisfied ReasonCode = "dependency_unsatisfied"
	ReasonDependencyCycle       ReasonCode = "dependency_cycle"
	ReasonStaleGeneration       ReasonCode = "stale_generation"
	ReasonAuthorityChanged      ReasonCode = "authority_changed"
	ReasonPermissionDenied      ReasonCode = "permission_denied"
	ReasonActivationFailed      ReasonCode = "activation_failed"
	ReasonProviderFailed        ReasonCode = "provider_failed"
	ReasonDeadlineExceeded      ReasonCode = "deadline_exceeded"
	ReasonCleanupFailed         ReasonCode = "cleanup_failed"
	ReasonRollbackFailed        ReasonCode = "rollback_failed"
	ReasonLedgerCorrupt         ReasonCode = "ledger_corrupt"
	ReasonQueueFull             ReasonCode = "queue_full"
)

// reasonBlockKinds is DESIGN §8's block_kind column; "" where the table has
// no block kind.
var reasonBlockKinds = map[ReasonCode]BlockKind{
	ReasonUnsupportedVersion:    BlockValidation,
	ReasonVerificationFailed:    BlockValidation,
	ReasonSchemaMismatch:        BlockValidation,
	ReasonDependencyUnsatisfied: BlockDependency,
	ReasonDependencyCycle:       BlockDependency,
	ReasonStaleGeneration:       BlockDependency,
	ReasonAuthorityChanged:      BlockValidation,
	ReasonPermissionDenied:      "",
	ReasonActivationFailed:      BlockProvider,
	ReasonProviderFailed:        BlockProvider,
	ReasonDeadlineExceeded:      BlockDeadline,
	ReasonCleanupFailed:         BlockProvider,
	ReasonRollbackFailed:        BlockProvider,
	ReasonLedgerCorrupt:         BlockValidation,
	ReasonQueueFull:             "",
}

// BlockKindOf returns the block kind a blocked record carries for code, and
// whether code may block a transaction at all: codes without a block kind
// (permission_denied, queue_full) never do, cleanup_failed is only a drain
// note, and rollback_failed is an outcome, not a cause.
func BlockKindOf(code ReasonCode) (BlockKind, bool) {
	kind := reasonBlockKinds[code]
	if kind == "" || code == ReasonCleanupFailed || code == ReasonRollbackFailed {
		return "", false
	}
	return kind, true
}

// recoveryMessage is the message of the blocked record with which recovery
// closes a transaction interrupted before its switch (spec/wire.md §5: the
// block kind is provider, the message "host restarted").
const recoveryMessage = "host restarted"

// FormatReason returns "<code>: <message>" as a ledger reason: 1..1024 bytes
// of valid UTF-8 with no control character (a provider's message may carry
// any, and the family forbids \n, \r and NUL), truncated at a character
// boundary to fit. An empty message becomes "no detail" so the form stays
// "<code>: <message>".
func FormatReason(code ReasonCode, message string) string {
	var b strings.Builder
	b.Grow(min(MaxReasonBytes, len(code)+2+len(message)))
	b.WriteString(string(code))
	b.WriteString(": ")
	message = strings.Trim(strings.ToValidUTF8(message, "\uFFFD"), " \t\r\n")
	if message == "" {
		message = "no detail"
	}
	for _, r := range message {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > MaxReasonBytes {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// parseReason splits a SchemaOperator reason into its code and message.
func parseReason(reason string) (ReasonCode, string, bool) {
	code, msg, ok := strings.Cut(reason, ": ")
	if !ok || msg == "" {
		return "", "", false
	}
	if _, known := reasonBlockKinds[ReasonCode(code)]; !known {
		return "", "", false
	}
	return ReasonCode(code), msg, true
}
