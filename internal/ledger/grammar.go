package ledger

import (
	"iteron.dev/operator/internal/reasons"
	"math/bits"
	"strings"
	"unicode/utf8"
)

// Kind is a transaction kind (docs/reference/ledger.md). The record layout has
// no kind field: a reader infers the kind from the generations and the
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
// (docs/reference/ledger.md); optional steps appear as two sequences.
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

// phaseSet is a set of work phases (and committed), one bit per position in
// phaseOrder. A transaction's applied phases follow phaseOrder, so the set
// alone says which phases were applied and in what order.
type phaseSet uint16

func phaseIndex(p Phase) int {
	switch p {
	case PhaseVerify:
		return 0
	case PhaseShadowLoad:
		return 1
	case PhaseQuiesce:
		return 2
	case PhaseSnapshot:
		return 3
	case PhaseMigrate:
		return 4
	case PhaseRestore:
		return 5
	case PhaseReadiness:
		return 6
	case PhaseAtomicSwitch:
		return 7
	case PhaseDrain:
		return 8
	case PhaseCommitted:
		return 9
	case PhaseRolledBack:
		return 10
	}
	return -1
}

func (s phaseSet) has(p Phase) bool {
	i := phaseIndex(p)
	return i >= 0 && s&(1<<i) != 0
}

func (s phaseSet) add(p Phase) phaseSet {
	if i := phaseIndex(p); i >= 0 {
		s |= 1 << i
	}
	return s
}

func (s phaseSet) count() int { return bits.OnesCount16(uint16(s)) }

// phases lists the set in phaseOrder.
func (s phaseSet) phases() []Phase {
	var out []Phase
	for i, p := range phaseOrder {
		if s&(1<<i) != 0 {
			out = append(out, p)
		}
	}
	return out
}

// phaseSeq is one legal phase sequence with the set of each prefix.
type phaseSeq struct {
	phases []Phase
	prefix []phaseSet // prefix[i] is the set of phases[:i]
}

func newPhaseSeq(phases []Phase) phaseSeq {
	s := phaseSeq{phases: phases, prefix: make([]phaseSet, len(phases)+1)}
	for i, p := range phases {
		s.prefix[i+1] = s.prefix[i].add(p)
	}
	return s
}

// grammar is the set of phase sequences a transaction may follow.
type grammar []phaseSeq

var (
	kindGrammars  = map[Kind]grammar{}
	familyGrammar grammar
	// swapGrammar is hot swap or cold replace, what a reader knows of a
	// transaction with new_generation = old_generation + 1.
	swapGrammar grammar
)

func init() {
	for k, seqs := range sequences {
		for _, seq := range seqs {
			kindGrammars[k] = append(kindGrammars[k], newPhaseSeq(seq))
		}
	}
	for _, seq := range familySequences {
		familyGrammar = append(familyGrammar, newPhaseSeq(seq))
	}
	swapGrammar = append(append(grammar(nil), kindGrammars[KindHotSwap]...), kindGrammars[KindColdReplace]...)
}

func grammarOf(schema Schema, kinds []Kind) grammar {
	if schema == SchemaFamily {
		return familyGrammar
	}
	if len(kinds) == 1 {
		return kindGrammars[kinds[0]]
	}
	if len(kinds) == 2 && kinds[0] == KindHotSwap && kinds[1] == KindColdReplace {
		return swapGrammar
	}
	var g grammar
	for _, k := range kinds {
		g = append(g, kindGrammars[k]...)
	}
	return g
}

// allows reports whether p may follow the applied phases done.
func (g grammar) allows(done phaseSet, p Phase) bool {
	n := done.count()
	for _, s := range g {
		if len(s.phases) > n && s.prefix[n] == done && s.phases[n] == p {
			return true
		}
	}
	return false
}

// next returns the phases that may follow done, in the family's order.
func (g grammar) next(done phaseSet) []Phase {
	n := done.count()
	var allowed phaseSet
	for _, s := range g {
		if len(s.phases) > n && s.prefix[n] == done {
			allowed = allowed.add(s.phases[n])
		}
	}
	return allowed.phases()
}

func containsPhase(ps []Phase, p Phase) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// ReasonCode is a reason of the operator's reason table (internal/reasons);
// a reason is written as "<code>: <message>".
type ReasonCode = reasons.Code

// BlockKindOf returns the block kind a blocked record carries for code, and
// whether code may block a transaction at all (the reason table decides).
func BlockKindOf(code ReasonCode) (BlockKind, bool) {
	kind, ok := reasons.BlockKindOf(code)
	return BlockKind(kind), ok
}

// RecoveryMessage is the message of the blocked record with which recovery
// closes a transaction interrupted before its switch
// (docs/reference/ledger.md: the block kind is provider, the message "host
// restarted").
const RecoveryMessage = "host restarted"

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
	if !reasons.Known(code) {
		return "", "", false
	}
	return ReasonCode(code), msg, true
}
