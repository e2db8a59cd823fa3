package pkgruntime

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	caminopb "iteron.dev/operator/api/quixos/camino"
	"iteron.dev/operator/pkg/strictjson"
)

// MaxValueDepth bounds the nesting of a Value, either way: deeper input is
// refused rather than recursed into.
const MaxValueDepth = 64

// ValueFromJSON turns one strict JSON value (no duplicate names at any depth,
// valid UTF-8, no trailing data, at most maxBytes bytes) into a camino.Value:
// null → null_value, booleans → bool_value, integers within int64 →
// int_value, every other number → float_value, strings → string_value,
// arrays → list_value, objects → map_value.
func ValueFromJSON(data []byte, maxBytes int) (*caminopb.Value, error) {
	if err := strictjson.Valid(data, maxBytes); err != nil {
		return nil, err
	}
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	return readValue(dec, 0)
}

// MapFromJSON turns a strict JSON object into the map an InvokeRequest's or
// WatchRequest's input is: the object's members, each a camino.Value.
func MapFromJSON(data []byte, maxBytes int) (map[string]*caminopb.Value, error) {
	v, err := ValueFromJSON(data, maxBytes)
	if err != nil {
		return nil, err
	}
	m, ok := v.Kind.(*caminopb.Value_MapValue)
	if !ok {
		return nil, errors.New("input is not a JSON object")
	}
	return m.MapValue.GetEntries(), nil
}

func readValue(dec *jsontext.Decoder, depth int) (*caminopb.Value, error) {
	if depth > MaxValueDepth {
		return nil, fmt.Errorf("json at %s: nested deeper than %d", dec.StackPointer(), MaxValueDepth)
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case 'n':
		return &caminopb.Value{Kind: &caminopb.Value_NullValue{NullValue: true}}, nil
	case 't', 'f':
		return &caminopb.Value{Kind: &caminopb.Value_BoolValue{BoolValue: tok.Bool()}}, nil
	case '"':
		return &caminopb.Value{Kind: &caminopb.Value_StringValue{StringValue: tok.String()}}, nil
	case '0':
		return numberValue(tok.String())
	case '[':
		list := &caminopb.ListValue{}
		for dec.PeekKind() != ']' {
			v, err := readValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			list.Values = append(list.Values, v)
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		return &caminopb.Value{Kind: &caminopb.Value_ListValue{ListValue: list}}, nil
	case '{':
		entries := map[string]*caminopb.Value{}
		for dec.PeekKind() != '}' {
			tok, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			name := tok.String() // a token is only valid until the next read
			v, err := readValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			entries[name] = v
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		return &caminopb.Value{Kind: &caminopb.Value_MapValue{MapValue: &caminopb.MapValue{Entries: entries}}}, nil
	}
	return nil, fmt.Errorf("json at %s: unexpected %v", dec.StackPointer(), tok.Kind())
}

// numberValue: an integer literal (no fraction, no exponent) within int64 is
// an int_value; anything else a float_value.
func numberValue(lit string) (*caminopb.Value, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return &caminopb.Value{Kind: &caminopb.Value_IntValue{IntValue: i}}, nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return nil, fmt.Errorf("number %s is outside float64", lit)
	}
	return &caminopb.Value{Kind: &caminopb.Value_FloatValue{FloatValue: f}}, nil
}

// ValueToJSON renders a camino.Value as JSON: map members sorted by name,
// strings and floats as strictjson writes them, bytes as a standard base64
// string (bytes have no JSON form). A nil Value, or one with no kind set, is
// null. A float that is not finite, invalid UTF-8 in a string or name, or
// nesting deeper than MaxValueDepth is an error: JSON cannot say it.
func ValueToJSON(v *caminopb.Value) ([]byte, error) {
	return appendValue(nil, v, 0)
}

// MapToJSON renders a map of Values (a request's input) as a JSON object.
func MapToJSON(m map[string]*caminopb.Value) ([]byte, error) {
	return appendMap(nil, m, 0)
}

func appendValue(out []byte, v *caminopb.Value, depth int) ([]byte, error) {
	if depth > MaxValueDepth {
		return nil, fmt.Errorf("value nested deeper than %d", MaxValueDepth)
	}
	switch k := v.GetKind().(type) {
	case nil, *caminopb.Value_NullValue:
		return append(out, "null"...), nil
	case *caminopb.Value_BoolValue:
		return strconv.AppendBool(out, k.BoolValue), nil
	case *caminopb.Value_IntValue:
		return strconv.AppendInt(out, k.IntValue, 10), nil
	case *caminopb.Value_FloatValue:
		if math.IsInf(k.FloatValue, 0) || math.IsNaN(k.FloatValue) {
			return nil, fmt.Errorf("float %v has no JSON form", k.FloatValue)
		}
		return strictjson.AppendFloat(out, k.FloatValue), nil
	case *caminopb.Value_StringValue:
		return appendString(out, k.StringValue)
	case *caminopb.Value_BytesValue:
		out = append(out, '"')
		out = base64.StdEncoding.AppendEncode(out, k.BytesValue)
		return append(out, '"'), nil
	case *caminopb.Value_ListValue:
		out = append(out, '[')
		for i, e := range k.ListValue.GetValues() {
			if i > 0 {
				out = append(out, ',')
			}
			var err error
			if out, err = appendValue(out, e, depth+1); err != nil {
				return nil, err
			}
		}
		return append(out, ']'), nil
	case *caminopb.Value_MapValue:
		return appendMap(out, k.MapValue.GetEntries(), depth)
	}
	return nil, fmt.Errorf("value of unknown kind %T", v.GetKind())
}

func appendMap(out []byte, m map[string]*caminopb.Value, depth int) ([]byte, error) {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	out = append(out, '{')
	for i, name := range names {
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if out, err = appendString(out, name); err != nil {
			return nil, err
		}
		out = append(out, ':')
		if out, err = appendValue(out, m[name], depth+1); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

func appendString(out []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return nil, fmt.Errorf("string %q is not valid UTF-8", s)
	}
	return strictjson.AppendString(out, s), nil
}
