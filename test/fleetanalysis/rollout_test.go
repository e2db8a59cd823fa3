package fleetanalysis

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/fleettest"
)

// errorRate is the share of the calls the new revision took on the wave's
// nodes that failed, from the managers' call counters (a counter of the new
// revision starts with the rollout: no window is needed).
func errorRate(count, interval int32) iteronv1.AnalysisMetric {
	return iteronv1.AnalysisMetric{Name: "error-rate", Provider: "prometheus",
		Query: `(sum(iteron_gateway_calls_total{revision="{{revision}}",node=~"{{nodes}}",code!="ok"}) or vector(0))` +
			` / sum(iteron_gateway_calls_total{revision="{{revision}}",node=~"{{nodes}}"})`,
		SuccessCondition: "result.all(v, v < 0.05)",
		IntervalSeconds:  ptr.To(interval), Count: ptr.To(count), FailureLimit: ptr.To[int32](0), ConsecutiveErrorLimit: ptr.To[int32](2)}
}

// latency is the 90th percentile of the new revision's call latency on the
// wave's nodes (NaN, no call in the window, passes).
func latency(count, interval int32) iteronv1.AnalysisMetric {
	return iteronv1.AnalysisMetric{Name: "latency-p90", Provider: "prometheus",
		Query:            `histogram_quantile(0.9, sum by (le) (rate(iteron_gateway_call_duration_seconds_bucket{revision="{{revision}}",node=~"{{nodes}}"}[30s])))`,
		SuccessCondition: "result.all(v, v != v || v < 1.0)",
		IntervalSeconds:  ptr.To(interval), Count: ptr.To(count), ConsecutiveErrorLimit: ptr.To[int32](2)}
}

// oneByOne is a canary wave of one node, then waves of one node, each
// judged by analysis.
func oneByOne(onFailure iteronv1.FailurePolicy, metrics ...iteronv1.AnalysisMetric) iteronv1.RolloutStrategy {
	st := iteronv1.RolloutStrategy{
		Steps:          []iteronv1.RolloutStep{{Wave: &iteronv1.WaveStep{Nodes: ptr.To[int32](1)}}},
		MaxUnavailable: ptr.To(intstr.FromInt32(1)), OnFailure: onFailure, RevertStateDisposition: iteronv1.StateDispositionMigrate,
	}
	if len(metrics) > 0 {
		st.Analysis = &iteronv1.RolloutAnalysis{Metrics: metrics}
	}
	return st
}

// webhookProvider creates a cluster-scoped AnalysisProvider for a loopback
// server; it is deleted when the test ends.
func webhookProvider(t *testing.T, name, url string, timeout int32) {
	t.Helper()
	p := &iteronv1.AnalysisProvider{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: iteronv1.AnalysisProviderSpec{Webhook: &iteronv1.WebhookProvider{URL: url}, TimeoutSeconds: ptr.To(timeout)}}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p) })
}

// gate is a webhook that records what it was asked.
type gate struct {
	mu    sync.Mutex
	asked []string // "wave N: nodes"
	delay time.Duration
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Wave  int32    `json:"wave"`
		Nodes []string `json:"nodes"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	g.mu.Lock()
	g.asked = append(g.asked, fmt.Sprintf("wave %d: %s", req.Wave, strings.Join(req.Nodes, ",")))
	g.mu.Unlock()
	if g.delay > 0 {
		select {
		case <-time.After(g.delay):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"verdict":"pass"}`)
}

func (g *gate) requests() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.asked...)
}

// deploy creates a set on v1 and waits for its first deployment (no
// rollout: no analysis).
func deploy(t *testing.T, name string, tpl iteronv1.ActivationTemplate, st iteronv1.RolloutStrategy) client.ObjectKey {
	t.Helper()
	key := newSet(t, name, tpl, st)
	waitSet(t, key, "Completed (first deployment)", fleettest.Completed)
	return key
}

func logStatus(t *testing.T, key client.ObjectKey) {
	t.Helper()
	out, code := plugin(t, "rollout", "status", key.Name, "--watch=false")
	t.Logf("kubectl iteron rollout status %s (exit %d):\n%s", key.Name, code, out)
}

