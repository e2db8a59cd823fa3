package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// activationScope carries one reconcile's state between phases.
type activationScope struct {
	act  *iteronv1.ImplementationActivation
	base *iteronv1.ImplementationActivation
	key  hotswap.ActivationKey

	res        Resolution
	resolved   bool
	status     hotswap.ActivationStatus
	haveStatus bool
	// targets are the desired generations, by module.
	targets map[string]hotswap.ModuleTarget
	// stalled explains modules whose failed target is not retried.
	stalled map[string]hotswap.Failure
	// retryHandled is the retry annotation value acted on.
	retryHandled string
	// recordRequests are the Generations of the plan the generation
	// controller is asked to create once the coordinator has the plan.
	recordRequests []string
	// plan is the RuntimePlan of the spec against what ran before Apply.
	plan *iteronv1.PlanStatus

	// gens are the activation's Generation objects as last listed.
	gens []iteronv1.Generation
	// lagging explains a Generation whose status does not yet show what
	// the coordinator did ("" when they agree).
	lagging string

	requeueAfter time.Duration
	deleted      bool
	// probes are the outcomes of the spec's probes (status.probes).
	probes []iteronv1.ProbeStatus
}

// reconcileResolve verifies the spec and orders its modules. A paused
// activation is not resolved: nothing changes while paused.
func (r *ActivationReconciler) reconcileResolve(ctx context.Context, s *activationScope) error {
	// The ledger is replayed before anything is decided: after a restart
	// Status then knows each module's last committed generation. The head
	// mirrored into status must be in the chain.
	var anchor *hotswap.Anchor
	if l := s.act.Status.Ledger; l != nil && l.HeadSHA256 != "" && l.Records > 0 {
		anchor = &hotswap.Anchor{Sequence: uint64(l.Records - 1), RecordSHA256: l.HeadSHA256}
	}
	if err := r.Coordinator.Prepare(s.key, anchor); err != nil {
		r.Recorder.Eventf(s.act, nil, corev1.EventTypeWarning, iteronv1.ReasonLedgerCorrupt, "Replay", "the ledger is unusable: %v", err)
	}
	s.status, s.haveStatus = r.Coordinator.Status(s.key.UID)
	if s.act.Spec.Paused {
		return nil
	}
	// Verified again only when the spec or a file it read changed: a
	// reconcile with nothing changed stats the files and reads none.
	name, key := client.ObjectKeyFromObject(s.act), verificationKeyOf(s.act)
	res, kept := r.verified.get(name, key)
	if !kept {
		res = r.verify(ctx, &s.act.Spec)
		r.verified.put(name, key, res)
	}
	s.res = res
	s.resolved = true
	admitProbes(s)
	s.requeueWithin(s.res.RetryAfter)
	return nil
}

// reconcilePaused keeps serving what served while the activation is
// paused: spec changes wait, but after a manager restart nothing runs until
// the ledger's last committed generations are relaunched (their Generation
// objects' sources verified again). Modules that run are kept as they are.
func (r *ActivationReconciler) reconcilePaused(ctx context.Context, s *activationScope) error {
	if !s.act.Spec.Paused || !s.haveStatus || s.status.AppliedSpecGeneration != 0 {
		return nil
	}
	var relaunch []string
	for module, ms := range s.status.Modules {
		if ms.Committed != nil && ms.Active == "" {
			relaunch = append(relaunch, module)
		}
	}
	if len(relaunch) == 0 {
		return nil
	}
	gens, err := r.ownedGenerations(ctx, s.act)
	if err != nil {
		return apiRefusal("list Generations", err)
	}
	d := desiredOf(s)
	for _, module := range slices.Sorted(maps.Keys(s.status.Modules)) {
		ms := s.status.Modules[module]
		t := hotswap.ModuleTarget{Module: module, Keep: true}
		if ms.Committed != nil && ms.Active == "" {
			target, _, failure := r.committedTarget(ctx, s, ResolvedModule{Module: module}, ms.Committed, gens)
			if failure != nil {
				r.Recorder.Eventf(s.act, nil, corev1.EventTypeWarning, reasonOf(failure.Code), "Relaunch", "module %s: %s", module, failure.Message)
				t.Refused = failure
			} else {
				t = *target
				d.ActivateOrder = append(d.ActivateOrder, module)
			}
		}
		d.Modules = append(d.Modules, t)
	}
	d.DrainOrder = slices.Clone(d.ActivateOrder)
	slices.Reverse(d.DrainOrder)
	if err := r.Coordinator.Apply(d); err != nil {
		return &phaseError{reason: "CoordinatorError", err: fmt.Errorf("hand the paused activation's relaunches to the node's coordinator: %w", err)}
	}
	s.status, s.haveStatus = r.Coordinator.Status(s.key.UID)
	return nil
}

