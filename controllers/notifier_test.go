package controllers

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/event"

	"iteron.dev/operator/internal/hotswap"
)

// startNotifier runs a notifier until the test ends.
func startNotifier(t *testing.T) *Notifier {
	t.Helper()
	n := NewNotifier()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

// receive waits up to within for an event on ch and returns its object's
// name ("" when none came).
func receive(ch <-chan event.GenericEvent, within time.Duration) string {
	select {
	case e := <-ch:
		return e.Object.GetNamespace() + "/" + e.Object.GetName()
	case <-time.After(within):
		return ""
	}
}

func TestAnActivationWhoseGenerationsChangedIsRequeuedOnceTheyAreMirrored(t *testing.T) {
	n := startNotifier(t)
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act", Generations: []string{"act-m-2-1"}, GenerationsOnly: true})
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act"})
	if got := receive(n.Generations(), 5*time.Second); got != "ns/act-m-2-1" {
		t.Fatalf("the generation controller got %q; want ns/act-m-2-1", got)
	}
	// Held: its Generation is not mirrored yet.
	if got := receive(n.Activations(), 4*NotifyCoalesce); got != "" {
		t.Fatalf("the activation was requeued (%s) before its Generation was mirrored", got)
	}
	n.Mirrored("ns", "act-m-2-1", time.Now())
	if got := receive(n.Activations(), 5*time.Second); got != "ns/act" {
		t.Fatalf("after the mirror the activation controller got %q; want ns/act", got)
	}
	if got := receive(n.Activations(), 4*NotifyCoalesce); got != "" {
		t.Fatalf("a second requeue of %s followed", got)
	}
}

func TestAnActivationWithNothingToMirrorIsRequeuedAtOnce(t *testing.T) {
	n := startNotifier(t)
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act"})
	if got := receive(n.Activations(), 5*time.Second); got != "ns/act" {
		t.Fatalf("the activation controller got %q; want ns/act", got)
	}
	if got := receive(n.Generations(), 4*NotifyCoalesce); got != "" {
		t.Fatalf("the generation controller got %q from a notification that named no Generation", got)
	}
}

func TestAGenerationThatNeverReportsHoldsItsActivationAtMostMirrorWait(t *testing.T) {
	n := startNotifier(t)
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act", Generations: []string{"gone"}})
	if got := receive(n.Generations(), 5*time.Second); got != "ns/gone" {
		t.Fatalf("the generation controller got %q; want ns/gone", got)
	}
	start := time.Now()
	if got := receive(n.Activations(), MirrorWait+5*time.Second); got != "ns/act" {
		t.Fatalf("the activation controller got %q within MirrorWait and 5s; want ns/act", got)
	}
	if waited := time.Since(start); waited < MirrorWait/2 {
		t.Fatalf("the activation was requeued after %v, before its Generation reported or MirrorWait (%v) passed", waited, MirrorWait)
	}
	// Nothing is left held: the next notification is delivered at once.
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act"})
	if got := receive(n.Activations(), 5*time.Second); got != "ns/act" {
		t.Fatalf("a later notification got %q; want ns/act", got)
	}
}

func TestAMirroredGenerationOfAnotherActivationReleasesNothing(t *testing.T) {
	n := startNotifier(t)
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "a", Generations: []string{"a-m-1-1"}})
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "b", Generations: []string{"b-m-1-1"}})
	for range 2 {
		if got := receive(n.Generations(), 5*time.Second); got == "" {
			t.Fatal("a Generation event did not come")
		}
	}
	n.Mirrored("ns", "b-m-1-1", time.Now())
	if got := receive(n.Activations(), 5*time.Second); got != "ns/b" {
		t.Fatalf("got %q; want ns/b, whose Generation was mirrored", got)
	}
	if got := receive(n.Activations(), 4*NotifyCoalesce); got != "" {
		t.Fatalf("%s was requeued though its Generation was not mirrored", got)
	}
}

func TestAMirrorThatBeganBeforeTheLatestNotificationReleasesNothing(t *testing.T) {
	n := startNotifier(t)
	// A reconcile of the Generation is under way when the coordinator
	// reports another change of it (the swap's last step): that reconcile
	// read the coordinator before the change.
	began := time.Now()
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act", Generations: []string{"act-m-2-1"}, GenerationsOnly: true})
	n.Notify(hotswap.Notification{Namespace: "ns", Name: "act"})
	if got := receive(n.Generations(), 5*time.Second); got != "ns/act-m-2-1" {
		t.Fatalf("the generation controller got %q; want ns/act-m-2-1", got)
	}
	n.Mirrored("ns", "act-m-2-1", began)
	if got := receive(n.Activations(), 4*NotifyCoalesce); got != "" {
		t.Fatalf("the activation was requeued (%s) by a mirror that began before its Generation's last change", got)
	}
	// The reconcile the notification brought mirrors it.
	n.Mirrored("ns", "act-m-2-1", time.Now())
	if got := receive(n.Activations(), 5*time.Second); got != "ns/act" {
		t.Fatalf("after the later mirror the activation controller got %q; want ns/act", got)
	}
}
