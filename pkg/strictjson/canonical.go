package strictjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// DigestPrefix starts every digest the family writes.
const DigestPrefix = "sha256:"

// Canonical encodes v as serde_json::to_vec would: struct fields in
// declaration order (as the family's Rust structs serialize them), map keys
// sorted, strings and numbers in serde_json's form. Free-form JSON held in a
// jsontext.Value keeps its member order; use CanonicalValue for values whose
// digest the family takes over a serde_json::Value.
func Canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v, json.Deterministic(true), jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	if err != nil {
		return nil, err
	}
	return reencode(raw, false)
}

// CanonicalValue re-encodes one JSON value as serde_json prints a parsed
// serde_json::Value: object keys sorted byte-wise, compact. The input is
// parsed strictly (duplicate names, invalid UTF-8 and trailing data are
// errors) and numbers that overflow float64 are refused, as serde_json does.
// Input that already is canonical is returned as it is (not copied), after
// one checking pass.
func CanonicalValue(raw []byte) ([]byte, error) {
	if isCanonical(raw) {
		return raw, nil
	}
	return reencode(raw, true)
}

// Digest returns "sha256:" and the lowercase hex SHA-256 of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return DigestPrefix + hex.EncodeToString(sum[:])
}

// DigestOf returns the digest of v's canonical encoding.
func DigestOf(v any) (string, error) {
	b, err := Canonical(v)
	if err != nil {
		return "", err
	}
	return Digest(b), nil
}

// DigestOfValue returns the digest of the canonical form of one JSON value
// (the state_sha256 construction of docs/reference/protocol.md).
func DigestOfValue(raw []byte) (string, error) {
	b, err := CanonicalValue(raw)
	if err != nil {
		return "", err
	}
	return Digest(b), nil
}

func reencode(raw []byte, sortKeys bool) ([]byte, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(raw), jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	out := make([]byte, 0, len(raw))
	out, err := appendCanonical(out, dec, sortKeys)
	if err != nil {
		return nil, wrapDecodeError(err)
	}
	if _, err := dec.ReadToken(); err == nil {
		return nil, &Error{Offset: dec.InputOffset(), Reason: "trailing data after the JSON value"}
	}
	return out, nil
}

func appendCanonical(out []byte, dec *jsontext.Decoder, sortKeys bool) ([]byte, error) {
	switch dec.PeekKind() {
	case '{':
		if _, err := dec.ReadToken(); err != nil {
			return out, err
		}
		type member struct{ name, value []byte }
		var members []member
		for dec.PeekKind() != '}' {
			nameTok, err := dec.ReadToken()
			if err != nil {
				return out, err
			}
			name := nameTok.String()
			value, err := appendCanonical(nil, dec, sortKeys)
			if err != nil {
				return out, err
			}
			members = append(members, member{AppendString(nil, name), value})
		}
		if _, err := dec.ReadToken(); err != nil {
			return out, err
		}
		if sortKeys {
			slices.SortFunc(members, func(a, b member) int { return bytes.Compare(a.name, b.name) })
		}
		out = append(out, '{')
		for i, m := range members {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, m.name...)
			out = append(out, ':')
			out = append(out, m.value...)
		}
		return append(out, '}'), nil
	case '[':
		if _, err := dec.ReadToken(); err != nil {
			return out, err
		}
		out = append(out, '[')
		for i := 0; dec.PeekKind() != ']'; i++ {
			if i > 0 {
				out = append(out, ',')
			}
			var err error
			if out, err = appendCanonical(out, dec, sortKeys); err != nil {
				return out, err
			}
		}
		if _, err := dec.ReadToken(); err != nil {
			return out, err
		}
		return append(out, ']'), nil
	case 0:
		// PeekKind reports 0 on a syntax error or EOF; ReadToken returns it.
		_, err := dec.ReadToken()
		return out, err
	default:
		tok, err := dec.ReadToken()
		if err != nil {
			return out, err
		}
		switch tok.Kind() {
		case '"':
			return AppendString(out, tok.String()), nil
		case '0':
			return appendNumber(out, tok.String())
		case 't':
			return append(out, "true"...), nil
		case 'f':
			return append(out, "false"...), nil
		default:
			return append(out, "null"...), nil
		}
	}
}

// AppendString appends s as serde_json quotes it: only '"', '\\' and the
// control characters below U+0020 are escaped; \b \t \n \f \r have short
// forms, the rest are \u00xx in lowercase hex. s must be valid UTF-8 (the
// caller checks; Canonical and CanonicalValue refuse anything else).
func AppendString(out []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[start:i]...)
		switch c {
		case '"':
			out = append(out, '\\', '"')
		case '\\':
			out = append(out, '\\', '\\')
		case '\b':
			out = append(out, '\\', 'b')
		case '\t':
			out = append(out, '\\', 't')
		case '\n':
			out = append(out, '\\', 'n')
		case '\f':
			out = append(out, '\\', 'f')
		case '\r':
			out = append(out, '\\', 'r')
		default:
			out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}

// appendNumber writes a JSON number as serde_json prints it after parsing:
// an integer literal that fits u64 (or i64 when negative) stays an integer;
// anything else, "-0" included, is an f64 printed by ryu.
func appendNumber(out []byte, lit string) ([]byte, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if strings.HasPrefix(lit, "-") {
			if n, err := strconv.ParseInt(lit, 10, 64); err == nil && n != 0 {
				return strconv.AppendInt(out, n, 10), nil
			}
		} else if n, err := strconv.ParseUint(lit, 10, 64); err == nil {
			return strconv.AppendUint(out, n, 10), nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return out, fmt.Errorf("number %s is out of range", lit)
	}
	return AppendFloat(out, f), nil
}

// AppendFloat appends f in the form ryu's format_finite (and so serde_json)
// prints it: the shortest digits that round-trip, as an integer with ".0"
// when the decimal exponent is 0..16, as a plain decimal when it is -5..16,
// otherwise in scientific notation with no '+' ("1e21", "1.5e-7").
func AppendFloat(out []byte, f float64) []byte {
	if math.Signbit(f) {
		out = append(out, '-')
		f = -f
	}
	if f == 0 {
		return append(out, "0.0"...)
	}
	// 'e' with precision -1 gives the shortest round-trip digits: d.ddde±XX.
	var buf [32]byte
	sci := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	ePos := bytes.IndexByte(sci, 'e')
	exp, _ := strconv.Atoi(string(sci[ePos+1:]))
	digits := make([]byte, 0, 17)
	for _, c := range sci[:ePos] {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	length := len(digits)
	kk := exp + 1 // 10^(kk-1) <= f < 10^kk
	k := kk - length
	switch {
	case k >= 0 && kk <= 16:
		out = append(out, digits...)
		for range k {
			out = append(out, '0')
		}
		return append(out, '.', '0')
	case kk > 0 && kk <= 16:
		out = append(out, digits[:kk]...)
		out = append(out, '.')
		return append(out, digits[kk:]...)
	case kk > -5 && kk <= 0:
		out = append(out, '0', '.')
		for range -kk {
			out = append(out, '0')
		}
		return append(out, digits...)
	case length == 1:
		out = append(out, digits[0], 'e')
		return strconv.AppendInt(out, int64(kk-1), 10)
	default:
		out = append(out, digits[0], '.')
		out = append(out, digits[1:]...)
		out = append(out, 'e')
		return strconv.AppendInt(out, int64(kk-1), 10)
	}
}
