package fleet

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

func waveStep(edit func(*iteronv1.WaveStep)) iteronv1.RolloutStep {
	ws := &iteronv1.WaveStep{}
	edit(ws)
	return iteronv1.RolloutStep{Wave: ws}
}

func pauseStep(seconds *int32) iteronv1.RolloutStep {
	return iteronv1.RolloutStep{Pause: &iteronv1.PauseStep{DurationSeconds: seconds}}
}

func cohort(key, value string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{key: value}}
}

// zones labels node-i with zone a, b or c in turn (node-1 a, node-2 b, …).
func (w *world) zones() *world {
	w.labels = map[string]map[string]string{}
	for i, n := range w.nodes {
		w.labels[n] = map[string]string{"zone": string(rune('a' + i%3))}
	}
	return w
}

// moveAndReady applies a plan and makes the nodes it moved Ready.
func (w *world) moveAndReady(t *testing.T, p Plan) {
	t.Helper()
	w.apply(t, p)
	for _, a := range p.Actions {
		if a.Kind == Move {
			w.ready(a.Node)
		}
	}
}

// TestStepsMoveByCountPercentAndCohortInOrderWithAPause walks a rollout of
// 9 nodes in three zones through steps: one node, 20 % (rounded up), a
// pause released by a promotion, zone b, zone c, then the rest in waves of
// maxUnavailable.
func TestStepsMoveByCountPercentAndCohortInOrderWithAPause(t *testing.T) {
	st := iteronv1.RolloutStrategy{
		MaxUnavailable: ptr.To(intstr.FromInt32(2)),
		Steps: []iteronv1.RolloutStep{
			waveStep(func(s *iteronv1.WaveStep) { s.Nodes = ptr.To[int32](1) }),
			waveStep(func(s *iteronv1.WaveStep) { s.Percent = ptr.To[int32](20) }),
			pauseStep(nil),
			waveStep(func(s *iteronv1.WaveStep) { s.Selector = cohort("zone", "b") }),
			waveStep(func(s *iteronv1.WaveStep) { s.Selector = cohort("zone", "c") }),
		},
	}
	w := newWorld(9, st).zones().allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	// node-1 a, node-2 b, node-3 c, node-4 a, node-5 b, node-6 c, node-7 a,
	// node-8 b, node-9 c.
	steps := []struct {
		phase   iteronv1.RolloutPhase
		actions string
		step    int32
	}{
		{iteronv1.RolloutProgressing, "Move node-1→v2@1", 1},
		{iteronv1.RolloutProgressing, "Move node-2→v2@2, Move node-3→v2@2", 2}, // 20 % of 9 rounds up to 2
		{iteronv1.RolloutPausedAtStep, "", 3},
	}
	for i, s := range steps {
		p := Compute(w.input("v2"))
		expect(t, p, s.phase, s.actions)
		if p.Status.Step != s.step {
			t.Fatalf("reconcile %d: step %d; want %d", i, p.Status.Step, s.step)
		}
		w.moveAndReady(t, p)
	}
	// Paused: nothing moves, and the phase is at rest until a promotion.
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutPausedAtStep, "")
	if !AtRest(p.Status.Phase) || !strings.Contains(p.Message, "kubectl iteron rollout promote web") {
		t.Fatalf("paused at step: at rest %v, message %q", AtRest(p.Status.Phase), p.Message)
	}
	// spec.paused does not release it; a promotion does, once.
	w.set.Annotations[iteronv1.AnnotationPromote] = "2026-12-01T12:01:00Z"
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-5→v2@3, Move node-8→v2@3") // zone b not moved yet
	if p.Status.LastHandledPromoteAt != "2026-12-01T12:01:00Z" || p.Status.Step != 4 {
		t.Fatalf("status after promote = %+v", p.Status)
	}
	w.moveAndReady(t, p)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-6→v2@4, Move node-9→v2@4") // zone c
	w.moveAndReady(t, p)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-4→v2@5, Move node-7→v2@5") // the rest (zone a), maxUnavailable 2
	w.moveAndReady(t, p)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutCompleted, "")
	if p.Status.Step != 0 || p.Status.CurrentRevision != w.revs["v2"].Name {
		t.Fatalf("status at the end = %+v", p.Status)
	}
}

