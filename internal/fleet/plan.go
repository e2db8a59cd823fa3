package fleet

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Bounds of the status lists.
const (
	maxFailed    = 16
	maxConflicts = 16
	maxWaveNodes = 32
	maxHaltNodes = 16
	// maxNodeMessage bounds a failed node's or a conflict's message.
	maxNodeMessage = 512
)

// ActionKind is what an action does to one node's activation.
type ActionKind string

// Action kinds.
const (
	// Create stamps a new activation for a node.
	Create ActionKind = "Create"
	// Move changes a node to another revision (a wave, or a revert).
	Move ActionKind = "Move"
	// Restore sets a hand-edited activation back to its revision's spec.
	Restore ActionKind = "Restore"
	// Retry sets the activation's iteron.dev/retry annotation.
	Retry ActionKind = "Retry"
	// Delete deletes an activation whose node is no longer selected.
	Delete ActionKind = "Delete"
)

// Action is one change to one node's activation.
type Action struct {
	Kind ActionKind
	// Node and Activation (its name).
	Node, Activation string
	// Revision is the revision the activation is stamped from after the
	// action (Create, Move, Restore).
	Revision *Revision
	// Wave is its iteron.dev/wave annotation after a Create or Move.
	Wave int32
	// RevertedFrom is its iteron.dev/reverted-from annotation after a
	// Create, Move or Restore ("" removes it).
	RevertedFrom string
	// Discard stamps the spec with stateDisposition Discard.
	Discard bool
	// Retry is the iteron.dev/retry value of a Retry action.
	Retry string
	// Why says why, for events and logs.
	Why string
	// Traceparent, when set, is the W3C traceparent of the node's span in
	// the rollout's trace: a Create, Move or Restore writes it as the
	// activation's iteron.dev/traceparent in the stamp's own request.
	// Compute never sets it: the reconciler does (RolloutTraces.Stamp), so
	// that the plan stays a function of its input.
	Traceparent string
}

// Input is everything one reconcile decides from.
type Input struct {
	// Set is the ActivationSet as read (status included: the stable
	// revision, a halt and a soak are read back from it).
	Set *iteronv1.ActivationSet
	// Nodes are the names of the nodes the selector matches.
	Nodes []string
	// NodeLabels are their labels, by name (cohort steps read them; not
	// copied, never written through).
	NodeLabels map[string]map[string]string
	// Activations are the set's own activations and any other activation
	// holding one of its stamped names.
	Activations []Activation
	// Update is the revision of spec.template.
	Update Revision
	// Revisions are the set's revisions by name (Update among them).
	Revisions map[string]Revision
	// Now is the clock.
	Now time.Time
	// Name is ActivationName unless a test gives another.
	Name func(set, node string) string
	// Measured are the measurements this reconcile made for the
	// Plan.Measure of a Compute of the same input: they are recorded in
	// their runs.
	Measured []Measured
}

// Plan is what one reconcile does and reports.
type Plan struct {
	// Actions, in the order to carry them out.
	Actions []Action
	// Status is the set's new status, but for conditions and
	// observedGeneration (Conditions and AtRest say those).
	Status iteronv1.ActivationSetStatus
	// Message explains the phase in a sentence (the conditions' message).
	Message string
	// RequeueAfter, when set, is when time alone changes the plan (the
	// end of a soak, a measurement due).
	RequeueAfter time.Duration
	// Measure are the analysis measurements due now. The reconciler makes
	// them and computes again with their results in Input.Measured; a
	// Compute given the results asks for none of them again.
	Measure []MeasureRequest
}

// member is a selected node that has (or gets) a stamped activation.
type member struct {
	node, name string
	act        *Activation
	rev        *Revision // nil: none, or a revision the set no longer has
	ready      bool
	stalled    *metav1.Condition
	// wave is its iteron.dev/wave after this plan's actions.
	wave int32
	// moved: an action of this plan changes its spec.
	moved bool
}

