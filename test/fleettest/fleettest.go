// Package fleettest holds what the ActivationSet suites share: the fleet
// controller's and the node managers' RBAC installed as shipped, clients and
// kubeconfigs that act as their service accounts, Node objects, and waits on
// sets and activations that print what they saw when they time out. Test
// packages only.
package fleettest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

// Service accounts, as the API server names them.
const (
	FleetUser   = "system:serviceaccount:iteron-system:iteron-fleet"
	ManagerUser = operatortest.ManagerUser
)

// Groups of a service account of iteron-system.
var saGroups = []string{"system:serviceaccounts", "system:serviceaccounts:iteron-system", "system:authenticated"}

// InstallRBAC creates namespace iteron-system and applies, as shipped, the
// fleet controller's service account, generated role and bindings, and the
// node managers' role, binding and Generation admission policy.
func InstallRBAC(env *kubeapi.Environment) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "iteron-system"}}
	if err := env.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, f := range []string{
		"config/fleet/service_account.yaml", "config/fleet/role.yaml", "config/fleet/role_binding.yaml",
		"config/rbac/service_account.yaml", "config/rbac/role.yaml", "config/rbac/role_binding.yaml", "config/admission/generation_writers.yaml",
	} {
		if err := operatortest.ApplyFile(env.Client, filepath.Join(env.RepoRoot, f)); err != nil {
			return err
		}
	}
	return nil
}

// As is a copy of cfg that acts as user (a service account of
// iteron-system).
func As(cfg *rest.Config, user string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: saGroups}
	return c
}

// KubeconfigAs writes, next to the administrator's kubeconfig admin, one
// that acts as user (kubectl's --as), for the manager binaries; it returns
// its path.
func KubeconfigAs(admin, user, name string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return "", err
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate, a.ImpersonateGroups = user, saGroups
	}
	path := filepath.Join(filepath.Dir(admin), name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

// CreateNodes creates Node objects with labels (the local control plane has
// no kubelet: a Node is only an object here).
func CreateNodes(t testing.TB, c client.Client, labels map[string]string, names ...string) {
	t.Helper()
	for _, n := range names {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}}}
		for k, v := range labels {
			node.Labels[k] = v
		}
		if err := c.Create(context.Background(), node); err != nil {
			t.Fatalf("create Node %s: %v", n, err)
		}
	}
}

// LabelNode sets (value non-empty) or removes a label of a Node.
func LabelNode(t testing.TB, c client.Client, name, key, value string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		if value == "" {
			delete(n.Labels, key)
		} else {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[key] = value
		}
		return c.Update(context.Background(), &n)
	})
	if err != nil {
		t.Fatalf("label Node %s %s=%q: %v", name, key, value, err)
	}
}

// Template is an activation template of sources, with the candidate test
// plans carry.
func Template(candidate string, sources ...iteronv1.ActivationSource) iteronv1.ActivationTemplate {
	return iteronv1.ActivationTemplate{CandidateSHA256: candidate, Sources: sources}
}

// Condition is a condition of a set, or nil.
func Condition(s *iteronv1.ActivationSet, typ string) *metav1.Condition {
	return meta.FindStatusCondition(s.Status.Conditions, typ)
}

// Phase reports a set at phase for its current spec (conditions of this
// generation).
func Phase(phase iteronv1.RolloutPhase) func(*iteronv1.ActivationSet) bool {
	return func(s *iteronv1.ActivationSet) bool {
		r := Condition(s, iteronv1.ConditionReady)
		return s.Status.Phase == phase && r != nil && r.ObservedGeneration == s.Generation && s.Status.UpdateRevision != ""
	}
}

// Completed: Completed and Ready for the current spec, observed.
func Completed(s *iteronv1.ActivationSet) bool {
	r := Condition(s, iteronv1.ConditionReady)
	return s.Status.Phase == iteronv1.RolloutCompleted && s.Status.ObservedGeneration == s.Generation &&
		r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == s.Generation
}

// WaitSet polls a set until cond holds, for at most timeout; on a timeout
// it prints the set's status and its activations' conditions.
func WaitSet(t testing.TB, c client.Client, key client.ObjectKey, what string, timeout time.Duration, cond func(*iteronv1.ActivationSet) bool) *iteronv1.ActivationSet {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var s iteronv1.ActivationSet
		err := c.Get(context.Background(), key, &s)
		if err == nil && cond(&s) {
			return &s
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(s.Status, "", "  ")
			t.Fatalf("ActivationSet %s never became %s (%v); status:\n%s\nactivations:\n%s", key, what, err, b, DescribeActivations(c, key))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// DescribeActivations is one line per activation the set stamped: node,
// revision, wave, generation, observed generation and conditions.
func DescribeActivations(c client.Client, key client.ObjectKey) string {
	acts, err := Stamped(c, key)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, a := range acts {
		var conds []string
		for _, cd := range a.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s(%s,g%d)", cd.Type, cd.Status, cd.Reason, cd.ObservedGeneration))
		}
		lines = append(lines, fmt.Sprintf("  %s node=%s revision=%s wave=%s generation=%d observed=%d deleting=%v %s",
			a.Name, a.Spec.NodeName, a.Labels[iteronv1.LabelRevision], a.Annotations[iteronv1.AnnotationWave], a.Generation,
			a.Status.ObservedGeneration, a.DeletionTimestamp != nil, strings.Join(conds, " ")))
	}
	return strings.Join(lines, "\n")
}

// Stamped are the activations controlled by the set key, by node name.
func Stamped(c client.Client, key client.ObjectKey) ([]iteronv1.ImplementationActivation, error) {
	var set iteronv1.ActivationSet
	if err := c.Get(context.Background(), key, &set); err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	var list iteronv1.ImplementationActivationList
	if err := c.List(context.Background(), &list, client.InNamespace(key.Namespace), client.MatchingLabels{iteronv1.LabelActivationSet: key.Name}); err != nil {
		return nil, err
	}
	var out []iteronv1.ImplementationActivation
	for _, a := range list.Items {
		if set.UID == "" || metav1.IsControlledBy(&a, &set) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.NodeName < out[j].Spec.NodeName })
	return out, nil
}

// Verbose reports whether ITERON_TEST_VERBOSE is set (controller logs).
func Verbose() bool { return os.Getenv("ITERON_TEST_VERBOSE") != "" }
