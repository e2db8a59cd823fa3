package controllers

import (
	"context"
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// The reconcilers' own cost, so that how often a reconcile verifies and
// writes can be measured rather than guessed (docs/operations.md, Metrics).
var (
	activationReconciles = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "iteron", Name: "activation_reconciles_total",
		Help: "ImplementationActivation Reconcile calls (an object already gone included).",
	})
	activationVerifications = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "iteron", Name: "activation_verifications_total",
		Help: "Verifications of an activation's sources against the files on this node (its catalogs, manifests and executables), by the activation reconciler.",
	})
	apiWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "iteron", Name: "activation_api_writes_total",
		Help: "Writes to the API server by the activation and generation reconcilers, by what was written (activation_status, generation_create, generation_status, event, …).",
	}, []string{"kind"})
)

// Collectors are the reconcilers' metrics, for the manager to register
// (controller-runtime's registry).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{activationReconciles, activationVerifications, apiWrites}
}

// Write kinds of iteron_activation_api_writes_total that are not derived
// from an object's kind and a verb.
const writeKindEvent = "event"

// countedClient is a reconciler's client whose every write is counted, at
// the one place every write passes (controller-runtime's interceptor): a
// write added later is counted without anyone remembering to.
type countedClient struct {
	client.WithWatch
}

// countWrites wraps c once (SetupWithManager may see a client it already
// wrapped when a test sets a reconciler up twice).
func countWrites(c client.Client) client.Client {
	if c == nil {
		return nil
	}
	if _, ok := c.(countedClient); ok {
		return c
	}
	return countedClient{interceptor.NewClient(watchless{c}, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			countWrite(c, obj, "create")
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			countWrite(c, obj, "update")
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			countWrite(c, obj, "patch")
			return c.Patch(ctx, obj, patch, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			apiWrites.WithLabelValues("apply").Inc()
			return c.Apply(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			countWrite(c, obj, "delete")
			return c.Delete(ctx, obj, opts...)
		},
		DeleteAllOf: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			countWrite(c, obj, "delete")
			return c.DeleteAllOf(ctx, obj, opts...)
		},
		// A subresource write is kind_<subresource> whatever its verb (a
		// status merge patch or update is activation_status).
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			countWrite(c, obj, sub)
			return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			countWrite(c, obj, sub)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			countWrite(c, obj, sub)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			apiWrites.WithLabelValues("apply_" + sub).Inc()
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
	})}
}

// watchless is a manager's client, which cannot watch, as the interceptor
// takes it; the reconcilers never watch through their client.
type watchless struct {
	client.Client
}

// Watch refuses: the manager's client has no watch.
func (watchless) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("the reconciler's client does not watch")
}

// countWrite counts one write of obj: the label is the object's kind,
// short for this repository's activation, then the verb or subresource.
func countWrite(c client.Client, obj runtime.Object, verb string) {
	kind := "unknown"
	if gvk, err := c.GroupVersionKindFor(obj); err == nil {
		kind = strings.ToLower(gvk.Kind)
	}
	if kind == "implementationactivation" {
		kind = "activation"
	}
	apiWrites.WithLabelValues(kind + "_" + verb).Inc()
}

// countingRecorder counts the events a reconciler emits. The broadcaster
// writes them asynchronously and folds repeats into a series, so this is
// what was asked of it, at most one write each.
type countingRecorder struct {
	events.EventRecorder
}

// countEvents wraps r once.
func countEvents(r events.EventRecorder) events.EventRecorder {
	if r == nil {
		return nil
	}
	if _, ok := r.(countingRecorder); ok {
		return r
	}
	return countingRecorder{r}
}

// Eventf counts the event and emits it.
func (r countingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...interface{}) {
	apiWrites.WithLabelValues(writeKindEvent).Inc()
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}