// onRevision reports whether the member is on r.
func (m *member) onRevision(r *Revision) bool { return m.rev != nil && m.rev.Name == r.Name }

// Compute decides one reconcile of a set.
func Compute(in Input) Plan {
	set := in.Set
	spec, prev := &set.Spec, &set.Status
	p := &planner{in: in, update: &in.Update}
	p.status = iteronv1.ActivationSetStatus{
		UpdateRevision:       in.Update.Name,
		CollisionCount:       prev.CollisionCount,
		LastHandledResumeAt:  prev.LastHandledResumeAt,
		LastHandledPromoteAt: prev.LastHandledPromoteAt,
		LastHandledAbortAt:   prev.LastHandledAbortAt,
		SoakedRevision:       prev.SoakedRevision,
		Halt:                 prev.Halt.DeepCopy(),
	}
	for i := range prev.AnalysisRuns {
		p.status.AnalysisRuns = append(p.status.AnalysisRuns, *prev.AnalysisRuns[i].DeepCopy())
	}
	if prev.UpdateRevision == in.Update.Name {
		p.status.SoakStartedAt = prev.SoakStartedAt.DeepCopy()
		p.status.Step, p.status.StepStartedAt = prev.Step, prev.StepStartedAt.DeepCopy()
	}
	p.members()
	p.deletes()
	p.current = p.stableRevision()
	p.status.CurrentRevision = p.current.Name
	p.observe()
	p.resume()
	p.abort()
	p.failures()

	maxUnavailable := resolveMaxUnavailable(spec.Strategy.MaxUnavailable, len(in.Nodes))
	if !p.stopped(maxUnavailable) {
		switch {
		case p.complete() && p.finalSettled():
			p.finish()
		case spec.Paused:
			p.phase(iteronv1.RolloutPaused, fmt.Sprintf("spec.paused is true: no node is moved (%d of %d nodes on revision %s)", p.countOn(p.update), len(p.all), p.update.Name))
		default:
			p.rollout(maxUnavailable)
		}
	}
	// A promotion that found no pause step to release is handled all the
	// same: it never releases a later one.
	if want := set.Annotations[iteronv1.AnnotationPromote]; want != "" {
		p.status.LastHandledPromoteAt = want
	}
	if p.current.Name == p.update.Name {
		p.status.Step, p.status.StepStartedAt = 0, nil
	}
	p.counts()
	return Plan{Actions: p.actions, Status: p.status, Message: p.message, RequeueAfter: p.requeue, Measure: p.measure}
}

// stopped carries out a halt, if there is one: a revert moves nodes back,
// a halt leaves them.
func (p *planner) stopped(maxUnavailable int) bool {
	switch h := p.status.Halt; {
	case h != nil && h.Action == iteronv1.FailurePolicyRevert:
		p.revert(maxUnavailable)
	case h != nil:
		p.phase(iteronv1.RolloutHalted, fmt.Sprintf("the rollout of revision %s halted: %s; nodes not reached keep their revision (kubectl iteron rollout status %s; resume or undo)", h.Revision, h.Message, p.in.Set.Name))
	default:
		return false
	}
	return true
}

// finish completes the rollout: the update revision becomes the stable
// one.
func (p *planner) finish() {
	p.status.CurrentRevision = p.update.Name
	p.current = p.update
	p.status.SoakStartedAt = nil
	p.phase(iteronv1.RolloutCompleted, fmt.Sprintf("all %d nodes Ready on revision %s", len(p.all), p.update.Name))
}

type planner struct {
	in     Input
	status iteronv1.ActivationSetStatus
	// all are the selected nodes with a stamped activation (or one being
	// created), by node name.
	all     []*member
	byName  map[string]*Activation
	update  *Revision
	current *Revision
	actions []Action
	message string
	requeue time.Duration
	measure []MeasureRequest
}

func (p *planner) act(a Action) { p.actions = append(p.actions, a) }

func (p *planner) phase(ph iteronv1.RolloutPhase, msg string) {
	p.status.Phase, p.message = ph, msg
}

