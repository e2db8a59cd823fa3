package protocol

import (
	"bytes"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/strictjson"
)

// Payload is a free-form raw JSON value (a run's input) that has passed the
// strict check once: one strict JSON value (no duplicate names at any
// depth, valid UTF-8, no trailing data), at most MaxPayloadBytes, on one
// line. Only NewPayload and NewCanonicalPayload make one, so a Payload is
// checked exactly once per process however far it is carried: the frame
// writer splices it into the start frame as it is. The zero Payload is
// empty and refused by the writer.
type Payload struct{ raw jsontext.Value }

// NewPayload checks raw strictly, once, and returns it as a Payload (raw
// itself or a sub-slice without surrounding whitespace, not copied, unless
// it spans lines: then a compacted copy, since a frame is one line). The error names the offset and the reason.
func NewPayload(raw []byte) (Payload, error) {
	if err := sizeOf(raw); err != nil {
		return Payload{}, err
	}
	if !strictjson.Check(raw) {
		return Payload{}, rejected(raw)
	}
	return oneLine(raw)
}

// NewCanonicalPayload is NewPayload for a caller that also needs the
// value's canonical encoding (the gateway's fingerprint of a call): the
// same strict pass produces both. canonical is raw itself when raw already
// is canonical.
func NewCanonicalPayload(raw []byte) (p Payload, canonical []byte, err error) {
	if err := sizeOf(raw); err != nil {
		return Payload{}, nil, err
	}
	canonical, err = strictjson.CanonicalValue(raw)
	if err != nil {
		return Payload{}, nil, errorf(ErrMalformed, "", "not one strict JSON value: %v", err)
	}
	p, err = oneLine(raw)
	return p, canonical, err
}

// Raw is the payload's bytes, as they go on the wire. The caller must not
// modify them.
func (p Payload) Raw() jsontext.Value { return p.raw }

// Len is the payload's length in bytes.
func (p Payload) Len() int { return len(p.raw) }

func sizeOf(raw []byte) error {
	if len(raw) > MaxPayloadBytes {
		return errorf(ErrTooLarge, "", "%d bytes exceed %d", len(raw), MaxPayloadBytes)
	}
	if len(raw) == 0 {
		return errorf(ErrMalformed, "", "not one strict JSON value: empty")
	}
	return nil
}

// rejected explains why raw is not one strict JSON value (the slow path:
// the full decoder says where and why).
func rejected(raw []byte) error {
	if err := strictjson.Valid(raw, MaxPayloadBytes); err != nil {
		return errorf(ErrMalformed, "", "not one strict JSON value: %v", err)
	}
	return errorf(ErrMalformed, "", "not one strict JSON value")
}

// oneLine returns a valid raw as a Payload: without the whitespace around
// the value (what a decoder of the frame returns as the value), and
// compacted when it spans lines (JSON allows a line break only as
// whitespace between tokens).
func oneLine(raw []byte) (Payload, error) {
	if bytes.IndexByte(raw, '\n') < 0 && bytes.IndexByte(raw, '\r') < 0 {
		return Payload{raw: bytes.Trim(raw, " \t")}, nil
	}
	c := jsontext.Value(bytes.Clone(raw))
	if err := c.Compact(); err != nil {
		return Payload{}, errorf(ErrMalformed, "", "not one strict JSON value: %v", err)
	}
	return Payload{raw: c}, nil
}

// MustPayload is NewPayload for literals known to be valid (fixed inputs,
// tests); it panics on anything else.
func MustPayload(raw string) Payload {
	p, err := NewPayload([]byte(raw))
	if err != nil {
		panic("protocol.MustPayload: " + err.Error())
	}
	return p
}
