package strictjson

import (
	"errors"
	"fmt"
	"io"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// ErrTooLarge is wrapped by every error about input over its size bound.
var ErrTooLarge = errors.New("exceeds its size bound")

// Error is a rejection of untrusted JSON: where (a JSON Pointer and a byte
// offset) and why.
type Error struct {
	// Pointer is the RFC 6901 JSON Pointer of the offending value; "" is the
	// document root.
	Pointer string
	// Offset is the byte offset at which the problem was found, or -1.
	Offset int64
	// Reason says what is wrong, in words.
	Reason string
	err    error
}

func (e *Error) Error() string {
	where := e.Pointer
	if where == "" {
		where = "/"
	}
	if e.Offset >= 0 {
		return fmt.Sprintf("json at %s (byte %d): %s", where, e.Offset, e.Reason)
	}
	return fmt.Sprintf("json at %s: %s", where, e.Reason)
}

// Unwrap returns the underlying error (ErrTooLarge, or the decoder's).
func (e *Error) Unwrap() error { return e.err }

// decodeOptions are the strict options used for every untrusted document.
// Duplicate names and invalid UTF-8 are rejected by default in this package's
// version of json; they are spelled out so that a default change cannot
// loosen us.
var decodeOptions = json.JoinOptions(
	json.RejectUnknownMembers(true),
	jsontext.AllowDuplicateNames(false),
	jsontext.AllowInvalidUTF8(false),
)

// Decode parses data, a single JSON value of at most maxBytes bytes, into v.
// It rejects oversized input before parsing, duplicate object names at any
// depth, members v does not declare, trailing data and invalid UTF-8.
func Decode(data []byte, v any, maxBytes int) error {
	if len(data) > maxBytes {
		return &Error{Offset: -1, Reason: fmt.Sprintf("%d bytes %v of %d bytes", len(data), ErrTooLarge, maxBytes), err: ErrTooLarge}
	}
	if err := json.Unmarshal(data, v, decodeOptions); err != nil {
		return wrapDecodeError(err)
	}
	return nil
}

// Valid reports whether data is one strict JSON value (no duplicate names at
// any depth, valid UTF-8, no trailing data) of at most maxBytes bytes.
func Valid(data []byte, maxBytes int) error {
	var v jsontext.Value
	if err := Decode(data, &v, maxBytes); err != nil {
		return err
	}
	return nil
}

// ReadBounded reads all of r, failing with ErrTooLarge as soon as more than
// maxBytes bytes arrive (it never buffers more than maxBytes+1).
func ReadBounded(r io.Reader, maxBytes int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxBytes {
		return nil, &Error{Offset: -1, Reason: fmt.Sprintf("more than %d bytes: %v", maxBytes, ErrTooLarge), err: ErrTooLarge}
	}
	return data, nil
}

func wrapDecodeError(err error) error {
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		return &Error{Pointer: string(syn.JSONPointer), Offset: syn.ByteOffset, Reason: reasonOf(syn.Err, "invalid JSON"), err: err}
	}
	var sem *json.SemanticError
	if errors.As(err, &sem) {
		reason := reasonOf(sem.Err, "")
		if reason == "" {
			reason = "cannot decode JSON " + sem.JSONKind.String()
			if sem.GoType != nil {
				reason += " into " + sem.GoType.String()
			}
		}
		return &Error{Pointer: string(sem.JSONPointer), Offset: sem.ByteOffset, Reason: reason, err: err}
	}
	return &Error{Offset: -1, Reason: err.Error(), err: err}
}

func reasonOf(err error, fallback string) string {
	switch {
	case err == nil:
		return fallback
	case errors.Is(err, json.ErrUnknownName):
		return "unknown field"
	default:
		return err.Error()
	}
}
