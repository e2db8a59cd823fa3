package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// callsTotal counts gateway calls by outcome: code is "ok" or the call's
// reason (permission_denied, queue_full, stale_generation, …). Labels are
// namespace, activation, module and code only — never an invocation ID.
var callsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "iteron", Name: "gateway_calls_total",
	Help: "Gateway calls (Invoke and Watch) by outcome: code is ok or the reason the call failed.",
}, []string{"namespace", "activation", "module", "code"})

// Collectors are the gateway's metrics, for the manager to register.
func Collectors() []prometheus.Collector { return []prometheus.Collector{callsTotal} }

// countCall records one call's outcome; err nil is ok.
func countCall(namespace, activation, module string, err error) {
	code := "ok"
	if err != nil {
		code = "unknown"
		if f, ok := ReasonOf(err); ok && f.GetReason() != "" {
			code = f.GetReason()
		}
	}
	callsTotal.WithLabelValues(namespace, activation, module, code).Inc()
}
