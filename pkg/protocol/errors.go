package protocol

import (
	"errors"
	"fmt"
)

// ErrorKind classifies a protocol Error, so that the host can map it to a
// fault without parsing messages.
type ErrorKind int

// Error kinds.
const (
	// ErrMalformed: the bytes are not one strict JSON object of the expected
	// shape (syntax, duplicate or unknown member, missing member, wrong type).
	ErrMalformed ErrorKind = iota + 1
	// ErrTooLarge: a frame, payload, state or field is over its bound.
	ErrTooLarge
	// ErrInvalid: well-formed, but a value breaks a rule (an ID's alphabet, a
	// zero deadline, an unknown capability, a wrong digest).
	ErrInvalid
	// ErrMismatch: a response or observation does not correlate with the
	// request or run it claims to answer.
	ErrMismatch
)

// String names the kind.
func (k ErrorKind) String() string {
	switch k {
	case ErrMalformed:
		return "malformed"
	case ErrTooLarge:
		return "too large"
	case ErrInvalid:
		return "invalid"
	case ErrMismatch:
		return "mismatch"
	}
	return fmt.Sprintf("ErrorKind(%d)", int(k))
}

// Error is a rejected frame or value: what kind of rejection, where (a JSON
// Pointer into the frame) and why.
type Error struct {
	// Kind classifies the rejection.
	Kind ErrorKind
	// Pointer is the RFC 6901 JSON Pointer of the offending member within
	// the frame ("" is the frame itself).
	Pointer string
	// Reason says what is wrong, in words.
	Reason string
}

// Error says what kind of rejection, where and why.
func (e *Error) Error() string {
	where := e.Pointer
	if where == "" {
		where = "/"
	}
	return fmt.Sprintf("%s at %s: %s", e.Kind, where, e.Reason)
}

// KindOf returns the ErrorKind of err if it is (or wraps) an *Error, else 0.
func KindOf(err error) ErrorKind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

func errorf(kind ErrorKind, pointer, format string, args ...any) *Error {
	return &Error{Kind: kind, Pointer: pointer, Reason: fmt.Sprintf(format, args...)}
}
