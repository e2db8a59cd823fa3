package analysis

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestConditionsAreCheckedWhenCompiledAndJudgeTheAnswer(t *testing.T) {
	cases := []struct {
		name       string
		kind       Kind
		expr       string
		vars       map[string]any
		compileErr string
		want       bool
		evalErr    string
	}{
		{"every value below a threshold", KindPrometheus, "result.size() > 0 && result.all(v, v < 0.05)", SampleVars([]Sample{{Value: 0.01}, {Value: 0.02}}), "", true, ""},
		{"one value above it", KindPrometheus, "result.size() > 0 && result.all(v, v < 0.05)", SampleVars([]Sample{{Value: 0.01}, {Value: 0.3}}), "", false, ""},
		{"an empty vector passes all() alone", KindPrometheus, "result.all(v, v < 0.05)", SampleVars(nil), "", true, ""},
		{"an int literal orders with a double", KindPrometheus, "result[0] < 2", SampleVars([]Sample{{Value: 1}}), "", true, ""},
		{"NaN (no calls to divide by) cannot be judged", KindPrometheus, "result.all(v, v < 1.0)", SampleVars([]Sample{{Value: math.NaN()}}), "", false, "NaN"},
		{"series labels are read", KindPrometheus, `series.exists(s, s.labels.node == "n1" && s.value > 2.0)`,
			SampleVars([]Sample{{Labels: map[string]string{"node": "n1"}, Value: 3}}), "", true, ""},
		{"an index out of range is an error", KindPrometheus, "result[3] < 1.0", SampleVars(nil), "", false, "index"},
		{"a webhook's default condition", KindWebhook, DefaultWebhookCondition, map[string]any{"status": int64(204), "result": nil}, "", true, ""},
		{"a webhook's 500", KindWebhook, DefaultWebhookCondition, map[string]any{"status": int64(500), "result": nil}, "", false, ""},
		{"a webhook body field", KindWebhook, `result.verdict == "pass"`, map[string]any{"status": int64(200), "result": map[string]any{"verdict": "pass"}}, "", true, ""},
		{"a missing body field is an error", KindWebhook, `result.verdict == "pass"`, map[string]any{"status": int64(200), "result": map[string]any{}}, "", false, "no such key"},
		{"a probe's JSON answer", KindProbe, `result.upper == "ABC" && result.length == 3`, map[string]any{"result": map[string]any{"upper": "ABC", "length": 3.0}}, "", true, ""},
		{"a dyn expression that is not a bool", KindProbe, `result.upper`, map[string]any{"result": map[string]any{"upper": "ABC"}}, "", false, "not a bool"},
		{"a syntax error", KindPrometheus, "result.all(v, v <", nil, "does not compile", false, ""},
		{"an unknown variable", KindProbe, "status == 200", nil, "undeclared reference to 'status'", false, ""},
		{"a condition that is not a bool", KindPrometheus, "result.size()", nil, "must be a bool", false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Compile(tc.kind, tc.expr)
			if tc.compileErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.compileErr) {
					t.Fatalf("compile error %v; want one containing %q", err, tc.compileErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Eval(tc.vars)
			if tc.evalErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.evalErr) {
					t.Fatalf("eval error %v; want one containing %q", err, tc.evalErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("eval = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestAConditionThatWouldRunLongIsStoppedByItsCostBudget evaluates a
// quadratic condition over a large answer.
func TestAConditionThatWouldRunLongIsStoppedByItsCostBudget(t *testing.T) {
	c, err := Compile(KindPrometheus, "result.all(a, result.all(b, a + b >= 0.0))")
	if err != nil {
		t.Fatal(err)
	}
	samples := make([]Sample, 5000)
	_, err = c.Eval(SampleVars(samples))
	if err == nil || !strings.Contains(err.Error(), "cost") {
		t.Fatalf("err = %v; want the cost limit", err)
	}
	if errors.Is(err, ErrNotBool) {
		t.Fatal("a cost error read as a type error")
	}
}
