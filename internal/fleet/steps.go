package fleet

import (
	"fmt"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// step is a step of the rollout as the planner reads it: spec.strategy.steps,
// or the canary as one wave step.
type step struct {
	// pause is set for a pause step.
	pause *iteronv1.PauseStep
	// nodes and percent bound a wave (0: not that way); selector narrows
	// it to a cohort (nil: every node).
	nodes, percent int
	selector       labels.Selector
	soak           time.Duration
	// wave is a wave step's wave number.
	wave int32
	// canary: this is spec.strategy.canary (its soak is recorded in
	// status.soakedRevision, as it always was).
	canary bool
}

// stepsOf reads a strategy's steps. A selector that does not parse is an
// error (ValidateStrategy reports it before Compute is called).
func stepsOf(st *iteronv1.RolloutStrategy) ([]step, error) {
	if c := st.Canary; c != nil {
		return []step{{nodes: int(max(c.Nodes, 1)), soak: time.Duration(soakSeconds(c)) * time.Second, wave: 1, canary: true}}, nil
	}
	out := make([]step, 0, len(st.Steps))
	var wave int32
	for i, s := range st.Steps {
		switch {
		case s.Pause != nil:
			out = append(out, step{pause: s.Pause})
		case s.Wave != nil:
			wave++
			ws := step{nodes: int(ptr.Deref(s.Wave.Nodes, 0)), percent: int(ptr.Deref(s.Wave.Percent, 0)),
				soak: time.Duration(ptr.Deref(s.Wave.SoakSeconds, 0)) * time.Second, wave: wave}
			if s.Wave.Selector != nil {
				sel, err := metav1.LabelSelectorAsSelector(s.Wave.Selector)
				if err != nil {
					return nil, fmt.Errorf("spec.strategy.steps[%d].wave.selector: %w", i, err)
				}
				ws.selector = sel
			}
			out = append(out, ws)
		default:
			return nil, fmt.Errorf("spec.strategy.steps[%d]: a step is either a wave or a pause", i)
		}
	}
	return out, nil
}

// ValidateStrategy reports what in a set's strategy cannot be acted on
// that the schema does not catch (a label selector that does not parse),
// naming the field.
func ValidateStrategy(st *iteronv1.RolloutStrategy) error {
	_, err := stepsOf(st)
	return err
}

// lastWave is the wave number of the last wave step (0: none).
func lastWave(steps []step) int32 {
	var w int32
	for _, s := range steps {
		w = max(w, s.wave)
	}
	return w
}

// matches reports whether a node is in a wave step's cohort.
func (p *planner) matches(s *step, node string) bool {
	if s.selector == nil {
		return true
	}
	return s.selector.Matches(labels.Set(p.in.NodeLabels[node]))
}

// target is how many nodes a wave step moves: its count, or its percentage
// of the selected nodes in its cohort (rounded up); every node of its
// cohort when neither is given.
func (p *planner) target(s *step) int {
	switch {
	case s.nodes > 0:
		return s.nodes
	case s.percent > 0:
		n := 0
		for _, m := range p.all {
			if p.matches(s, m.node) {
				n++
			}
		}
		return max(1, int(math.Ceil(float64(n)*float64(s.percent)/100)))
	}
	return math.MaxInt
}

// describe names a step for messages.
func (s *step) describe(k int) string {
	switch {
	case s.pause != nil && s.pause.DurationSeconds != nil:
		return fmt.Sprintf("step %d (pause %ds)", k, *s.pause.DurationSeconds)
	case s.pause != nil:
		return fmt.Sprintf("step %d (pause)", k)
	case s.canary:
		return fmt.Sprintf("wave %d (canary)", s.wave)
	}
	what := ""
	switch {
	case s.nodes > 0:
		what = fmt.Sprintf("%d nodes", s.nodes)
	case s.percent > 0:
		what = fmt.Sprintf("%d%%", s.percent)
	}
	if s.selector != nil {
		if what != "" {
			what += " of "
		}
		what += "cohort " + s.selector.String()
	}
	return fmt.Sprintf("wave %d (step %d: %s)", s.wave, k, what)
}