func (p *planner) name() func(string, string) string {
	if p.in.Name != nil {
		return p.in.Name
	}
	return ActivationName
}

// members pairs each selected node with its stamped name and activation,
// and reports the nodes that cannot have one.
func (p *planner) members() {
	set := p.in.Set
	p.byName = map[string]*Activation{}
	for i := range p.in.Activations {
		a := &p.in.Activations[i]
		if prior, ok := p.byName[a.Name]; !ok || !prior.Owned && a.Owned {
			p.byName[a.Name] = a
		}
	}
	names, collisions := AssignNames(set.Name, p.in.Nodes, p.name())
	var conflicts []iteronv1.NodeConflict
	for _, c := range collisions {
		conflicts = append(conflicts, iteronv1.NodeConflict{Node: c.Node, Activation: c.Name, Reason: iteronv1.ConflictNameCollision,
			Message: fmt.Sprintf("node %s's stamped name %s is also node %s's, which keeps it (the first by node name); this node gets no activation", c.Node, c.Name, c.Holder)})
	}
	nodes := make([]string, 0, len(names))
	for node := range names {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		name := names[node]
		a := p.byName[name]
		switch {
		case a != nil && !a.Owned:
			conflicts = append(conflicts, iteronv1.NodeConflict{Node: node, Activation: name, Reason: iteronv1.ConflictNotOwned,
				Message: fmt.Sprintf("an ImplementationActivation named %s exists (for node %s) and this set did not stamp it: it is not adopted or changed; delete or rename it to let the set stamp this node", name, a.Node)})
			continue
		case a != nil && a.Node != node:
			conflicts = append(conflicts, iteronv1.NodeConflict{Node: node, Activation: name, Reason: iteronv1.ConflictNameCollision,
				Message: fmt.Sprintf("the set's activation %s is node %s's; it is deleted first (that node is no longer selected)", name, a.Node)})
			continue
		}
		p.all = append(p.all, &member{node: node, name: name, act: a})
	}
	sort.Slice(conflicts, func(i, j int) bool { return conflicts[i].Node < conflicts[j].Node })
	if len(conflicts) > maxConflicts {
		conflicts = conflicts[:maxConflicts]
	}
	p.status.Conflicts = conflicts
}

// deletes deletes the set's activations that no selected node keeps.
func (p *planner) deletes() {
	keep := map[string]bool{}
	for _, m := range p.all {
		keep[m.name] = true
	}
	var gone []Activation
	for _, a := range p.in.Activations {
		if a.Owned && !a.Deleting && !keep[a.Name] {
			gone = append(gone, a)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].Name < gone[j].Name })
	for _, a := range gone {
		p.act(Action{Kind: Delete, Node: a.Node, Activation: a.Name, Why: fmt.Sprintf("node %s is no longer selected (or no longer exists)", a.Node)})
	}
}

// stableRevision is the revision new nodes get and a revert goes back to:
// status.currentRevision, or (when the status lost it) the revision most
// nodes are on besides the update, or the update when none is.
func (p *planner) stableRevision() *Revision {
	if r, ok := p.in.Revisions[p.in.Set.Status.CurrentRevision]; ok {
		return &r
	}
	count := map[string]int{}
	for _, m := range p.all {
		if m.act != nil {
			if r, ok := p.revisionByHash(m.act.Revision); ok && r.Name != p.update.Name {
				count[r.Name]++
			}
		}
	}
	var best *Revision
	for name, n := range count {
		r := p.in.Revisions[name]
		if best == nil || n > count[best.Name] || n == count[best.Name] && r.Number > best.Number {
			best = &r
		}
	}
	if best == nil {
		return p.update
	}
	return best
}

func (p *planner) revisionByHash(hash string) (Revision, bool) {
	if hash == "" {
		return Revision{}, false
	}
	r, ok := p.in.Revisions[RevisionName(p.in.Set.Name, hash)]
	return r, ok && r.Hash == hash
}