// reconcileGenerations decides the desired generation of every runnable
// module and creates the Generation objects that do not exist yet.
func (r *ActivationReconciler) reconcileGenerations(ctx context.Context, s *activationScope) error {
	if !s.resolved || s.res.DocumentError != nil {
		return nil
	}
	gens, err := r.ownedGenerations(ctx, s.act)
	if err != nil {
		return err
	}
	// The coordinator is always ahead of the Generations' mirrored status:
	// read it after listing them, so that a Generation already showing
	// activatedAt is never weighed against an older view that knows no
	// active generation (which would start a lineage that never runs).
	s.status, s.haveStatus = r.Coordinator.Status(s.key.UID)
	retry := s.act.Annotations[iteronv1.AnnotationRetry]
	retryRequested := retry != "" && retry != s.act.Status.LastHandledRetryAt
	if !retryRequested {
		retry = ""
	}
	s.targets = map[string]hotswap.ModuleTarget{}
	s.stalled = map[string]hotswap.Failure{}
	type decision struct {
		rm     ResolvedModule
		target *hotswap.ModuleTarget
		create *iteronv1.Generation
	}
	var decisions []decision
	for _, rm := range s.res.Modules {
		if rm.Plan == nil {
			// Not runnable now: whatever runs keeps running (bad input
			// changes nothing); only removing the source retires it. After
			// a restart nothing runs yet: the last committed generation is
			// relaunched from its Generation object, so that what served
			// before keeps serving while the spec's source cannot be had
			// (an artifact still being pulled, a registry down).
			if c := s.status.Modules[rm.Module].Committed; c != nil && r.activeOf(s, rm.Module).name == "" {
				target, _, failure := r.committedTarget(ctx, s, rm, c, gens)
				if failure == nil && target != nil && !target.Keep {
					decisions = append(decisions, decision{rm, target, nil})
					continue
				}
				if failure != nil {
					r.Recorder.Eventf(s.act, nil, corev1.EventTypeWarning, reasonOf(failure.Code), "Relaunch", "module %s: %s", rm.Module, failure.Message)
				}
				// Calls fail at once with why it cannot be relaunched.
				s.targets[rm.Module] = hotswap.ModuleTarget{Module: rm.Module, Keep: true, Refused: failure}
				continue
			}
			s.targets[rm.Module] = hotswap.ModuleTarget{Module: rm.Module, Keep: true}
			continue
		}
		target, create, stalled := r.desiredGeneration(ctx, s, rm, gens, retry)
		if stalled != nil {
			s.stalled[rm.Module] = *stalled
		}
		if target != nil {
			decisions = append(decisions, decision{rm, target, create})
		}
	}
	var creates []decision
	for _, d := range decisions {
		committed := s.status.Modules[d.rm.Module].Committed
		relaunch := committed != nil && committed.Name == d.target.GenerationName
		if len(s.stalled) > 0 && !d.target.Keep && d.target.GenerationName != r.activeOf(s, d.rm.Module).name && !relaunch {
			// A plan is not atomic across modules: after a failure the rest
			// of it waits until the spec changes or a retry is requested.
			// What served before a restart is relaunched all the same.
			s.targets[d.rm.Module] = hotswap.ModuleTarget{Module: d.rm.Module, Keep: true}
			continue
		}
		if d.create == nil && !d.target.Keep && !slices.ContainsFunc(gens, func(g iteronv1.Generation) bool { return g.Name == d.target.GenerationName }) {
			// The Generation of a running target was deleted: re-create it
			// from what runs (the process keeps running).
			d.create = newGeneration(s.act, d.rm, d.target.Lineage, d.target.Attempt, "")
			d.create.Spec.Implementation = implementationOf(d.target.Plan, d.rm.CatalogPath)
		}
		t := *d.target
		if d.create != nil {
			creates = append(creates, d)
			t.Unrecorded = true
		}
		s.targets[d.rm.Module] = t
	}
	// The generation controller creates the Generations the plan names
	// (GenerationRecords); the coordinator starts nothing of the plan
	// before they exist.
	records := make([]*generationRecord, 0, len(creates))
	for _, d := range creates {
		records = append(records, &generationRecord{object: d.create, owner: ownerOf(s.act),
			note: fmt.Sprintf("module %s: generation %d attempt %d (%s)", d.rm.Module, d.target.Lineage, d.target.Attempt, d.rm.Plan.ImplementationID())})
	}
	unrequested, refusal := r.Records.plan(s.act, records)
	if refusal != nil {
		return refusal
	}
	s.recordRequests = unrequested
	if retry != "" {
		s.retryHandled = retry
	}
	return nil
}

