package analysis

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

var vars = Vars{Set: "web", Namespace: "default", Revision: "web-5d8f", RevisionHash: "5d8f", Wave: 1, Nodes: []string{"node-1", "node-2"}}

func prometheusProvider(url string) *iteronv1.AnalysisProvider {
	return &iteronv1.AnalysisProvider{ObjectMeta: metav1.ObjectMeta{Name: "prom"},
		Spec: iteronv1.AnalysisProviderSpec{Prometheus: &iteronv1.PrometheusProvider{Address: url}, TimeoutSeconds: ptr.To[int32](1), MaxResponseBytes: ptr.To[int32](1024)}}
}

func webhookProvider(url string) *iteronv1.AnalysisProvider {
	return &iteronv1.AnalysisProvider{ObjectMeta: metav1.ObjectMeta{Name: "gate"},
		Spec: iteronv1.AnalysisProviderSpec{Webhook: &iteronv1.WebhookProvider{URL: url}, TimeoutSeconds: ptr.To[int32](1), MaxResponseBytes: ptr.To[int32](1024)}}
}

// prometheusAnswering is a loopback server speaking /api/v1/query that
// answers one value and records the query it was sent.
func prometheusAnswering(t *testing.T, value string, got *atomic.Value) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/query" || r.Method != http.MethodPost {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		_ = r.ParseForm()
		got.Store(r.PostForm.Get("query"))
		fmt.Fprintf(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"node-1"},"value":[1,%q]}]}}`, value)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestAMeasurementAsksTheProviderAndJudgesItsAnswer(t *testing.T) {
	metric := &iteronv1.AnalysisMetric{Name: "error-rate", Provider: "prom",
		Query:            `sum(rate(iteron_gateway_calls_total{revision="{{revision}}",node=~"{{nodes}}",code!="ok"}[1m]))`,
		SuccessCondition: "result.size() > 0 && result.all(v, v < 0.05)"}
	for _, tc := range []struct {
		value string
		phase iteronv1.AnalysisPhase
		msg   string
	}{
		{"0.01", iteronv1.AnalysisSuccessful, ""},
		{"0.31", iteronv1.AnalysisFailed, "result.size() > 0 && result.all(v, v < 0.05) is false"},
		{"NaN", iteronv1.AnalysisError, "could not be evaluated"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			var query atomic.Value
			s := prometheusAnswering(t, tc.value, &query)
			m := Measure(context.Background(), NewClient(), Request{Metric: metric, Provider: prometheusProvider(s.URL), Vars: vars, Seq: 1}, time.Now())
			if m.Phase != tc.phase || m.Value != "["+strings.Replace(tc.value, "0.", "0.", 1)+"]" || !strings.Contains(m.Message, tc.msg) {
				t.Fatalf("measurement = %+v", m)
			}
			if q := query.Load().(string); q != `sum(rate(iteron_gateway_calls_total{revision="5d8f",node=~"node-1|node-2",code!="ok"}[1m]))` {
				t.Fatalf("query sent: %s", q)
			}
		})
	}
}

func TestAProviderThatMisbehavesGivesAnErrorNamingWhy(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer slow.Close()
	defer close(release)
	large := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[`+strings.Repeat(`{"metric":{},"value":[1,"0"]},`, 100)+`]}}`)
	}))
	defer large.Close()
	var redirected atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { redirected.Add(1) }))
	defer target.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusFound)
	}))
	defer redirect.Close()
	queryErr := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}`)
	}))
	defer queryErr.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	prom := &iteronv1.AnalysisMetric{Name: "m", Provider: "prom", Query: "up", SuccessCondition: "result.size() > 0"}
	hook := &iteronv1.AnalysisMetric{Name: "m", Provider: "gate"}
	cases := []struct {
		name     string
		metric   *iteronv1.AnalysisMetric
		provider *iteronv1.AnalysisProvider
		phase    iteronv1.AnalysisPhase
		msg      string
	}{
		{"a webhook that does not answer in time", hook, webhookProvider(slow.URL), iteronv1.AnalysisError, "no answer within 1s (timeoutSeconds)"},
		{"an answer larger than maxResponseBytes", prom, prometheusProvider(large.URL), iteronv1.AnalysisError, "answered more than maxResponseBytes (1024 bytes)"},
		{"a redirect is not followed", hook, webhookProvider(redirect.URL), iteronv1.AnalysisFailed, "status >= 200 && status < 300 is false"},
		{"a query Prometheus refuses", prom, prometheusProvider(queryErr.URL), iteronv1.AnalysisError, "(HTTP 400): the query failed: bad_data: 1:5: parse error"},
		{"a provider that refuses connections", prom, prometheusProvider(closedURL), iteronv1.AnalysisError, "connection refused"},
		{"a provider that does not exist", prom, nil, iteronv1.AnalysisError, `AnalysisProvider "prom" not found`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			m := Measure(context.Background(), NewClient(), Request{Metric: tc.metric, Provider: tc.provider, Vars: vars, Seq: 1}, time.Now())
			if m.Phase != tc.phase || !strings.Contains(m.Message, tc.msg) || len(m.Message) > maxMessage || len(m.Value) > maxValue {
				t.Fatalf("measurement = %+v; want %s with %q", m, tc.phase, tc.msg)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("the measurement took %s; the provider's timeout is 1s", d)
			}
		})
	}
	if n := redirected.Load(); n != 0 {
		t.Fatalf("the redirect was followed %d times", n)
	}
}

func TestAWebhookIsToldTheWaveAndJudgedByItsAnswer(t *testing.T) {
	var got webhookRequest
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"verdict":"pass","errors":0}`)
	}))
	defer s.Close()
	metric := &iteronv1.AnalysisMetric{Name: "gate", Provider: "gate", SuccessCondition: `status == 200 && result.verdict == "pass"`}
	m := Measure(context.Background(), NewClient(), Request{Metric: metric, Provider: webhookProvider(s.URL), Vars: vars, Seq: 3}, time.Now())
	if m.Phase != iteronv1.AnalysisSuccessful || m.Value != `200 {"verdict":"pass","errors":0}` {
		t.Fatalf("measurement = %+v", m)
	}
	want := webhookRequest{Set: "web", Namespace: "default", Metric: "gate", Measurement: 3, Revision: "web-5d8f", RevisionHash: "5d8f", Wave: 1, Nodes: []string{"node-1", "node-2"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the webhook got %+v; want %+v", got, want)
	}
}