// observe reads each member's revision, readiness and failure, creates the
// missing activations on the stable revision and sets hand edits back.
func (p *planner) observe() {
	discardOnRevert := p.in.Set.Spec.Strategy.RevertStateDisposition == iteronv1.StateDispositionDiscard
	for _, m := range p.all {
		if m.act == nil {
			m.rev, m.moved = p.current, true
			p.act(Action{Kind: Create, Node: m.node, Activation: m.name, Revision: p.current,
				Why: fmt.Sprintf("node %s is selected: it gets the stable revision %s", m.node, p.current.Name)})
			continue
		}
		if m.act.Deleting {
			continue // not Ready; re-created once its finalizer let it go
		}
		if r, ok := p.revisionByHash(m.act.Revision); ok {
			m.rev = &r
		}
		m.ready, m.stalled, m.wave = m.act.Ready, m.act.Stalled, m.act.Wave
		if m.rev == nil {
			continue // an unknown revision: the rollout moves it
		}
		discard := m.act.RevertedFrom != "" && discardOnRevert
		if !Stamped(m.act.Spec, m.rev.Template, m.node, discard) {
			m.ready, m.stalled, m.moved = false, nil, true
			p.act(Action{Kind: Restore, Node: m.node, Activation: m.name, Revision: m.rev, Wave: m.act.Wave, RevertedFrom: m.act.RevertedFrom, Discard: discard,
				Why: fmt.Sprintf("activation %s differs from revision %s: set back", m.name, m.rev.Name)})
		}
	}
}

// resume handles iteron.dev/resume and a template that changed since a
// halt: either lifts the halt; a resume also retries the Stalled nodes.
func (p *planner) resume() {
	set := p.in.Set
	if h := p.status.Halt; h != nil && h.Revision != p.update.Name {
		p.status.Halt = nil
	}
	want := set.Annotations[iteronv1.AnnotationResume]
	if want == "" || want == set.Status.LastHandledResumeAt {
		return
	}
	p.status.LastHandledResumeAt = want
	p.status.Halt = nil
	// The failed analysis runs of the update revision are measured again.
	runs := p.status.AnalysisRuns[:0]
	for _, r := range p.status.AnalysisRuns {
		if r.Revision != p.update.Name || r.Phase != iteronv1.AnalysisFailed && r.Phase != iteronv1.AnalysisError {
			runs = append(runs, r)
		}
	}
	p.status.AnalysisRuns = runs
	for _, m := range p.all {
		if m.stalled != nil && !m.moved && m.act.Retry != want {
			m.stalled = nil
			p.act(Action{Kind: Retry, Node: m.node, Activation: m.name, Retry: want, Why: fmt.Sprintf("the rollout was resumed (%s=%s): node %s's failed swap is retried", iteronv1.AnnotationResume, want, m.node)})
		}
	}
}

// failures lists the Stalled nodes and halts the rollout when one of them
// is on the update revision.
func (p *planner) failures() {
	var failed []iteronv1.FailedNode
	var onUpdate []*member
	for _, m := range p.all {
		if m.stalled == nil {
			continue
		}
		rev := ""
		if m.rev != nil {
			rev = m.rev.Name
		}
		failed = append(failed, iteronv1.FailedNode{Node: m.node, Activation: m.name, Revision: rev, Reason: m.stalled.Reason, Message: truncate(m.stalled.Message, maxNodeMessage)})
		if m.onRevision(p.update) && p.update.Name != p.current.Name {
			onUpdate = append(onUpdate, m)
		}
	}
	p.status.FailedNodes = int32(len(failed))
	if len(failed) > maxFailed {
		failed = failed[:maxFailed]
	}
	p.status.Failed = failed
	if p.status.Halt != nil || len(onUpdate) == 0 {
		return
	}
	cause := iteronv1.HaltNodeFailed
	for _, m := range onUpdate {
		if m.stalled.Reason == iteronv1.ReasonProbeFailed {
			cause = iteronv1.HaltProbeFailed
		}
	}
	h := p.newHalt(cause)
	var why []string
	for _, m := range onUpdate {
		if len(h.Nodes) < maxHaltNodes {
			h.Nodes = append(h.Nodes, m.node)
		}
		why = append(why, fmt.Sprintf("node %s is Stalled (%s: %s)", m.node, m.stalled.Reason, m.stalled.Message))
	}
	h.Message = truncate(strings.Join(why, "; "), iteronv1.MaxMessageBytes)
	p.status.Halt = h
}