func TestAPauseStepIsReleasedByItsDurationOrAPromotionButNotByAnOldPromotion(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pause   *int32
		promote string
		after   time.Duration
		phase   iteronv1.RolloutPhase
		actions string
	}{
		{"an indefinite pause waits", nil, "", time.Hour, iteronv1.RolloutPausedAtStep, ""},
		{"a promotion handled before the pause releases nothing", nil, "old", 0, iteronv1.RolloutPausedAtStep, ""},
		{"a new promotion releases it", nil, "new", 0, iteronv1.RolloutProgressing, "Move node-2→v2@2, Move node-3→v2@2"},
		{"a timed pause waits for its duration", ptr.To[int32](60), "", 59 * time.Second, iteronv1.RolloutProgressing, ""},
		{"a timed pause ends by itself", ptr.To[int32](60), "", 60 * time.Second, iteronv1.RolloutProgressing, "Move node-2→v2@2, Move node-3→v2@2"},
		{"a promotion cuts a timed pause short", ptr.To[int32](60), "new", time.Second, iteronv1.RolloutProgressing, "Move node-2→v2@2, Move node-3→v2@2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := iteronv1.RolloutStrategy{MaxUnavailable: ptr.To(intstr.FromInt32(2)), Steps: []iteronv1.RolloutStep{
				waveStep(func(s *iteronv1.WaveStep) { s.Nodes = ptr.To[int32](1) }), pauseStep(tc.pause),
			}}
			w := newWorld(3, st).allOn("v1").on("node-1", "v2", wave(1))
			w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name, Step: 1, LastHandledPromoteAt: "old"}
			w.set.Annotations[iteronv1.AnnotationPromote] = "old"
			p := Compute(w.input("v2")) // reaches the pause
			w.apply(t, p)
			if p.Status.Step != 2 {
				t.Fatalf("step %d; want 2 (the pause)", p.Status.Step)
			}
			if tc.promote != "" {
				w.set.Annotations[iteronv1.AnnotationPromote] = tc.promote
			}
			w.now = t0.Add(tc.after)
			expect(t, Compute(w.input("v2")), tc.phase, tc.actions)
		})
	}
}

// analysisStrategy is a canary of 1 (no soak) and waves of 2, judged by
// one metric measured count times every 10 s.
func analysisStrategy(count, failureLimit, errorLimit int32, onFailure iteronv1.FailurePolicy) iteronv1.RolloutStrategy {
	st := canary(1, 0)
	st.OnFailure = onFailure
	st.Analysis = &iteronv1.RolloutAnalysis{Metrics: []iteronv1.AnalysisMetric{{
		Name: "error-rate", Provider: "prom", Query: `sum(rate(x{revision="{{revision}}"}[1m]))`, SuccessCondition: "result.all(v, v < 0.05)",
		IntervalSeconds: ptr.To[int32](10), Count: ptr.To(count), FailureLimit: ptr.To(failureLimit), ConsecutiveErrorLimit: ptr.To(errorLimit),
	}}}
	return st
}

// measureDue makes the measurements a plan asks for with the given
// results, in order, and returns the plan computed with them.
func (w *world) measureDue(t *testing.T, p Plan, results ...iteronv1.Measurement) Plan {
	t.Helper()
	if len(p.Measure) != len(results) {
		t.Fatalf("%d measurements due (%+v); want %d", len(p.Measure), p.Measure, len(results))
	}
	w.measured = nil
	for i, r := range p.Measure {
		res := results[i]
		res.At = metav1.NewTime(w.now)
		w.measured = append(w.measured, Measured{MeasureRequest: r, Result: res})
	}
	defer func() { w.measured = nil }()
	again := Compute(w.input("v2"))
	if len(again.Measure) != 0 {
		t.Fatalf("a plan given its measurements asks again: %+v", again.Measure)
	}
	return again
}

func ok(v string) iteronv1.Measurement {
	return iteronv1.Measurement{Phase: iteronv1.AnalysisSuccessful, Value: v}
}
func bad(v string) iteronv1.Measurement {
	return iteronv1.Measurement{Phase: iteronv1.AnalysisFailed, Value: v, Message: "result.all(v, v < 0.05) is false"}
}
func broken(msg string) iteronv1.Measurement {
	return iteronv1.Measurement{Phase: iteronv1.AnalysisError, Message: msg}
}

