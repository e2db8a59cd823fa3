package controllers

import (
	"context"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// countingClient counts each write its reconciler makes through it, at the
// one place every write passes: a write added later is counted without
// anyone remembering to.
type countingClient struct {
	client.Client
}

// countWrites wraps c once (SetupWithManager may see a client it already
// wrapped when a test sets a reconciler up twice).
func countWrites(c client.Client) client.Client {
	if c == nil {
		return nil
	}
	if _, ok := c.(countingClient); ok {
		return c
	}
	return countingClient{c}
}

// writeKind is the kind label of a write: the object's kind, short for this
// repository's two (activation, generation), then the verb.
func writeKind(c client.Client, obj runtime.Object, verb string) string {
	kind := "unknown"
	if gvk, err := c.GroupVersionKindFor(obj); err == nil {
		kind = strings.ToLower(gvk.Kind)
	}
	switch kind {
	case "implementationactivation":
		kind = "activation"
	}
	return kind + "_" + verb
}

func (c countingClient) count(obj runtime.Object, verb string) {
	apiWrites.WithLabelValues(writeKind(c.Client, obj, verb)).Inc()
}

// Create counts the write and creates obj.
func (c countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.count(obj, "create")
	return c.Client.Create(ctx, obj, opts...)
}

// Update counts the write and updates obj.
func (c countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.count(obj, "update")
	return c.Client.Update(ctx, obj, opts...)
}

// Patch counts the write and patches obj.
func (c countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.count(obj, "patch")
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// Apply counts the write and applies obj.
func (c countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	apiWrites.WithLabelValues("apply").Inc()
	return c.Client.Apply(ctx, obj, opts...)
}

// Delete counts the write and deletes obj.
func (c countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.count(obj, "delete")
	return c.Client.Delete(ctx, obj, opts...)
}

// DeleteAllOf counts the write and deletes the objects.
func (c countingClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	c.count(obj, "delete")
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

// Status is the status writer, counting its writes.
func (c countingClient) Status() client.SubResourceWriter {
	return countingSubResource{SubResourceWriter: c.Client.Status(), c: c.Client, sub: "status"}
}

// SubResource is the subresource's client, counting its writes.
func (c countingClient) SubResource(sub string) client.SubResourceClient {
	return countingSubResourceClient{SubResourceClient: c.Client.SubResource(sub), c: c.Client, sub: sub}
}

// countingSubResource counts writes to a subresource: a status write is
// kind_status whatever its verb (a merge patch or an update).
type countingSubResource struct {
	client.SubResourceWriter
	c   client.Client
	sub string
}

func (w countingSubResource) count(obj runtime.Object) {
	apiWrites.WithLabelValues(writeKind(w.c, obj, w.sub)).Inc()
}

// Create counts the write and creates the subresource.
func (w countingSubResource) Create(ctx context.Context, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
	w.count(obj)
	return w.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

// Update counts the write and updates the subresource.
func (w countingSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	w.count(obj)
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}

// Patch counts the write and patches the subresource.
func (w countingSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	w.count(obj)
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// Apply counts the write and applies the subresource.
func (w countingSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	apiWrites.WithLabelValues("apply_" + w.sub).Inc()
	return w.SubResourceWriter.Apply(ctx, obj, opts...)
}

// countingSubResourceClient is countingSubResource for SubResource(sub).
type countingSubResourceClient struct {
	client.SubResourceClient
	c   client.Client
	sub string
}

func (w countingSubResourceClient) writer() countingSubResource {
	return countingSubResource{SubResourceWriter: w.SubResourceClient, c: w.c, sub: w.sub}
}

// Create counts the write and creates the subresource.
func (w countingSubResourceClient) Create(ctx context.Context, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return w.writer().Create(ctx, obj, sub, opts...)
}

// Update counts the write and updates the subresource.
func (w countingSubResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return w.writer().Update(ctx, obj, opts...)
}

// Patch counts the write and patches the subresource.
func (w countingSubResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return w.writer().Patch(ctx, obj, patch, opts...)
}

// Apply counts the write and applies the subresource.
func (w countingSubResourceClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return w.writer().Apply(ctx, obj, opts...)
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