// desiredGeneration picks the target generation of one module: the active
// one when its epoch and authority are unchanged; else the next lineage,
// reusing an existing Generation for the same target unless it failed and
// either a retry was requested or the spec changed since (a failed attempt's
// number is never reused). A failed target of the same spec without a retry
// keeps the active generation and reports the failure.
func (r *ActivationReconciler) desiredGeneration(ctx context.Context, s *activationScope, rm ResolvedModule, gens []iteronv1.Generation, retry string) (target *hotswap.ModuleTarget, create *iteronv1.Generation, stalled *hotswap.Failure) {
	mk := func(name string, lineage int64, attempt int32) *hotswap.ModuleTarget {
		return &hotswap.ModuleTarget{Module: rm.Module, Plan: *rm.Plan, Epoch: rm.Epoch, GenerationName: name, Lineage: lineage, Attempt: attempt, DependsOn: rm.DependsOn,
			Revision: s.act.Labels[iteronv1.LabelRevision]}
	}
	cur := r.activeOf(s, rm.Module)
	active, activeLineage := cur.name, cur.lineage
	if active == "" {
		if c := s.status.Modules[rm.Module].Committed; c != nil {
			// After a restart: the ledger's last committed generation is
			// relaunched first, whatever the spec says now.
			return r.committedTarget(ctx, s, rm, c, gens)
		}
	}
	// Unchanged: same epoch and same admitted authority (a narrower
	// ceiling changes what the process may do, so it is a reload too).
	if active != "" && hotswap.Unchanged(cur.epoch, cur.authority, rm.Epoch, rm.Plan.AuthoritySHA256()) {
		return mk(active, cur.lineage, cur.attempt), nil, nil
	}
	lineage := hotswap.NextLineage(activeLineage)
	if active == "" {
		// No active generation: continue after the last lineage that was
		// ever active (a module removed and added back).
		for _, g := range gens {
			if g.Spec.Module == rm.Module && g.Status.ActivatedAt != nil && g.Spec.Generation >= lineage {
				lineage = hotswap.NextLineage(g.Spec.Generation)
			}
		}
	}
	var match *iteronv1.Generation
	maxAttempt := int32(0)
	for i := range gens {
		g := &gens[i]
		if g.Spec.Module != rm.Module || g.Spec.Generation != lineage {
			continue
		}
		maxAttempt = max(maxAttempt, g.Spec.Attempt)
		if sameTarget(g, rm.Plan, active) && (match == nil || g.Spec.Attempt > match.Spec.Attempt) {
			match = g
		}
	}
	if match != nil {
		failure := r.failureOf(s, match)
		sameSpec := match.Annotations[iteronv1.AnnotationActivationGeneration] == strconv.FormatInt(s.act.Generation, 10)
		switch {
		case failure == nil:
			return mk(match.Name, lineage, match.Spec.Attempt), nil, nil
		case (retry == "" || match.Annotations[iteronv1.AnnotationRetryOf] == retry) && sameSpec && !failure.Retryable:
			// Not retried for the same target: keep what serves. A retry
			// this attempt already answered (its status echo lost to a
			// conflicting write) is not answered twice.
			return &hotswap.ModuleTarget{Module: rm.Module, Keep: true}, nil, failure
		}
	}
	attempt := maxAttempt + 1
	g := newGeneration(s.act, rm, lineage, attempt, active)
	if retry != "" {
		g.Annotations[iteronv1.AnnotationRetryOf] = retry
	}
	return mk(g.Name, lineage, attempt), g, nil
}

