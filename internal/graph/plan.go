package graph

import (
	"slices"

	"iteron.dev/operator/api/v1alpha1"
)

// RuntimePlan is what applying a new activation over an old one does, module
// by module. Added, Removed, Reloaded, Unchanged and Blocked are in ModuleId
// order (Removed in the old activation's); transactions run one at a time in
// ActivateOrder, retirements in DrainOrder.
type RuntimePlan struct {
	// Added modules are admitted now and were not before: first activation.
	Added []string `json:"added"`
	// Removed modules were admitted before and have no source now: retired.
	Removed []string `json:"removed"`
	// Reloaded modules are admitted in both with different epochs: swapped.
	Reloaded []string `json:"reloaded"`
	// Unchanged modules have equal epochs: they keep their process.
	Unchanged []string `json:"unchanged"`
	// Blocked modules have a source now that is not admitted (it failed
	// verification or its dependencies): no transaction runs for them, and a
	// generation that serves them keeps serving. Their status says why.
	Blocked []string `json:"blocked"`
	// ActivateOrder is Added ∪ Reloaded in the new activation order.
	ActivateOrder []string `json:"activateOrder"`
	// DrainOrder is Removed in the old drain order (consumers first).
	DrainOrder []string `json:"drainOrder"`
}

// Plan compares an old evaluation (nil: nothing active) with a new one. Only
// admitted modules take part: a module's epoch decides Reloaded versus
// Unchanged.
func Plan(old, next *Evaluation) RuntimePlan {
	if old == nil {
		old = &Evaluation{}
	}
	if next == nil {
		next = &Evaluation{}
	}
	oldEpochs := map[string]string{}
	for _, s := range old.Modules {
		if s.Admitted {
			oldEpochs[s.Module] = s.Epoch
		}
	}
	p := RuntimePlan{
		Added: []string{}, Removed: []string{}, Reloaded: []string{}, Unchanged: []string{},
		Blocked: []string{}, ActivateOrder: []string{}, DrainOrder: []string{},
	}
	present := map[string]bool{}
	for _, s := range next.Modules {
		present[s.Module] = true
		epoch, was := oldEpochs[s.Module]
		switch {
		case !s.Admitted:
			p.Blocked = append(p.Blocked, s.Module)
		case !was:
			p.Added = append(p.Added, s.Module)
		case epoch != s.Epoch:
			p.Reloaded = append(p.Reloaded, s.Module)
		default:
			p.Unchanged = append(p.Unchanged, s.Module)
		}
	}
	for _, s := range old.Modules {
		if s.Admitted && !present[s.Module] {
			p.Removed = append(p.Removed, s.Module)
		}
	}
	for _, m := range next.ActivateOrder {
		if slices.Contains(p.Added, m) || slices.Contains(p.Reloaded, m) {
			p.ActivateOrder = append(p.ActivateOrder, m)
		}
	}
	for _, m := range old.DrainOrder {
		if slices.Contains(p.Removed, m) {
			p.DrainOrder = append(p.DrainOrder, m)
		}
	}
	return p
}

// Empty reports a no-op plan: nothing to add, remove or reload.
func (p RuntimePlan) Empty() bool {
	return len(p.Added) == 0 && len(p.Removed) == 0 && len(p.Reloaded) == 0
}

// Status is the plan as the activation's status.plan shows it. PlanStatus
// has no Blocked list: a blocked module's reason is in its module status.
func (p RuntimePlan) Status() v1alpha1.PlanStatus {
	return v1alpha1.PlanStatus{
		Added: slices.Clone(p.Added), Removed: slices.Clone(p.Removed), Reloaded: slices.Clone(p.Reloaded),
		Unchanged: slices.Clone(p.Unchanged), ActivateOrder: slices.Clone(p.ActivateOrder), DrainOrder: slices.Clone(p.DrainOrder),
	}
}
