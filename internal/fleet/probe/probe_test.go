package probe

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// fakeClock advances by what an invoke says it took.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func TestAProbeIsJudgedByItsCheckAndItsLatencyBound(t *testing.T) {
	p := iteronv1.ActivationProbe{Name: "upper", Module: "text", Input: `{"text":"abc"}`, Check: `result.upper == "ABC"`, TimeoutMilliseconds: ptr.To[int32](100)}
	cases := []struct {
		name  string
		body  string
		took  time.Duration
		err   error
		phase iteronv1.ProbePhase
		msg   string
	}{
		{"the right answer in time", `{"length":3,"upper":"ABC"}`, 5 * time.Millisecond, nil, iteronv1.ProbePassed, `check result.upper == "ABC" is true (5 ms)`},
		{"a wrong answer", `{"length":3,"upper":"abc"}`, 5 * time.Millisecond, nil, iteronv1.ProbeFailed, `check result.upper == "ABC" is false for the answer {"length":3,"upper":"abc"}`},
		{"an answer without the field", `{"length":3}`, 5 * time.Millisecond, nil, iteronv1.ProbeFailed, "could not be evaluated over the answer: no such key: upper"},
		{"the right answer too late", `{"upper":"ABC"}`, 150 * time.Millisecond, nil, iteronv1.ProbeFailed, "answered in 150ms, beyond its timeout of 100ms"},
		{"no answer in time", ``, 100 * time.Millisecond, context.DeadlineExceeded, iteronv1.ProbeFailed, "no answer within 100ms (timeoutMilliseconds 100)"},
		{"a call that fails", ``, time.Millisecond, errors.New("provider_failed: the provider exited"), iteronv1.ProbeFailed, "the call failed: provider_failed: the provider exited"},
		{"an answer that is not JSON", `{"upper":`, time.Millisecond, nil, iteronv1.ProbeFailed, "the answer is not JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
			var gotModule, gotInput string
			var gotDeadline time.Time
			invoke := func(ctx context.Context, module string, input []byte, deadline time.Time) (Answer, error) {
				gotModule, gotInput, gotDeadline = module, string(input), deadline
				clock.now = clock.now.Add(tc.took)
				return Answer{Body: []byte(tc.body), Generation: "web-text-g2-1"}, tc.err
			}
			st := Run(context.Background(), p, invoke, clock.Now)
			if st.Phase != tc.phase || !strings.Contains(st.Message, tc.msg) {
				t.Fatalf("status = %+v; want %s with %q", st, tc.phase, tc.msg)
			}
			if gotModule != "text" || gotInput != `{"text":"abc"}` || !gotDeadline.Equal(time.Date(2026, 12, 1, 12, 0, 0, 100e6, time.UTC)) {
				t.Fatalf("invoked %s with %s, deadline %s", gotModule, gotInput, gotDeadline)
			}
			if st.GenerationName != "web-text-g2-1" || st.LatencyMilliseconds != tc.took.Milliseconds() || st.Name != "upper" || st.Module != "text" {
				t.Fatalf("status = %+v", st)
			}
		})
	}
}

func TestAProbeRecordsABoundedAnswer(t *testing.T) {
	p := iteronv1.ActivationProbe{Name: "big", Module: "text", Input: `{}`, Check: `result.size() == 0`}
	body := `{"x":"` + strings.Repeat("é", 1000) + `"}`
	st := Run(context.Background(), p, func(context.Context, string, []byte, time.Time) (Answer, error) {
		return Answer{Body: []byte(body)}, nil
	}, time.Now)
	if len(st.Result) > maxResult || len(st.Message) > maxMessage || !strings.HasSuffix(st.Result, "…") {
		t.Fatalf("result %d bytes, message %d bytes", len(st.Result), len(st.Message))
	}
}

func TestProbesAreAdmittedOnlyOnReadOnlyModulesNamingTheField(t *testing.T) {
	caps := map[string][]string{"text": {"read_only"}, "counter": {"read_only", "reversible_local"}}
	admitted := func(m string) ([]string, bool) { c, ok := caps[m]; return c, ok }
	cases := []struct {
		name  string
		probe iteronv1.ActivationProbe
		err   string
	}{
		{"a read_only module", iteronv1.ActivationProbe{Module: "text", Input: `{}`, Check: "true"}, ""},
		{"a module without a verified plan yet is checked later", iteronv1.ActivationProbe{Module: "pulling", Input: `{}`, Check: "true"}, ""},
		{"a module admitted more than read_only", iteronv1.ActivationProbe{Module: "counter", Input: `{}`, Check: "true"},
			"spec.probes[0].module: module counter is admitted with capabilities [read_only, reversible_local]; a probe runs only on a module admitted read_only alone"},
		{"a check that does not compile", iteronv1.ActivationProbe{Module: "text", Input: `{}`, Check: "result.upper =="}, "spec.probes[0].check:"},
		{"an input that is not an object", iteronv1.ActivationProbe{Module: "text", Input: `[1]`, Check: "true"}, "spec.probes[0].input: not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Admit([]iteronv1.ActivationProbe{tc.probe}, admitted)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v; want %q", err, tc.err)
			}
		})
	}
}

func TestAProbeRunsAgainForAnotherGenerationOrSpecOnly(t *testing.T) {
	p := iteronv1.ActivationProbe{Name: "upper", Module: "text"}
	last := []iteronv1.ProbeStatus{{Name: "upper", Module: "text", GenerationName: "g2", SpecGeneration: 3}}
	for _, tc := range []struct {
		gen  string
		spec int64
		due  bool
	}{{"g2", 3, false}, {"g3", 3, true}, {"g2", 4, true}} {
		if got := Due(p, last, tc.gen, tc.spec); got != tc.due {
			t.Errorf("generation %s spec %d: due %v; want %v", tc.gen, tc.spec, got, tc.due)
		}
	}
	if !Due(p, nil, "g2", 3) {
		t.Error("a probe that never ran is not due")
	}
}