// complete reports whether every selected node is Ready on the update
// revision.
func (p *planner) complete() bool {
	for _, m := range p.all {
		if !m.onRevision(p.update) || !m.ready || m.moved {
			return false
		}
	}
	return true
}

func (p *planner) countOn(r *Revision) int {
	n := 0
	for _, m := range p.all {
		if m.onRevision(r) {
			n++
		}
	}
	return n
}

// notReady counts the members that are not Ready (or are being changed).
func (p *planner) notReady() int {
	n := 0
	for _, m := range p.all {
		if !m.ready || m.moved {
			n++
		}
	}
	return n
}

// move changes m to revision r.
func (p *planner) move(m *member, r *Revision, wave int32, revertedFrom string, discard bool, why string) {
	m.rev, m.wave, m.moved, m.ready, m.stalled = r, wave, true, false, nil
	p.act(Action{Kind: Move, Node: m.node, Activation: m.name, Revision: r, Wave: wave, RevertedFrom: revertedFrom, Discard: discard, Why: why})
}

// rollout moves the next wave, or waits for the current one, its soak and
// its analysis; at a pause step it waits for a promotion.
func (p *planner) rollout(maxUnavailable int) {
	set := p.in.Set
	var updated, pending []*member
	var wave int32
	for _, m := range p.all {
		if m.onRevision(p.update) {
			updated = append(updated, m)
			wave = max(wave, m.wave)
		} else if m.act != nil && !m.act.Deleting {
			pending = append(pending, m)
		}
	}
	// Nodes that are not Ready go first: moving them costs the budget
	// nothing. Then by node name.
	sort.SliceStable(pending, func(i, j int) bool { return !pending[i].ready && pending[j].ready })
	var waiting []string
	for _, m := range updated {
		if !m.ready || m.moved {
			waiting = append(waiting, m.node)
		}
	}
	if len(waiting) > 0 {
		p.status.SoakStartedAt = nil
		// An analysis that started goes on measuring while a node of its
		// wave is not Ready (a provider that crashes now and then flaps):
		// its metrics judge the wave all the same; only passing it waits.
		if p.analysisStarted(wave) {
			if _, failed, next := p.analyse(wave, p.waveNodes(wave)); failed != nil {
				p.haltForAnalysis(failed, wave, p.waveNodes(wave))
				p.stopped(maxUnavailable)
				return
			} else if next > 0 {
				p.requeue = next
			}
		}
		p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("wave %d of revision %s: waiting for %s to become Ready (%d of %d nodes updated)",
			wave, p.update.Name, list(waiting), len(updated), len(p.all)))
		return
	}
	steps, err := stepsOf(&set.Spec.Strategy)
	if err != nil {
		p.phase("", err.Error())
		return
	}
	if p.current.Name == p.update.Name {
		// No rollout is under way: nodes on a revision the set no longer
		// has are moved in waves of maxUnavailable.
		steps = nil
	}
	last := lastWave(steps)
	if len(pending) == 0 {
		// Every selected node is on the update revision: what is left is
		// to judge the last wave, and nodes still being created.
		if len(updated) == len(p.all) && wave > 0 && !p.settle(&step{wave: wave}, wave, maxUnavailable) {
			return
		}
		if p.status.Halt == nil && p.complete() {
			p.finish()
			return
		}
		p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("waiting for %d new nodes to become Ready on revision %s", p.notReady(), p.update.Name))
		return
	}
	budget := maxUnavailable - p.notReady()
	// moveWave moves up to size of candidates as wave w, within the budget
	// (a node that is not Ready already costs nothing).
	moveWave := func(candidates []*member, size int, w int32, what string) {
		var moved []string
		for _, m := range candidates {
			if len(moved) == size {
				break
			}
			if m.ready {
				if budget <= 0 {
					break
				}
				budget--
			}
			p.move(m, p.update, w, "", false, fmt.Sprintf("%s of revision %s", what, p.update.Name))
			moved = append(moved, m.node)
		}
		if len(moved) == 0 {
			p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("%s of revision %s waits: %d nodes are not Ready and maxUnavailable is %d",
				what, p.update.Name, p.notReady(), maxUnavailable))
			return
		}
		p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("%s of revision %s: moving %s (%d of %d nodes updated)", what, p.update.Name, list(moved), len(updated)+len(moved), len(p.all)))
	}
	for k := 1; k <= len(steps); k++ {
		s := &steps[k-1]
		if s.pause != nil {
			if k < int(p.status.Step) {
				continue // passed before
			}
			if !p.pauseStep(s, k) {
				return
			}
			continue
		}
		inStep := 0
		for _, m := range updated {
			if m.wave == s.wave {
				inStep++
			}
		}
		var candidates []*member
		for _, m := range pending {
			if p.matches(s, m.node) {
				candidates = append(candidates, m)
			}
		}
		if target := p.target(s); inStep < target && len(candidates) > 0 {
			p.status.Step = max(p.status.Step, int32(k))
			moveWave(candidates, target-inStep, s.wave, s.describe(k))
			return
		}
		if k < int(p.status.Step) {
			continue // moved and judged before
		}
		p.status.Step = int32(k)
		if inStep > 0 && !p.settle(s, s.wave, maxUnavailable) {
			return
		}
		p.status.Step = int32(k + 1)
	}
	// Past the steps: the nodes left, in waves of maxUnavailable, each
	// judged (analysis) before the next.
	if wave > last && !p.settle(&step{wave: wave}, wave, maxUnavailable) {
		return
	}
	next := max(wave, last) + 1
	moveWave(pending, len(pending), next, fmt.Sprintf("wave %d", next))
}

