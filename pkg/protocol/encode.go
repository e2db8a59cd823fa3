package protocol

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// The encoders below write frames by hand, members in the order of
// docs/reference/protocol.md, compact, strings in their minimal form (no
// escaping of '<', '>', '&', U+2028 or U+2029). Raw JSON values (inputs,
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
	e.envelope(r.Envelope, true)
	e.key("payload")
	e.b = append(e.b, '{')
	if r.Payload == nil {
		return nil, errorf(ErrMalformed, "/payload", "no payload")
	}
	e.first = true
	op := r.Payload.Operation()
	c, ok := requestCodecs[op]
	if !ok {
		return nil, errorf(ErrMalformed, "/payload", "unknown payload type %T", r.Payload)
	}
	e.field("operation")
	e.str(string(op))
	e, err := c.write(e, r.Payload, "/payload")
	if err != nil {
		return nil, err
	}
	e.b = append(e.b, '}', '}')
	return e.b, e.err
}

// AppendResponse appends r's frame (no newline) to dst.
func AppendResponse(dst []byte, r *Response) ([]byte, error) {
	e := encoder{b: dst}
	e.envelope(r.Envelope, true)
	e.key("payload")
	e.b = append(e.b, '{')
	if r.Payload == nil {
		return nil, errorf(ErrMalformed, "/payload", "no payload")
	}
	e.first = true
	res := r.Payload.Result()
	c, ok := responseCodecs[res]
	if !ok {
		return nil, errorf(ErrMalformed, "/payload", "unknown payload type %T", r.Payload)
	}
	e.field("result")
	e.str(string(res))
	e, err := c.write(e, r.Payload, "/payload")
	if err != nil {
		return nil, err
	}
	e.b = append(e.b, '}', '}')
	return e.b, e.err
}

// AppendObservation appends o's frame (no newline) to dst.
func AppendObservation(dst []byte, o *Observation) ([]byte, error) {
	e := encoder{b: dst, first: true}
	e.b = append(e.b, '{')
	e.field("protocol")
	e.str(o.Protocol)
	e.field("implementation_id")
	e.str(o.ImplementationID)
	e.field("module")
	e.str(o.Module)
	e.field("run_id")
	e.str(o.RunID)
	e.field("sequence")
	e.uint(o.Sequence)
	e.contractField("schema", o.Schema)
	e.field("terminal")
	if o.Terminal {
		e.b = append(e.b, "true"...)
	} else {
		e.b = append(e.b, "false"...)
	}
	e.field("observation")
	e.raw(o.Observation, "", "observation")
	e.b = append(e.b, '}')
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
	e.contract(c)
	return e.b
}

type encoder struct {
	b     []byte
	first bool
	err   error
}

func (e *encoder) envelope(env Envelope, withRequestID bool) {
	e.b = append(e.b, '{')
	e.first = true
	e.field("protocol")
	e.str(env.Protocol)
	if withRequestID {
		e.field("request_id")
		e.str(env.RequestID)
	}
	e.field("implementation_id")
	e.str(env.ImplementationID)
	e.field("module")
	e.str(env.Module)
}

// key writes a member name after a member of the envelope.
func (e *encoder) key(name string) {
	e.b = append(e.b, ',', '"')
	e.b = append(e.b, name...)
	e.b = append(e.b, '"', ':')
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

func (e *encoder) contract(c ContractRef) {
	e.b = append(e.b, `{"id":`...)
	e.str(c.ID)
	e.b = append(e.b, `,"version":`...)
	e.b = strconv.AppendUint(e.b, uint64(c.Version), 10)
	e.b = append(e.b, '}')
}

func (e *encoder) contractField(name string, c ContractRef) {
	e.field(name)
	e.contract(c)
}

// raw copies a raw JSON value, compacting it only when it spans lines; its
// JSON Pointer, for errors, is base + "/" + name.
func (e *encoder) raw(v jsontext.Value, base, name string) {
	if len(v) == 0 {
		if e.err == nil {
			e.err = errorf(ErrMalformed, base+"/"+name, "missing value")
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
			e.err = errorf(ErrMalformed, base+"/"+name, "not one JSON value: %v", err)
		}
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, c...)
}

// state writes a State object; ptr is its JSON Pointer, for errors.
func (e *encoder) state(s *State, ptr string) {
	saved := e.first
	e.b = append(e.b, '{')
	e.first = true
	*e, _ = stateCodec.write(*e, s, ptr)
	e.b = append(e.b, '}')
	e.first = saved
}

// String renders a request for diagnostics (its frame, or why it has none).
func (r *Request) String() string {
	b, err := AppendRequest(nil, r)
	if err != nil {
		return fmt.Sprintf("<unencodable request: %v>", err)
	}
	return string(b)
}
