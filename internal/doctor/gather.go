package doctor

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// MaxEvents bounds the events a report shows.
const MaxEvents = 10

// NodeLookup is what reading the Node objects established.
type NodeLookup struct {
	// Exists is true when the Node spec.nodeName names exists.
	Exists bool
	// OtherNodes is true when at least one Node object exists (so a missing
	// one is really gone, not merely never registered).
	OtherNodes bool
	// Err is set when Nodes could not be read (RBAC, for example); the
	// node's state is then unknown.
	Err string
}

// NodeView is every activation and Generation of one node: what process
// records are attributed against.
type NodeView struct {
	// Activations are the ImplementationActivations whose spec.nodeName is
	// the node.
	Activations []iteronv1.ImplementationActivation
	// Generations are the Generations whose spec.nodeName is the node.
	Generations []iteronv1.Generation
	// Scope is "cluster" when every namespace was read, else the one
	// namespace that could be.
	Scope string
}

// Input is everything the doctor reads from the API server about one
// activation.
type Input struct {
	// Activation is the diagnosed activation.
	Activation *iteronv1.ImplementationActivation
	// Generations are the Generations it controls (by owner reference).
	Generations []iteronv1.Generation
	// Node is what is known of its Node.
	Node NodeLookup
	// Events are the events about it, oldest first.
	Events []corev1.Event
	// NodeView is every activation and Generation of its node, read only
	// when process records are to be attributed (nil otherwise).
	NodeView *NodeView
	// Unread lists what could not be read, with why.
	Unread []string
}

// GatherOptions say what Gather reads beyond the activation.
type GatherOptions struct {
	// NodeView reads every activation and Generation of the activation's
	// node (for attributing process records; needs cluster-wide list).
	NodeView bool
}

// Gather reads the activation namespace/name and what its diagnosis needs.
// Only failing to read the activation itself is an error (a NotFound one
// included); anything else that cannot be read is listed in Input.Unread
// and the diagnosis says it saw only part of the picture.
func Gather(ctx context.Context, c client.Reader, namespace, name string, opts GatherOptions) (*Input, error) {
	act := &iteronv1.ImplementationActivation{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, act); err != nil {
		return nil, fmt.Errorf("read ImplementationActivation %s/%s: %w", namespace, name, err)
	}
	in := &Input{Activation: act}

	var gens iteronv1.GenerationList
	if err := c.List(ctx, &gens, client.InNamespace(namespace)); err != nil {
		in.Unread = append(in.Unread, fmt.Sprintf("Generations in %s: %v", namespace, err))
	}
	for _, g := range gens.Items {
		if metav1.IsControlledBy(&g, act) {
			in.Generations = append(in.Generations, g)
		}
	}

	in.Node = lookupNode(ctx, c, act.Spec.NodeName)

	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(namespace), client.MatchingFields{"involvedObject.uid": string(act.UID)}); err != nil {
		in.Unread = append(in.Unread, fmt.Sprintf("Events in %s: %v", namespace, err))
	}
	in.Events = newestEvents(events.Items, MaxEvents)

	if opts.NodeView {
		in.NodeView = gatherNodeView(ctx, c, act, in)
	}
	return in, nil
}

// lookupNode decides whether the activation's Node exists. A cluster with
// no Node objects at all (the local control plane, which runs no kubelet)
// tells nothing: the lookup says so instead of calling the Node missing.
func lookupNode(ctx context.Context, c client.Reader, node string) NodeLookup {
	var n corev1.Node
	err := c.Get(ctx, client.ObjectKey{Name: node}, &n)
	switch {
	case err == nil:
		return NodeLookup{Exists: true, OtherNodes: true}
	case !apierrors.IsNotFound(err):
		return NodeLookup{Err: fmt.Sprintf("read Node %s: %v", node, err)}
	}
	var list corev1.NodeList
	if err := c.List(ctx, &list, client.Limit(1)); err != nil {
		return NodeLookup{Err: fmt.Sprintf("list Nodes: %v", err)}
	}
	return NodeLookup{OtherNodes: len(list.Items) > 0}
}

// gatherNodeView lists the node's activations and Generations by the
// selectable field spec.nodeName, cluster-wide when allowed, else in the
// activation's namespace.
func gatherNodeView(ctx context.Context, c client.Reader, act *iteronv1.ImplementationActivation, in *Input) *NodeView {
	onNode := client.MatchingFields{"spec.nodeName": act.Spec.NodeName}
	view := &NodeView{Scope: "cluster"}
	var acts iteronv1.ImplementationActivationList
	var gens iteronv1.GenerationList
	errA := c.List(ctx, &acts, onNode)
	errG := c.List(ctx, &gens, onNode)
	if errA != nil || errG != nil {
		in.Unread = append(in.Unread, fmt.Sprintf("activations and Generations of node %s in every namespace: %v", act.Spec.NodeName, firstError(errA, errG)))
		view.Scope = act.Namespace
		acts, gens = iteronv1.ImplementationActivationList{}, iteronv1.GenerationList{}
		errA = c.List(ctx, &acts, onNode, client.InNamespace(act.Namespace))
		errG = c.List(ctx, &gens, onNode, client.InNamespace(act.Namespace))
		if errA != nil || errG != nil {
			in.Unread = append(in.Unread, fmt.Sprintf("activations and Generations of node %s in %s: %v", act.Spec.NodeName, act.Namespace, firstError(errA, errG)))
			// The diagnosed activation and its Generations are still known.
			acts.Items = []iteronv1.ImplementationActivation{*act}
			gens.Items = in.Generations
		}
	}
	view.Activations, view.Generations = acts.Items, gens.Items
	return view
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// newestEvents keeps the newest n events, oldest first.
func newestEvents(events []corev1.Event, n int) []corev1.Event {
	out := slices.Clone(events)
	slices.SortStableFunc(out, func(a, b corev1.Event) int {
		return eventTime(a).Compare(eventTime(b))
	})
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}