// settle reports whether wave w (of step s) is judged: its nodes stayed
// Ready for the step's soak and its analysis passed. Until then the phase
// is Soaking; a failed analysis stops the rollout (onFailure).
func (p *planner) settle(s *step, w int32, maxUnavailable int) bool {
	analysis := p.in.Set.Spec.Strategy.Analysis != nil
	if s.soak == 0 && !analysis || s.canary && p.status.SoakedRevision == p.update.Name {
		return true
	}
	now := p.in.Now
	nodes := p.waveNodes(w)
	var left time.Duration
	var soakUntil time.Time
	if s.soak > 0 {
		if p.status.SoakStartedAt == nil {
			p.status.SoakStartedAt = &metav1.Time{Time: now}
		}
		soakUntil = p.status.SoakStartedAt.Add(s.soak)
		left = soakUntil.Sub(now)
	}
	done, failed, next := p.analyse(w, nodes)
	if failed != nil {
		p.haltForAnalysis(failed, w, nodes)
		p.stopped(maxUnavailable)
		return false
	}
	if left > 0 || !done {
		var why []string
		if left > 0 {
			who := "every node"
			if s.canary {
				who = "every canary" // as the canary's message always read
			}
			why = append(why, fmt.Sprintf("soaking until %s (%s left): %s must stay Ready", soakUntil.UTC().Format(time.RFC3339), left.Round(time.Second), who))
			p.requeue = left
		}
		if !done {
			why = append(why, p.analysisProgress(w))
			if next > 0 && (p.requeue == 0 || next < p.requeue) {
				p.requeue = next
			}
		}
		what := fmt.Sprintf("wave %d", w)
		if s.canary {
			what = "canary"
		}
		p.phase(iteronv1.RolloutSoaking, fmt.Sprintf("%s %s Ready on revision %s; %s", what, list(nodes), p.update.Name, strings.Join(why, "; ")))
		return false
	}
	if s.canary {
		p.status.SoakedRevision = p.update.Name
	} else {
		p.status.SoakStartedAt = nil
	}
	return true
}

