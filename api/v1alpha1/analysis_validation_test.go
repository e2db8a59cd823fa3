package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

func wave(edit func(*iteronv1.WaveStep)) iteronv1.RolloutStep {
	w := &iteronv1.WaveStep{}
	edit(w)
	return iteronv1.RolloutStep{Wave: w}
}

func metric(name string) iteronv1.AnalysisMetric {
	return iteronv1.AnalysisMetric{Name: name, Provider: "prometheus", Query: "up", SuccessCondition: "result.all(v, v > 0.0)"}
}

func TestStepsAnalysisAndProbesAreRejectedNamingTheField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*iteronv1.ActivationSet)
		field  string
	}{
		{"canary and steps both", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Canary = &iteronv1.CanaryStrategy{Nodes: 1}
			s.Spec.Strategy.Steps = []iteronv1.RolloutStep{{Pause: &iteronv1.PauseStep{}}}
		}, "give canary or steps, not both"},
		{"a step that is a wave and a pause", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Steps = []iteronv1.RolloutStep{{Wave: &iteronv1.WaveStep{Nodes: ptr.To[int32](1)}, Pause: &iteronv1.PauseStep{}}}
		}, "a step is either a wave or a pause"},
		{"a step that is neither", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.Steps = []iteronv1.RolloutStep{{}} }, "a step is either a wave or a pause"},
		{"a wave that moves nothing", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Steps = []iteronv1.RolloutStep{wave(func(w *iteronv1.WaveStep) { w.SoakSeconds = ptr.To[int32](5) })}
		}, "a wave moves nodes, a percent of them or a label cohort"},
		{"nodes and percent both", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Steps = []iteronv1.RolloutStep{wave(func(w *iteronv1.WaveStep) { w.Nodes, w.Percent = ptr.To[int32](1), ptr.To[int32](10) })}
		}, "give nodes or percent, not both"},
		{"a percent above 100", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Steps = []iteronv1.RolloutStep{wave(func(w *iteronv1.WaveStep) { w.Percent = ptr.To[int32](101) })}
		}, "spec.strategy.steps[0].wave.percent"},
		{"33 steps", func(s *iteronv1.ActivationSet) {
			for range 33 {
				s.Spec.Strategy.Steps = append(s.Spec.Strategy.Steps, iteronv1.RolloutStep{Pause: &iteronv1.PauseStep{}})
			}
		}, "spec.strategy.steps"},
		{"an analysis without metrics", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.Analysis = &iteronv1.RolloutAnalysis{} }, "spec.strategy.analysis.metrics"},
		{"a metric name that is not a DNS label", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Analysis = &iteronv1.RolloutAnalysis{Metrics: []iteronv1.AnalysisMetric{metric("Error_Rate")}}
		}, "spec.strategy.analysis.metrics[0].name"},
		{"two metrics of one name", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Analysis = &iteronv1.RolloutAnalysis{Metrics: []iteronv1.AnalysisMetric{metric("a"), metric("a")}}
		}, "spec.strategy.analysis.metrics[1]"},
		{"an interval of 0", func(s *iteronv1.ActivationSet) {
			m := metric("a")
			m.IntervalSeconds = ptr.To[int32](0)
			s.Spec.Strategy.Analysis = &iteronv1.RolloutAnalysis{Metrics: []iteronv1.AnalysisMetric{m}}
		}, "spec.strategy.analysis.metrics[0].intervalSeconds"},
		{"a probe of a module the template does not have", func(s *iteronv1.ActivationSet) {
			s.Spec.Template.Probes = []iteronv1.ActivationProbe{{Name: "p", Module: "nowhere", Input: "{}", Check: "true"}}
		}, "probes[].module must be one of sources[].module"},
		{"a probe with a timeout above 60 s", func(s *iteronv1.ActivationSet) {
			s.Spec.Template.Probes = []iteronv1.ActivationProbe{{Name: "p", Module: s.Spec.Template.Sources[0].Module, Input: "{}", Check: "true", TimeoutMilliseconds: ptr.To[int32](60001)}}
		}, "spec.template.probes[0].timeoutMilliseconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			set := validSet("reject")
			tc.mutate(set)
			expectInvalid(t, createDryRun(t, set), tc.field)
		})
	}
}

