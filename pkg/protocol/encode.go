package protocol

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// The encoders below write every frame from its declaration (members.go),
// members in the order of docs/reference/protocol.md, compact, strings in
// their minimal form (no escaping of '<', '>', '&', U+2028 or U+2029). Raw JSON values (inputs,
// observations, states) are copied as they are, never decoded and re-encoded:
// only a value that spans lines is compacted, because a frame is one line.

// MarshalRequest validates r for a provider speaking v against the module's
// contracts (Validate; nil skips the contract comparison) and returns
// its frame, without the trailing newline.
func MarshalRequest(r *Request, v Version, contracts *ModuleContracts) ([]byte, error) {
	if err := r.Validate(v, contracts); err != nil {
		return nil, err
	}
	b, err := AppendRequest(nil, r)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFrameBytes {
		return nil, errorf(ErrTooLarge, "", "frame of %d bytes exceeds %d", len(b), MaxFrameBytes)
	}
	return b, nil
}

// AppendRequest appends r's frame (no newline) to dst. It does not validate
// r beyond what encoding needs (valid UTF-8, raw values present): call
// Validate first, or use MarshalRequest.
func AppendRequest(dst []byte, r *Request) ([]byte, error) {
	e := encoder{b: dst}
	e.object(requestFrame, r, "")
	return e.b, e.err
}

// AppendResponse appends r's frame (no newline) to dst.
func AppendResponse(dst []byte, r *Response) ([]byte, error) {
	e := encoder{b: dst}
	e.object(responseFrame, r, "")
	return e.b, e.err
}

// AppendObservation appends o's frame (no newline) to dst.
func AppendObservation(dst []byte, o *Observation) ([]byte, error) {
	e := encoder{b: dst}
	e.object(observationFrame, o, "")
	return e.b, e.err
}

// AppendState appends s as a JSON object to dst.
func AppendState(dst []byte, s *State) ([]byte, error) {
	e := encoder{b: dst}
	e.state(s, "")
	return e.b, e.err
}

// AppendContract appends c as a JSON object to dst.
func AppendContract(dst []byte, c ContractRef) []byte {
	e := encoder{b: dst}
	e.contract(&c)
	return e.b
}

type encoder struct {
	b     []byte
	first bool
	err   error
}

// object writes v as a JSON object with the members c declares; ptr is its
// JSON Pointer, for errors.
func (e *encoder) object(c codec, v any, ptr string) {
	e.tagged("", "", c, v, ptr)
}

// tagged writes v as a JSON object: the tag member tagName (unless "") with
// the value tag, then the members c declares.
func (e *encoder) tagged(tagName, tag string, c codec, v any, ptr string) {
	saved := e.first
	e.b = append(e.b, '{')
	e.first = true
	if tagName != "" {
		e.field(tagName)
		e.str(tag)
	}
	var err error
	*e, err = c.write(*e, v, ptr)
	e.fail(err)
	e.b = append(e.b, '}')
	e.first = saved
}

// fail keeps the first error.
func (e *encoder) fail(err error) {
	if err != nil && e.err == nil {
		e.err = err
	}
}

// requestPayload writes a request's payload, tagged "operation".
func (e *encoder) requestPayload(p RequestPayload, ptr string) {
	if p == nil {
		e.fail(errorf(ErrMalformed, ptr, "no payload"))
		e.b = append(e.b, "null"...)
		return
	}
	op := p.Operation()
	c, ok := requestCodecs[op]
	if !ok {
		e.fail(errorf(ErrMalformed, ptr, "unknown payload type %T", p))
		e.b = append(e.b, "null"...)
		return
	}
	e.tagged("operation", string(op), c, p, ptr)
}

// responsePayload writes a response's payload, tagged "result".
func (e *encoder) responsePayload(p ResponsePayload, ptr string) {
	if p == nil {
		e.fail(errorf(ErrMalformed, ptr, "no payload"))
		e.b = append(e.b, "null"...)
		return
	}
	res := p.Result()
	c, ok := responseCodecs[res]
	if !ok {
		e.fail(errorf(ErrMalformed, ptr, "unknown payload type %T", p))
		e.b = append(e.b, "null"...)
		return
	}
	e.tagged("result", string(res), c, p, ptr)
}

// field writes a member name (names are ASCII identifiers, never escaped),
// preceded by a comma unless it is the first of its object.
func (e *encoder) field(name string) {
	if !e.first {
		e.b = append(e.b, ',')
	}
	e.first = false
	e.b = append(e.b, '"')
	e.b = append(e.b, name...)
	e.b = append(e.b, '"', ':')
}

func (e *encoder) str(s string) {
	var err error
	e.b, err = jsontext.AppendQuote(e.b, s)
	if err != nil && e.err == nil {
		e.err = errorf(ErrInvalid, "", "string %q is not valid UTF-8", s)
	}
}

func (e *encoder) strings(ss []string) {
	e.b = append(e.b, '[')
	for i, s := range ss {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.str(s)
	}
	e.b = append(e.b, ']')
}

func (e *encoder) uint(n uint64) { e.b = strconv.AppendUint(e.b, n, 10) }

func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, "true"...)
	} else {
		e.b = append(e.b, "false"...)
	}
}

// contract writes a contract object (its members cannot fail).
func (e *encoder) contract(c *ContractRef) {
	e.object(contractCodec, c, "")
}

// raw copies a raw JSON value, compacting it only when it spans lines; its
// JSON Pointer, for errors, is base + rel.
func (e *encoder) raw(v jsontext.Value, base, rel string) {
	if len(v) == 0 {
		if e.err == nil {
			e.err = errorf(ErrMalformed, base+rel, "missing value")
		}
		e.b = append(e.b, "null"...)
		return
	}
	if bytes.IndexByte(v, '\n') < 0 && bytes.IndexByte(v, '\r') < 0 {
		e.b = append(e.b, v...)
		return
	}
	c := v.Clone()
	if err := c.Compact(); err != nil {
		if e.err == nil {
			e.err = errorf(ErrMalformed, base+rel, "not one JSON value: %v", err)
		}
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, c...)
}

// at is the JSON Pointer base + rel, allocated only below the top level.
func at(base, rel string) string {
	if base == "" {
		return rel
	}
	return base + rel
}

// state writes a State object; ptr is its JSON Pointer, for errors.
func (e *encoder) state(s *State, ptr string) {
	e.object(stateCodec, s, ptr)
}

// String renders a request for diagnostics (its frame, or why it has none).
func (r *Request) String() string {
	b, err := AppendRequest(nil, r)
	if err != nil {
		return fmt.Sprintf("<unencodable request: %v>", err)
	}
	return string(b)
}
