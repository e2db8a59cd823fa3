package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/fleet"
	"iteron.dev/operator/internal/fleet/analysis"
)

// The fleet controller's least privilege (config/fleet/role.yaml is
// generated from these markers by make manifests). Nodes are read as
// metadata only (labels), never changed.
// +kubebuilder:rbac:groups=iteron.dev,resources=activationsets,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=activationsets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=activationsets/finalizers,verbs=update
// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch
// +kubebuilder:rbac:groups=apps,resources=controllerrevisions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=analysisproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=iteron-system

// Name is the controller's name (metrics, logs).
const Name = "activationset"

// cacheWait is how soon a reconcile runs again when the cache does not show
// this process's last writes yet (their watch events usually come first).
const cacheWait = 250 * time.Millisecond

// Reconciler reconciles ActivationSets.
type Reconciler struct {
	// Client reads from the cache and writes to the API server.
	Client client.Client
	// Recorder emits events (one per wave or transition, not per node).
	Recorder events.EventRecorder
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// Wrap, when set, wraps the reconciler the controller calls (the scale
	// test times each reconcile with it).
	Wrap func(reconcile.Reconciler) reconcile.Reconciler
	// HTTP makes the analysis measurements (analysis.NewClient if nil).
	HTTP *http.Client

	expect *expectations
	// traces are the rollouts' open spans while tracing is on (in memory
	// only: a restart loses the open ones; see fleet.RolloutTraces).
	traces *fleet.RolloutTraces
}

// Reconcile computes and carries out one step of a set's rollout.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := req.String()
	var set iteronv1.ActivationSet
	if err := r.Client.Get(ctx, req.NamespacedName, &set); err != nil {
		if apierrors.IsNotFound(err) {
			r.expect.forget(key)
			r.traces.Forget(req.NamespacedName, r.Now())
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	now := r.Now()
	if r.expect.staleStatus(key, &set.Status, now) {
		return ctrl.Result{RequeueAfter: cacheWait}, nil
	}
	acts, err := r.activations(ctx, &set)
	if err != nil {
		return ctrl.Result{}, err
	}
	if name := r.expect.unmet(key, acts, now); name != "" {
		log.FromContext(ctx).V(1).Info("waiting for the cache to show this controller's last write", "activation", name)
		return ctrl.Result{RequeueAfter: cacheWait}, nil
	}
	if !set.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, &set, acts)
	}
	if !controllerutil.ContainsFinalizer(&set, iteronv1.FinalizerActivationSet) {
		patch := client.MergeFromWithOptions(set.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&set, iteronv1.FinalizerActivationSet)
		if err := r.Client.Patch(ctx, &set, patch); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	selector, err := metav1.LabelSelectorAsSelector(&set.Spec.NodeSelector)
	if err != nil {
		return r.refuse(ctx, &set, fmt.Sprintf("spec.nodeSelector: %v", err))
	}
	if err := fleet.ValidateStrategy(&set.Spec.Strategy); err != nil {
		return r.refuse(ctx, &set, err.Error())
	}
	nodes, nodeLabels, err := r.nodes(ctx, selector)
	if err != nil {
		return ctrl.Result{}, err
	}
	update, revisions, result, err := r.revisions(ctx, &set)
	if err != nil || result != nil {
		return ptr.Deref(result, ctrl.Result{}), err
	}
	providers, err := r.providers(ctx, &set, update)
	if err != nil {
		if errors.Is(err, errInvalidAnalysis) {
			return r.refuse(ctx, &set, err.Error())
		}
		return ctrl.Result{}, err
	}
	in := fleet.Input{Set: &set, Nodes: nodes, NodeLabels: nodeLabels, Update: update, Revisions: revisions, Now: now}
	names, _ := fleet.AssignNames(set.Name, nodes, nil)
	stamped := map[string]bool{}
	for _, n := range names {
		stamped[n] = true
	}
	for name, a := range acts {
		o := fleet.Observe(a, set.UID)
		if o.Owned || stamped[name] {
			in.Activations = append(in.Activations, o)
		}
	}
	sort.Slice(in.Activations, func(i, j int) bool { return in.Activations[i].Name < in.Activations[j].Name })
	plan := fleet.Compute(in)
	if len(plan.Measure) > 0 {
		// The measurements due are made now, and the plan decided again
		// with their results (a failed one may halt the rollout).
		in.Measured = r.measure(ctx, &set, providers, plan.Measure, now)
		plan = fleet.Compute(in)
	}

	// The status first: it is where a halt, a soak and the stable revision
	// live, and its write is guarded by the set's resourceVersion, so a
	// reconcile of a stale copy carries out nothing.
	// writeStatus leaves the new status in set: announce compares with
	// what it was.
	before := set.DeepCopy()
	conflict, err := r.writeStatus(ctx, &set, plan.Status, plan.Message, now)
	if err != nil || conflict {
		return ctrl.Result{RequeueAfter: cacheWait}, err
	}
	r.announce(before, plan)
	// The trace sees the reconcile's view before this plan's stamps start
	// their nodes' spans: their traceparents go into the stamps' own
	// writes, never a write of their own.
	r.traces.Observe(&in, &plan)
	r.traces.Stamp(&set, plan.Actions, now)
	if err := r.carryOut(ctx, &set, acts, plan.Actions, now); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.prune(ctx, &set, plan.Status, acts); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: plan.RequeueAfter}, nil
}

