package hotswap

import (
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// PhaseEdge is one legal change of a Generation's phase, and why the
// coordinator takes it.
type PhaseEdge struct {
	// From and To are the phases before and after.
	From, To iteronv1.ModulePhase
	// Why is when the coordinator takes the edge.
	Why string
}

// PhaseEdges is the one table of the legal changes of a Generation's phase
// (docs/concepts.md, "Generation lifecycle"): the lifecycle Inactive →
// Preparing → Active → Draining → Inactive, Failed from any live phase, and
// the edges the coordinator takes on purpose. A generation is created
// Preparing (for a transaction) or, recovered from the ledger without a
// process for its retirement, Inactive; setting the phase it already has
// is no change. Every other change is a bug, reported by setPhase.
var PhaseEdges = []PhaseEdge{
	{iteronv1.PhasePreparing, iteronv1.PhaseActive, "its transaction switched to it: a first activation, a swap, a relaunch or a re-attach after a restart"},
	{iteronv1.PhaseActive, iteronv1.PhaseDraining, "a swap switched to its successor, or its module's retirement quiesces it"},
	{iteronv1.PhaseDraining, iteronv1.PhaseInactive, "drained: its process was stopped (or had none)"},
	{iteronv1.PhasePreparing, iteronv1.PhaseFailed, "its transaction failed, or its relaunch failed past the crash budget or was refused"},
	{iteronv1.PhaseActive, iteronv1.PhaseFailed, "its process crashed past the crash budget"},
	{iteronv1.PhaseDraining, iteronv1.PhaseFailed, "a post-switch rollback could not bring it back (rollback_failed)"},
	{iteronv1.PhaseActive, iteronv1.PhasePreparing, "crash relaunch: its process exited, its survivor went away, or a renewal or relaunch waits for the ledger"},
	{iteronv1.PhaseDraining, iteronv1.PhaseActive, "a post-switch rollback returned to it, or its retirement could not be recorded and it keeps serving"},
	{iteronv1.PhaseInactive, iteronv1.PhaseActive, "a post-switch rollback after the drain stopped it: relaunched from its rollback snapshot"},
	{iteronv1.PhaseInactive, iteronv1.PhaseFailed, "a post-switch rollback after the drain could not relaunch it (rollback_failed)"},
	{iteronv1.PhaseInactive, iteronv1.PhaseDraining, "the retirement of a generation recovered from the ledger without a process (its module left the spec while no manager ran)"},
	{iteronv1.PhasePreparing, iteronv1.PhaseDraining, "a swap to its successor, or its module's retirement, while it waits for a relaunch"},
	{iteronv1.PhaseFailed, iteronv1.PhaseDraining, "a swap to its successor, or its module's retirement, after it failed"},
	{iteronv1.PhaseFailed, iteronv1.PhasePreparing, "a relaunch refused for a reason that does not pass by itself is tried again: a new spec or a retry request"},
}

// LegalPhaseEdge reports whether a Generation's phase may change from from
// to to, and why the coordinator takes that edge. The same phase is no
// change and always legal.
func LegalPhaseEdge(from, to iteronv1.ModulePhase) (string, bool) {
	if from == to {
		return "no change", true
	}
	for _, e := range PhaseEdges {
		if e.From == from && e.To == to {
			return e.Why, true
		}
	}
	return "", false
}

// illegalPhaseEdges counts phase changes outside PhaseEdges. It is not per
// activation (and not forgotten with one): a non-zero value is a bug of the
// coordinator, whichever activation showed it.
var illegalPhaseEdges = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "iteron", Name: "generation_illegal_phase_transitions_total",
	Help: "Generation phase changes outside the coordinator's table of legal edges (a bug: the log names the generation); from and to are the phases.",
}, []string{"from", "to"})

// setPhase changes g's phase. An edge outside PhaseEdges is a bug: it is
// logged as an error naming the generation and both phases and counted in
// iteron_generation_illegal_phase_transitions_total, and the change is
// still made — the rest of the coordinator's state (process, route,
// active generation) has moved already, so refusing only the phase would
// make the status lie about what runs. Caller holds a.mu.
func (a *activationRuntime) setPhase(g *generationRuntime, to iteronv1.ModulePhase) {
	if _, ok := LegalPhaseEdge(g.phase, to); !ok {
		reportIllegalPhaseEdge(a.c.cfg.Log, a.key, g.name, g.phase, to)
	}
	g.phase = to
}

// reportIllegalPhaseEdge logs and counts an illegal phase change.
func reportIllegalPhaseEdge(log logr.Logger, key ActivationKey, generation string, from, to iteronv1.ModulePhase) {
	illegalPhaseEdges.WithLabelValues(string(from), string(to)).Inc()
	log.Error(nil, "illegal generation phase transition (a coordinator bug): the change is made, and counted in iteron_generation_illegal_phase_transitions_total",
		"namespace", key.Namespace, "activation", key.Name, "generation", generation, "from", string(from), "to", string(to))
}
