package strictjson

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// maxFastDepth bounds the nesting the fast path checks before it leaves a
// value to the full re-encoder.
const maxFastDepth = 512

// isCanonical reports whether raw already is the canonical form of one JSON
// value: no whitespace, object keys strictly increasing (so none repeats),
// strings valid UTF-8 with no escape at all, numbers exactly as serde_json
// prints them. A false answer says nothing about validity: the caller then
// re-encodes, which also rejects what is invalid. Providers and the host
// write canonical state, so the common case costs one pass and no
// allocation.
func isCanonical(raw []byte) bool {
	c := canonChecker{b: raw}
	return c.value(0) && c.i == len(raw)
}

type canonChecker struct {
	b []byte
	i int
}

func (c *canonChecker) value(depth int) bool {
	if c.i >= len(c.b) || depth > maxFastDepth {
		return false
	}
	switch ch := c.b[c.i]; {
	case ch == '{':
		return c.object(depth)
	case ch == '[':
		return c.array(depth)
	case ch == '"':
		_, ok := c.str()
		return ok
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	case ch == '-' || ch >= '0' && ch <= '9':
		return c.number()
	}
	return false
}

func (c *canonChecker) literal(lit string) bool {
	if !bytes.HasPrefix(c.b[c.i:], []byte(lit)) {
		return false
	}
	c.i += len(lit)
	return true
}

// str consumes a string with no escape and valid UTF-8 and returns its
// content.
func (c *canonChecker) str() ([]byte, bool) {
	start := c.i + 1
	for j := start; j < len(c.b); j++ {
		switch ch := c.b[j]; {
		case ch == '"':
			s := c.b[start:j]
			if !utf8.Valid(s) {
				return nil, false
			}
			c.i = j + 1
			return s, true
		case ch == '\\' || ch < 0x20:
			return nil, false
		}
	}
	return nil, false
}

func (c *canonChecker) object(depth int) bool {
	c.i++ // {
	if c.i < len(c.b) && c.b[c.i] == '}' {
		c.i++
		return true
	}
	var prev []byte
	for n := 0; ; n++ {
		if c.i >= len(c.b) || c.b[c.i] != '"' {
			return false
		}
		key, ok := c.str()
		if !ok || n > 0 && bytes.Compare(prev, key) >= 0 {
			return false
		}
		prev = key
		if c.i >= len(c.b) || c.b[c.i] != ':' {
			return false
		}
		c.i++
		if !c.value(depth + 1) {
			return false
		}
		if c.i >= len(c.b) {
			return false
		}
		switch c.b[c.i] {
		case ',':
			c.i++
		case '}':
			c.i++
			return true
		default:
			return false
		}
	}
}

func (c *canonChecker) array(depth int) bool {
	c.i++ // [
	if c.i < len(c.b) && c.b[c.i] == ']' {
		c.i++
		return true
	}
	for {
		if !c.value(depth + 1) {
			return false
		}
		if c.i >= len(c.b) {
			return false
		}
		switch c.b[c.i] {
		case ',':
			c.i++
		case ']':
			c.i++
			return true
		default:
			return false
		}
	}
}

// number consumes a number and checks that appendNumber would print it
// byte for byte as it stands.
func (c *canonChecker) number() bool {
	start := c.i
	j := c.i
	if c.b[j] == '-' {
		j++
	}
	for j < len(c.b) {
		ch := c.b[j]
		if ch >= '0' && ch <= '9' || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-' {
			j++
			continue
		}
		break
	}
	lit := c.b[start:j]
	c.i = j
	// Fast case: a plain integer without leading zeros that fits 64 bits.
	if isPlainInteger(lit) {
		if lit[0] == '-' {
			n, err := strconv.ParseInt(string(lit), 10, 64)
			return err == nil && n != 0
		}
		_, err := strconv.ParseUint(string(lit), 10, 64)
		return err == nil
	}
	out, err := appendNumber(nil, string(lit))
	return err == nil && bytes.Equal(out, lit)
}

func isPlainInteger(lit []byte) bool {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || digits[0] == '0' && len(digits) > 1 {
		return false
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return false
		}
	}
	return true
}