// committedTarget is the relaunch target of a module's last committed
// generation. When the spec still selects its implementation the resolved
// plan serves; otherwise (the spec changed while no manager ran) its
// Generation object's source is verified again to relaunch it, and the next
// reconcile swaps it to the new spec.
func (r *ActivationReconciler) committedTarget(ctx context.Context, s *activationScope, rm ResolvedModule, c *hotswap.CommittedGeneration, gens []iteronv1.Generation) (*hotswap.ModuleTarget, *iteronv1.Generation, *hotswap.Failure) {
	t := &hotswap.ModuleTarget{Module: rm.Module, GenerationName: c.Name, Lineage: c.Lineage, Attempt: c.Attempt, DependsOn: rm.DependsOn}
	// The revision the relaunched generation was made for (its
	// Generation's label), not the one the spec has now.
	for i := range gens {
		if gens[i].Name == c.Name {
			t.Revision = gens[i].Labels[iteronv1.LabelRevision]
		}
	}
	if rm.Plan != nil && rm.Plan.ImplementationID() == c.ImplementationID && rm.Plan.ArtifactSHA256() == c.ArtifactSHA256 {
		t.Plan, t.Epoch = *rm.Plan, rm.Epoch
		return t, nil, nil
	}
	var gen *iteronv1.Generation
	for i := range gens {
		if gens[i].Name == c.Name {
			gen = &gens[i]
		}
	}
	failure := func(msg string) (*hotswap.ModuleTarget, *iteronv1.Generation, *hotswap.Failure) {
		f := &hotswap.Failure{Module: rm.Module, GenerationName: c.Name, Code: reasons.VerificationFailed, Message: msg}
		return &hotswap.ModuleTarget{Module: rm.Module, Keep: true, Refused: f}, nil, f
	}
	if gen == nil || gen.Spec.Implementation.CatalogPath == "" {
		return failure(fmt.Sprintf("the last committed generation %s cannot be relaunched: its Generation object (with its catalog path) is gone", c.Name))
	}
	impl := gen.Spec.Implementation
	spec := iteronv1.ImplementationActivationSpec{
		NodeName: s.act.Spec.NodeName, CandidateSHA256: s.act.Spec.CandidateSHA256, CapabilityCeiling: s.act.Spec.CapabilityCeiling,
		Sources: []iteronv1.ActivationSource{{Module: rm.Module, ImplementationID: impl.ID, CatalogPath: impl.CatalogPath,
			ArtifactRoot: impl.ArtifactRoot, ManifestSHA256: impl.ManifestSHA256, ArtifactSHA256: impl.ArtifactSHA256}},
	}
	res := r.verify(ctx, &spec)
	if res.DocumentError != nil || len(res.Modules) != 1 || res.Modules[0].Plan == nil {
		msg := "verification failed"
		if res.DocumentError != nil {
			msg = res.DocumentError.Error()
		} else if len(res.Modules) == 1 {
			msg = res.Modules[0].Message
		}
		return failure(fmt.Sprintf("the last committed generation %s cannot be relaunched: %s", c.Name, msg))
	}
	t.Plan, t.Epoch = *res.Modules[0].Plan, res.Modules[0].Epoch
	return t, nil, nil
}

// verify resolves a spec, counting the verification: the expensive step
// of a reconcile (every catalog, manifest and executable read and checked).
func (r *ActivationReconciler) verify(ctx context.Context, spec *iteronv1.ImplementationActivationSpec) Resolution {
	activationVerifications.Inc()
	return r.Resolve(ctx, spec)
}

// activeGeneration is what serves a module now.
type activeGeneration struct {
	name, epoch, authority string
	lineage                int64
	attempt                int32
}

// activeOf returns the active generation of a module, as the coordinator
// (which owns the processes) reports it.
func (r *ActivationReconciler) activeOf(s *activationScope, module string) activeGeneration {
	if ms, ok := s.status.Modules[module]; s.haveStatus && ok && ms.Active != "" {
		return activeGeneration{name: ms.Active, epoch: ms.Epoch, authority: ms.AuthoritySHA256, lineage: ms.Lineage, attempt: ms.Attempt}
	}
	return activeGeneration{}
}

// failureOf reports whether a Generation's attempt failed: the coordinator
// knows at once, the Generation's status durably.
func (r *ActivationReconciler) failureOf(s *activationScope, g *iteronv1.Generation) *hotswap.Failure {
	if s.haveStatus {
		for _, f := range s.status.Failures {
			if f.GenerationName == g.Name {
				return &f
			}
		}
		if f, ok := s.status.FailedAttempts[g.Name]; ok {
			return &f
		}
		if gs, ok := s.status.Generations[g.Name]; ok && gs.Phase == iteronv1.PhaseFailed {
			return &hotswap.Failure{Module: g.Spec.Module, GenerationName: g.Name, Code: gs.Reason, Message: gs.Message}
		}
	}
	if g.Status.Phase == iteronv1.PhaseFailed {
		return &hotswap.Failure{Module: g.Spec.Module, GenerationName: g.Name, Code: g.Status.Reason, Message: g.Status.Message}
	}
	return nil
}

func sameTarget(g *iteronv1.Generation, p *verifier.LaunchPlan, previous string) bool {
	return g.Spec.Implementation.ID == p.ImplementationID() &&
		g.Spec.Implementation.ManifestSHA256 == p.ManifestSHA256() &&
		g.Spec.Implementation.ArtifactSHA256 == p.ArtifactSHA256() &&
		g.Spec.AuthoritySHA256 == p.AuthoritySHA256() &&
		g.Spec.Previous == previous
}

// implementationOf is a Generation's implementation from its launch plan.
func implementationOf(p verifier.LaunchPlan, catalogPath string) iteronv1.Implementation {
	v := p.Version()
	impl := iteronv1.Implementation{
		ID: p.ImplementationID(), Version: fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]),
		ManifestSHA256: p.ManifestSHA256(), ArtifactSHA256: p.ArtifactSHA256(),
		CatalogPath: catalogPath, ArtifactRoot: p.ArtifactRoot(), Executable: p.Executable(), Argv: p.Argv(),
		ProtocolVersion: int32(p.ProtocolVersion()),
	}
	if m, ok := p.PackageRuntime(); ok {
		impl.PackageRuntime = &iteronv1.PackageRuntimeImplementation{RuntimeProtocolVersion: m.RuntimeProtocolVersion, Exports: m.ExportIDs}
	}
	return impl
}

