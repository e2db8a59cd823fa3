package strictjson

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// strictnessCorpus is every rule a strict value obeys, each as inputs that
// break it and inputs that come close without breaking it. Both validators
// (Check, the one the hot path uses, and Valid, jsontext's) must agree with
// the table.
var strictnessCorpus = []struct {
	rule  string
	in    string
	valid bool
}{
	{"a plain object is valid", `{"a":1,"b":[true,false,null],"c":{"d":"é"}}`, true},
	{"surrounding whitespace is allowed", " \t\r\n{\"a\" : [ 1 , 2 ] }\n ", true},
	{"a scalar at the top is a value", `"x"`, true},
	{"every number form of the grammar is valid", `[0,-0,1,-1,1.5,1e5,1E+5,1e-5,-0.0e0,123456789012345678901234567890]`, true},
	{"every escape is valid", `"\" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00"`, true},
	{"a duplicate name at the top is refused", `{"a":1,"a":2}`, false},
	{"a duplicate name deep inside is refused", `{"x":[{"y":{"a":1,"b":2,"a":3}}]}`, false},
	{"a duplicate name written with an escape is refused", `{"a":1,"\u0061":2}`, false},
	{"a duplicate name among many members is refused", `{` + manyMembers(40) + `,"k7":0}`, false},
	{"many distinct names are valid", `{` + manyMembers(40) + `}`, true},
	{"the same name in sibling objects is valid", `[{"a":1},{"a":2},{"a":{"a":3}}]`, true},
	{"names differing only by case are distinct", `{"a":1,"A":2}`, true},
	{"invalid UTF-8 in a string is refused", "\"\xff\"", false},
	{"invalid UTF-8 in a name is refused", "{\"\xc3\x28\":1}", false},
	{"a truncated UTF-8 sequence is refused", "\"\xe2\x82\"", false},
	{"an overlong UTF-8 encoding is refused", "\"\xc0\xaf\"", false},
	{"an encoded surrogate is refused", "\"\xed\xa0\x80\"", false},
	{"a lone high surrogate escape is refused", `"\ud83d"`, false},
	{"a lone low surrogate escape is refused", `"\ude00"`, false},
	{"a reversed surrogate pair is refused", `"\ude00\ud83d"`, false},
	{"an unknown escape is refused", `"\x"`, false},
	{"a short \\u escape is refused", `"\u12"`, false},
	{"an unescaped control character is refused", "\"a\tb\"", false},
	{"trailing data is refused", `{"a":1}x`, false},
	{"a second value is refused", `{"a":1} {}`, false},
	{"an empty input is refused", ``, false},
	{"whitespace alone is refused", `  `, false},
	{"a trailing comma is refused", `[1,2,]`, false},
	{"a missing colon is refused", `{"a" 1}`, false},
	{"an unquoted name is refused", `{a:1}`, false},
	{"a leading zero is refused", `01`, false},
	{"a bare minus is refused", `-`, false},
	{"a fraction without digits is refused", `1.`, false},
	{"an exponent without digits is refused", `1e+`, false},
	{"a leading plus is refused", `+1`, false},
	{"a misspelled literal is refused", `tru`, false},
	{"an unterminated string is refused", `"abc`, false},
	{"an unterminated object is refused", `{"a":1`, false},
	{"single quotes are refused", `'a'`, false},
	{"nesting to the maximum depth is valid", strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), true},
	{"nesting beyond the maximum depth is refused", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), false},
	{"objects nested beyond the maximum depth are refused", strings.Repeat(`{"":`, MaxDepth+1) + `1` + strings.Repeat("}", MaxDepth+1), false},
}

func manyMembers(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":%d`, i, i)
	}
	return strings.Join(parts, ",")
}

func TestBothValidatorsFollowEveryStrictnessRule(t *testing.T) {
	for _, tc := range strictnessCorpus {
		t.Run(tc.rule, func(t *testing.T) {
			in := []byte(tc.in)
			if got := Check(in); got != tc.valid {
				t.Errorf("Check(%.60q) = %v, want %v", tc.in, got, tc.valid)
			}
			if err := Valid(in, len(in)+1); (err == nil) != tc.valid {
				t.Errorf("Valid(%.60q) = %v, want valid %v", tc.in, err, tc.valid)
			}
		})
	}
}

func TestTheSizeBoundIsValidsAndRefusesBeforeParsing(t *testing.T) {
	in := []byte(`{"a":"` + strings.Repeat("x", 100) + `"}`)
	if err := Valid(in, 50); err == nil || !strings.Contains(err.Error(), "exceeds its size bound") {
		t.Fatalf("Valid of %d bytes bounded at 50: %v, want a size error", len(in), err)
	}
}

// FuzzCheck checks the hand-written validator against jsontext's strict
// decoder: the same answer for every input.
func FuzzCheck(f *testing.F) {
	for _, tc := range strictnessCorpus {
		if len(tc.in) < 1000 {
			f.Add([]byte(tc.in))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want := jsontext.Value(in).IsValid(jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
		if got := Check(in); got != want {
			t.Fatalf("Check(%q) = %v; jsontext says %v", in, got, want)
		}
	})
}

// benchDocument is shaped like a real input (records of ids, short strings
// and numbers), n bytes or a little less.
func benchDocument(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < n-200; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"id":%d,"role":"user","text":"lorem ipsum dolor sit amet, consectetur adipiscing elit","score":%d.25}`, i, i%97)
	}
	b.WriteString(`],"pad":"p"}`)
	return []byte(b.String())
}

// BenchmarkStrictValidators compares the validators a strict pass can use
// on the same documents, interleaved in the same iterations so that both
// see the same machine load: jsontext (Valid and the full decoders) and
// Check (the hot path). It reports each one's MB/s and jsontext ÷ Check
// time (the speed-up).
func BenchmarkStrictValidators(b *testing.B) {
	for _, size := range []int{200, 64 << 10, 500 << 10} {
		doc := benchDocument(size)
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			var tj, tc time.Duration
			for b.Loop() {
				t0 := time.Now()
				if !jsontext.Value(doc).IsValid(jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)) {
					b.Fatal("invalid")
				}
				t1 := time.Now()
				if !Check(doc) {
					b.Fatal("invalid")
				}
				tj, tc = tj+t1.Sub(t0), tc+time.Since(t1)
			}
			mb := float64(len(doc)) * float64(b.N) / 1e6
			b.ReportMetric(mb/tj.Seconds(), "jsontext-MB/s")
			b.ReportMetric(mb/tc.Seconds(), "check-MB/s")
			b.ReportMetric(float64(tj)/float64(tc), "speedup")
		})
	}
}
