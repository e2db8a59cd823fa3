package controllers

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

// Notifier turns coordinator notifications into requeue events for the two
// controllers. Notify never blocks the coordinator: notifications are
// coalesced into a set that Run drains into the channels, at most once per
// NotifyCoalesce, so that the notifications of one transaction (one per
// phase) become one reconcile, and one status write, of each object.
//
// An activation's requeue waits until the Generations the coordinator
// reported for it were mirrored (Mirrored, or MirrorWait at most): the
// activation is Ready only once its Generations show what happened, and a
// requeue that ran ahead of their mirror would only have to run again. A
// mirror counts only if its reconcile began after the notification: one
// that began before read the coordinator before the change it reports.
type Notifier struct {
	activations chan event.GenericEvent
	generations chan event.GenericEvent

	mu      sync.Mutex
	pending map[objectKey]bool // true for an activation, false for a generation
	// unmirrored maps each Generation delivered to the generation
	// controller, and not yet mirrored, to its activation and the time of
	// its latest notification.
	unmirrored map[objectKey]unmirrored
	// held are the activations whose requeue waits for unmirrored
	// Generations, with the time it is delivered regardless.
	held map[objectKey]time.Time

	signal  chan struct{}
	release chan struct{}
}

type objectKey struct{ namespace, name string }

// unmirrored is a Generation's activation and when the coordinator last
// reported a change of it.
type unmirrored struct {
	activation objectKey
	notedAt    time.Time
}

// NotifyCoalesce is how long the notifier gathers notifications after the
// first one before it delivers them: a module's first activation records
// four phases within a few milliseconds, and its Generation's status is
// then written once, not four times. Short against what a reader of the
// status waits for (an activation of 28 modules takes about a second).
const NotifyCoalesce = 50 * time.Millisecond

// MirrorWait bounds how long an activation's requeue waits for its
// Generations to be mirrored: a Generation whose reconcile never reports
// (deleted, failing to patch) must not hold its activation back for good.
const MirrorWait = 3 * time.Second

// NewNotifier returns a notifier; call Run to deliver.
func NewNotifier() *Notifier {
	return &Notifier{
		activations: make(chan event.GenericEvent, 256),
		generations: make(chan event.GenericEvent, 256),
		pending:     map[objectKey]bool{},
		unmirrored:  map[objectKey]unmirrored{},
		held:        map[objectKey]time.Time{},
		signal:      make(chan struct{}, 1),
		release:     make(chan struct{}, 1),
	}
}

// Activations is the activation controller's channel source.
func (n *Notifier) Activations() <-chan event.GenericEvent { return n.activations }

// Generations is the generation controller's channel source.
func (n *Notifier) Generations() <-chan event.GenericEvent { return n.generations }

// Notify records a coordinator notification (hotswap.Config.Notify).
func (n *Notifier) Notify(note hotswap.Notification) {
	now := time.Now()
	n.mu.Lock()
	act := objectKey{note.Namespace, note.Name}
	if !note.GenerationsOnly {
		n.pending[act] = true
	}
	for _, g := range note.Generations {
		k := objectKey{note.Namespace, g}
		if _, isActivation := n.pending[k]; !isActivation {
			n.pending[k] = false
		}
		n.unmirrored[k] = unmirrored{activation: act, notedAt: now}
	}
	n.mu.Unlock()
	poke(n.signal)
}

// Mirrored records that the generation controller finished a reconcile of
// the Generation namespace/name that began at began
// (GenerationReconciler.Mirrored): an activation requeue held for it may go,
// unless the coordinator reported a change of it after began, which that
// reconcile may have missed (the notification's own reconcile follows).
func (n *Notifier) Mirrored(namespace, name string, began time.Time) {
	k := objectKey{namespace, name}
	n.mu.Lock()
	u, was := n.unmirrored[k]
	was = was && !began.Before(u.notedAt)
	if was {
		delete(n.unmirrored, k)
	}
	n.mu.Unlock()
	if was {
		poke(n.release)
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Run delivers pending notifications until ctx ends (a manager Runnable).
func (n *Notifier) Run(ctx context.Context) error {
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.signal:
			gather := time.NewTimer(NotifyCoalesce)
			select {
			case <-ctx.Done():
				gather.Stop()
				return nil
			case <-gather.C:
			}
		case <-n.release:
		case <-expiry.C:
		}
		generations, activations, next := n.due(time.Now())
		for _, e := range generations {
			if send(ctx, n.generations, e) != nil {
				return nil
			}
		}
		for _, e := range activations {
			if send(ctx, n.activations, e) != nil {
				return nil
			}
		}
		expiry.Stop()
		if !next.IsZero() {
			expiry.Reset(max(time.Until(next), time.Millisecond))
		}
	}
}

// due takes the pending notifications: every Generation's, and the
// activations' that wait for no unmirrored Generation (or waited
// MirrorWait). next is when the first held activation is due regardless.
func (n *Notifier) due(now time.Time) (generations, activations []event.GenericEvent, next time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, isActivation := range n.pending {
		if isActivation {
			if _, held := n.held[k]; !held {
				n.held[k] = now.Add(MirrorWait)
			}
			continue
		}
		generations = append(generations, event.GenericEvent{Object: &iteronv1.Generation{ObjectMeta: metav1.ObjectMeta{Namespace: k.namespace, Name: k.name}}})
	}
	n.pending = map[objectKey]bool{}
	waiting := map[objectKey]bool{}
	for _, u := range n.unmirrored {
		waiting[u.activation] = true
	}
	for act, deadline := range n.held {
		if waiting[act] && now.Before(deadline) {
			if next.IsZero() || deadline.Before(next) {
				next = deadline
			}
			continue
		}
		delete(n.held, act)
		if waiting[act] {
			// Waited long enough: what was not mirrored by now is left
			// to the generation controller's own retries.
			for g, u := range n.unmirrored {
				if u.activation == act {
					delete(n.unmirrored, g)
				}
			}
		}
		activations = append(activations, event.GenericEvent{Object: &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Namespace: act.namespace, Name: act.name}}})
	}
	return generations, activations, next
}

// Start makes the notifier a controller-runtime Runnable.
func (n *Notifier) Start(ctx context.Context) error { return n.Run(ctx) }

func send(ctx context.Context, ch chan event.GenericEvent, e event.GenericEvent) error {
	select {
	case ch <- e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
