package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"iteron.dev/operator/internal/dispatch"
)

// The gateway's call metrics. Labels are namespace, activation, module,
// revision (the revision label of the activation spec the serving
// generation was made for: a stamped activation's iteron.dev/revision, ""
// for others, and for calls refused before a generation took them) and
// code only — never an invocation ID or a generation, so cardinality stays
// bounded by the objects on the node and the revisions a rollout moves
// between. A fleet analysis selects a wave's nodes (the scrape target's
// node label) and the new revision with them.
var (
	callsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "iteron", Name: "gateway_calls_total",
		Help: "Gateway calls (Invoke and Watch) by outcome: code is ok or the reason the call failed; revision is the revision of the generation that took the call.",
	}, []string{"namespace", "activation", "module", "revision", "code"})
	callDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "iteron", Name: "gateway_call_duration_seconds",
		Help:    "Time from a call's arrival to its outcome (its wait in the module's queue included), of calls a generation took, whatever their outcome.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"namespace", "activation", "module", "revision"})
)

// Collectors are the gateway's metrics, for the manager to register.
func Collectors() []prometheus.Collector { return []prometheus.Collector{callsTotal, callDuration} }

// countCall records one call's outcome; err nil is ok.
func countCall(namespace, activation, module, revision string, err error) {
	code := "ok"
	if err != nil {
		code = "unknown"
		if f, ok := ReasonOf(err); ok && f.GetReason() != "" {
			code = f.GetReason()
		}
	}
	callsTotal.WithLabelValues(namespace, activation, module, revision, code).Inc()
}

// observeCall records how long a call a generation took lasted.
func observeCall(namespace, activation, module, revision string, d time.Duration) {
	callDuration.WithLabelValues(namespace, activation, module, revision).Observe(d.Seconds())
}

// routeRevision is the revision of the generation d routes to now ("" when
// none).
func routeRevision(d *dispatch.Dispatcher) string {
	if r := d.Route(); r != nil {
		return r.Revision
	}
	return ""
}