// pauseStep reports whether pause step k is over: its duration passed, or
// a promotion released it. Until then the rollout waits there.
func (p *planner) pauseStep(s *step, k int) bool {
	set := p.in.Set
	if int(p.status.Step) != k {
		p.status.Step, p.status.StepStartedAt = int32(k), nil
	}
	if d := s.pause.DurationSeconds; d != nil {
		if p.status.StepStartedAt == nil {
			p.status.StepStartedAt = &metav1.Time{Time: p.in.Now}
		}
		until := p.status.StepStartedAt.Add(time.Duration(*d) * time.Second)
		if left := until.Sub(p.in.Now); left > 0 {
			p.requeue = left
			p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("step %d of revision %s: pausing until %s (%s left; kubectl iteron rollout promote %s goes on now)",
				k, p.update.Name, until.UTC().Format(time.RFC3339), left.Round(time.Second), set.Name))
			if !p.promoted() {
				return false
			}
		}
		p.status.Step, p.status.StepStartedAt = int32(k+1), nil
		return true
	}
	if p.promoted() {
		p.status.Step = int32(k + 1)
		return true
	}
	p.phase(iteronv1.RolloutPausedAtStep, fmt.Sprintf("step %d of revision %s: paused with %d of %d nodes updated; kubectl iteron rollout promote %s goes on (abort reverts)",
		k, p.update.Name, p.countOn(p.update), len(p.all), set.Name))
	return false
}

// promoted reports (once) a promotion not handled yet.
func (p *planner) promoted() bool {
	want := p.in.Set.Annotations[iteronv1.AnnotationPromote]
	if want == "" || want == p.status.LastHandledPromoteAt {
		return false
	}
	p.status.LastHandledPromoteAt = want
	return true
}

// abort handles iteron.dev/abort: the rollout under way is stopped and
// reverted, whatever onFailure says.
func (p *planner) abort() {
	set := p.in.Set
	want := set.Annotations[iteronv1.AnnotationAbort]
	if want == "" || want == set.Status.LastHandledAbortAt {
		return
	}
	p.status.LastHandledAbortAt = want
	if p.current.Name == p.update.Name {
		return // nothing under way
	}
	if h := p.status.Halt; h != nil && h.Action == iteronv1.FailurePolicyRevert {
		return
	}
	h := p.newHalt(iteronv1.HaltAborted)
	h.Message = fmt.Sprintf("aborted (%s=%s): every node that left revision %s goes back to it", iteronv1.AnnotationAbort, want, p.current.Name)
	p.status.Halt = h
}