// TestEachWaveIsMeasuredWhileItSoaksAndTheNextWaitsForItsAnalysis walks a
// rollout of 3 nodes whose waves are each measured twice, 10 s apart.
func TestEachWaveIsMeasuredWhileItSoaksAndTheNextWaitsForItsAnalysis(t *testing.T) {
	w := newWorld(3, analysisStrategy(2, 0, 2, iteronv1.FailurePolicyHalt)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-1→v2@1")
	w.moveAndReady(t, p)

	// The canary is Ready: its run starts, the first measurement is due
	// one interval later.
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	if len(p.Measure) != 0 || p.RequeueAfter != 10*time.Second || len(p.Status.AnalysisRuns) != 1 || p.Status.AnalysisRuns[0].Phase != iteronv1.AnalysisRunning {
		t.Fatalf("measure %+v, requeue %s, runs %+v", p.Measure, p.RequeueAfter, p.Status.AnalysisRuns)
	}
	w.apply(t, p)
	w.now = t0.Add(10 * time.Second)
	p = Compute(w.input("v2"))
	want := MeasureRequest{Metric: "error-rate", Revision: w.revs["v2"].Name, Hash: "hashv2", Wave: 1, Nodes: []string{"node-1"}, Seq: 1}
	if len(p.Measure) != 1 || !reflect.DeepEqual(p.Measure[0], want) {
		t.Fatalf("measure = %+v; want %+v", p.Measure, want)
	}
	p = w.measureDue(t, p, ok("[0.01]"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	if !strings.Contains(p.Message, "analysis error-rate 1/2 (last Successful [0.01])") || p.RequeueAfter != 10*time.Second {
		t.Fatalf("message %q, requeue %s", p.Message, p.RequeueAfter)
	}
	w.apply(t, p)
	w.now = t0.Add(20 * time.Second)
	p = w.measureDue(t, Compute(w.input("v2")), ok("[0.02]"))
	// The second measurement passes the run: the next wave moves in the
	// same reconcile.
	expect(t, p, iteronv1.RolloutProgressing, "Move node-2→v2@2, Move node-3→v2@2")
	r := p.Status.AnalysisRuns[0]
	if r.Phase != iteronv1.AnalysisSuccessful || r.Successful != 2 || len(r.Measurements) != 2 || r.FinishedAt == nil ||
		!strings.Contains(r.Message, "2 of 2 measurements succeeded") {
		t.Fatalf("run = %+v", r)
	}
	w.moveAndReady(t, p)

	// Every node is on v2: the last wave is judged before the rollout
	// completes.
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	w.apply(t, p)
	w.now = t0.Add(30 * time.Second)
	p = w.measureDue(t, Compute(w.input("v2")), ok("[0]"))
	w.apply(t, p)
	w.now = t0.Add(40 * time.Second)
	p = w.measureDue(t, Compute(w.input("v2")), ok("[0]"))
	expect(t, p, iteronv1.RolloutCompleted, "")
	if len(p.Status.AnalysisRuns) != 2 || p.Status.AnalysisRuns[0].Wave != 2 || p.Status.AnalysisRuns[1].Wave != 1 {
		t.Fatalf("runs (newest first) = %+v", p.Status.AnalysisRuns)
	}
	c, shown := AnalysisCondition(w.set, &p.Status)
	if !shown || c.Status != metav1.ConditionFalse || c.Reason != iteronv1.ReasonSucceeded {
		t.Fatalf("AnalysisFailed condition = %+v (%v)", c, shown)
	}
}

func TestAWaveWhoseAnalysisFailsIsAFailedWave(t *testing.T) {
	cases := []struct {
		name       string
		count      int32
		failures   int32
		errorLimit int32
		results    []iteronv1.Measurement
		onFailure  iteronv1.FailurePolicy
		phase      iteronv1.RolloutPhase
		actions    string
		message    string
		runPhase   iteronv1.AnalysisPhase
	}{
		{"a failed measurement beyond failureLimit 0 halts", 3, 0, 2, []iteronv1.Measurement{bad("[0.31]")},
			iteronv1.FailurePolicyHalt, iteronv1.RolloutHalted, "",
			"analysis error-rate (provider prom) of wave 1 (node-1) failed: 1 of 1 measurements failed (failureLimit 0); last: Failed [0.31]", iteronv1.AnalysisFailed},
		{"a failed measurement beyond failureLimit 0 reverts", 3, 0, 2, []iteronv1.Measurement{bad("[0.31]")},
			iteronv1.FailurePolicyRevert, iteronv1.RolloutReverting, "Move node-1→v1", "[0.31]", iteronv1.AnalysisFailed},
		{"a failure within failureLimit 1 goes on measuring", 3, 1, 2, []iteronv1.Measurement{bad("[0.31]")},
			iteronv1.FailurePolicyRevert, iteronv1.RolloutSoaking, "", "error-rate 1/3", iteronv1.AnalysisRunning},
		{"errors within consecutiveErrorLimit 2 go on measuring", 1, 0, 2, []iteronv1.Measurement{broken("timeout"), broken("timeout")},
			iteronv1.FailurePolicyRevert, iteronv1.RolloutSoaking, "", "error-rate 0/1", iteronv1.AnalysisRunning},
		{"errors beyond consecutiveErrorLimit 0 fail the wave with their reason", 1, 0, 0,
			[]iteronv1.Measurement{broken("webhook gate: http://127.0.0.1:1/: no answer within 2s (timeoutSeconds)")},
			iteronv1.FailurePolicyRevert, iteronv1.RolloutReverting, "Move node-1→v1",
			"could not be measured: 1 measurements in a row could not be made (consecutiveErrorLimit 0); last: Error (webhook gate: http://127.0.0.1:1/: no answer within 2s (timeoutSeconds))", iteronv1.AnalysisError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(3, analysisStrategy(tc.count, tc.failures, tc.errorLimit, tc.onFailure)).allOn("v1").on("node-1", "v2", wave(1))
			w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
			w.apply(t, Compute(w.input("v2"))) // the run starts
			var p Plan
			for i, res := range tc.results {
				w.now = t0.Add(time.Duration(i+1) * 10 * time.Second)
				p = w.measureDue(t, Compute(w.input("v2")), res)
				w.apply(t, p)
			}
			expect(t, p, tc.phase, tc.actions)
			if !strings.Contains(p.Message, tc.message) {
				t.Fatalf("message %q; want it to contain %q", p.Message, tc.message)
			}
			if r := p.Status.AnalysisRuns[0]; r.Phase != tc.runPhase || len(r.Measurements) != len(tc.results) {
				t.Fatalf("run = %+v", r)
			}
			if tc.runPhase == iteronv1.AnalysisRunning {
				return
			}
			h := p.Status.Halt
			if h == nil || h.Cause != iteronv1.HaltAnalysisFailed || h.Action != tc.onFailure || !reflect.DeepEqual(h.Nodes, []string{"node-1"}) {
				t.Fatalf("halt = %+v", h)
			}
			c, _ := AnalysisCondition(w.set, &p.Status)
			if c.Status != metav1.ConditionTrue || c.Reason != iteronv1.ReasonAnalysisFailed || !strings.Contains(c.Message, tc.message) {
				t.Fatalf("AnalysisFailed condition = %+v", c)
			}
		})
	}
}

func TestResumingAFailedAnalysisMeasuresTheWaveAgain(t *testing.T) {
	w := newWorld(3, analysisStrategy(1, 0, 2, iteronv1.FailurePolicyHalt)).allOn("v1").on("node-1", "v2", wave(1))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
	w.apply(t, Compute(w.input("v2")))
	w.now = t0.Add(10 * time.Second)
	p := w.measureDue(t, Compute(w.input("v2")), bad("[0.5]"))
	expect(t, p, iteronv1.RolloutHalted, "")
	w.apply(t, p)
	expect(t, Compute(w.input("v2")), iteronv1.RolloutHalted, "")

	w.set.Annotations[iteronv1.AnnotationResume] = "2026-12-01T12:05:00Z"
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	if p.Status.Halt != nil || len(p.Status.AnalysisRuns) != 1 || p.Status.AnalysisRuns[0].Phase != iteronv1.AnalysisRunning ||
		!p.Status.AnalysisRuns[0].StartedAt.Time.Equal(w.now) {
		t.Fatalf("after resume: halt %+v, runs %+v", p.Status.Halt, p.Status.AnalysisRuns)
	}
}

func TestAbortRevertsTheRolloutWhateverOnFailureSays(t *testing.T) {
	w := newWorld(4, analysisStrategy(1, 0, 2, iteronv1.FailurePolicyHalt)).allOn("v1").on("node-1", "v2", wave(1)).on("node-2", "v2", wave(2), notReady)
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name, Step: 2}
	w.set.Annotations[iteronv1.AnnotationAbort] = "2026-12-01T12:02:00Z"
	p := Compute(w.input("v2"))
	// node-2 (not Ready) takes one of maxUnavailable 2: one node goes back
	// at a time.
	expect(t, p, iteronv1.RolloutReverting, "Move node-1→v1")
	h := p.Status.Halt
	if h == nil || h.Cause != iteronv1.HaltAborted || h.Action != iteronv1.FailurePolicyRevert || p.Status.LastHandledAbortAt != "2026-12-01T12:02:00Z" ||
		!strings.Contains(h.Message, "aborted (iteron.dev/abort=2026-12-01T12:02:00Z)") {
		t.Fatalf("status = %+v", p.Status)
	}
	// An abort with nothing under way changes nothing but what it echoes.
	w = newWorld(2, canary(1, 0)).allOn("v2")
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v2"].Name, UpdateRevision: w.revs["v2"].Name}
	w.set.Annotations[iteronv1.AnnotationAbort] = "now"
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutCompleted, "")
	if p.Status.Halt != nil || p.Status.LastHandledAbortAt != "now" {
		t.Fatalf("status = %+v", p.Status)
	}
}