func TestAnAnalysisProviderIsOneEndpointWithAURL(t *testing.T) {
	cases := []struct {
		name  string
		spec  iteronv1.AnalysisProviderSpec
		field string
	}{
		{"both kinds", iteronv1.AnalysisProviderSpec{Prometheus: &iteronv1.PrometheusProvider{Address: "http://p:9090"}, Webhook: &iteronv1.WebhookProvider{URL: "http://w"}}, "set exactly one of prometheus and webhook"},
		{"neither", iteronv1.AnalysisProviderSpec{}, "set exactly one of prometheus and webhook"},
		{"a file URL", iteronv1.AnalysisProviderSpec{Webhook: &iteronv1.WebhookProvider{URL: "file:///etc/passwd"}}, "must be an http or https URL with a host"},
		{"no host", iteronv1.AnalysisProviderSpec{Prometheus: &iteronv1.PrometheusProvider{Address: "http://"}}, "must be an http or https URL with a host"},
		{"a timeout above 60 s", iteronv1.AnalysisProviderSpec{Webhook: &iteronv1.WebhookProvider{URL: "http://w"}, TimeoutSeconds: ptr.To[int32](61)}, "spec.timeoutSeconds"},
		{"an answer bound above 16 MiB", iteronv1.AnalysisProviderSpec{Webhook: &iteronv1.WebhookProvider{URL: "http://w"}, MaxResponseBytes: ptr.To[int32](16<<20 + 1)}, "spec.maxResponseBytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectInvalid(t, createDryRun(t, &iteronv1.AnalysisProvider{ObjectMeta: metav1.ObjectMeta{Name: "reject"}, Spec: tc.spec}), tc.field)
		})
	}
	ctx := context.Background()
	p := &iteronv1.AnalysisProvider{ObjectMeta: metav1.ObjectMeta{Name: "defaults"}, Spec: iteronv1.AnalysisProviderSpec{Prometheus: &iteronv1.PrometheusProvider{Address: "https://prometheus.monitoring:9090"}}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, p) })
	if ptr.Deref(p.Spec.TimeoutSeconds, 0) != 10 || ptr.Deref(p.Spec.MaxResponseBytes, 0) != 256<<10 {
		t.Fatalf("defaults not applied: %+v", p.Spec)
	}
}

// TestAMaximalSetWithStepsAnalysisAndProbesFitsTheCELCostBudget stores
// the largest strategy, probes and analysis history the schema allows.
func TestAMaximalSetWithStepsAnalysisAndProbesFitsTheCELCostBudget(t *testing.T) {
	ctx := context.Background()
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	set := validSet("maximal-analysis")
	for i := range 32 {
		sel := &metav1.LabelSelector{MatchLabels: map[string]string{}}
		for j := range 8 {
			sel.MatchLabels[fmt.Sprintf("k%d/%s", j, long("k", 60))] = long("v", 63)
		}
		if i%2 == 0 {
			set.Spec.Strategy.Steps = append(set.Spec.Strategy.Steps, wave(func(w *iteronv1.WaveStep) { w.Nodes, w.Selector = ptr.To[int32](10000), sel }))
		} else {
			set.Spec.Strategy.Steps = append(set.Spec.Strategy.Steps, iteronv1.RolloutStep{Pause: &iteronv1.PauseStep{DurationSeconds: ptr.To[int32](86400)}})
		}
	}
	set.Spec.Strategy.Analysis = &iteronv1.RolloutAnalysis{}
	for i := range 8 {
		set.Spec.Strategy.Analysis.Metrics = append(set.Spec.Strategy.Analysis.Metrics, iteronv1.AnalysisMetric{
			Name: fmt.Sprintf("m%d", i) + long("m", 61), Provider: long("p", 253), Query: long("q", 4096), SuccessCondition: long("c", 1024)})
	}
	for i := range 8 {
		set.Spec.Template.Probes = append(set.Spec.Template.Probes, iteronv1.ActivationProbe{
			Name: fmt.Sprintf("p%d", i) + long("p", 61), Module: set.Spec.Template.Sources[0].Module, Input: "{" + long(" ", 4094) + "}", Check: long("c", 1024)})
	}
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatalf("maximal set refused: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, set) })
	st := &set.Status
	st.Phase, st.UpdateRevision, st.Step = iteronv1.RolloutPausedAtStep, long("u", 253), 33
	st.LastHandledPromoteAt, st.LastHandledAbortAt = long("p", 64), long("a", 64)
	for i := range 16 {
		r := iteronv1.AnalysisRun{Metric: long("m", 63), Provider: long("p", 253), Revision: long("u", 253), Wave: int32(i), Phase: iteronv1.AnalysisFailed,
			StartedAt: metav1.Now(), FinishedAt: ptr.To(metav1.Now()), Message: long("x", 512)}
		for range 10 {
			r.Measurements = append(r.Measurements, iteronv1.Measurement{At: metav1.Now(), Phase: iteronv1.AnalysisError, Value: long("v", 256), Message: long("w", 256)})
		}
		st.AnalysisRuns = append(st.AnalysisRuns, r)
	}
	if err := env.Client.Status().Update(ctx, set); err != nil {
		t.Fatalf("maximal status refused: %v", err)
	}
	raw, _ := json.Marshal(set)
	t.Logf("a maximal set with steps, analysis, probes and history is %d bytes", len(raw))
	if len(raw) > 512<<10 {
		t.Errorf("a maximal set is %d bytes; keep it far below etcd's 1.5 MiB request limit", len(raw))
	}
	set.Status.AnalysisRuns = append(set.Status.AnalysisRuns, set.Status.AnalysisRuns[0])
	expectInvalid(t, env.Client.Status().Update(ctx, set), "status.analysisRuns")
}