// revert moves the nodes that left the stable revision back to it.
func (p *planner) revert(maxUnavailable int) {
	h := p.status.Halt
	to := p.current
	if r, ok := p.in.Revisions[h.ToRevision]; ok {
		to = &r
	}
	// The policy as it is now: a revert that failed for want of a
	// down-migration goes on with Discard once the spec says so (the
	// reverted activations are set to it as hand edits would be).
	if d := p.in.Set.Spec.Strategy.RevertStateDisposition; d != "" {
		h.StateDisposition = d
	}
	discard := h.StateDisposition == iteronv1.StateDispositionDiscard
	state := "their state migrated back (revertStateDisposition Migrate)"
	if discard {
		state = "their state discarded (revertStateDisposition Discard)"
	}
	var failedBack []string
	var stalledAway, away []*member
	for _, m := range p.all {
		switch {
		case m.act == nil || m.act.Deleting:
		case m.onRevision(to) && m.stalled != nil && m.act.RevertedFrom != "":
			failedBack = append(failedBack, fmt.Sprintf("node %s (%s: %s)", m.node, m.stalled.Reason, m.stalled.Message))
		case !m.onRevision(to) && m.stalled != nil:
			stalledAway = append(stalledAway, m)
		case !m.onRevision(to):
			away = append(away, m)
		}
	}
	if len(failedBack) > 0 {
		p.phase(iteronv1.RolloutRevertFailed, fmt.Sprintf("revision %s failed (%s); the revert to revision %s failed on %s. A previous implementation that cannot read the newer state needs spec.strategy.revertStateDisposition: Discard",
			h.Revision, h.Message, to.Name, strings.Join(failedBack, "; ")))
		return
	}
	// A Stalled node is not Ready already: moving it back costs nothing of
	// the budget. The others go back within it.
	budget := maxUnavailable - p.notReady()
	var moved []string
	from := func(m *member) string {
		if m.rev != nil {
			return m.rev.Hash
		}
		return "unknown"
	}
	for _, m := range stalledAway {
		p.move(m, to, 0, from(m), discard, fmt.Sprintf("revert to revision %s: node %s is Stalled on %s", to.Name, m.node, h.Revision))
		moved = append(moved, m.node)
	}
	for _, m := range away {
		if budget <= 0 {
			break
		}
		p.move(m, to, 0, from(m), discard, fmt.Sprintf("revert to revision %s", to.Name))
		moved = append(moved, m.node)
		budget--
	}
	reverted := 0
	for _, m := range p.all {
		if m.act != nil && m.onRevision(to) && (m.act.RevertedFrom != "" || m.moved) {
			reverted++
		}
	}
	var notBack []string
	for _, m := range p.all {
		if !m.onRevision(to) || !m.ready || m.moved {
			notBack = append(notBack, m.node)
		}
	}
	switch {
	case len(moved) > 0:
		p.phase(iteronv1.RolloutReverting, fmt.Sprintf("revision %s failed (%s); moving %s back to revision %s with %s", h.Revision, h.Message, list(moved), to.Name, state))
	case len(notBack) > 0:
		p.phase(iteronv1.RolloutReverting, fmt.Sprintf("revision %s failed (%s); waiting for %s to be Ready on revision %s with %s", h.Revision, h.Message, list(notBack), to.Name, state))
	default:
		p.phase(iteronv1.RolloutReverted, fmt.Sprintf("revision %s failed (%s); %d nodes went back to revision %s with %s. Change the template, or resume to try revision %s again",
			h.Revision, h.Message, reverted, to.Name, state, h.Revision))
	}
}

// counts fills the node counts and the wave, after this plan's actions:
// the wave is the latest that moved nodes to the update revision.
func (p *planner) counts() {
	st := &p.status
	st.DesiredNodes = int32(len(p.in.Nodes))
	st.UpdatedNodes, st.ReadyNodes, st.Wave, st.WaveNodes = 0, 0, 0, nil
	for _, m := range p.all {
		if m.onRevision(p.update) {
			st.UpdatedNodes++
			st.Wave = max(st.Wave, m.wave)
		}
		if m.ready && !m.moved {
			st.ReadyNodes++
		}
	}
	for _, m := range p.all {
		if st.Wave > 0 && m.onRevision(p.update) && m.wave == st.Wave && len(st.WaveNodes) < maxWaveNodes {
			st.WaveNodes = append(st.WaveNodes, m.node)
		}
	}
}

// resolveMaxUnavailable turns maxUnavailable into a number of nodes: an
// integer as it is, a percentage of the selected nodes rounded down, at
// least 1 either way.
func resolveMaxUnavailable(v *intstr.IntOrString, nodes int) int {
	if v == nil {
		return 1
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, nodes, false)
	if err != nil || n < 1 {
		return 1
	}
	return n
}

func soakSeconds(c *iteronv1.CanaryStrategy) int32 {
	if c == nil || c.SoakSeconds == nil {
		return 60
	}
	return *c.SoakSeconds
}

func nodesOf(ms []*member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.node
	}
	return out
}

// list names at most 8 nodes.
func list(nodes []string) string {
	if len(nodes) > 8 {
		return strings.Join(nodes[:8], ", ") + fmt.Sprintf(" and %d more", len(nodes)-8)
	}
	return strings.Join(nodes, ", ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}
