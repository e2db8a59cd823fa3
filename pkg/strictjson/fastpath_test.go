package strictjson

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestTheFastPathAcceptsOnlyWhatTheReencoderWouldPrintUnchanged(t *testing.T) {
	cases := []struct {
		in        string
		canonical bool
	}{
		{"{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"é\u2028<&>\"}}", true},
		{`[0,-1,18446744073709551615,-9223372036854775808,1.5,100.0,1e21,1.5e-7]`, true},
		{`"plain"`, true},
		{`{}`, true},
		{`{"b":1,"a":2}`, false},        // unsorted
		{`{"a":1,"a":2}`, false},        // duplicate
		{`{"a": 1}`, false},             // whitespace
		{`"a\nb"`, false},               // an escape
		{`-0`, false},                   // prints -0.0
		{`1E2`, false},                  // prints 100.0
		{`100`, true},                   // an integer stays
		{`1e+21`, false},                // prints 1e21
		{`0.10`, false},                 // prints 0.1
		{`18446744073709551616`, false}, // overflows u64: a float
		{`01`, false},                   // invalid
		{"\"\xff\"", false},             // invalid UTF-8
		{`{"a":1}x`, false},             // trailing data
		{strings.Repeat("[", 600) + strings.Repeat("]", 600), false}, // deeper than the fast path checks
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%.40s", tc.in), func(t *testing.T) {
			if got := isCanonical([]byte(tc.in)); got != tc.canonical {
				t.Fatalf("isCanonical(%q) = %v, want %v", tc.in, got, tc.canonical)
			}
			if tc.canonical {
				slow, err := reencode([]byte(tc.in), true)
				if err != nil || !bytes.Equal(slow, []byte(tc.in)) {
					t.Fatalf("the re-encoder prints %q (%v) for input the fast path calls canonical", slow, err)
				}
			}
		})
	}
}

func TestCanonicalValueReturnsCanonicalInputWithoutCopying(t *testing.T) {
	in := []byte(`{"a":[1,2],"b":"x"}`)
	out, err := CanonicalValue(in)
	if err != nil || &out[0] != &in[0] {
		t.Fatalf("CanonicalValue copied or failed: %v", err)
	}
}

// FuzzCanonicalFastPath checks the fast path against the full re-encoder:
// whatever it calls canonical, the re-encoder prints byte for byte, and
// CanonicalValue's outcome is the re-encoder's.
func FuzzCanonicalFastPath(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[true,null]}`, `[1.5,100.0,1e21]`, `{"b":1,"a":2}`, `-0`, `"\u00e9"`, `{"":{"":[]}}`, `1e-7`, `0.000001`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		slow, slowErr := reencode(in, true)
		if isCanonical(in) && (slowErr != nil || !bytes.Equal(slow, in)) {
			t.Fatalf("fast path calls %q canonical; the re-encoder gives %q, %v", in, slow, slowErr)
		}
		got, err := CanonicalValue(in)
		if (err == nil) != (slowErr == nil) || err == nil && !bytes.Equal(got, slow) {
			t.Fatalf("CanonicalValue(%q) = %q, %v; the re-encoder gives %q, %v", in, got, err, slow, slowErr)
		}
	})
}

func BenchmarkCanonicalValue(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"keys":[`)
	for i := range 1500 {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"count":%d,"key":"key-%05d","note":"some text here"}`, i, i)
	}
	sb.WriteString(`],"layout":2,"total":12345}`)
	canonical := []byte(sb.String())
	unsorted := bytes.Replace(canonical, []byte(`{"keys":`), []byte(`{"zz":0,"keys":`), 1)
	for _, bc := range []struct {
		name string
		in   []byte
	}{{"canonical-input", canonical}, {"reencoded-input", unsorted}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.in)))
			for b.Loop() {
				if _, err := CanonicalValue(bc.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
