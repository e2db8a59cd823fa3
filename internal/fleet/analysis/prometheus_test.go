package analysis

import (
	"math"
	"strings"
	"testing"
)

func TestAPrometheusAnswerIsReadOrRefusedWithWhatWasWrong(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		values []float64
		err    string
	}{
		{"a vector, sorted by labels", `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"b"},"value":[1.5,"0.25"]},{"metric":{"node":"a"},"value":[1.5,"1e-3"]}]}}`, []float64{0.001, 0.25}, ""},
		{"an empty vector", `{"status":"success","data":{"resultType":"vector","result":[]}}`, []float64{}, ""},
		{"a scalar", `{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}`, []float64{3}, ""},
		{"NaN and infinities", `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"1"},"value":[1,"NaN"]},{"metric":{"a":"2"},"value":[1,"+Inf"]}]}}`, []float64{math.NaN(), math.Inf(1)}, ""},
		{"an error answer", `{"status":"error","errorType":"bad_data","error":"parse error at char 5"}`, nil, "the query failed: bad_data: parse error at char 5"},
		{"a matrix", `{"status":"success","data":{"resultType":"matrix","result":[]}}`, nil, "range vector (matrix)"},
		{"a string", `{"status":"success","data":{"resultType":"string","result":[1,"x"]}}`, nil, "returned a string"},
		{"not JSON", `<html>gateway timeout</html>`, nil, "not a Prometheus API document"},
		{"a value that is not a number", `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"lots"]}]}}`, nil, `sample 0: the sample value "lots" is not a number`},
		{"a sample of three items", `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1","2"]}]}}`, nil, "not 3 items"},
		{"no resultType", `{"status":"success","data":{}}`, nil, "no resultType"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			samples, err := ParseQueryResponse([]byte(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v; want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(samples) != len(tc.values) {
				t.Fatalf("%d samples; want %d", len(samples), len(tc.values))
			}
			for i, s := range samples {
				if w := tc.values[i]; !(s.Value == w || math.IsNaN(w) && math.IsNaN(s.Value)) {
					t.Errorf("sample %d = %v; want %v", i, s.Value, w)
				}
			}
		})
	}
}

func TestFormattedValuesAreBounded(t *testing.T) {
	samples := make([]Sample, 200)
	for i := range samples {
		samples[i].Value = 0.123456789
	}
	s := FormatSamples(samples, 64)
	if len(s) > 64 || !strings.Contains(s, "more") || !strings.HasPrefix(s, "[0.123457, ") {
		t.Fatalf("%q (%d bytes)", s, len(s))
	}
	if got := FormatSamples([]Sample{{Value: math.Inf(-1)}, {Value: 2}}, 64); got != "[-Inf, 2]" {
		t.Fatalf("%q", got)
	}
}

// FuzzParseQueryResponse feeds arbitrary bytes to the parser of what a
// Prometheus endpoint answers: it never panics, and what it accepts is a
// vector or a scalar whose values the condition environment takes.
func FuzzParseQueryResponse(f *testing.F) {
	for _, seed := range []string{
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"b"},"value":[1.5,"0.25"]}]}}`,
		`{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}`,
		`{"status":"error","errorType":"bad_data","error":"x"}`,
		`{"status":"success","data":{"resultType":"matrix","result":[]}}`,
		`{}`, `[]`, `null`,
	} {
		f.Add([]byte(seed))
	}
	c, err := Compile(KindPrometheus, "result.all(v, v >= 0.0) || series.size() > 0")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		samples, err := ParseQueryResponse(body)
		if err != nil {
			if samples != nil {
				t.Fatal("samples returned with an error")
			}
			return
		}
		for _, s := range samples {
			if s.Labels == nil {
				t.Fatal("a sample without a label map")
			}
		}
		_, _ = c.Eval(SampleVars(samples))
		if v := FormatSamples(samples, maxValue); len(v) > maxValue {
			t.Fatalf("formatted value of %d bytes", len(v))
		}
	})
}