// activations are the cached activations of the set's namespace, by name.
func (r *Reconciler) activations(ctx context.Context, set *iteronv1.ActivationSet) (map[string]*iteronv1.ImplementationActivation, error) {
	// The cached objects themselves, not copies: nothing here writes
	// through them (an update is made on a copy).
	var list iteronv1.ImplementationActivationList
	if err := r.Client.List(ctx, &list, client.InNamespace(set.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list activations: %w", err)
	}
	out := make(map[string]*iteronv1.ImplementationActivation, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// nodes are the names of the Nodes the selector matches (from the
// metadata cache), but those being deleted, and their labels (the cached
// maps: never written through).
func (r *Reconciler) nodes(ctx context.Context, selector labels.Selector) ([]string, map[string]map[string]string, error) {
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.Client.List(ctx, &list, client.MatchingLabelsSelector{Selector: selector}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make([]string, 0, len(list.Items))
	byName := make(map[string]map[string]string, len(list.Items))
	for _, n := range list.Items {
		if n.DeletionTimestamp.IsZero() {
			out = append(out, n.Name)
			byName[n.Name] = n.Labels
		}
	}
	return out, byName, nil
}

// revisions reads the set's ControllerRevisions and makes sure the
// template's revision exists and is the newest (DaemonSet's history): a
// template seen before (an undo) gets its revision renumbered, a new one a
// revision of its own; a hash naming another template bumps the collision
// count (a status write) and comes back.
func (r *Reconciler) revisions(ctx context.Context, set *iteronv1.ActivationSet) (fleet.Revision, map[string]fleet.Revision, *ctrl.Result, error) {
	var list appsv1.ControllerRevisionList
	if err := r.Client.List(ctx, &list, client.InNamespace(set.Namespace), client.MatchingLabels{iteronv1.LabelActivationSet: set.Name}); err != nil {
		return fleet.Revision{}, nil, nil, fmt.Errorf("list ControllerRevisions: %w", err)
	}
	revs := map[string]fleet.Revision{}
	crs := map[string]*appsv1.ControllerRevision{}
	var newest int64
	for i := range list.Items {
		cr := &list.Items[i]
		if !metav1.IsControlledBy(cr, set) {
			continue
		}
		rev, err := fleet.RevisionOf(cr)
		if err != nil {
			log.FromContext(ctx).Error(err, "ignoring a ControllerRevision that is not a template revision")
			continue
		}
		revs[rev.Name], crs[rev.Name] = rev, cr
		newest = max(newest, rev.Number)
	}
	want, err := fleet.NewRevision(set, newest+1)
	if err != nil {
		return fleet.Revision{}, nil, nil, err
	}
	if existing, ok := revs[want.Name]; ok {
		if !fleet.SameTemplate(existing.Template, &set.Spec.Template) {
			base := set.DeepCopy()
			set.Status.CollisionCount = ptr.To(ptr.Deref(set.Status.CollisionCount, 0) + 1)
			if err := r.Client.Status().Patch(ctx, set, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsConflict(err) {
				return fleet.Revision{}, nil, nil, fmt.Errorf("count a revision hash collision: %w", err)
			}
			return fleet.Revision{}, nil, &ctrl.Result{RequeueAfter: cacheWait}, nil
		}
		if existing.Number < newest {
			cr := crs[want.Name].DeepCopy()
			cr.Revision = newest + 1
			if err := r.Client.Update(ctx, cr); err != nil {
				return fleet.Revision{}, nil, nil, fmt.Errorf("renumber ControllerRevision %s: %w", cr.Name, err)
			}
			existing.Number = cr.Revision
			revs[want.Name] = existing
		}
		return existing, revs, nil, nil
	}
	if err := r.Client.Create(ctx, want); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Not in the cache yet, or not ours: read again.
			return fleet.Revision{}, nil, &ctrl.Result{RequeueAfter: cacheWait}, nil
		}
		return fleet.Revision{}, nil, nil, fmt.Errorf("create ControllerRevision %s: %w", want.Name, err)
	}
	rev, err := fleet.RevisionOf(want)
	if err != nil {
		return fleet.Revision{}, nil, nil, err
	}
	revs[rev.Name] = rev
	return rev, revs, nil, nil
}

// writeStatus writes the plan's status with the conditions and, at rest,
// the observed generation; conflict when the set changed since it was read.
func (r *Reconciler) writeStatus(ctx context.Context, set *iteronv1.ActivationSet, st iteronv1.ActivationSetStatus, message string, now time.Time) (bool, error) {
	base := set.DeepCopy()
	st.Conditions = slices.Clone(set.Status.Conditions)
	for _, c := range fleet.Conditions(st.Phase, message, st.Conflicts, set.Generation) {
		meta.SetStatusCondition(&st.Conditions, c)
	}
	if c, ok := fleet.AnalysisCondition(set, &st); ok {
		meta.SetStatusCondition(&st.Conditions, c)
	}
	st.ObservedGeneration = set.Status.ObservedGeneration
	if fleet.AtRest(st.Phase) {
		st.ObservedGeneration = set.Generation
	}
	if equality.Semantic.DeepEqual(&st, &set.Status) {
		return false, nil
	}
	set.Status = st
	err := r.Client.Status().Patch(ctx, set, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		return true, nil
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("write the status of ActivationSet %s: %w", set.Name, err)
	}
	r.expect.wroteStatus(client.ObjectKeyFromObject(set).String(), &set.Status, now)
	return false, nil
}

// refuse reports a spec that cannot be acted on (Stalled).
func (r *Reconciler) refuse(ctx context.Context, set *iteronv1.ActivationSet, why string) (ctrl.Result, error) {
	st := set.Status.DeepCopy()
	st.Phase = ""
	_, err := r.writeStatus(ctx, set, *st, why, r.Now())
	return ctrl.Result{}, err
}

// announce emits one event per transition worth a person's attention.
func (r *Reconciler) announce(set *iteronv1.ActivationSet, plan fleet.Plan) {
	var moved []string
	for _, a := range plan.Actions {
		if a.Kind == fleet.Move {
			moved = append(moved, a.Node)
		}
	}
	prev := set.Status.Phase
	r.announceAnalysis(set, plan)
	switch {
	case len(moved) > 0:
		r.Recorder.Eventf(set, nil, corev1.EventTypeNormal, "NodesMoved", "Rollout", "%s", plan.Message)
	case plan.Status.Phase != prev && (plan.Status.Phase == iteronv1.RolloutHalted || plan.Status.Phase == iteronv1.RolloutRevertFailed):
		r.Recorder.Eventf(set, nil, corev1.EventTypeWarning, string(plan.Status.Phase), "Rollout", "%s", plan.Message)
	case plan.Status.Phase != prev && (plan.Status.Phase == iteronv1.RolloutCompleted || plan.Status.Phase == iteronv1.RolloutReverted):
		r.Recorder.Eventf(set, nil, corev1.EventTypeNormal, string(plan.Status.Phase), "Rollout", "%s", plan.Message)
	case plan.Status.Phase != prev && plan.Status.Phase == iteronv1.RolloutPausedAtStep:
		r.Recorder.Eventf(set, nil, corev1.EventTypeNormal, string(plan.Status.Phase), "Rollout", "%s", plan.Message)
	}
}

// carryOut writes the plan's actions, each with the cached copy it was
// decided from (an update of a copy that changed since is refused by its
// resourceVersion and decided again).
func (r *Reconciler) carryOut(ctx context.Context, set *iteronv1.ActivationSet, acts map[string]*iteronv1.ImplementationActivation, actions []fleet.Action, now time.Time) error {
	key := client.ObjectKeyFromObject(set).String()
	var errs []error
	for _, a := range actions {
		var err error
		switch a.Kind {
		case fleet.Create:
			obj := fleet.NewActivation(set, a)
			if err = r.Client.Create(ctx, obj); err == nil {
				r.expect.expect(key, a.Activation, expectation{created: true, at: now})
			} else if apierrors.IsAlreadyExists(err) {
				err = nil // not in the cache yet; the next reconcile sees it
			}
		case fleet.Delete:
			obj := acts[a.Activation].DeepCopy()
			err = r.Client.Delete(ctx, obj, client.Preconditions{UID: &obj.UID, ResourceVersion: &obj.ResourceVersion})
			if err == nil || apierrors.IsNotFound(err) {
				err = nil
				r.expect.expect(key, a.Activation, expectation{deleted: true, at: now})
			}
		default:
			obj := acts[a.Activation].DeepCopy()
			fleet.Apply(obj, set, a)
			if err = r.Client.Update(ctx, obj); err == nil {
				r.expect.expect(key, a.Activation, expectation{generation: obj.Generation, retry: a.Retry, at: now})
			}
		}
		if apierrors.IsConflict(err) {
			err = nil // decided again from the newer copy
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s activation %s (node %s): %w", strings.ToLower(string(a.Kind)), a.Activation, a.Node, err))
		}
	}
	return errors.Join(errs...)
}

// prune deletes the revisions beyond revisionHistoryLimit that neither the
// status nor any activation names.
func (r *Reconciler) prune(ctx context.Context, set *iteronv1.ActivationSet, st iteronv1.ActivationSetStatus, acts map[string]*iteronv1.ImplementationActivation) error {
	var list appsv1.ControllerRevisionList
	if err := r.Client.List(ctx, &list, client.InNamespace(set.Namespace), client.MatchingLabels{iteronv1.LabelActivationSet: set.Name}); err != nil {
		return err
	}
	live := map[string]bool{st.CurrentRevision: true, st.UpdateRevision: true}
	if st.Halt != nil {
		live[st.Halt.Revision], live[st.Halt.ToRevision] = true, true
	}
	for _, a := range acts {
		if metav1.IsControlledBy(a, set) {
			live[fleet.RevisionName(set.Name, a.Labels[iteronv1.LabelRevision])] = true
		}
	}
	var old []appsv1.ControllerRevision
	for _, cr := range list.Items {
		if metav1.IsControlledBy(&cr, set) && !live[cr.Name] {
			old = append(old, cr)
		}
	}
	limit := int(ptr.Deref(set.Spec.RevisionHistoryLimit, 10))
	if len(old) <= limit {
		return nil
	}
	sort.Slice(old, func(i, j int) bool { return old[i].Revision < old[j].Revision })
	for _, cr := range old[:len(old)-limit] {
		if err := r.Client.Delete(ctx, &cr); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("prune ControllerRevision %s: %w", cr.Name, err)
		}
	}
	return nil
}

// reconcileDelete deletes every activation the set stamped, waits until
// each one's finalizer let it go (their nodes' managers retire the
// providers), deletes the revisions and lets the set go.
func (r *Reconciler) reconcileDelete(ctx context.Context, set *iteronv1.ActivationSet, acts map[string]*iteronv1.ImplementationActivation) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(set, iteronv1.FinalizerActivationSet) {
		return ctrl.Result{}, nil
	}
	key := client.ObjectKeyFromObject(set).String()
	r.traces.Forget(client.ObjectKeyFromObject(set), r.Now())
	var waiting []string
	for _, a := range acts {
		if !metav1.IsControlledBy(a, set) {
			continue
		}
		waiting = append(waiting, a.Spec.NodeName)
		if a.DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, a.DeepCopy(), client.Preconditions{UID: &a.UID}); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, fmt.Errorf("delete activation %s: %w", a.Name, err)
			}
			r.expect.expect(key, a.Name, expectation{deleted: true, at: r.Now()})
		}
	}
	if len(waiting) > 0 {
		sort.Strings(waiting)
		st := set.Status.DeepCopy()
		st.Phase = iteronv1.RolloutDeleting
		msg := fmt.Sprintf("waiting for the activations of %d nodes to be retired by their managers (%s); a node whose manager is gone keeps its activation: see kubectl iteron doctor",
			len(waiting), strings.Join(waiting[:min(len(waiting), 8)], ", "))
		if _, err := r.writeStatus(ctx, set, *st, msg, r.Now()); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	var list appsv1.ControllerRevisionList
	if err := r.Client.List(ctx, &list, client.InNamespace(set.Namespace), client.MatchingLabels{iteronv1.LabelActivationSet: set.Name}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], set) {
			if err := r.Client.Delete(ctx, &list.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, fmt.Errorf("delete ControllerRevision %s: %w", list.Items[i].Name, err)
			}
		}
	}
	patch := client.MergeFrom(set.DeepCopy())
	controllerutil.RemoveFinalizer(set, iteronv1.FinalizerActivationSet)
	r.expect.forget(key)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, set, patch))
}