// events are the set's events, "type reason: note" in order.
func setEvents(t *testing.T, key client.ObjectKey) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(key.Namespace)); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(list.Items, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "ActivationSet" && e.Regarding.Name == key.Name {
			out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Note))
		}
	}
	return out
}

// TestAGoodRevisionPassesTheAnalysisOfEveryWave rolls counter v1 → v2 over
// three nodes, one node per wave, under traffic on every node: each wave is
// measured twice by Prometheus (the new revision's error rate and p90
// latency on the wave's nodes) and once by a webhook, and the rollout
// completes.
func TestAGoodRevisionPassesTheAnalysisOfEveryWave(t *testing.T) {
	g := &gate{}
	srv := httptest.NewServer(g)
	defer srv.Close()
	webhookProvider(t, "gate-pass", srv.URL, 2)
	st := oneByOne(iteronv1.FailurePolicyRevert, errorRate(2, 3), latency(2, 3),
		iteronv1.AnalysisMetric{Name: "gate", Provider: "gate-pass", SuccessCondition: `status == 200 && result.verdict == "pass"`, IntervalSeconds: ptr.To[int32](3)})
	key := deploy(t, "good", template(source(t, artifacts.CounterV1Down, "counter-v1", nil)), st)
	tr := startTraffic(t, key, 200*time.Millisecond)
	w := watchWaves(t, key)
	start := time.Now()
	editSet(t, key, func(s *iteronv1.ActivationSet) {
		s.Spec.Template = template(source(t, artifacts.CounterV2, "counter-v2", nil))
	})
	done := waitSet(t, key, "Completed on v2", fleettest.Completed)
	w.stop()
	t.Logf("rollout v1 → v2 completed in %s; traffic: %s\nwave log:\n%s", time.Since(start).Round(time.Second), tr, w)
	logStatus(t, key)

	if got := w.movesInOrder(); !slices.Equal(got, []string{"fa-1@1", "fa-2@2", "fa-3@3"}) {
		t.Errorf("moves %v; want fa-1@1, fa-2@2, fa-3@3", got)
	}
	runs := map[string]iteronv1.AnalysisRun{}
	for _, r := range done.Status.AnalysisRuns {
		if r.Revision == done.Status.UpdateRevision {
			runs[fmt.Sprintf("%s/%d", r.Metric, r.Wave)] = r
		}
	}
	for wave := int32(1); wave <= 3; wave++ {
		for _, m := range []string{"error-rate", "latency-p90", "gate"} {
			r, ok := runs[fmt.Sprintf("%s/%d", m, wave)]
			if !ok || r.Phase != iteronv1.AnalysisSuccessful || len(r.Measurements) == 0 {
				t.Errorf("analysis %s of wave %d: %+v; want Successful with its measurements", m, wave, r)
				continue
			}
			if m == "error-rate" && r.Measurements[len(r.Measurements)-1].Value != "[0]" {
				t.Errorf("wave %d error rate measured %s; want [0]", wave, r.Measurements[len(r.Measurements)-1].Value)
			}
		}
	}
	want := []string{"wave 1: fa-1", "wave 2: fa-2", "wave 3: fa-3"}
	if got := g.requests(); !slices.Equal(got, want) {
		t.Errorf("the webhook was asked %v; want %v", got, want)
	}
	if c := fleettest.Condition(done, iteronv1.ConditionAnalysisFailed); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("AnalysisFailed condition %+v; want False", c)
	}
}

