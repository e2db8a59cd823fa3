package ledger

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"iteron.dev/operator/pkg/strictjson"
)

// recordFields are the record's member names in wire order.
var recordFields = [...]string{
	"schema_id", "sequence", "previous_sha256", "record_sha256", "transaction_id",
	"module", "candidate_sha256", "old_generation", "old_implementation_id",
	"old_artifact_sha256", "old_state_sha256", "new_generation",
	"new_implementation_id", "new_artifact_sha256", "new_state_sha256",
	"authority_sha256", "phase", "outcome", "block_kind", "reason",
	"started_unix_ms", "elapsed_ms", "deadline_ms",
}

// parseLine reads one line (without its newline) into dst, which must not
// be prev. A line must be
// strict JSON and exactly the record's canonical encoding: a writer of either
// schema prints records with serde_json, so any other byte stream for the
// same values (spacing, member order, escapes, a missing member) is not what
// a writer wrote. prev, when not nil, is the previous record and prevPlain
// the mask parseLine returned for it; equal strings are shared with it
// instead of allocated (a transaction repeats most fields).
//
// The fast path matches the canonical layout byte by byte; only a line it
// refuses is decoded by strictjson, whose error names the JSON problem.
func parseLine(dst *Record, line []byte, prev *Record, prevPlain uint32) (hashSpan, uint32, *RuleError) {
	if len(line) > MaxRecordBytes {
		return hashSpan{}, 0, &RuleError{Rule: RuleRecordTooLarge, Detail: fmt.Sprintf("record is %d bytes, at most %d", len(line), MaxRecordBytes)}
	}
	if span, plain, ok := parseCanonicalInto(dst, line, prev, prevPlain); ok {
		return span, plain, nil
	}
	r, span, err := parseStrict(line)
	*dst = r
	return span, 0, err
}

// parseStrict is the slow path: strict decoding, then a comparison with the
// canonical encoding of what was decoded.
func parseStrict(line []byte) (Record, hashSpan, *RuleError) {
	var r Record
	if err := strictjson.Decode(line, &r, MaxRecordBytes); err != nil {
		return Record{}, hashSpan{}, &RuleError{Rule: RuleInvalidJSON, Detail: err.Error()}
	}
	canon, err := strictjson.Canonical(&r)
	if err != nil {
		return Record{}, hashSpan{}, &RuleError{Rule: RuleInvalidJSON, Detail: err.Error()}
	}
	if !bytes.Equal(canon, line) {
		return Record{}, hashSpan{}, &RuleError{Rule: RuleInvalidJSON, Detail: nonCanonicalDetail(line, canon)}
	}
	// The span is the value's bytes in the line, escapes included: the hash
	// input is the line without them.
	sc := scanner{b: line, p: bytes.Index(line, recordHashField) + len(recordHashField) - 1}
	_, start, end, _, ok := sc.str("", false)
	if !ok {
		return Record{}, hashSpan{}, &RuleError{Rule: RuleInvalidJSON, Detail: "record_sha256 is not a canonical string"}
	}
	return r, hashSpan{start: start, end: end}, nil
}

