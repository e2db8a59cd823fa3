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
type Notifier struct {
	activations chan event.GenericEvent
	generations chan event.GenericEvent

	mu      sync.Mutex
	pending map[objectKey]bool // true for an activation, false for a generation
	signal  chan struct{}
}

type objectKey struct{ namespace, name string }

// NotifyCoalesce is how long the notifier gathers notifications after the
// first one before it delivers them: a module's first activation records
// four phases within a few milliseconds, and its Generation's status is
// then written once, not four times. Short against what a reader of the
// status waits for (an activation of 28 modules takes about a second).
const NotifyCoalesce = 50 * time.Millisecond

// NewNotifier returns a notifier; call Run to deliver.
func NewNotifier() *Notifier {
	return &Notifier{
		activations: make(chan event.GenericEvent, 256),
		generations: make(chan event.GenericEvent, 256),
		pending:     map[objectKey]bool{},
		signal:      make(chan struct{}, 1),
	}
}

// Activations is the activation controller's channel source.
func (n *Notifier) Activations() <-chan event.GenericEvent { return n.activations }

// Generations is the generation controller's channel source.
func (n *Notifier) Generations() <-chan event.GenericEvent { return n.generations }

// Notify records a coordinator notification (hotswap.Config.Notify).
func (n *Notifier) Notify(note hotswap.Notification) {
	n.mu.Lock()
	if !note.GenerationsOnly {
		n.pending[objectKey{note.Namespace, note.Name}] = true
	}
	for _, g := range note.Generations {
		k := objectKey{note.Namespace, g}
		if _, isActivation := n.pending[k]; !isActivation {
			n.pending[k] = false
		}
	}
	n.mu.Unlock()
	select {
	case n.signal <- struct{}{}:
	default:
	}
}

// Run delivers pending notifications until ctx ends (a manager Runnable).
func (n *Notifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.signal:
		}
		gather := time.NewTimer(NotifyCoalesce)
		select {
		case <-ctx.Done():
			gather.Stop()
			return nil
		case <-gather.C:
		}
		n.mu.Lock()
		pending := n.pending
		n.pending = map[objectKey]bool{}
		n.mu.Unlock()
		for k, isActivation := range pending {
			meta := metav1.ObjectMeta{Namespace: k.namespace, Name: k.name}
			var err error
			if isActivation {
				err = send(ctx, n.activations, event.GenericEvent{Object: &iteronv1.ImplementationActivation{ObjectMeta: meta}})
			} else {
				err = send(ctx, n.generations, event.GenericEvent{Object: &iteronv1.Generation{ObjectMeta: meta}})
			}
			if err != nil {
				return nil
			}
		}
	}
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
