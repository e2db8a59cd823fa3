package strictjson

import (
	"errors"
	"strings"
	"testing"
)

func TestCanonicalValueMatchesSerdeJSONBytes(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"object keys are sorted byte-wise and whitespace dropped", `{ "b": 1, "a": [true, false, null], "B": {} }`, `{"B":{},"a":[true,false,null],"b":1}`},
		{"html characters are not escaped", `"<a href=\"x\">&amp;</a>"`, `"<a href=\"x\">&amp;</a>"`},
		{"line and paragraph separators stay literal", `"a\u2028b\u2029c"`, "\"a\u2028b\u2029c\""},
		{"non-ascii escapes are decoded to utf-8", `"caf\u00e9 \ud83d\ude00"`, "\"café 😀\""},
		{"control characters use short escapes where serde has them", `"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{"other control characters are lowercase \\u00xx", `"\u0001\u001F\u007f"`, "\"\\u0001\\u001f\x7f\""},
		{"solidus escape is dropped", `"a\/b"`, `"a/b"`},
		{"integers stay integers", `[0, -1, 18446744073709551615, -9223372036854775808]`, `[0,-1,18446744073709551615,-9223372036854775808]`},
		{"negative zero is a float", `-0`, `-0.0`},
		{"a float that is integral keeps .0", `100.0`, `100.0`},
		{"exponent notation parses as float", `1E2`, `100.0`},
		{"large floats use exponent without plus", `1e21`, `1e21`},
		{"u64 overflow becomes a float", `18446744073709551616`, `1.8446744073709552e19`},
		{"i64 underflow becomes a float", `-9223372036854775809`, `-9.223372036854776e18`},
		{"small floats use negative exponent", `0.00000015`, `1.5e-7`},
		{"decimal fractions print shortest", `0.1`, `0.1`},
		{"16 digit integral float stays decimal", `1234567890123456.0`, `1234567890123456.0`},
		{"17 digit exponent switches to scientific", `1e16`, `1e16`},
		{"1e15 is decimal", `1e15`, `1000000000000000.0`},
		{"four leading zeros stay decimal", `0.0001`, `0.0001`},
		{"five leading zeros stay decimal", `0.00001`, `0.00001`},
		{"six leading zeros switch to scientific", `0.000001`, `1e-6`},
		{"mixed digits with exponent", `12345e30`, `1.2345e34`},
		{"nested values sort at every depth", `{"z":{"y":1,"x":[{"b":2,"a":1}]}}`, `{"z":{"x":[{"a":1,"b":2}],"y":1}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CanonicalValue([]byte(tc.in))
			if err != nil {
				t.Fatalf("CanonicalValue(%s): %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("CanonicalValue(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestCanonicalValueRejectsWhatSerdeRejects(t *testing.T) {
	cases := []struct{ name, in string }{
		{"a duplicate key", `{"a":1,"a":2}`},
		{"a duplicate key deep inside", `{"a":[{"b":1,"b":1}]}`},
		{"a number that overflows float64", `1e400`},
		{"trailing data", `{} {}`},
		{"invalid utf-8", "\"\xff\""},
		{"a lone surrogate", `"\ud800"`},
		{"an empty input", ``},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := CanonicalValue([]byte(tc.in)); err == nil {
				t.Fatalf("CanonicalValue(%q) = %s, want an error", tc.in, got)
			}
		})
	}
}

type manifestLike struct {
	Zeta  string            `json:"zeta"`
	Alpha []int             `json:"alpha"`
	Meta  map[string]string `json:"meta"`
}

func TestCanonicalKeepsStructOrderAndSortsMaps(t *testing.T) {
	got, err := Canonical(manifestLike{Zeta: "<&>\u2028", Alpha: []int{3, 1}, Meta: map[string]string{"b": "2", "a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "{\"zeta\":\"<&>\u2028\",\"alpha\":[3,1],\"meta\":{\"a\":\"1\",\"b\":\"2\"}}"
	if string(got) != want {
		t.Fatalf("Canonical = %s, want %s", got, want)
	}
	d, err := DigestOf(manifestLike{})
	if err != nil || !strings.HasPrefix(d, "sha256:") || len(d) != 71 {
		t.Fatalf("DigestOf = %q, %v", d, err)
	}
}

type strictDoc struct {
	Name  string `json:"name"`
	Items []struct {
		ID string `json:"id"`
	} `json:"items"`
}

func TestDecodeIsStrict(t *testing.T) {
	cases := []struct {
		name, in, pointer string
		tooLarge          bool
	}{
		{name: "an unknown field is named", in: `{"name":"a","extra":1}`, pointer: "/extra"},
		{name: "an unknown field deep inside is named", in: `{"items":[{"id":"x","idd":1}]}`, pointer: "/items/0/idd"},
		{name: "a duplicate key at the top is named", in: `{"name":"a","name":"b"}`, pointer: "/name"},
		{name: "a duplicate key deep inside is named", in: `{"items":[{"id":"x","id":"y"}]}`, pointer: "/items/0/id"},
		{name: "trailing data is refused", in: `{"name":"a"}x`},
		{name: "a second value is refused", in: `{"name":"a"}{}`},
		{name: "a case-folded field name is unknown", in: `{"Name":"a"}`, pointer: "/Name"},
		{name: "oversized input is refused before parsing", in: `{"name":"` + strings.Repeat("a", 64) + `"}`, tooLarge: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d strictDoc
			err := Decode([]byte(tc.in), &d, 64)
			var jerr *Error
			if !errors.As(err, &jerr) {
				t.Fatalf("Decode(%s) error = %v, want *Error", tc.in, err)
			}
			if tc.tooLarge != errors.Is(err, ErrTooLarge) {
				t.Fatalf("Decode(%s) error = %v, ErrTooLarge expected %v", tc.in, err, tc.tooLarge)
			}
			if tc.pointer != "" && jerr.Pointer != tc.pointer {
				t.Fatalf("Decode(%s) pointer = %q (%v), want %q", tc.in, jerr.Pointer, err, tc.pointer)
			}
		})
	}
	var d strictDoc
	if err := Decode([]byte(`{"name":"ok","items":[{"id":"1"}]}`), &d, 64); err != nil || d.Name != "ok" || d.Items[0].ID != "1" {
		t.Fatalf("Decode of a valid document: %+v, %v", d, err)
	}
}

func TestReadBoundedStopsAtTheBound(t *testing.T) {
	if b, err := ReadBounded(strings.NewReader("12345"), 5); err != nil || string(b) != "12345" {
		t.Fatalf("exactly the bound: %q, %v", b, err)
	}
	if _, err := ReadBounded(strings.NewReader("123456"), 5); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one byte over: %v, want ErrTooLarge", err)
	}
}