// TestARevisionThatFailsAShareOfCallsIsRevertedByItsAnalysis rolls a
// counter v2 whose provider crashes on every tenth run out under traffic:
// the first wave's error rate, measured by Prometheus, fails the wave, and
// the canary goes back to v1 with its state; the other nodes are never
// touched.
func TestARevisionThatFailsAShareOfCallsIsRevertedByItsAnalysis(t *testing.T) {
	key := deploy(t, "flaky", template(source(t, artifacts.CounterV1Down, "counter-v1", nil)), oneByOne(iteronv1.FailurePolicyRevert, errorRate(5, 2)))
	tr := startTraffic(t, key, 200*time.Millisecond)
	w := watchWaves(t, key)
	flaky := source(t, artifacts.Faulty, "counter-v2-flaky", nil, "--fault", "crash", "--at", "start", "--skip", "9")
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(flaky) })
	done := waitSet(t, key, "Reverted", fleettest.Phase(iteronv1.RolloutReverted))
	w.stop()
	t.Logf("traffic: %s\nwave log:\n%s", tr, w)
	logStatus(t, key)

	h := done.Status.Halt
	if h == nil || h.Cause != iteronv1.HaltAnalysisFailed || h.Action != iteronv1.FailurePolicyRevert || !slices.Equal(h.Nodes, []string{"fa-1"}) {
		t.Fatalf("halt %s; want a revert caused by the analysis of wave 1 (fa-1)", statusJSON(h))
	}
	var run *iteronv1.AnalysisRun
	for i := range done.Status.AnalysisRuns {
		if r := &done.Status.AnalysisRuns[i]; r.Metric == "error-rate" && r.Revision == h.Revision {
			run = r
		}
	}
	if run == nil || run.Phase != iteronv1.AnalysisFailed || run.Wave != 1 {
		t.Fatalf("analysis runs %s; want error-rate of wave 1 Failed", statusJSON(done.Status.AnalysisRuns))
	}
	last := run.Measurements[len(run.Measurements)-1]
	v, err := strconv.ParseFloat(strings.Trim(last.Value, "[]"), 64)
	if err != nil || v <= 0.05 || !strings.Contains(h.Message, last.Value) {
		t.Fatalf("the failing measurement %+v (halt message %q); want a share of failed calls above 0.05 named in the halt", last, h.Message)
	}
	t.Logf("status.halt.message: %s", h.Message)
	if got := w.movesInOrder(); !slices.Equal(got, []string{"fa-1@1", "fa-1@0"}) {
		t.Errorf("moves %v; want fa-1 to the new revision (wave 1) and back, nothing else", got)
	}
	acts, err := fleettest.Stamped(env.Client, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		if rev := fmt.Sprintf("%s-%s", key.Name, a.Labels[iteronv1.LabelRevision]); rev != done.Status.CurrentRevision {
			t.Errorf("%s is on %s; want the stable %s", a.Spec.NodeName, rev, done.Status.CurrentRevision)
		}
	}
	if c := fleettest.Condition(done, iteronv1.ConditionAnalysisFailed); c == nil || c.Status != metav1.ConditionTrue || c.Reason != iteronv1.ReasonAnalysisFailed {
		t.Errorf("AnalysisFailed condition %+v; want True (AnalysisFailed)", c)
	}
	ev := setEvents(t, key)
	if !slices.ContainsFunc(ev, func(e string) bool {
		return strings.HasPrefix(e, "Warning AnalysisFailed: analysis error-rate of wave 1")
	}) {
		t.Errorf("events %v; want a Warning AnalysisFailed for wave 1", ev)
	}
}