// nonCanonicalDetail explains why a strictly valid line is not canonical:
// the members it lacks, or the first byte where it differs.
func nonCanonicalDetail(line, canon []byte) string {
	var members map[string]any
	if strictjson.Decode(line, &members, MaxRecordBytes) == nil {
		var missing []string
		for _, name := range recordFields {
			if _, ok := members[name]; !ok {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return "missing member(s) " + strings.Join(missing, ", ")
		}
	}
	i := 0
	for i < len(line) && i < len(canon) && line[i] == canon[i] {
		i++
	}
	return fmt.Sprintf("not the record's canonical encoding: byte %d is %s, canonical is %s", i, snippet(line, i), snippet(canon, i))
}

func snippet(b []byte, at int) string {
	if at >= len(b) {
		return "the end"
	}
	end := min(len(b), at+16)
	return fmt.Sprintf("%q", b[at:end])
}

// scanner walks a canonical line. Its methods return false at the first
// byte that is not canonical; the caller then takes the slow path.
type scanner struct {
	b []byte
	p int
}

func (s *scanner) lit(l string) bool {
	if len(s.b)-s.p < len(l) || string(s.b[s.p:s.p+len(l)]) != l {
		return false
	}
	s.p += len(l)
	return true
}

// str reads a string in serde_json's form: '"' and '\\' escaped, control
// characters as \b \t \n \f \r or \u00xx (lowercase), everything else
// literal UTF-8. When prevPlain, prev was read from bytes without escapes,
// and bytes equal to it are taken without a second look (a transaction
// repeats most fields). plain reports a string read without escapes.
func (s *scanner) str(prev string, prevPlain bool) (v string, start, end int, plain, ok bool) {
	if s.p >= len(s.b) || s.b[s.p] != '"' {
		return "", 0, 0, false, false
	}
	start = s.p + 1
	if prevPlain {
		// prev holds no '"', '\\' or control character, so a quote right
		// after it is the string's end.
		end = start + len(prev)
		if end < len(s.b) && s.b[end] == '"' && string(s.b[start:end]) == prev {
			s.p = end + 1
			return prev, start, end, true, true
		}
	}
	i := start
	escaped := false
	for {
		q := bytes.IndexByte(s.b[i:], '"')
		if q < 0 {
			return "", 0, 0, false, false
		}
		q += i
		e := bytes.IndexByte(s.b[i:q], '\\')
		if e < 0 {
			i = q
			break
		}
		e += i
		escaped = true
		n, ok := escapeLen(s.b[e:])
		if !ok {
			return "", 0, 0, false, false
		}
		i = e + n
	}
	raw := s.b[start:i]
	for _, c := range raw {
		if c < 0x20 {
			return "", 0, 0, false, false
		}
	}
	if !utf8.Valid(raw) {
		return "", 0, 0, false, false
	}
	s.p = i + 1
	if escaped {
		v, ok = unescape(raw)
		return v, start, i, false, ok
	}
	if string(raw) == prev {
		return prev, start, i, true, true
	}
	return internEnum(raw), start, i, true, true
}

// digest reads a string that is exactly "sha256:" and 64 lowercase hex,
// the form of every record hash, in one pass; on anything else it reads
// nothing and returns false (str then reads the string, whatever it is).
func (s *scanner) digest() (string, int, int, bool) {
	const n = 1 + 71 + 1
	b := s.b[s.p:]
	if len(b) < n || b[0] != '"' || b[n-1] != '"' || string(b[1:8]) != "sha256:" {
		return "", 0, 0, false
	}
	for _, c := range b[8 : n-1] {
		if !lowerHexDigit[c] {
			return "", 0, 0, false
		}
	}
	start := s.p + 1
	s.p += n
	return string(b[1 : n-1]), start, start + 71, true
}

// lowerHexDigit marks 0-9 and a-f.
var lowerHexDigit = func() (t [256]bool) {
	for _, c := range "0123456789abcdef" {
		t[c] = true
	}
	return t
}()

// escapeLen returns the length of the canonical escape at the start of b.
func escapeLen(b []byte) (int, bool) {
	if len(b) < 2 {
		return 0, false
	}
	switch b[1] {
	case '"', '\\', 'b', 't', 'n', 'f', 'r':
		return 2, true
	case 'u':
		if len(b) < 6 || b[2] != '0' || b[3] != '0' {
			return 0, false
		}
		hi, lo := b[4], b[5]
		if hi != '0' && hi != '1' || !(lo >= '0' && lo <= '9' || lo >= 'a' && lo <= 'f') {
			return 0, false
		}
		v := hexVal(hi)<<4 | hexVal(lo)
		if v == '\b' || v == '\t' || v == '\n' || v == '\f' || v == '\r' {
			return 0, false
		}
		return 6, true
	}
	return 0, false
}

// internEnum returns the constant for the schema, phase, outcome and block
// kind names, so they cost no allocation; any other bytes are copied.
func internEnum(raw []byte) string {
	switch string(raw) {
	case string(SchemaOperator):
		return string(SchemaOperator)
	case string(SchemaFamily):
		return string(SchemaFamily)
	case string(PhaseVerify):
		return string(PhaseVerify)
	case string(PhaseShadowLoad):
		return string(PhaseShadowLoad)
	case string(PhaseQuiesce):
		return string(PhaseQuiesce)
	case string(PhaseSnapshot):
		return string(PhaseSnapshot)
	case string(PhaseMigrate):
		return string(PhaseMigrate)
	case string(PhaseRestore):
		return string(PhaseRestore)
	case string(PhaseReadiness):
		return string(PhaseReadiness)
	case string(PhaseAtomicSwitch):
		return string(PhaseAtomicSwitch)
	case string(PhaseDrain):
		return string(PhaseDrain)
	case string(PhaseCommitted):
		return string(PhaseCommitted)
	case string(PhaseRolledBack):
		return string(PhaseRolledBack)
	case string(OutcomeApplied):
		return string(OutcomeApplied)
	case string(OutcomeBlocked):
		return string(OutcomeBlocked)
	case string(OutcomeRollbackFailed):
		return string(OutcomeRollbackFailed)
	case string(BlockValidation):
		return string(BlockValidation)
	case string(BlockDependency):
		return string(BlockDependency)
	case string(BlockProvider):
		return string(BlockProvider)
	case string(BlockDeadline):
		return string(BlockDeadline)
	case "":
		return ""
	}
	return string(raw)
}

func hexVal(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// unescape decodes the escapes str accepted.
func unescape(raw []byte) (string, bool) {
	var b strings.Builder
	b.Grow(len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		switch raw[i] {
		case '"', '\\':
			b.WriteByte(raw[i])
		case 'b':
			b.WriteByte('\b')
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'f':
			b.WriteByte('\f')
		case 'r':
			b.WriteByte('\r')
		case 'u':
			b.WriteByte(hexVal(raw[i+3])<<4 | hexVal(raw[i+4]))
			i += 4
		default:
			return "", false
		}
	}
	return b.String(), true
}

// uint reads an unsigned integer with no sign, exponent, fraction or
// leading zero that fits uint64.
func (s *scanner) uint() (uint64, bool) {
	start := s.p
	var n uint64
	for s.p < len(s.b) && s.b[s.p] >= '0' && s.b[s.p] <= '9' {
		d := uint64(s.b[s.p] - '0')
		if n > (^uint64(0)-d)/10 {
			return 0, false
		}
		n = n*10 + d
		s.p++
	}
	digits := s.p - start
	if digits == 0 || digits > 1 && s.b[start] == '0' {
		return 0, false
	}
	return n, true
}

// nullableStr reads null or a string. The pointer is always new, so no two
// records share one; the string bytes may be shared with prev.
func (s *scanner) nullableStr(prev *string, prevPlain bool) (*string, bool, bool) {
	if s.lit("null") {
		return nil, false, true
	}
	p := ""
	if prev != nil {
		p = *prev
	}
	v, _, _, plain, ok := s.str(p, prevPlain && prev != nil)
	if !ok {
		return nil, false, false
	}
	return &v, plain, true
}

// String members, as bits of the plain mask parseCanonical returns: which
// strings of a record were read without escapes.
const (
	plainSchema = 1 << iota
	plainPrevious
	plainRecordHash
	plainTransaction
	plainModule
	plainCandidate
	plainOldImpl
	plainOldArtifact
	plainOldState
	plainNewImpl
	plainNewArtifact
	plainNewState
	plainAuthority
	plainPhase
	plainOutcome
	plainBlockKind
	plainReason
)

// emptyRecord stands for "no previous record".
var emptyRecord Record

// parseCanonical is the fast path of parseLine: it accepts exactly the
// canonical encoding of a Record and nothing else. prev and prevPlain are
// the previous record and its plain mask (nil and 0 when none).
func parseCanonical(line []byte, prev *Record, prevPlain uint32) (Record, hashSpan, uint32, bool) {
	var r Record
	span, plain, ok := parseCanonicalInto(&r, line, prev, prevPlain)
	return r, span, plain, ok
}

// parseCanonicalInto is parseCanonical filling *dst in place (dst must not
// be prev); dst is garbage when it returns false.
func parseCanonicalInto(dst *Record, line []byte, prev *Record, prevPlain uint32) (hashSpan, uint32, bool) {
	if prev == nil {
		prev, prevPlain = &emptyRecord, 0
	}
	r := dst
	*r = Record{}
	var span hashSpan
	var plain uint32
	s := scanner{b: line}
	ok := true
	str := func(name string, dst *string, prevVal string, prevBit, bit uint32) bool {
		if !ok || !s.lit(name) {
			return false
		}
		var p bool
		*dst, _, _, p, ok = s.str(prevVal, prevPlain&prevBit != 0)
		if p {
			plain |= bit
		}
		return ok
	}
	num := func(name string, dst *uint64) bool {
		if !ok || !s.lit(name) {
			return false
		}
		*dst, ok = s.uint()
		return ok
	}
	var v string
	if !str(`{"schema_id":`, &v, string(prev.SchemaID), plainSchema, plainSchema) {
		return span, 0, false
	}
	r.SchemaID = Schema(v)
	if !num(`,"sequence":`, &r.Sequence) ||
		!str(`,"previous_sha256":`, &r.PreviousSHA256, prev.RecordSHA256, plainRecordHash, plainPrevious) ||
		!s.lit(`,"record_sha256":`) {
		return span, 0, false
	}
	var p bool
	if r.RecordSHA256, span.start, span.end, ok = s.digest(); ok {
		p = true
	} else {
		r.RecordSHA256, span.start, span.end, p, ok = s.str("", false)
	}
	if p {
		plain |= plainRecordHash
	}
	if !ok ||
		!str(`,"transaction_id":`, &r.TransactionID, prev.TransactionID, plainTransaction, plainTransaction) ||
		!str(`,"module":`, &r.Module, prev.Module, plainModule, plainModule) ||
		!str(`,"candidate_sha256":`, &r.CandidateSHA256, prev.CandidateSHA256, plainCandidate, plainCandidate) ||
		!num(`,"old_generation":`, &r.OldGeneration) ||
		!str(`,"old_implementation_id":`, &r.OldImplementationID, prev.OldImplementationID, plainOldImpl, plainOldImpl) ||
		!str(`,"old_artifact_sha256":`, &r.OldArtifactSHA256, prev.OldArtifactSHA256, plainOldArtifact, plainOldArtifact) ||
		!str(`,"old_state_sha256":`, &r.OldStateSHA256, prev.OldStateSHA256, plainOldState, plainOldState) ||
		!num(`,"new_generation":`, &r.NewGeneration) ||
		!str(`,"new_implementation_id":`, &r.NewImplementationID, prev.NewImplementationID, plainNewImpl, plainNewImpl) ||
		!str(`,"new_artifact_sha256":`, &r.NewArtifactSHA256, prev.NewArtifactSHA256, plainNewArtifact, plainNewArtifact) ||
		!str(`,"new_state_sha256":`, &r.NewStateSHA256, prev.NewStateSHA256, plainNewState, plainNewState) ||
		!str(`,"authority_sha256":`, &r.AuthoritySHA256, prev.AuthoritySHA256, plainAuthority, plainAuthority) ||
		!str(`,"phase":`, &v, string(prev.Phase), plainPhase, plainPhase) {
		return span, 0, false
	}
	r.Phase = Phase(v)
	if !str(`,"outcome":`, &v, string(prev.Outcome), plainOutcome, plainOutcome) || !s.lit(`,"block_kind":`) {
		return span, 0, false
	}
	r.Outcome = Outcome(v)
	kind, p, ok := s.nullableStr((*string)(prev.BlockKind), prevPlain&plainBlockKind != 0)
	if !ok || !s.lit(`,"reason":`) {
		return span, 0, false
	}
	if p {
		plain |= plainBlockKind
	}
	r.BlockKind = (*BlockKind)(kind)
	if r.Reason, p, ok = s.nullableStr(prev.Reason, prevPlain&plainReason != 0); !ok ||
		!num(`,"started_unix_ms":`, &r.StartedUnixMs) ||
		!num(`,"elapsed_ms":`, &r.ElapsedMs) ||
		!num(`,"deadline_ms":`, &r.DeadlineMs) ||
		!s.lit(`}`) || s.p != len(line) {
		return span, 0, false
	}
	if p {
		plain |= plainReason
	}
	return span, plain, true
}
