package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

// GenerationStatusSource is what the generation controller reads of the
// coordinator.
type GenerationStatusSource interface {
	Status(uid string) (hotswap.ActivationStatus, bool)
}

// GenerationReconciler runs the Generation objects' lifecycle: it creates
// the ones an activation's plan names (Records), and mirrors the
// coordinator's state of each generation into its object's status. It
// never blocks on a process: the coordinator reports changes through
// Notifications.
type GenerationReconciler struct {
	// Client reads and writes objects (through the node-scoped cache).
	Client client.Client
	// Coordinator is read, never changed.
	Coordinator GenerationStatusSource
	// Notifications requeues Generations the coordinator changed.
	Notifications <-chan event.GenericEvent
	// Mirrored is told of each Generation whose reconcile ended, patched
	// or not, and when that reconcile began (Notifier.Mirrored; nil: no
	// one is told).
	Mirrored func(namespace, name string, began time.Time)
	// Records are the Generations plans wait for; their requests queue
	// the creations.
	Records *GenerationRecords
	// Recorded tells the coordinator a planned Generation was created, or
	// why not (hotswap.Coordinator.Recorded).
	Recorded func(uid, generation string, err error)
	// Recorder emits the creation events.
	Recorder events.EventRecorder
}

// Reconcile copies the coordinator's view of one generation into status.
func (r *GenerationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if r.Mirrored != nil {
		began := time.Now()
		defer func() { r.Mirrored(req.Namespace, req.Name, began) }()
	}
	var gen iteronv1.Generation
	if err := r.Client.Get(ctx, req.NamespacedName, &gen); apierrors.IsNotFound(err) {
		if r.Records.madeHereUnseen(req.NamespacedName) {
			// Created here, not in the cache yet, and its creation event
			// will not bring it back: look again shortly.
			return ctrl.Result{RequeueAfter: madeHereRecheck}, nil
		}
		return ctrl.Result{}, r.create(ctx, req.NamespacedName)
	} else if err != nil {
		return ctrl.Result{}, err
	}
	owner := metav1.GetControllerOf(&gen)
	if owner == nil {
		return ctrl.Result{}, nil
	}
	live := gen.Status.Phase == iteronv1.PhaseActive || gen.Status.Phase == iteronv1.PhasePreparing || gen.Status.Phase == iteronv1.PhaseDraining
	st, ok := r.Coordinator.Status(string(owner.UID))
	if !ok {
		if live {
			// A restarted manager has not replayed this activation's ledger
			// yet: look again once it has.
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return ctrl.Result{}, nil
	}
	base := gen.DeepCopy()
	gs, ok := st.Generations[gen.Name]
	if !ok {
		if !live {
			if unstarted(&gen) {
				// Created, but the coordinator has not taken it up yet. The
				// notifications that report it usually requeue it, but one
				// that arrives before this cache has the object is lost:
				// look again for a while rather than rely on it.
				return ctrl.Result{RequeueAfter: unstartedRecheck}, nil
			}
			return ctrl.Result{}, nil
		}
		// The status says live, but no process of this manager runs it: a
		// generation its predecessor left mid-transaction. Once the ledger
		// names another generation for the module, this one is over.
		ms, known := st.Modules[gen.Spec.Module]
		superseded := !known && !st.Busy ||
			known && ms.Active != "" && ms.Active != gen.Name ||
			known && ms.Committed != nil && ms.Committed.Name != gen.Name
		if !superseded {
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		successor := ms.Active
		if successor == "" && ms.Committed != nil {
			successor = ms.Committed.Name
		}
		markSuperseded(&gen, successor)
		return r.patchStatus(ctx, &gen, base)
	}
	mirrorGeneration(&gen, gs)
	res, err := r.patchStatus(ctx, &gen, base)
	if err == nil && res.IsZero() && audited(&gen) {
		// Nothing signals a violation: its count is read again while the
		// provider runs.
		res.RequeueAfter = auditRecheck
	}
	return res, err
}

// create makes the Generation key that a plan waits for, if one does, and
// tells the coordinator; a refusal is kept for the activation's conditions
// and retried with the controller's backoff.
func (r *GenerationReconciler) create(ctx context.Context, key types.NamespacedName) error {
	rec, ok := r.Records.get(key)
	if !ok {
		return nil
	}
	uid := string(rec.owner.UID)
	// A Generation the coordinator runs already (one re-created after it
	// was deleted) gets no notification: its creation event mirrors it.
	st, _ := r.Coordinator.Status(uid)
	_, running := st.Generations[key.Name]
	r.Records.creating(key, !running)
	err := r.Client.Create(ctx, rec.object.DeepCopy())
	if err != nil {
		r.Records.creating(key, false)
	}
	switch {
	case err == nil:
		r.Recorder.Eventf(rec.owner, rec.object, corev1.EventTypeNormal, "GenerationCreated", "Plan", "%s", rec.note)
	case apierrors.IsAlreadyExists(err):
		// Created by an earlier attempt whose answer was lost, or seen
		// late by the cache.
	default:
		refusal := apiRefusal("create Generation "+key.Name, err)
		r.Records.refused(key, refusal)
		r.Recorded(uid, key.Name, refusal)
		return refusal
	}
	r.Records.created(key)
	r.Recorded(uid, key.Name, nil)
	return nil
}

// madeHereRecheck is how soon a Generation created here and not yet in the
// cache is looked at again.
const madeHereRecheck = 100 * time.Millisecond

// auditRecheck is how often an audited provider's Generation is mirrored
// again, for the violations it counted since (status.sandbox.violations).
const auditRecheck = 5 * time.Second

// audited reports a live Generation whose provider runs under
// --sandbox=audit.
func audited(gen *iteronv1.Generation) bool {
	sb := gen.Status.Sandbox
	return sb != nil && sb.Mode == "audit" && (gen.Status.Phase == iteronv1.PhaseActive || gen.Status.Phase == iteronv1.PhasePreparing)
}

// patchStatus writes the mirrored status; a Generation that changed since
// it was read is read and mirrored again.
func (r *GenerationReconciler) patchStatus(ctx context.Context, gen, base *iteronv1.Generation) (ctrl.Result, error) {
	conflict, err := patchStatusFrom(ctx, r.Client, gen, base)
	if conflict {
		return ctrl.Result{RequeueAfter: conflictRequeue}, nil
	}
	return ctrl.Result{}, err
}

// unstartedRecheck is how often a Generation the coordinator has not taken
// up is looked at again, for unstartedWindow after its creation.
const (
	unstartedRecheck = 2 * time.Second
	unstartedWindow  = 2 * time.Minute
)

// unstarted reports a recent Generation whose status was never written.
func unstarted(gen *iteronv1.Generation) bool {
	return gen.Status.ObservedGeneration == 0 && gen.Status.Phase == "" &&
		time.Since(gen.CreationTimestamp.Time) < unstartedWindow
}

// markSuperseded ends the status of a generation that a previous manager
// left live and the ledger has since replaced.
func markSuperseded(gen *iteronv1.Generation, successor string) {
	s := &gen.Status
	s.ObservedGeneration = gen.Generation
	s.Phase, s.Pid = iteronv1.PhaseInactive, 0
	s.Message = "its process ended with the manager that ran it; the ledger's last committed generation of the module is " + successor
	if successor == "" {
		s.Message = "its process ended with the manager that ran it; the module no longer runs"
	}
	now := metav1.Now()
	if s.DrainedAt == nil {
		s.DrainedAt = &now
	}
	for _, c := range []metav1.Condition{
		{Type: iteronv1.ConditionReady, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: s.Message},
		{Type: iteronv1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "Inactive"},
		{Type: iteronv1.ConditionStalled, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "not stalled"},
	} {
		c.ObservedGeneration = gen.Generation
		meta.SetStatusCondition(&s.Conditions, c)
	}
}

func timeOrNil(t metav1.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// mirrorGeneration writes a coordinator generation status into an object.
func mirrorGeneration(gen *iteronv1.Generation, gs hotswap.GenerationStatus) {
	s := &gen.Status
	s.ObservedGeneration = gen.Generation
	s.Phase, s.Step = gs.Phase, gs.Step
	s.Pid = int64(gs.Pid)
	if gs.Pid != 0 {
		s.ProcessStartedAt = timeOrNil(metav1.NewTime(gs.ProcessStartedAt))
	}
	s.Renewals = gs.Renewals
	s.StateSHA256 = gs.StateSHA256
	if gs.LastCheckpoint != nil {
		s.LastCheckpoint = &iteronv1.Checkpoint{StateSHA256: gs.LastCheckpoint.StateSHA256, At: metav1.NewTime(gs.LastCheckpoint.At)}
	}
	s.Reason, s.Message = gs.Reason, truncate(gs.Message, iteronv1.MaxMessageBytes)
	s.StderrTail = tailBytes(gs.StderrTail, 2048)
	s.StderrDroppedBytes = gs.StderrDropped
	s.Receipts = &iteronv1.ReceiptSummary{Total: gs.Receipts.Total, Irreversible: gs.Receipts.Irreversible, Truncated: gs.Receipts.Truncated,
		IncompleteReason: truncate(gs.Receipts.IncompleteReason, 256)}
	if gs.TransactionID != "" {
		s.Ledger = &iteronv1.LedgerPosition{TransactionID: gs.TransactionID, LastSequence: int64(gs.LastSequence), LastRecordSHA256: gs.LastRecordSHA256}
	}
	s.StartedAt = timeOrNil(metav1.NewTime(gs.StartedAt))
	s.ActivatedAt = timeOrNil(metav1.NewTime(gs.ActivatedAt))
	s.DrainedAt = timeOrNil(metav1.NewTime(gs.DrainedAt))
	s.Sandbox = boundedSandbox(gs.Sandbox)
	ready := metav1.Condition{Type: iteronv1.ConditionReady, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonProgressing, Message: string(gs.Phase) + " at " + string(gs.Step), ObservedGeneration: gen.Generation}
	reconciling := metav1.Condition{Type: iteronv1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: string(gs.Phase), ObservedGeneration: gen.Generation}
	stalled := metav1.Condition{Type: iteronv1.ConditionStalled, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "not stalled", ObservedGeneration: gen.Generation}
	switch {
	case gs.Phase == iteronv1.PhaseActive:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, iteronv1.ReasonSucceeded, "serving"
	case gs.Phase == iteronv1.PhaseFailed:
		ready.Reason, ready.Message = reasonOf(gs.Reason), truncate(gs.Message, iteronv1.MaxMessageBytes)
		stalled.Status, stalled.Reason, stalled.Message = metav1.ConditionTrue, ready.Reason, ready.Message
	case gs.Phase == iteronv1.PhasePreparing || gs.Phase == iteronv1.PhaseDraining:
		reconciling.Status, reconciling.Reason = metav1.ConditionTrue, iteronv1.ReasonProgressing
		reconciling.Message = string(gs.Phase) + " at " + string(gs.Step)
		if gs.Reason != "" {
			ready.Reason, ready.Message = reasonOf(gs.Reason), truncate(gs.Message, iteronv1.MaxMessageBytes)
		}
	case gs.Reason != "":
		ready.Reason, ready.Message = reasonOf(gs.Reason), truncate(gs.Message, iteronv1.MaxMessageBytes)
	}
	if p := gen.Spec.FailurePolicy; p != "" && p != "fail_closed" && ready.Status == metav1.ConditionTrue {
		// The host owns fallback and quarantine: say so where people look.
		ready.Message = fmt.Sprintf("serving (failure_policy %s is treated as fail_closed: the host owns fallback and quarantine)", p)
	}
	meta.SetStatusCondition(&s.Conditions, ready)
	meta.SetStatusCondition(&s.Conditions, reconciling)
	meta.SetStatusCondition(&s.Conditions, stalled)
}

// tailBytes keeps the last n bytes of s, starting at a rune boundary.
func tailBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := len(s) - n
	for cut < len(s) && s[cut]&0xC0 == 0x80 {
		cut++
	}
	return s[cut:]
}

// SetupWithManager registers the reconciler.
func (r *GenerationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	// Several workers: mirroring one Generation never waits for another
	// (a slow status write of one activation's Generation does not hold up
	// the rest). Each reconcile only reads the coordinator and patches.
	r.Client = countWrites(r.Client)
	r.Recorder = countEvents(r.Recorder)
	b := ctrl.NewControllerManagedBy(mgr).
		// A Generation this controller created is mirrored when the
		// coordinator reports what it does with it, not on its creation.
		For(&iteronv1.Generation{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(e event.CreateEvent) bool {
				return r.Records == nil || !r.Records.madeHereSeen(client.ObjectKeyFromObject(e.Object))
			},
		})).
		Named("generation").
		// Eight: a first activation of many modules has its Generations
		// created eight at a time.
		WithOptions(controller.Options{MaxConcurrentReconciles: 8})
	if r.Notifications != nil {
		b = b.WatchesRawSource(source.Channel(r.Notifications, &handler.EnqueueRequestForObject{}))
	}
	if r.Records != nil {
		b = b.WatchesRawSource(source.Channel(r.Records.Requests(), &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// maxViolationKinds bounds status.sandbox.violations (its CRD schema's
// maxProperties).
const maxViolationKinds = 64

// boundedSandbox is the sandbox status within the CRD's bounds: at most
// maxViolationKinds syscalls, the most frequent kept.
func boundedSandbox(sb *iteronv1.SandboxStatus) *iteronv1.SandboxStatus {
	if sb == nil || len(sb.Violations) <= maxViolationKinds {
		return sb
	}
	out := *sb
	names := make([]string, 0, len(sb.Violations))
	for n := range sb.Violations {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(sb.Violations[b], sb.Violations[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out.Violations = make(map[string]int64, maxViolationKinds)
	for _, n := range names[:maxViolationKinds] {
		out.Violations[n] = sb.Violations[n]
	}
	return &out
}
