package catalog

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/strictjson"
)

// Sentinel errors wrapped by *Error, so that callers can tell the kind of a
// rejection apart without matching text.
var (
	// ErrTooLarge: the input exceeds its size or count bound.
	ErrTooLarge = errors.New("exceeds its bound")
	// ErrMalformed: the input is not strict JSON of the expected shape
	// (duplicate names, unknown members, wrong types, trailing data, null).
	ErrMalformed = errors.New("malformed")
	// ErrMissingField: a required member is absent.
	ErrMissingField = errors.New("required field missing")
	// ErrInvalidValue: a member is present but breaks a rule of its format
	// (docs/reference/catalog.md).
	ErrInvalidValue = errors.New("invalid value")
	// ErrDuplicate: a value that must be unique is repeated.
	ErrDuplicate = errors.New("duplicate")
	// ErrUnsupportedVersion: a schema or protocol version this host does not speak.
	ErrUnsupportedVersion = errors.New("unsupported version")
	// ErrNotDependencyClosed: a manifest depends on an implementation the
	// catalog lacks; the whole catalog is rejected.
	ErrNotDependencyClosed = errors.New("catalog is not dependency-closed")
	// ErrCycle: a dependency cycle in a seam graph.
	ErrCycle = errors.New("dependency cycle")
)

// Error is a rejection of a catalog, manifest or seam graph: the field path in
// the document's own spelling (implementations[3].argv[2]; "" for the document
// as a whole), why, and the reason code it maps to
// (docs/reference/reasons.md).
type Error struct {
	// Field is the offending member, e.g. "implementations[3].argv[2]".
	Field string
	// Code is the snake_case reason code (verification_failed, …).
	Code string
	// Detail says what is wrong, in words.
	Detail string
	// Err is a sentinel of this package or the underlying cause.
	Err error
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Detail
	}
	return e.Field + ": " + e.Detail
}

// Unwrap returns the sentinel or cause.
func (e *Error) Unwrap() error { return e.Err }

// ReasonCode is the reason code the rejection is reported under
// (docs/reference/reasons.md).
func (e *Error) ReasonCode() string { return e.Code }

func invalidf(field string, sentinel error, format string, args ...any) *Error {
	code := reasons.VerificationFailed
	switch sentinel {
	case ErrMalformed, ErrMissingField:
		code = reasons.SchemaMismatch
	case ErrUnsupportedVersion:
		code = reasons.UnsupportedVersion
	case ErrCycle:
		code = reasons.DependencyCycle
	}
	return &Error{Field: field, Code: code, Detail: fmt.Sprintf(format, args...), Err: sentinel}
}

// Field joins a parent field path and a member name ("" parent: the name).
func Field(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// Index appends an array index to a field path: Index("argv", 2) = "argv[2]".
func Index(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// FieldPath turns an RFC 6901 JSON Pointer into the field-path spelling used
// in every error ("/sources/2/catalog_path" → "sources[2].catalog_path"),
// under prefix. No member of these documents has an all-digit name, so every
// all-digit token is an array index.
func FieldPath(prefix, pointer string) string {
	path := prefix
	if pointer == "" {
		return path
	}
	for tok := range strings.SplitSeq(strings.TrimPrefix(pointer, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		if n, err := strconv.Atoi(tok); err == nil && n >= 0 && tok == strconv.Itoa(n) {
			path = Index(path, n)
			continue
		}
		path = Field(path, tok)
	}
	return path
}

// DecodeStrict is the decoding every document of the family gets: the size
// bound first, then strictjson (duplicate names at any depth, unknown
// members, trailing data, invalid UTF-8), and no null anywhere (no member of
// these documents is nullable; encoding a missing value as null must not
// pass for a default). The error names the member under prefix.
func DecodeStrict(data []byte, v any, maxBytes int, prefix string) *Error {
	if len(data) > maxBytes {
		return invalidf(prefix, ErrTooLarge, "%d bytes exceed the bound of %d bytes", len(data), maxBytes)
	}
	if err := strictjson.Decode(data, v, maxBytes); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) {
			return &Error{Field: FieldPath(prefix, se.Pointer), Code: reasons.SchemaMismatch,
				Detail: jsonReason(se), Err: errors.Join(ErrMalformed, err)}
		}
		return &Error{Field: prefix, Code: reasons.SchemaMismatch, Detail: err.Error(), Err: errors.Join(ErrMalformed, err)}
	}
	if ptr, off, found := findNull(data); found {
		return invalidf(FieldPath(prefix, ptr), ErrMalformed, "null is not a valid value (byte %d)", off)
	}
	return nil
}

func jsonReason(se *strictjson.Error) string {
	reason := se.Reason
	if reason == "invalid syntax" {
		reason = "not a valid value of its type (a non-negative integer where one is expected?)"
	}
	if se.Offset >= 0 {
		return fmt.Sprintf("%s (byte %d)", reason, se.Offset)
	}
	return reason
}

// findNull reports the first null literal in data, which strictjson has
// already accepted as one valid JSON value.
func findNull(data []byte) (pointer string, offset int64, found bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	for {
		off := dec.InputOffset()
		tok, err := dec.ReadToken()
		if err != nil {
			return "", 0, false
		}
		if tok.Kind() == 'n' {
			// StackPointer names the most recently read value: this null.
			return string(dec.StackPointer()), off, true
		}
	}
}