func newGeneration(act *iteronv1.ImplementationActivation, rm ResolvedModule, lineage int64, attempt int32, previous string) *iteronv1.Generation {
	p := rm.Plan
	caps := make([]iteronv1.Capability, 0, len(p.AdmittedCapabilities()))
	for _, c := range p.AdmittedCapabilities() {
		caps = append(caps, iteronv1.Capability(c))
	}
	limits := p.EvidenceLimits()
	return &iteronv1.Generation{
		ObjectMeta: metav1.ObjectMeta{
			Name:        iteronv1.GenerationName(act.Name, rm.Module, lineage, attempt),
			Namespace:   act.Namespace,
			Labels:      generationLabels(act, rm.Module),
			Annotations: map[string]string{iteronv1.AnnotationActivationGeneration: strconv.FormatInt(act.Generation, 10)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: iteronv1.GroupVersion.String(), Kind: "ImplementationActivation",
				Name: act.Name, UID: act.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: iteronv1.GenerationSpec{
			ActivationName: act.Name, NodeName: act.Spec.NodeName, Module: rm.Module,
			Generation: lineage, Attempt: attempt, Previous: previous, CandidateSHA256: act.Spec.CandidateSHA256,
			Implementation:       implementationOf(*p, rm.CatalogPath),
			AdmittedCapabilities: caps,
			AuthoritySHA256:      p.AuthoritySHA256(),
			Deadlines:            iteronv1.Deadlines{RuntimeMs: p.RuntimeDeadline().Milliseconds(), CancellationMs: p.CancellationDeadline().Milliseconds()},
			FailurePolicy:        p.FailurePolicy(),
			EvidenceLimits:       iteronv1.EvidenceLimits{StdoutBytes: limits.StdoutBytes, StderrBytes: limits.StderrBytes, Observations: int64(limits.Observations)},
		},
	}
}

// generationLabels are a new Generation's labels: its activation and
// module, and the activation's revision (a stamped activation's
// iteron.dev/revision) that the generation's calls are counted under.
func generationLabels(act *iteronv1.ImplementationActivation, module string) map[string]string {
	l := map[string]string{iteronv1.LabelActivation: act.Name, iteronv1.LabelModule: strings.ReplaceAll(module, "_", "-")}
	if rev := act.Labels[iteronv1.LabelRevision]; rev != "" {
		l[iteronv1.LabelRevision] = rev
	}
	return l
}

// ownedGenerations lists the Generations of an activation (by owner, never
// by label).
func (r *ActivationReconciler) ownedGenerations(ctx context.Context, act *iteronv1.ImplementationActivation) ([]iteronv1.Generation, error) {
	return ownedGenerations(ctx, r.Client, act)
}

// ownedGenerations lists the Generations act controls, through c.
func ownedGenerations(ctx context.Context, c client.Reader, act *iteronv1.ImplementationActivation) ([]iteronv1.Generation, error) {
	var list iteronv1.GenerationList
	if err := c.List(ctx, &list, client.InNamespace(act.Namespace)); err != nil {
		return nil, err
	}
	var out []iteronv1.Generation
	for _, g := range list.Items {
		if metav1.IsControlledBy(&g, act) {
			out = append(out, g)
		}
	}
	return out, nil
}

// reconcileApply hands the desired state to the coordinator.
func (r *ActivationReconciler) reconcileApply(ctx context.Context, s *activationScope) error {
	if !s.resolved || s.res.DocumentError != nil {
		return nil
	}
	d := desiredOf(s)
	for _, m := range s.res.ActivateOrder {
		if t, ok := s.targets[m]; ok {
			d.ActivateOrder = append(d.ActivateOrder, m)
			d.Modules = append(d.Modules, t)
		}
	}
	var relaunched []string
	for _, rm := range s.res.Modules {
		if t, ok := s.targets[rm.Module]; ok && !slices.Contains(d.ActivateOrder, rm.Module) {
			// A Keep target outside the order, or the relaunch of a module
			// the spec cannot resolve now: it runs what it ran before, so it
			// comes first (what others may depend on) and drains last.
			d.Modules = append(d.Modules, t)
			if !t.Keep {
				relaunched = append(relaunched, rm.Module)
			}
		}
	}
	d.ActivateOrder = append(slices.Clone(relaunched), d.ActivateOrder...)
	for _, m := range s.res.DrainOrder {
		if _, ok := s.targets[m]; ok {
			d.DrainOrder = append(d.DrainOrder, m)
		}
	}
	slices.Reverse(relaunched)
	d.DrainOrder = append(d.DrainOrder, relaunched...)
	// The plan compares the spec with what ran before this Apply: a
	// transaction that finishes quickly must not make a reload look like
	// "unchanged".
	s.plan = planStatus(s)
	if err := r.Coordinator.Apply(d); err != nil {
		return &phaseError{reason: "CoordinatorError", err: fmt.Errorf("hand the plan to the node's coordinator: %w", err)}
	}
	if err := r.Records.request(ctx, s.act.Namespace, s.recordRequests); err != nil {
		return err
	}
	s.status, s.haveStatus = r.Coordinator.Status(s.key.UID)
	return nil
}

// desiredOf is the part of the coordinator's desired state the spec's
// settings make (no modules yet).
func desiredOf(s *activationScope) hotswap.Desired {
	spec := s.act.Spec
	return hotswap.Desired{
		Key: s.key, SpecGeneration: s.act.Generation, Retry: s.act.Annotations[iteronv1.AnnotationRetry], CandidateSHA256: spec.CandidateSHA256,
		Swap: hotswap.SwapPolicy{
			Deadline:       time.Duration(max(spec.Swap.DeadlineSeconds, 1)) * time.Second,
			QuiesceTimeout: time.Duration(ptr.Deref(spec.Swap.QuiesceTimeoutSeconds, 10)) * time.Second,
			Cold:           spec.Swap.Strategy == iteronv1.SwapStrategyCold,
			Discard:        spec.Swap.StateDisposition == iteronv1.StateDispositionDiscard,
		},
		CheckpointInterval: time.Duration(ptr.Deref(spec.Checkpoint.IntervalSeconds, 60)) * time.Second,
		// Not part of what the coordinator compares (sameDesired): a stamp
		// writes it with the spec it moves to, and it alone never starts
		// a transaction.
		RolloutSpan: rolloutSpan(s.act),
	}
}

// summarize writes status from the resolution, the coordinator and the
// error the reconcile ends with (so a failed phase shows in the conditions,
// not only in the log).
func (r *ActivationReconciler) summarize(s *activationScope, reconcileErr error) {
	act, st := s.act, s.status
	act.Status.ModuleCount = int32(len(act.Spec.Sources))
	if s.retryHandled != "" {
		act.Status.LastHandledRetryAt = s.retryHandled
	}
	if st.Ledger != nil {
		act.Status.Ledger = ledgerStatus(st)
	}
	switch {
	case s.resolved:
		act.Status.Modules = moduleStatuses(s)
		// The plan is the RuntimePlan of the spec when it was first acted
		// on; it stays until the spec changes (transactions finishing do
		// not turn it into "unchanged").
		if s.plan != nil && (act.Status.Plan == nil || act.Status.Plan.SpecGeneration != act.Generation) {
			act.Status.Plan = s.plan
		}
	case s.haveStatus:
		// Paused: the spec is not acted on, but what runs is still
		// mirrored (a transaction that was running when the pause came
		// finishes), module by module as status lists them.
		mirror := *s
		mirror.res = Resolution{}
		for _, ms := range act.Status.Modules {
			mirror.res.Modules = append(mirror.res.Modules, ResolvedModule{Module: ms.Module, Epoch: ms.Epoch})
		}
		act.Status.Modules = moduleStatuses(&mirror)
	}
	if s.resolved || len(act.Spec.Probes) == 0 {
		act.Status.Probes = s.probes
	}
	r.recordTransitions(s)
	s.lagging = generationsLag(s)
	sum := summarizeActivation(s, reconcileErr)
	act.Status.ActiveCount = int32(sum.active)
	for _, c := range conditionsFor(sum) {
		c.ObservedGeneration = act.Generation
		meta.SetStatusCondition(&act.Status.Conditions, c)
	}
	if sum.restingState() {
		act.Status.ObservedGeneration = act.Generation
	}
	switch {
	case s.haveStatus && (st.Busy || st.AppliedSpecGeneration < act.Generation && !act.Spec.Paused):
		s.requeueWithin(10 * time.Second)
	case s.lagging != "":
		// The Generation controller's status write requeues this one too;
		// look again soon in case that event is missed.
		s.requeueWithin(2 * time.Second)
	}
}

// requeueWithin asks for another reconcile within d (the soonest request
// wins: an OCI pull in progress asks for less than a busy coordinator).
func (s *activationScope) requeueWithin(d time.Duration) {
	if d > 0 && (s.requeueAfter == 0 || d < s.requeueAfter) {
		s.requeueAfter = d
	}
}

// generationsLag explains the first Generation whose status does not show
// what the coordinator did: the active generation of a module Active at a
// final step, every generation the coordinator retired or failed in that
// phase. Ready waits for them, so that what a reader of the Generations sees
// agrees with Ready.
func generationsLag(s *activationScope) string {
	_, why := laggingGeneration(s)
	return why
}

// laggingGeneration is the index in s.gens of the first Generation whose
// status does not show what the coordinator did, and why (-1, "" when they
// all agree).
func laggingGeneration(s *activationScope) (int, string) {
	if !s.haveStatus {
		return -1, ""
	}
	active := map[string]bool{}
	for _, ms := range s.status.Modules {
		if ms.Active != "" {
			active[ms.Active] = true
		}
	}
	for i, g := range s.gens {
		gs, known := s.status.Generations[g.Name]
		if !known {
			continue
		}
		st := g.Status
		switch {
		case active[g.Name] && gs.Phase == iteronv1.PhaseActive:
			// A renewal moves the active generation through its steps while
			// it serves: only a transaction that ended must show as ended.
			ended := func(step iteronv1.GenerationStep) bool {
				return step == iteronv1.StepCommitted || step == iteronv1.StepRolledBack
			}
			if st.Phase != iteronv1.PhaseActive || ended(gs.Step) && !ended(st.Step) {
				return i, fmt.Sprintf("Generation %s does not show Active at a final step yet (it shows %s %s)", g.Name, orNone(string(st.Phase)), orNone(string(st.Step)))
			}
		case gs.Phase == iteronv1.PhaseInactive || gs.Phase == iteronv1.PhaseFailed:
			if st.Phase != gs.Phase {
				return i, fmt.Sprintf("Generation %s does not show %s yet (it shows %s %s)", g.Name, gs.Phase, orNone(string(st.Phase)), orNone(string(st.Step)))
			}
		}
	}
	return -1, ""
}

// reconcileMirror lists the activation's Generations (Ready waits for what
// they show, paused or not) and reads again, from the API server, each one
// that the cache shows behind the coordinator. The notifier requeues an
// activation once its Generations were mirrored, and the cache may not
// have seen those writes yet: without this read the reconcile would find
// them lagging and have to come back.
func (r *ActivationReconciler) reconcileMirror(ctx context.Context, s *activationScope) error {
	gens, err := r.ownedGenerations(ctx, s.act)
	if err != nil {
		return err
	}
	s.gens = gens
	if r.APIReader == nil {
		return nil
	}
	reread := map[string]bool{}
	for {
		i, _ := laggingGeneration(s)
		if i < 0 || reread[s.gens[i].Name] {
			return nil
		}
		reread[s.gens[i].Name] = true
		var live iteronv1.Generation
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(&s.gens[i]), &live); err != nil {
			// The cached view stands; the requeue for a lagging
			// Generation looks again.
			return nil
		}
		s.gens[i] = live
	}
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// recordTransitions emits an event for each module whose active generation
// or failure changed since the status this reconcile started from.
func (r *ActivationReconciler) recordTransitions(s *activationScope) {
	before := map[string]iteronv1.ModuleStatus{}
	for _, ms := range s.base.Status.Modules {
		before[ms.Module] = ms
	}
	for _, ms := range s.act.Status.Modules {
		old := before[ms.Module]
		if ms.Phase == iteronv1.PhaseActive && (old.Phase != iteronv1.PhaseActive || old.GenerationName != ms.GenerationName) {
			r.Recorder.Eventf(s.act, nil, corev1.EventTypeNormal, "ModuleActive", "Activate", "module %s serves %s (generation %d, %s)", ms.Module, ms.GenerationName, ms.Generation, ms.ImplementationID)
		}
		if ms.Reason != "" && ms.Reason != old.Reason && ms.Reason != reasons.DependencyUnsatisfied {
			r.Recorder.Eventf(s.act, nil, corev1.EventTypeWarning, reasonOf(ms.Reason), "Transact", "module %s: %s", ms.Module, truncate(ms.Message, 512))
		}
	}
}

func ledgerStatus(st hotswap.ActivationStatus) *iteronv1.LedgerStatus {
	ls := &iteronv1.LedgerStatus{File: st.LedgerFile, HeadSHA256: st.Ledger.HeadSHA256, Records: int64(st.Ledger.Records), Verified: st.LedgerError == ""}
	for _, b := range st.Ledger.Recent {
		ls.Recent = append(ls.Recent, iteronv1.LedgerRecordSummary{
			Sequence: int64(b.Sequence), TransactionID: b.TransactionID, Module: b.Module,
			Phase: string(b.Phase), Outcome: string(b.Outcome), Reason: truncate(b.Reason, 256),
		})
	}
	return ls
}

// moduleStatuses lists every source's module in ModuleId order. Its reason
// is the most severe current one: what keeps a module from serving comes
// before why its new target failed (when an old generation still serves).
func moduleStatuses(s *activationScope) []iteronv1.ModuleStatus {
	var out []iteronv1.ModuleStatus
	for _, rm := range s.res.Modules {
		ms := iteronv1.ModuleStatus{Module: rm.Module, Phase: iteronv1.PhaseInactive, Epoch: rm.Epoch, Diagnostics: rm.Diagnostics}
		rt, known := s.status.Modules[rm.Module]
		if known {
			if rt.Active != "" {
				ms.ImplementationID, ms.Generation, ms.GenerationName, ms.Epoch = rt.ImplementationID, rt.Lineage, rt.Active, rt.Epoch
				ms.Phase = rt.Phase
				for _, c := range rt.AdmittedCapabilities {
					ms.AdmittedCapabilities = append(ms.AdmittedCapabilities, iteronv1.Capability(c))
				}
			}
			ms.Reason, ms.Message = rt.Reason, rt.Message
		}
		notServing := known && rt.Active != "" && !rt.Serving && rt.Reason != ""
		switch {
		case s.status.LedgerError != "" && (!known || !rt.Serving):
			ms.Reason, ms.Message = reasons.LedgerCorrupt, "nothing runs until an operator resolves the ledger: "+s.status.LedgerError
		case notServing:
			// What keeps the module from serving stays first.
		case rm.Code != "":
			ms.Reason, ms.Message = rm.Code, rm.Message
		case s.stalled[rm.Module].Code != "":
			f := s.stalled[rm.Module]
			ms.Reason, ms.Message = f.Code, fmt.Sprintf("%s (not retried for the same target: change the spec or set the %s annotation)", f.Message, iteronv1.AnnotationRetry)
		}
		if f := failureFor(s.status, rm.Module); f != nil && ms.Reason == "" {
			// A failed target: the module says why, whether or not an older
			// generation still serves.
			ms.Reason, ms.Message = f.Code, f.Message
			if ms.Phase != iteronv1.PhaseActive {
				ms.Phase = iteronv1.PhaseFailed
			}
		}
		ms.Message = truncate(ms.Message, iteronv1.MaxMessageBytes)
		out = append(out, ms)
	}
	// A module whose source left the spec stays listed while it is retired:
	// its process still runs until the drain has stopped it.
	inSpec := map[string]bool{}
	for _, rm := range s.res.Modules {
		inSpec[rm.Module] = true
	}
	for _, module := range slices.Sorted(maps.Keys(s.status.Modules)) {
		rt := s.status.Modules[module]
		if inSpec[module] || rt.Active == "" || len(out) >= maxModuleStatuses {
			continue
		}
		ms := iteronv1.ModuleStatus{Module: module, Phase: rt.Phase, ImplementationID: rt.ImplementationID, Generation: rt.Lineage,
			GenerationName: rt.Active, Epoch: rt.Epoch, Reason: rt.Reason,
			Message: truncate(fmt.Sprintf("its source left the spec: %s is retired (drained, then its process stopped)", rt.Active), iteronv1.MaxMessageBytes)}
		if rt.Message != "" && rt.Reason != "" {
			ms.Message = truncate(rt.Message, iteronv1.MaxMessageBytes)
		}
		out = append(out, ms)
	}
	return out
}

// maxModuleStatuses is status.modules' maxItems.
const maxModuleStatuses = 64

func failureFor(st hotswap.ActivationStatus, module string) *hotswap.Failure {
	for _, f := range st.Failures {
		if f.Module == module {
			return &f
		}
	}
	return nil
}

// planStatus is the RuntimePlan of this spec against what runs.
func planStatus(s *activationScope) *iteronv1.PlanStatus {
	p := &iteronv1.PlanStatus{SpecGeneration: s.act.Generation, ActivateOrder: s.res.ActivateOrder, DrainOrder: s.res.DrainOrder}
	desired := map[string]bool{}
	for _, rm := range s.res.Modules {
		desired[rm.Module] = true
		rt, running := s.status.Modules[rm.Module]
		switch {
		case !running || rt.Active == "":
			p.Added = append(p.Added, rm.Module)
		case s.targets[rm.Module].Keep || s.targets[rm.Module].GenerationName == rt.Active:
			p.Unchanged = append(p.Unchanged, rm.Module)
		default:
			p.Reloaded = append(p.Reloaded, rm.Module)
		}
	}
	for m, rt := range s.status.Modules {
		if !desired[m] && rt.Active != "" {
			p.Removed = append(p.Removed, m)
		}
	}
	slices.Sort(p.Removed)
	return p
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

// patchStatus writes status once per reconcile, with observedGeneration. It
// reports conflict when the object changed since this reconcile read it.
func (r *ActivationReconciler) patchStatus(ctx context.Context, s *activationScope) (conflict bool, err error) {
	if s.deleted {
		return false, nil
	}
	return patchStatusFrom(ctx, r.Client, s.act, s.base)
}