func TestAProbeThatFailsOnAMovedNodeHaltsWithThatCause(t *testing.T) {
	st := canary(1, 0)
	st.OnFailure = iteronv1.FailurePolicyRevert
	w := newWorld(3, st).allOn("v1").on("node-1", "v2", wave(1), stalled(iteronv1.ReasonProbeFailed))
	w.set.Spec.Template.Probes = []iteronv1.ActivationProbe{{Name: "upper"}}
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutReverting, "Move node-1→v1")
	if h := p.Status.Halt; h == nil || h.Cause != iteronv1.HaltProbeFailed {
		t.Fatalf("halt = %+v", h)
	}
	w.set.Spec.Template.Probes = []iteronv1.ActivationProbe{{Name: "upper"}}
	c, shown := AnalysisCondition(w.set, &p.Status)
	if !shown || c.Status != metav1.ConditionTrue || c.Reason != iteronv1.ReasonProbeFailed {
		t.Fatalf("condition = %+v", c)
	}
}

func TestTheAnalysisHistoryKeepsTheNewestRunsAndMeasurements(t *testing.T) {
	st := analysisStrategy(20, 20, 2, iteronv1.FailurePolicyHalt)
	w := newWorld(3, st).allOn("v1").on("node-1", "v2", wave(1))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
	for i := range 20 {
		w.set.Status.AnalysisRuns = append(w.set.Status.AnalysisRuns, iteronv1.AnalysisRun{Metric: "old", Revision: fmt.Sprintf("web-%d", i), Wave: 1, Phase: iteronv1.AnalysisSuccessful})
	}
	w.apply(t, Compute(w.input("v2")))
	for i := range 12 {
		w.now = t0.Add(time.Duration(i+1) * 10 * time.Second)
		p := w.measureDue(t, Compute(w.input("v2")), ok(fmt.Sprintf("[%d]", i)))
		w.apply(t, p)
	}
	runs := w.set.Status.AnalysisRuns
	if len(runs) != maxRuns || runs[0].Metric != "error-rate" || runs[1].Revision != "web-0" {
		t.Fatalf("%d runs, first %s, second %s", len(runs), runs[0].Metric, runs[1].Revision)
	}
	m := runs[0].Measurements
	if len(m) != maxMeasurements || m[0].Value != "[2]" || m[9].Value != "[11]" || runs[0].Successful != 12 {
		t.Fatalf("measurements = %+v (successful %d)", m, runs[0].Successful)
	}
}

