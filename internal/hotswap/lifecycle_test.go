package hotswap

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// phaseRecorder is an activation runtime whose log lines are kept, for
// setPhase alone (no process, no ledger).
func phaseRecorder() (*activationRuntime, *[]string) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, args)
		mu.Unlock()
	}, funcr.Options{})
	a := &activationRuntime{c: &Coordinator{cfg: Config{Log: log}}, key: ActivationKey{Namespace: "team", Name: "stack"}}
	return a, &lines
}

// TestIllegalPhaseEdgesAreRefusedAndReported: one row per change of a
// Generation's phase that PhaseEdges does not allow. The coordinator
// refuses it (the phase stays) and reports it: an error log naming the
// generation and both phases, and the illegal-transition counter labelled
// by the edge.
func TestIllegalPhaseEdgesAreRefusedAndReported(t *testing.T) {
	tests := []struct {
		name     string
		from, to iteronv1.ModulePhase
	}{
		{"an Inactive generation never goes back to Preparing (a new attempt is a new generation)", iteronv1.PhaseInactive, iteronv1.PhasePreparing},
		{"a Preparing generation never becomes Inactive without being drained (its transaction fails it)", iteronv1.PhasePreparing, iteronv1.PhaseInactive},
		{"an Active generation never becomes Inactive without Draining first", iteronv1.PhaseActive, iteronv1.PhaseInactive},
		{"a Draining generation is never relaunched as Preparing (a rollback makes it Active)", iteronv1.PhaseDraining, iteronv1.PhasePreparing},
		{"a Failed generation never becomes Inactive except through a retirement's drain", iteronv1.PhaseFailed, iteronv1.PhaseInactive},
		{"a Failed generation never becomes Active without a relaunch (Preparing) first", iteronv1.PhaseFailed, iteronv1.PhaseActive},
		{"a generation that never had a phase never becomes Active (it is created Preparing)", "", iteronv1.PhaseActive},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := LegalPhaseEdge(tc.from, tc.to); ok {
				t.Fatalf("%q → %q is in the table of legal edges", tc.from, tc.to)
			}
			a, lines := phaseRecorder()
			g := &generationRuntime{name: "stack-prompt-system-g3-1", phase: tc.from}
			edge := phaseEdgeLabel(tc.from, tc.to)
			counter := illegalPhaseEdges.WithLabelValues(edge)
			before := testutil.ToFloat64(counter)
			if a.setPhase(g, tc.to) {
				t.Errorf("setPhase reported the illegal change %s as made", edge)
			}
			if g.phase != tc.from {
				t.Errorf("phase = %q, want %q kept: an illegal change is refused", g.phase, tc.from)
			}
			if got := testutil.ToFloat64(counter) - before; got != 1 {
				t.Errorf("iteron_generation_illegal_transitions_total{edge=%q} rose by %v, want 1", edge, got)
			}
			if len(*lines) != 1 {
				t.Fatalf("log lines %q, want one", *lines)
			}
			for _, want := range []string{`"illegal generation phase transition`, `"generation"="stack-prompt-system-g3-1"`, `"from"="` + string(tc.from) + `"`, `"to"="` + string(tc.to) + `"`, `"activation"="stack"`} {
				if !strings.Contains((*lines)[0], want) {
					t.Errorf("log line %q does not say %s", (*lines)[0], want)
				}
			}
		})
	}
}

// TestLegalPhaseEdgesAreSilent: every edge of the table, and every phase
// set to itself, changes the phase without a report.
func TestLegalPhaseEdgesAreSilent(t *testing.T) {
	edges := append([]PhaseEdge{}, PhaseEdges...)
	for _, p := range []iteronv1.ModulePhase{iteronv1.PhaseInactive, iteronv1.PhasePreparing, iteronv1.PhaseActive, iteronv1.PhaseDraining, iteronv1.PhaseFailed} {
		edges = append(edges, PhaseEdge{From: p, To: p, Why: "no change"})
	}
	for _, e := range edges {
		a, lines := phaseRecorder()
		g := &generationRuntime{name: "g", phase: e.From}
		before := testutil.ToFloat64(illegalPhaseEdges.WithLabelValues(phaseEdgeLabel(e.From, e.To)))
		made := a.setPhase(g, e.To)
		if !made || g.phase != e.To || len(*lines) != 0 || testutil.ToFloat64(illegalPhaseEdges.WithLabelValues(phaseEdgeLabel(e.From, e.To))) != before {
			t.Errorf("legal edge %s → %s (%s): phase %q, log %q", e.From, e.To, e.Why, g.phase, *lines)
		}
	}
}

// TestThePhaseTableCoversTheLifecycle: the seed's lifecycle and Failed
// from every live phase are in the table, and every edge says why.
func TestThePhaseTableCoversTheLifecycle(t *testing.T) {
	must := [][2]iteronv1.ModulePhase{
		{iteronv1.PhasePreparing, iteronv1.PhaseActive}, {iteronv1.PhaseActive, iteronv1.PhaseDraining}, {iteronv1.PhaseDraining, iteronv1.PhaseInactive},
		{iteronv1.PhasePreparing, iteronv1.PhaseFailed}, {iteronv1.PhaseActive, iteronv1.PhaseFailed}, {iteronv1.PhaseDraining, iteronv1.PhaseFailed},
		{iteronv1.PhaseActive, iteronv1.PhasePreparing}, {iteronv1.PhaseDraining, iteronv1.PhaseActive},
	}
	for _, e := range must {
		if _, ok := LegalPhaseEdge(e[0], e[1]); !ok {
			t.Errorf("%s → %s is missing", e[0], e[1])
		}
	}
	seen := map[[2]iteronv1.ModulePhase]bool{}
	for _, e := range PhaseEdges {
		if e.Why == "" || e.From == e.To || seen[[2]iteronv1.ModulePhase{e.From, e.To}] {
			t.Errorf("edge %+v: empty reason, self edge or listed twice", e)
		}
		seen[[2]iteronv1.ModulePhase{e.From, e.To}] = true
	}
}

// illegalEdgeTotal is the illegal-transition counter summed over its
// labels.
func illegalEdgeTotal(t *testing.T) float64 {
	ch := make(chan prometheus.Metric, 64)
	illegalPhaseEdges.Collect(ch)
	close(ch)
	sum := 0.0
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		sum += d.GetCounter().GetValue()
	}
	return sum
}

// failOnIllegalPhaseEdges fails t when the coordinator reports an illegal
// phase edge while t runs (its shutdown included): every coordinator test
// (faults, rollbacks, renewals, restarts) checks the table too.
func failOnIllegalPhaseEdges(t *testing.T) {
	before := illegalEdgeTotal(t)
	t.Cleanup(func() {
		if n := illegalEdgeTotal(t) - before; n != 0 {
			t.Errorf("the coordinator took %v illegal generation phase transition(s): the log says which", n)
		}
	})
}
