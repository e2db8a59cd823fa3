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
// is no change. Every other change is a bug, refused by setPhase.
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

// illegalPhaseEdges counts phase changes outside PhaseEdges, by edge
// ("Active->Inactive"). It is not per activation (and not forgotten with
// one): a non-zero value is a bug of the coordinator, whichever activation
// showed it.
var illegalPhaseEdges = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "iteron", Name: "generation_illegal_transitions_total",
	Help: "Generation phase changes outside the coordinator's table of legal edges, refused (a bug: the log names the generation); edge is from->to.",
}, []string{"edge"})

// phaseEdgeLabel names an edge for the metric: "from->to", "(none)" for a
// generation that had no phase yet.
func phaseEdgeLabel(from, to iteronv1.ModulePhase) string {
	name := func(p iteronv1.ModulePhase) string {
		if p == "" {
			return "(none)"
		}
		return string(p)
	}
	return name(from) + "->" + name(to)
}

// setPhase changes g's phase and reports whether it did. An edge outside
// PhaseEdges is refused: the phase stays as it was (a status never shows a
// transition the lifecycle does not have), and the refusal is logged as an
// error naming the generation and both phases and counted in
// iteron_generation_illegal_transitions_total. Caller holds a.mu.
func (a *activationRuntime) setPhase(g *generationRuntime, to iteronv1.ModulePhase) bool {
	if _, ok := LegalPhaseEdge(g.phase, to); !ok {
		reportIllegalPhaseEdge(a.c.cfg.Log, a.key, g.name, g.phase, to)
		return false
	}
	g.phase = to
	return true
}

// reportIllegalPhaseEdge logs and counts a refused phase change.
func reportIllegalPhaseEdge(log logr.Logger, key ActivationKey, generation string, from, to iteronv1.ModulePhase) {
	illegalPhaseEdges.WithLabelValues(phaseEdgeLabel(from, to)).Inc()
	log.Error(nil, "illegal generation phase transition refused (a coordinator bug): the phase is kept, and the refusal counted in iteron_generation_illegal_transitions_total",
		"namespace", key.Namespace, "activation", key.Name, "generation", generation, "from", string(from), "to", string(to))
}
