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
}

// Input is everything one reconcile decides from.
type Input struct {
	// Set is the ActivationSet as read (status included: the stable
	// revision, a halt and a soak are read back from it).
	Set *iteronv1.ActivationSet
	// Nodes are the names of the nodes the selector matches.
	Nodes []string
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
	// end of a soak).
	RequeueAfter time.Duration
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
		UpdateRevision:      in.Update.Name,
		CollisionCount:      prev.CollisionCount,
		LastHandledResumeAt: prev.LastHandledResumeAt,
		SoakedRevision:      prev.SoakedRevision,
		Halt:                prev.Halt.DeepCopy(),
	}
	if prev.UpdateRevision == in.Update.Name {
		p.status.SoakStartedAt = prev.SoakStartedAt.DeepCopy()
	}
	p.members()
	p.deletes()
	p.current = p.stableRevision()
	p.status.CurrentRevision = p.current.Name
	p.observe()
	p.resume()
	p.failures()

	maxUnavailable := resolveMaxUnavailable(spec.Strategy.MaxUnavailable, len(in.Nodes))
	switch h := p.status.Halt; {
	case h != nil && h.Action == iteronv1.FailurePolicyRevert:
		p.revert(maxUnavailable)
	case h != nil:
		p.phase(iteronv1.RolloutHalted, fmt.Sprintf("the rollout of revision %s halted: %s; nodes not reached keep their revision (kubectl iteron rollout status %s; resume or undo)", h.Revision, h.Message, set.Name))
	case p.complete():
		p.status.CurrentRevision = p.update.Name
		p.current = p.update
		p.status.SoakStartedAt = nil
		p.phase(iteronv1.RolloutCompleted, fmt.Sprintf("all %d nodes Ready on revision %s", len(p.all), p.update.Name))
	case spec.Paused:
		p.phase(iteronv1.RolloutPaused, fmt.Sprintf("spec.paused is true: no node is moved (%d of %d nodes on revision %s)", p.countOn(p.update), len(p.all), p.update.Name))
	default:
		p.rollout(maxUnavailable)
	}
	p.counts()
	return Plan{Actions: p.actions, Status: p.status, Message: p.message, RequeueAfter: p.requeue}
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
	st := p.in.Set.Spec.Strategy
	h := &iteronv1.RolloutHalt{Revision: p.update.Name, Action: st.OnFailure, At: metav1.NewTime(p.in.Now)}
	if h.Action == "" {
		h.Action = iteronv1.FailurePolicyHalt
	}
	if h.Action == iteronv1.FailurePolicyRevert {
		h.ToRevision, h.StateDisposition = p.current.Name, st.RevertStateDisposition
		if h.StateDisposition == "" {
			h.StateDisposition = iteronv1.StateDispositionMigrate
		}
		p.status.SoakedRevision, p.status.SoakStartedAt = "", nil
	}
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

// rollout moves the next wave, or waits for the current one (or the soak).
func (p *planner) rollout(maxUnavailable int) {
	set := p.in.Set
	st := set.Spec.Strategy
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
	canary := 0
	if st.Canary != nil && p.current.Name != p.update.Name {
		canary = min(int(max(st.Canary.Nodes, 1)), len(p.all))
	}
	var waiting []string
	for _, m := range updated {
		if !m.ready || m.moved {
			waiting = append(waiting, m.node)
		}
	}
	if len(waiting) > 0 {
		p.status.SoakStartedAt = nil
		p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("wave %d of revision %s: waiting for %s to become Ready (%d of %d nodes updated)",
			wave, p.update.Name, list(waiting), len(updated), len(p.all)))
		return
	}
	if len(pending) == 0 {
		// Every selected node is on the update revision; some are still
		// being created.
		p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("waiting for %d new nodes to become Ready on revision %s", p.notReady(), p.update.Name))
		return
	}
	budget := maxUnavailable - p.notReady()
	next, size := wave+1, len(pending)
	switch {
	case len(updated) < canary:
		next, size = 1, canary-len(updated)
	case canary > 0 && p.status.SoakedRevision != p.update.Name:
		soak := time.Duration(soakSeconds(st.Canary)) * time.Second
		if p.status.SoakStartedAt == nil {
			p.status.SoakStartedAt = &metav1.Time{Time: p.in.Now}
		}
		if left := p.status.SoakStartedAt.Add(soak).Sub(p.in.Now); left > 0 {
			p.requeue = left
			p.phase(iteronv1.RolloutSoaking, fmt.Sprintf("canary %s Ready on revision %s; soaking until %s (%s left): every canary must stay Ready",
				list(nodesOf(updated)), p.update.Name, p.status.SoakStartedAt.Add(soak).UTC().Format(time.RFC3339), left.Round(time.Second)))
			return
		}
		p.status.SoakedRevision = p.update.Name
	}
	// A node that is not Ready already costs the budget nothing.
	var moved []string
	for _, m := range pending {
		if len(moved) == size {
			break
		}
		if m.ready {
			if budget <= 0 {
				break
			}
			budget--
		}
		p.move(m, p.update, next, "", false, fmt.Sprintf("wave %d of revision %s", next, p.update.Name))
		moved = append(moved, m.node)
	}
	if len(moved) == 0 {
		p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("wave %d of revision %s waits: %d nodes are not Ready and maxUnavailable is %d",
			next, p.update.Name, p.notReady(), maxUnavailable))
		return
	}
	what := fmt.Sprintf("wave %d", next)
	if next == 1 && canary > 0 {
		what = "wave 1 (canary)"
	}
	p.phase(iteronv1.RolloutProgressing, fmt.Sprintf("%s of revision %s: moving %s (%d of %d nodes updated)", what, p.update.Name, list(moved), len(updated)+len(moved), len(p.all)))
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
