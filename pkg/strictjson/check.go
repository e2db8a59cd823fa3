package strictjson

import (
	"bytes"
	"encoding/binary"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects a strict value may
// have: jsontext's bound, so that Check and the decoders accept the same
// values.
const MaxDepth = 10000

// Check reports whether data is exactly one strict JSON value (RFC 8259,
// surrounding whitespace allowed): no member name repeated in any object at
// any depth (names compared after unescaping), strings of valid UTF-8 with
// valid escapes (a \u surrogate only as a high-low pair), no control
// character unescaped, no trailing data, nesting at most MaxDepth. It is a
// single pass that allocates nothing for objects of up to 16 members whose
// names have no escapes. It accepts exactly what Valid accepts (without
// Valid's size bound: check the length first), which FuzzCheck verifies; on
// rejection call Valid for an error that says where and why.
func Check(data []byte) bool {
	s := getChecker(data, 0)
	defer s.release()
	s.ws()
	if !s.value(0) {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

// checkers keeps checkers with room for the names of open objects, so
// that a check allocates nothing for ordinary documents.
var checkers = sync.Pool{New: func() any { return &checker{names: make([][]byte, 0, 4*smallObject)} }}

func getChecker(b []byte, i int) *checker {
	s := checkers.Get().(*checker)
	s.b, s.i = b, i
	return s
}

func (s *checker) release() {
	if cap(s.names) > 16*smallObject {
		s.names = make([][]byte, 0, 4*smallObject)
	} else {
		clear(s.names[:cap(s.names)]) // no reference to the document stays
		s.names = s.names[:0]
	}
	s.b = nil
	checkers.Put(s)
}

// smallObject is how many member names are compared pairwise before an
// object's names go into a set.
const smallObject = 16

type checker struct {
	b     []byte
	i     int
	names [][]byte // the names of every open object, innermost last
}

// ws skips JSON whitespace.
func (s *checker) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *checker) value(depth int) bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; c {
	case '{':
		if depth >= MaxDepth {
			return false
		}
		return s.object(depth + 1)
	case '[':
		if depth >= MaxDepth {
			return false
		}
		return s.array(depth + 1)
	case '"':
		_, ok := s.str(false)
		return ok
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return s.number()
		}
		return false
	}
}

func (s *checker) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

func (s *checker) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *checker) number() bool {
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// plain marks the string bytes that need no attention: printable ASCII
// other than '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainWord reports whether all eight bytes of x are plain (SWAR: a byte
// with its high bit set, below 0x20, '"' or '\\' makes it false; borrows
// may make it false for a plain word too, which only costs the byte loop).
func plainWord(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q := x ^ (lo * '"')
	bs := x ^ (lo * '\\')
	return (x|(x-lo*0x20)&^x|(q-lo)&^q|(bs-lo)&^bs)&hi == 0
}

// str consumes a string at s.i (its opening quote). With name set it
// returns the string's unescaped content: a sub-slice of the input when it
// has no escape, a copy otherwise.
func (s *checker) str(name bool) ([]byte, bool) {
	b := s.b
	start := s.i + 1
	i := start
	var unescaped []byte // nil until the first escape of a name
	from := start        // the bytes not yet copied into unescaped
	for {
		// Eight bytes at a time while none needs attention, then one by one.
		for i+8 <= len(b) && plainWord(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && plain[b[i]] {
			i++
		}
		if i >= len(b) {
			return nil, false
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			if !name {
				return nil, true
			}
			if unescaped == nil {
				return b[start:i], true
			}
			return append(unescaped, b[from:i]...), true
		case c == '\\':
			if i+1 >= len(b) {
				return nil, false
			}
			var r rune
			n := 2
			switch b[i+1] {
			case '"', '\\', '/':
				r = rune(b[i+1])
			case 'b':
				r = '\b'
			case 'f':
				r = '\f'
			case 'n':
				r = '\n'
			case 'r':
				r = '\r'
			case 't':
				r = '\t'
			case 'u':
				v, ok := hex4(b, i+2)
				if !ok {
					return nil, false
				}
				r, n = rune(v), 6
				if utf16.IsSurrogate(r) {
					// Only a high half followed by an escaped low half.
					if i+12 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
						return nil, false
					}
					v2, ok := hex4(b, i+8)
					if !ok {
						return nil, false
					}
					if r = utf16.DecodeRune(r, rune(v2)); r == utf8.RuneError {
						return nil, false
					}
					n = 12
				}
			default:
				return nil, false
			}
			if name {
				if unescaped == nil {
					unescaped = make([]byte, 0, i-start+8)
				}
				unescaped = append(unescaped, b[from:i]...)
				unescaped = utf8.AppendRune(unescaped, r)
				from = i + n
			}
			i += n
		case c < 0x20:
			return nil, false
		default:
			// Multi-byte UTF-8: the common two- and three-byte forms are
			// checked inline, the rest by utf8.
			if c >= 0xC2 && c < 0xE0 && i+1 < len(b) && b[i+1]&0xC0 == 0x80 {
				i += 2
				continue
			}
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size <= 1 {
				return nil, false
			}
			i += size
		}
	}
}

func hex4(b []byte, i int) (uint16, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var v uint16
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(c)
	}
	return v, true
}

func (s *checker) object(depth int) bool {
	s.i++ // {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	base := len(s.names)
	ok := s.members(depth, base)
	s.names = s.names[:base]
	return ok
}

// members reads an object's members from its first name on; the names
// read go to s.names[base:].
func (s *checker) members(depth, base int) bool {
	var set map[string]struct{}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		name, ok := s.str(true)
		if !ok {
			return false
		}
		switch {
		case set != nil:
			if _, dup := set[string(name)]; dup {
				return false
			}
			set[string(name)] = struct{}{}
		default:
			for _, prev := range s.names[base:] {
				if bytes.Equal(prev, name) {
					return false
				}
			}
			s.names = append(s.names, name)
			if len(s.names)-base > smallObject {
				set = make(map[string]struct{}, 2*smallObject)
				for _, n := range s.names[base:] {
					set[string(n)] = struct{}{}
				}
			}
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		if !s.value(depth) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.ws()
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

func (s *checker) array(depth int) bool {
	s.i++ // [
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return true
	}
	for {
		if !s.value(depth) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.ws()
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// The scanning steps of Check, for decoders of their own formats that
// keep its rules (pkg/protocol's frame decoder). Each starts at b[i], on
// the first byte of its token (no whitespace), and returns the offset just
// past what it consumed; ok is false if that is not what b holds there.

// ValueAt checks one strict value nested depth levels deep (the arrays and
// objects around it count towards MaxDepth).
func ValueAt(b []byte, i, depth int) (end int, ok bool) {
	s := getChecker(b, i)
	defer s.release()
	ok = s.value(depth)
	return s.i, ok
}

// StringAt reads one string and returns its unescaped content: a sub-slice
// of b when it has no escape, a copy otherwise.
func StringAt(b []byte, i int) (content []byte, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	s := checker{b: b, i: i}
	content, ok = s.str(true)
	return content, s.i, ok
}

// NumberAt consumes one number.
func NumberAt(b []byte, i int) (end int, ok bool) {
	if i >= len(b) || !(b[i] == '-' || b[i] >= '0' && b[i] <= '9') {
		return i, false
	}
	s := checker{b: b, i: i}
	ok = s.number()
	return s.i, ok
}
