package hotswap

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics labels are namespace, activation, module and code only — never a run
// or invocation ID (docs/operations.md, metrics), so cardinality stays bounded
// by the objects on the node.
var (
	transactionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "iteron", Name: "transactions_total",
		Help: "Transactions that ended, by outcome: code is committed, or the reason code of the transaction that rolled back (rollback_failed when the rollback could not restore the old generation).",
	}, []string{"namespace", "activation", "module", "code"})
	phaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "iteron", Name: "phase_duration_seconds",
		Help:    "Time from the previous durable phase record (or the transaction start) to this one; code is the phase.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"namespace", "activation", "module", "code"})
	activeGenerations = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "iteron", Name: "active_generations",
		Help: "Active generations (1 per module that serves), by activation.",
	}, []string{"namespace", "activation"})
	renewalsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "iteron", Name: "renewals_total",
		Help: "Committed renewals: a generation moved into a fresh process before a per-process bound.",
	}, []string{"namespace", "activation", "module"})
	crashesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "iteron", Name: "provider_crashes_total",
		Help: "Provider processes of Active generations that exited unasked.",
	}, []string{"namespace", "activation", "module"})
	ledgerAppends = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "iteron", Name: "ledger_appends_total",
		Help: "Durable ledger records appended.",
	}, []string{"namespace", "activation"})
	ledgerSync = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "iteron", Name: "ledger_fdatasync_seconds",
		Help:    "fdatasync latency of each ledger append.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"namespace", "activation"})
)

// Collectors are the coordinator's metrics, for the manager to register
// (controller-runtime's registry).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{transactionsTotal, phaseDuration, activeGenerations, renewalsTotal, crashesTotal, ledgerAppends, ledgerSync, illegalPhaseEdges}
}

func (a *activationRuntime) observeSync(d time.Duration) {
	ledgerSync.WithLabelValues(a.key.Namespace, a.key.Name).Observe(d.Seconds())
}

func (a *activationRuntime) countAppend() {
	ledgerAppends.WithLabelValues(a.key.Namespace, a.key.Name).Inc()
}

func (a *activationRuntime) observePhase(module, phase string, d time.Duration) {
	phaseDuration.WithLabelValues(a.key.Namespace, a.key.Name, module, phase).Observe(d.Seconds())
}

func (a *activationRuntime) countTransaction(module, code string) {
	transactionsTotal.WithLabelValues(a.key.Namespace, a.key.Name, module, code).Inc()
}

func (a *activationRuntime) countRenewal(module string) {
	renewalsTotal.WithLabelValues(a.key.Namespace, a.key.Name, module).Inc()
}

func (a *activationRuntime) countCrash(module string) {
	crashesTotal.WithLabelValues(a.key.Namespace, a.key.Name, module).Inc()
}

// setActiveGauge updates the active-generation gauge. Caller holds a.mu.
func (a *activationRuntime) setActiveGauge() {
	n := 0
	for _, m := range a.modules {
		if m.active != nil && m.active.phase == "Active" && m.active.proc != nil {
			n++
		}
	}
	activeGenerations.WithLabelValues(a.key.Namespace, a.key.Name).Set(float64(n))
}

// forgetMetrics drops an activation's series once it is gone.
func (a *activationRuntime) forgetMetrics() {
	labels := prometheus.Labels{"namespace": a.key.Namespace, "activation": a.key.Name}
	for _, vec := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{transactionsTotal, phaseDuration, activeGenerations, renewalsTotal, crashesTotal, ledgerAppends, ledgerSync} {
		vec.DeletePartialMatch(labels)
	}
}