// SetupWithManager registers the reconciler. Activations requeue their
// set (its controller owner reference, else its label; the creation or
// deletion of any other activation requeues the sets of its namespace,
// for conflicts); Nodes (metadata only) requeue every set when they come,
// go or change labels.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	r.expect = newExpectations()
	r.traces = &fleet.RolloutTraces{}
	if r.HTTP == nil {
		r.HTTP = analysis.NewClient()
	}
	c := mgr.GetClient()
	allSets := func(ctx context.Context, namespace string) []reconcile.Request {
		var sets iteronv1.ActivationSetList
		opts := []client.ListOption{}
		if namespace != "" {
			opts = append(opts, client.InNamespace(namespace))
		}
		if err := c.List(ctx, &sets, opts...); err != nil {
			return nil
		}
		out := make([]reconcile.Request, len(sets.Items))
		for i, s := range sets.Items {
			out[i] = reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}}
		}
		return out
	}
	activationToSet := handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueueInterface) {
			enqueueActivation(ctx, e.Object, q, allSets, true)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueueInterface) {
			enqueueActivation(ctx, e.ObjectNew, q, allSets, false)
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueueInterface) {
			enqueueActivation(ctx, e.Object, q, allSets, true)
		},
	}
	nodeToSets := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return allSets(ctx, "")
	})
	nodeChanged := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !equality.Semantic.DeepEqual(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
				e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	var rec reconcile.Reconciler = r
	if r.Wrap != nil {
		rec = r.Wrap(r)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&iteronv1.ActivationSet{}).
		Watches(&iteronv1.ImplementationActivation{}, activationToSet).
		Owns(&appsv1.ControllerRevision{}).
		WatchesMetadata(&corev1.Node{}, nodeToSets, builder.WithPredicates(nodeChanged)).
		// A provider that comes, goes or changes may let a refused set go on.
		Watches(&iteronv1.AnalysisProvider{}, nodeToSets).
		Named(Name).
		Complete(rec)
}

type workqueueInterface = workqueue.TypedRateLimitingInterface[reconcile.Request]

// enqueueActivation requeues the set that controls (or labels) an
// activation; the creation or deletion of an activation no set controls
// requeues the sets of its namespace (it may hold, or free, a stamped name).
func enqueueActivation(ctx context.Context, obj client.Object, q workqueueInterface, allSets func(context.Context, string) []reconcile.Request, createOrDelete bool) {
	if ref := metav1.GetControllerOf(obj); ref != nil && ref.Kind == "ActivationSet" && strings.HasPrefix(ref.APIVersion, iteronv1.GroupVersion.Group+"/") {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}})
		return
	}
	if name := obj.GetLabels()[iteronv1.LabelActivationSet]; name != "" {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}})
		return
	}
	if createOrDelete {
		for _, r := range allSets(ctx, obj.GetNamespace()) {
			q.Add(r)
		}
	}
}