func TestAStrategyWithASelectorThatDoesNotParseIsNamed(t *testing.T) {
	st := iteronv1.RolloutStrategy{Steps: []iteronv1.RolloutStep{waveStep(func(s *iteronv1.WaveStep) {
		s.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Near"}}}
	})}}
	if err := ValidateStrategy(&st); err == nil || !strings.Contains(err.Error(), "spec.strategy.steps[0].wave.selector") {
		t.Fatalf("err = %v", err)
	}
}

// TestAnAnalysisThatStartedGoesOnWhileItsWaveFlaps: a node of the wave
// that is not Ready for a while (its provider crashed and is relaunched)
// does not stop its wave's measurements, and a failure halts the rollout.
func TestAnAnalysisThatStartedGoesOnWhileItsWaveFlaps(t *testing.T) {
	w := newWorld(3, analysisStrategy(3, 0, 2, iteronv1.FailurePolicyRevert)).allOn("v1").on("node-1", "v2", wave(1))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
	w.apply(t, Compute(w.input("v2"))) // the run starts
	w.acts["node-1"].Ready = false
	w.now = t0.Add(10 * time.Second)
	p := w.measureDue(t, Compute(w.input("v2")), bad("[0.2]"))
	expect(t, p, iteronv1.RolloutReverting, "Move node-1→v1")
	if h := p.Status.Halt; h == nil || h.Cause != iteronv1.HaltAnalysisFailed || !strings.Contains(h.Message, "[0.2]") {
		t.Fatalf("halt = %+v", h)
	}
	// Before its wave was ever Ready, a wave has no analysis to go on with.
	w = newWorld(3, analysisStrategy(3, 0, 2, iteronv1.FailurePolicyRevert)).allOn("v1").on("node-1", "v2", wave(1), notReady)
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
	w.now = t0.Add(time.Hour)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "")
	if len(p.Measure) != 0 || len(p.Status.AnalysisRuns) != 0 {
		t.Fatalf("measure %+v, runs %+v", p.Measure, p.Status.AnalysisRuns)
	}
}
