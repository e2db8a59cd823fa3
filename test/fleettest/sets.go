package fleettest

import (
	"cmp"
	"context"
	"os/exec"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Sets makes and drives a suite's ActivationSets: over the nodes that carry
// Pool, in Namespace, with Client as the administrator.
type Sets struct {
	Client    client.Client
	Namespace string
	// Pool is the node label (key and value) every set of the suite
	// selects.
	Pool map[string]string
	// Timeout bounds Wait (3 minutes when zero).
	Timeout time.Duration
}

// New creates a set over the pool; it is deleted, and its activations
// retired by their managers, when the test ends.
func (s Sets) New(t *testing.T, name string, tpl iteronv1.ActivationTemplate, strategy iteronv1.RolloutStrategy) client.ObjectKey {
	t.Helper()
	set := &iteronv1.ActivationSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace},
		Spec: iteronv1.ActivationSetSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: s.Pool},
			Template:     tpl, Strategy: strategy,
		},
	}
	if err := s.Client.Create(context.Background(), set); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(set)
	t.Cleanup(func() { s.Delete(t, key) })
	return key
}

// Delete deletes a set and waits until its finalizer let it go (every
// activation it stamped retired by its node's manager).
func (s Sets) Delete(t *testing.T, key client.ObjectKey) {
	ctx := context.Background()
	var set iteronv1.ActivationSet
	if err := s.Client.Get(ctx, key, &set); apierrors.IsNotFound(err) {
		return
	}
	if err := s.Client.Delete(ctx, &set); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %s: %v", key, err)
		return
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := s.Client.Get(ctx, key, &set)
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("ActivationSet %s was not released by its finalizer: %v\n%s", key, set.Status.Conditions, DescribeActivations(s.Client, key))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Edit changes a set (retrying conflicts).
func (s Sets) Edit(t *testing.T, key client.ObjectKey, edit func(*iteronv1.ActivationSet)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var set iteronv1.ActivationSet
		if err := s.Client.Get(context.Background(), key, &set); err != nil {
			return err
		}
		edit(&set)
		return s.Client.Update(context.Background(), &set)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Get reads a set.
func (s Sets) Get(t *testing.T, key client.ObjectKey) *iteronv1.ActivationSet {
	t.Helper()
	var set iteronv1.ActivationSet
	if err := s.Client.Get(context.Background(), key, &set); err != nil {
		t.Fatal(err)
	}
	return &set
}

// Wait waits (Timeout at most) for cond.
func (s Sets) Wait(t *testing.T, key client.ObjectKey, what string, cond func(*iteronv1.ActivationSet) bool) *iteronv1.ActivationSet {
	t.Helper()
	return WaitSet(t, s.Client, key, what, cmp.Or(s.Timeout, 3*time.Minute), cond)
}

// Plugin runs kubectl-iteron at bin with the kubeconfig given and returns
// its output and exit code.
func Plugin(t *testing.T, bin, kubeconfig, namespace string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, append(args, "--kubeconfig="+kubeconfig, "--namespace="+namespace)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kubectl-iteron %v: %v", args, err)
	}
	return string(out), code
}