func TestAnAnalysisIsValidatedAgainstItsProvidersNamingTheField(t *testing.T) {
	providers := map[string]*iteronv1.AnalysisProvider{"prom": prometheusProvider("http://127.0.0.1:9090"), "gate": webhookProvider("http://127.0.0.1:8080")}
	providers["private"] = prometheusProvider("http://127.0.0.1:9091")
	providers["private"].Spec.AllowedNamespaces = []string{"team-a"}
	a := func(m iteronv1.AnalysisMetric) *iteronv1.RolloutAnalysis {
		return &iteronv1.RolloutAnalysis{Metrics: []iteronv1.AnalysisMetric{{Name: "ok", Provider: "gate"}, m}}
	}
	cases := []struct {
		name   string
		metric iteronv1.AnalysisMetric
		err    string
	}{
		{"a valid Prometheus metric", iteronv1.AnalysisMetric{Name: "m", Provider: "prom", Query: "up", SuccessCondition: "result.size() > 0"}, ""},
		{"a webhook without a condition (2xx)", iteronv1.AnalysisMetric{Name: "m", Provider: "gate"}, ""},
		{"a provider that does not exist", iteronv1.AnalysisMetric{Name: "m", Provider: "nope"}, `spec.strategy.analysis.metrics[1].provider: AnalysisProvider "nope" not found`},
		{"a provider that does not admit the namespace", iteronv1.AnalysisMetric{Name: "m", Provider: "private", Query: "up", SuccessCondition: "true"},
			`spec.strategy.analysis.metrics[1].provider: AnalysisProvider "private" does not admit namespace default`},
		{"a Prometheus metric without a query", iteronv1.AnalysisMetric{Name: "m", Provider: "prom", SuccessCondition: "true"}, "spec.strategy.analysis.metrics[1].query"},
		{"a Prometheus metric without a condition", iteronv1.AnalysisMetric{Name: "m", Provider: "prom", Query: "up"}, "spec.strategy.analysis.metrics[1].successCondition: a Prometheus metric needs a condition"},
		{"a condition that does not compile", iteronv1.AnalysisMetric{Name: "m", Provider: "gate", SuccessCondition: "status =="}, "spec.strategy.analysis.metrics[1].successCondition: \"status ==\" does not compile"},
		{"a webhook condition over Prometheus variables", iteronv1.AnalysisMetric{Name: "m", Provider: "gate", SuccessCondition: "series.size() > 0"}, "undeclared reference to 'series'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(a(tc.metric), providers, "default")
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v; want %q", err, tc.err)
			}
		})
	}
}
