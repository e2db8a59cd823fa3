package ledger

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

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

// parseLine reads one line (without its newline) as a record. A line must be
// strict JSON and exactly the record's canonical encoding: a writer of either
// schema prints records with serde_json, so any other byte stream for the
// same values (spacing, member order, escapes, a missing member) is not what
// a writer wrote. prev, when not nil, is the previous record; equal strings
// are shared with it instead of allocated (a transaction repeats most
// fields).
//
// The fast path matches the canonical layout byte by byte; only a line it
// refuses is decoded by strictjson, whose error names the JSON problem.
func parseLine(line []byte, prev *Record) (Record, hashSpan, *RuleError) {
	if len(line) > MaxRecordBytes {
		return Record{}, hashSpan{}, &RuleError{Rule: RuleRecordTooLarge, Detail: fmt.Sprintf("record is %d bytes, at most %d", len(line), MaxRecordBytes)}
	}
	if r, span, ok := parseCanonical(line, prev); ok {
		return r, span, nil
	}
	return parseStrict(line)
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
	at := bytes.Index(line, recordHashField) + len(recordHashField)
	return r, hashSpan{start: at, end: at + len(r.RecordSHA256)}, nil
}

// nonCanonicalDetail explains why a strictly valid line is not canonical:
// the members it lacks, or the first byte where it differs.
func nonCanonicalDetail(line, canon []byte) string {
	var members map[string]jsontext.Value
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
// literal UTF-8. prev is returned instead of a new string when equal.
func (s *scanner) str(prev string) (string, int, int, bool) {
	if s.p >= len(s.b) || s.b[s.p] != '"' {
		return "", 0, 0, false
	}
	s.p++
	start := s.p
	escaped := false
	for s.p < len(s.b) {
		c := s.b[s.p]
		switch {
		case c == '"':
			end := s.p
			s.p++
			raw := s.b[start:end]
			if !utf8.Valid(raw) {
				return "", 0, 0, false
			}
			if !escaped {
				if string(raw) == prev {
					return prev, start, end, true
				}
				return string(raw), start, end, true
			}
			v, ok := unescape(raw)
			return v, start, end, ok
		case c == '\\':
			escaped = true
			if s.p+1 >= len(s.b) {
				return "", 0, 0, false
			}
			switch s.b[s.p+1] {
			case '"', '\\', 'b', 't', 'n', 'f', 'r':
				s.p += 2
			case 'u':
				if s.p+6 > len(s.b) || s.b[s.p+2] != '0' || s.b[s.p+3] != '0' {
					return "", 0, 0, false
				}
				hi, lo := s.b[s.p+4], s.b[s.p+5]
				if hi != '0' && hi != '1' || !(lo >= '0' && lo <= '9' || lo >= 'a' && lo <= 'f') {
					return "", 0, 0, false
				}
				v := hexVal(hi)<<4 | hexVal(lo)
				if v == '\b' || v == '\t' || v == '\n' || v == '\f' || v == '\r' {
					return "", 0, 0, false
				}
				s.p += 6
			default:
				return "", 0, 0, false
			}
		case c < 0x20:
			return "", 0, 0, false
		default:
			s.p++
		}
	}
	return "", 0, 0, false
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
func (s *scanner) nullableStr(prev *string) (*string, bool) {
	if s.lit("null") {
		return nil, true
	}
	p := ""
	if prev != nil {
		p = *prev
	}
	v, _, _, ok := s.str(p)
	if !ok {
		return nil, false
	}
	return &v, true
}

// parseCanonical is the fast path of parseLine: it accepts exactly the
// canonical encoding of a Record and nothing else.
func parseCanonical(line []byte, prev *Record) (Record, hashSpan, bool) {
	if prev == nil {
		prev = &Record{}
	}
	var r Record
	var span hashSpan
	s := scanner{b: line}
	var ok bool
	var v string
	str := func(name string, dst *string, prevVal string) bool {
		if !ok || !s.lit(name) {
			return false
		}
		*dst, _, _, ok = s.str(prevVal)
		return ok
	}
	num := func(name string, dst *uint64) bool {
		if !ok || !s.lit(name) {
			return false
		}
		*dst, ok = s.uint()
		return ok
	}
	ok = true
	if !str(`{"schema_id":`, &v, string(prev.SchemaID)) {
		return Record{}, span, false
	}
	r.SchemaID = Schema(v)
	if !num(`,"sequence":`, &r.Sequence) ||
		!str(`,"previous_sha256":`, &r.PreviousSHA256, prev.RecordSHA256) ||
		!s.lit(`,"record_sha256":`) {
		return Record{}, span, false
	}
	r.RecordSHA256, span.start, span.end, ok = s.str("")
	if !ok ||
		!str(`,"transaction_id":`, &r.TransactionID, prev.TransactionID) ||
		!str(`,"module":`, &r.Module, prev.Module) ||
		!str(`,"candidate_sha256":`, &r.CandidateSHA256, prev.CandidateSHA256) ||
		!num(`,"old_generation":`, &r.OldGeneration) ||
		!str(`,"old_implementation_id":`, &r.OldImplementationID, prev.OldImplementationID) ||
		!str(`,"old_artifact_sha256":`, &r.OldArtifactSHA256, prev.OldArtifactSHA256) ||
		!str(`,"old_state_sha256":`, &r.OldStateSHA256, prev.OldStateSHA256) ||
		!num(`,"new_generation":`, &r.NewGeneration) ||
		!str(`,"new_implementation_id":`, &r.NewImplementationID, prev.NewImplementationID) ||
		!str(`,"new_artifact_sha256":`, &r.NewArtifactSHA256, prev.NewArtifactSHA256) ||
		!str(`,"new_state_sha256":`, &r.NewStateSHA256, prev.NewStateSHA256) ||
		!str(`,"authority_sha256":`, &r.AuthoritySHA256, prev.AuthoritySHA256) ||
		!str(`,"phase":`, &v, string(prev.Phase)) {
		return Record{}, span, false
	}
	r.Phase = Phase(v)
	if !str(`,"outcome":`, &v, string(prev.Outcome)) || !s.lit(`,"block_kind":`) {
		return Record{}, span, false
	}
	r.Outcome = Outcome(v)
	kind, ok := s.nullableStr((*string)(prev.BlockKind))
	if !ok || !s.lit(`,"reason":`) {
		return Record{}, span, false
	}
	r.BlockKind = (*BlockKind)(kind)
	if r.Reason, ok = s.nullableStr(prev.Reason); !ok ||
		!num(`,"started_unix_ms":`, &r.StartedUnixMs) ||
		!num(`,"elapsed_ms":`, &r.ElapsedMs) ||
		!num(`,"deadline_ms":`, &r.DeadlineMs) ||
		!s.lit(`}`) || s.p != len(line) {
		return Record{}, span, false
	}
	return r, span, true
}