// TestAProbeThatSeesAWrongAnswerRevertsARevisionNoCallerUses rolls a text
// module whose new revision answers wrongly, with no traffic at all: the
// canary's manager probes it through its own dispatcher before reporting
// it Ready, the probe fails, and the rollout reverts.
func TestAProbeThatSeesAWrongAnswerRevertsARevisionNoCallerUses(t *testing.T) {
	tpl := func(src iteronv1.ActivationSource) iteronv1.ActivationTemplate {
		t := template(src)
		t.Swap = iteronv1.SwapPolicy{Strategy: iteronv1.SwapStrategyHot, StateDisposition: iteronv1.StateDispositionDiscard}
		t.Probes = []iteronv1.ActivationProbe{{Name: "upper", Module: "prompt_system", Input: `{"text":"abc"}`, Check: `result.upper == "ABC"`, TimeoutMilliseconds: ptr.To[int32](2000)}}
		return t
	}
	st := oneByOne(iteronv1.FailurePolicyRevert)
	st.RevertStateDisposition = iteronv1.StateDispositionDiscard
	key := deploy(t, "probed", tpl(source(t, artifacts.Stateless, "text-a", []string{"read_only"})), st)
	first, err := fleettest.Stamped(env.Client, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range first {
		if len(a.Status.Probes) != 1 || a.Status.Probes[0].Phase != iteronv1.ProbePassed {
			t.Fatalf("%s's probes after the first deployment: %s", a.Spec.NodeName, statusJSON(a.Status.Probes))
		}
	}
	t.Logf("fa-1's probe on the good revision: %s", statusJSON(first[0].Status.Probes[0]))
	w := watchWaves(t, key)
	editSet(t, key, func(s *iteronv1.ActivationSet) {
		s.Spec.Template = tpl(source(t, artifacts.Stateless, "text-b", []string{"read_only"}, "--wrong"))
	})
	halted := waitSet(t, key, "halted by the probe", func(s *iteronv1.ActivationSet) bool { return s.Status.Halt != nil })
	done := waitSet(t, key, "Reverted", fleettest.Phase(iteronv1.RolloutReverted))
	w.stop()
	t.Logf("wave log:\n%s", w)
	logStatus(t, key)
	h := halted.Status.Halt
	if h.Cause != iteronv1.HaltProbeFailed || !slices.Equal(h.Nodes, []string{"fa-1"}) ||
		!strings.Contains(h.Message, `check result.upper == \"ABC\" is false for the answer {\"length\":3,\"upper\":\"abc\"}`) && !strings.Contains(h.Message, `{"length":3,"upper":"abc"}`) {
		t.Fatalf("halt %s; want ProbeFailed on fa-1 naming the wrong answer", statusJSON(h))
	}
	t.Logf("status.halt.message: %s", h.Message)
	if got := w.movesInOrder(); !slices.Equal(got, []string{"fa-1@1", "fa-1@0"}) {
		t.Errorf("moves %v; want fa-1 to the new revision and back, nothing else", got)
	}
	if c := fleettest.Condition(done, iteronv1.ConditionAnalysisFailed); c == nil || c.Status != metav1.ConditionTrue || c.Reason != iteronv1.ReasonProbeFailed {
		t.Errorf("AnalysisFailed condition %+v; want True (ProbeFailed)", c)
	}
	// fa-1 is back on text-a and its probe passes there again.
	acts, _ := fleettest.Stamped(env.Client, key)
	if p := acts[0].Status.Probes; len(p) != 1 || p[0].Phase != iteronv1.ProbePassed || !strings.Contains(p[0].Result, `"upper":"ABC"`) {
		t.Errorf("fa-1's probe after the revert: %s", statusJSON(p))
	}
}

// TestAWebhookThatTimesOutFailsItsAnalysisWithThatReason judges a good
// revision by a webhook that answers after 3 s with a timeout of 1 s: the
// measurement cannot be made, the wave fails with that reason and the
// rollout halts; kubectl iteron rollout abort then reverts it.
func TestAWebhookThatTimesOutFailsItsAnalysisWithThatReason(t *testing.T) {
	g := &gate{delay: 3 * time.Second}
	srv := httptest.NewServer(g)
	defer srv.Close()
	webhookProvider(t, "gate-slow", srv.URL, 1)
	st := oneByOne(iteronv1.FailurePolicyHalt, iteronv1.AnalysisMetric{Name: "slow-gate", Provider: "gate-slow",
		IntervalSeconds: ptr.To[int32](1), ConsecutiveErrorLimit: ptr.To[int32](0)})
	key := deploy(t, "slowgate", template(source(t, artifacts.CounterV1Down, "counter-v1", nil)), st)
	w := watchWaves(t, key)
	editSet(t, key, func(s *iteronv1.ActivationSet) {
		s.Spec.Template = template(source(t, artifacts.CounterV2, "counter-v2", nil))
	})
	halted := waitSet(t, key, "Halted", fleettest.Phase(iteronv1.RolloutHalted))
	h := halted.Status.Halt
	if h == nil || h.Cause != iteronv1.HaltAnalysisFailed || !strings.Contains(h.Message, "no answer within 1s (timeoutSeconds)") ||
		!strings.Contains(h.Message, "slow-gate (provider gate-slow) of wave 1 (fa-1) could not be measured") {
		t.Fatalf("halt %s; want the webhook's timeout as the reason", statusJSON(h))
	}
	r := halted.Status.AnalysisRuns[0]
	if r.Phase != iteronv1.AnalysisError || r.Errors != 1 || !strings.Contains(r.Measurements[0].Message, "no answer within 1s") {
		t.Fatalf("run %s", statusJSON(r))
	}
	t.Logf("status.halt.message: %s", h.Message)
	logStatus(t, key)
	out, code := plugin(t, "rollout", "abort", key.Name)
	if code != 0 {
		t.Fatalf("kubectl iteron rollout abort: exit %d: %s", code, out)
	}
	t.Logf("kubectl iteron rollout abort %s: %s", key.Name, out)
	done := waitSet(t, key, "Reverted", fleettest.Phase(iteronv1.RolloutReverted))
	w.stop()
	t.Logf("wave log:\n%s", w)
	if done.Status.Halt == nil || done.Status.Halt.Cause != iteronv1.HaltAborted || done.Status.Halt.Action != iteronv1.FailurePolicyRevert {
		t.Fatalf("halt after abort %s", statusJSON(done.Status.Halt))
	}
	if out, code := plugin(t, "rollout", "abort", key.Name); code != 1 || !strings.Contains(out, "is reverting revision "+done.Status.UpdateRevision+" already") {
		t.Errorf("a second abort: exit %d: %s; want it refused", code, out)
	}
	ev := setEvents(t, key)
	for _, want := range []string{"Warning AnalysisFailed: analysis slow-gate of wave 1", "Warning Halted", "Warning Aborted", "Normal Reverted"} {
		if !slices.ContainsFunc(ev, func(e string) bool { return strings.HasPrefix(e, want) }) {
			t.Errorf("events %v; want %q", ev, want)
		}
	}
}

// TestCohortsMoveInTheirOrderAndAPauseWaitsForPromote rolls v1 → v2 zone by
// zone: zone b first, a pause, zone c, then the rest (zone a); the rollout
// waits at the pause until kubectl iteron rollout promote.
func TestCohortsMoveInTheirOrderAndAPauseWaitsForPromote(t *testing.T) {
	cohort := func(z string) iteronv1.RolloutStep {
		return iteronv1.RolloutStep{Wave: &iteronv1.WaveStep{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{zone: z}}, SoakSeconds: ptr.To[int32](1)}}
	}
	st := iteronv1.RolloutStrategy{MaxUnavailable: ptr.To(intstr.FromInt32(1)),
		Steps: []iteronv1.RolloutStep{cohort("b"), {Pause: &iteronv1.PauseStep{}}, cohort("c")}}
	key := deploy(t, "zones", template(source(t, artifacts.CounterV1Down, "counter-v1", nil)), st)
	if out, code := plugin(t, "rollout", "promote", key.Name); code != 1 || !strings.Contains(out, "is not waiting at a pause step") {
		t.Fatalf("promote with nothing paused: exit %d: %s", code, out)
	}
	w := watchWaves(t, key)
	editSet(t, key, func(s *iteronv1.ActivationSet) {
		s.Spec.Template = template(source(t, artifacts.CounterV2, "counter-v2", nil))
	})
	paused := waitSet(t, key, "PausedAtStep", fleettest.Phase(iteronv1.RolloutPausedAtStep))
	if paused.Status.Step != 2 || paused.Status.UpdatedNodes != 1 {
		t.Fatalf("paused at step %d with %d nodes updated; want step 2, 1 node", paused.Status.Step, paused.Status.UpdatedNodes)
	}
	// Argo CD reads a set waiting at a pause step as Suspended, not
	// Degraded (kstatus has no suspended status: as for spec.paused, it
	// reads the Ready condition, False until the rollout completes).
	if h, err := fleettest.SetHealth(env.RepoRoot, paused); err != nil || h.Argo != "Suspended" {
		t.Fatalf("health at the pause: %v (%v); want Argo CD Suspended", h, err)
	} else {
		t.Logf("at the pause: %s (%s)", h, h.ArgoMessage)
	}
	// At rest: kubectl iteron rollout status --watch returns at the pause.
	out, code := plugin(t, "rollout", "status", key.Name, "--timeout=60s")
	if code != 0 || !strings.Contains(out, "PausedAtStep") || !strings.Contains(out, ">  2 pause") {
		t.Fatalf("rollout status at the pause: exit %d\n%s", code, out)
	}
	t.Logf("kubectl iteron rollout status %s at the pause:\n%s", key.Name, out)
	// Nothing moves while it waits.
	time.Sleep(3 * time.Second)
	if got := w.movesInOrder(); !slices.Equal(got, []string{"fa-2@1"}) {
		t.Fatalf("moves while paused %v; want fa-2@1 only", got)
	}
	out, code = plugin(t, "rollout", "promote", key.Name)
	if code != 0 {
		t.Fatalf("promote: exit %d: %s", code, out)
	}
	t.Logf("kubectl iteron rollout promote %s: %s", key.Name, out)
	done := waitSet(t, key, "Completed on v2", fleettest.Completed)
	w.stop()
	t.Logf("wave log:\n%s", w)
	if got := w.movesInOrder(); !slices.Equal(got, []string{"fa-2@1", "fa-3@2", "fa-1@3"}) {
		t.Errorf("moves %v; want zone b (fa-2) wave 1, zone c (fa-3) wave 2, then zone a (fa-1) wave 3", got)
	}
	if done.Status.LastHandledPromoteAt == "" {
		t.Errorf("status %+v does not echo the promotion", done.Status)
	}
	ev := setEvents(t, key)
	for _, want := range []string{"Normal PausedAtStep", "Normal Promoted"} {
		if !slices.ContainsFunc(ev, func(e string) bool { return strings.HasPrefix(e, want) }) {
			t.Errorf("events %v; want %s", ev, want)
		}
	}
}

