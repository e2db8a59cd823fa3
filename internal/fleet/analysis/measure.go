package analysis

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Bounds of what a measurement records.
const (
	maxValue   = 256
	maxMessage = 256
)

// Defaults of an AnalysisProvider's bounds (the CRD's defaults).
const (
	defaultTimeout  = 10 * time.Second
	defaultMaxBytes = 256 << 10
)

// KindOf is the kind of condition a provider's metrics use.
func KindOf(p *iteronv1.AnalysisProvider) Kind {
	if p.Spec.Webhook != nil {
		return KindWebhook
	}
	return KindPrometheus
}

// ConditionOf is a metric's condition for a provider of kind: its
// successCondition, or the default of a webhook.
func ConditionOf(m *iteronv1.AnalysisMetric, kind Kind) string {
	if m.SuccessCondition == "" && kind == KindWebhook {
		return DefaultWebhookCondition
	}
	return m.SuccessCondition
}

// Validate checks an analysis against the providers it names (by name;
// nil: none exists) for a set in namespace: each provider exists and
// admits the namespace, a Prometheus metric has a query and a condition,
// and every condition compiles. The error names the field.
func Validate(a *iteronv1.RolloutAnalysis, providers map[string]*iteronv1.AnalysisProvider, namespace string) error {
	if a == nil {
		return nil
	}
	for i := range a.Metrics {
		m := &a.Metrics[i]
		field := fmt.Sprintf("spec.strategy.analysis.metrics[%d]", i)
		p := providers[m.Provider]
		if p == nil {
			return fmt.Errorf("%s.provider: AnalysisProvider %q not found (an administrator creates it; kubectl get analysisproviders)", field, m.Provider)
		}
		if len(p.Spec.AllowedNamespaces) > 0 && !slices.Contains(p.Spec.AllowedNamespaces, namespace) {
			return fmt.Errorf("%s.provider: AnalysisProvider %q does not admit namespace %s (its spec.allowedNamespaces)", field, m.Provider, namespace)
		}
		kind := KindOf(p)
		if kind == KindPrometheus && strings.TrimSpace(m.Query) == "" {
			return fmt.Errorf("%s.query: AnalysisProvider %q is a Prometheus API: the metric needs a query", field, m.Provider)
		}
		cond := ConditionOf(m, kind)
		if cond == "" {
			return fmt.Errorf("%s.successCondition: a Prometheus metric needs a condition over result (for example result.size() > 0 && result.all(v, v < 0.05))", field)
		}
		if _, err := Compile(kind, cond); err != nil {
			return fmt.Errorf("%s.successCondition: %q %v", field, cond, err)
		}
	}
	return nil
}

// Request is one measurement to make.
type Request struct {
	// Metric is the spec's metric.
	Metric *iteronv1.AnalysisMetric
	// Provider is its AnalysisProvider (nil: not found).
	Provider *iteronv1.AnalysisProvider
	// Vars describe the wave.
	Vars Vars
	// Seq is the measurement's number in its run, from 1.
	Seq int32
}

// webhookRequest is what a webhook receives.
type webhookRequest struct {
	Set          string   `json:"set"`
	Namespace    string   `json:"namespace"`
	Metric       string   `json:"metric"`
	Measurement  int32    `json:"measurement"`
	Revision     string   `json:"revision"`
	RevisionHash string   `json:"revisionHash"`
	Wave         int32    `json:"wave"`
	Nodes        []string `json:"nodes"`
}

// Measure makes one measurement: it asks the provider (within its bounds)
// and evaluates the metric's condition over the answer. Successful: the
// condition was true; Failed: false; Error: no usable answer, or a
// condition that could not be evaluated. It never returns without a phase.
func Measure(ctx context.Context, c *http.Client, r Request, now time.Time) iteronv1.Measurement {
	m := iteronv1.Measurement{At: metav1.NewTime(now)}
	fail := func(phase iteronv1.AnalysisPhase, value, format string, args ...any) iteronv1.Measurement {
		m.Phase, m.Value, m.Message = phase, Bounded(value, maxValue), Bounded(fmt.Sprintf(format, args...), maxMessage)
		return m
	}
	p := r.Provider
	if p == nil {
		return fail(iteronv1.AnalysisError, "", "AnalysisProvider %q not found", r.Metric.Provider)
	}
	kind := KindOf(p)
	cond, err := Compile(kind, ConditionOf(r.Metric, kind))
	if err != nil {
		return fail(iteronv1.AnalysisError, "", "successCondition %v", err)
	}
	ep := Endpoint{Timeout: defaultTimeout, MaxBytes: defaultMaxBytes}
	if t := ptr.Deref(p.Spec.TimeoutSeconds, 0); t > 0 {
		ep.Timeout = time.Duration(t) * time.Second
	}
	if b := ptr.Deref(p.Spec.MaxResponseBytes, 0); b > 0 {
		ep.MaxBytes = int64(b)
	}
	var vars map[string]any
	var value string
	switch kind {
	case KindPrometheus:
		ep.URL = strings.TrimSuffix(p.Spec.Prometheus.Address, "/") + "/api/v1/query"
		form := url.Values{"query": {Render(r.Metric.Query, r.Vars)}, "time": {strconv.FormatFloat(float64(now.UnixMilli())/1000, 'f', 3, 64)}}
		ans, err := Post(ctx, c, ep, "application/x-www-form-urlencoded", []byte(form.Encode()))
		if err != nil {
			return fail(iteronv1.AnalysisError, "", "prometheus %s: %v", p.Name, err)
		}
		samples, perr := ParseQueryResponse(ans.Body)
		if perr != nil {
			return fail(iteronv1.AnalysisError, "", "prometheus %s (HTTP %d): %v", p.Name, ans.Status, perr)
		}
		vars, value = SampleVars(samples), FormatSamples(samples, maxValue)
	case KindWebhook:
		ep.URL = p.Spec.Webhook.URL
		body, _ := json.Marshal(webhookRequest{Set: r.Vars.Set, Namespace: r.Vars.Namespace, Metric: r.Metric.Name, Measurement: r.Seq,
			Revision: r.Vars.Revision, RevisionHash: r.Vars.RevisionHash, Wave: r.Vars.Wave, Nodes: r.Vars.Nodes})
		ans, err := Post(ctx, c, ep, "application/json", body)
		if err != nil {
			return fail(iteronv1.AnalysisError, "", "webhook %s: %v", p.Name, err)
		}
		var result any
		if len(strings.TrimSpace(string(ans.Body))) > 0 {
			if err := json.Unmarshal(ans.Body, &result); err != nil {
				result = nil
				if strings.Contains(cond.Expr(), "result") {
					return fail(iteronv1.AnalysisError, fmt.Sprintf("%d %s", ans.Status, ans.Body), "webhook %s: the answer is not JSON: %v", p.Name, err)
				}
			}
		}
		vars = map[string]any{"status": int64(ans.Status), "result": result}
		value = fmt.Sprintf("%d %s", ans.Status, strings.TrimSpace(string(ans.Body)))
	}
	ok, err := cond.Eval(vars)
	switch {
	case err != nil:
		return fail(iteronv1.AnalysisError, value, "%s could not be evaluated: %v", cond.Expr(), err)
	case !ok:
		return fail(iteronv1.AnalysisFailed, value, "%s is false", cond.Expr())
	}
	m.Phase, m.Value = iteronv1.AnalysisSuccessful, Bounded(value, maxValue)
	return m
}

// Bounded is s as valid UTF-8 of at most n bytes (cut at a character,
// marked with "…"): what status fields that carry a provider's or a
// module's answer hold.
func Bounded(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return truncate(s, n)
}