// TestAProbeOnAModuleThatIsNotReadOnlyIsRefusedAndChangesNothing moves a
// node to a revision whose probe names a module admitted reversible_local:
// its manager refuses the spec before anything changes there (its v1
// generation keeps serving), and the rollout halts on that node.
func TestAProbeOnAModuleThatIsNotReadOnlyIsRefusedAndChangesNothing(t *testing.T) {
	caps := []string{"reversible_local"}
	key := deploy(t, "writer", template(source(t, artifacts.CounterV1Down, "counter-v1", caps)), oneByOne(iteronv1.FailurePolicyHalt))
	v2 := template(source(t, artifacts.CounterV2, "counter-v2", caps))
	v2.Probes = []iteronv1.ActivationProbe{{Name: "reads", Module: "prompt_system", Input: `{"key":"k","add":0}`, Check: "result.count >= 0"}}
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = v2 })
	halted := waitSet(t, key, "Halted", fleettest.Phase(iteronv1.RolloutHalted))
	f := halted.Status.Failed
	if len(f) != 1 || f[0].Node != "fa-1" || f[0].Reason != iteronv1.ReasonSchemaMismatch ||
		!strings.Contains(f[0].Message, "spec.probes[0].module: module prompt_system is admitted with capabilities [reversible_local]; a probe runs only on a module admitted read_only alone") {
		t.Fatalf("status.failed %s; want fa-1 refused naming spec.probes[0].module", statusJSON(f))
	}
	t.Logf("status.failed[0]: %s: %s", f[0].Reason, f[0].Message)
	acts, err := fleettest.Stamped(env.Client, key)
	if err != nil {
		t.Fatal(err)
	}
	if m := acts[0].Status.Modules; len(m) != 1 || m[0].ImplementationID != "counter-v1" || m[0].Phase != iteronv1.PhaseActive || len(acts[0].Status.Probes) != 0 {
		t.Fatalf("fa-1 after the refusal: modules %s, probes %s; want counter-v1 still Active and no probe run", statusJSON(m), statusJSON(acts[0].Status.Probes))
	}
}
