package controllers_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/operatortest"
)

// refusedPrefix names the activations whose Generations the test's
// admission policy refuses (no other test uses it).
const refusedPrefix = "refused-gen"

// refusalMessage is what the policy says when it denies.
const refusalMessage = "this cluster refuses Generations of activations named " + refusedPrefix + "-*"

// refuseGenerations installs a ValidatingAdmissionPolicy and its binding
// that deny creating the Generations of the activations named refusedPrefix-*,
// as a cluster's own policy would, and waits until the API server enforces
// it: a dry-run create of such a Generation, as the manager, is denied with
// the policy's message. The returned function removes them (also at the end
// of the test).
func refuseGenerations(t *testing.T) (lift func()) {
	t.Helper()
	ctx := context.Background()
	name := "test-refuse-" + refusedPrefix
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{iteronv1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"generations"}},
				},
			}}},
			MatchConditions: []admissionv1.MatchCondition{{
				Name: "of-refused-activations", Expression: fmt.Sprintf("object.spec.activationName.startsWith('%s-')", refusedPrefix),
			}},
			Validations: []admissionv1.Validation{{Expression: "false", Message: refusalMessage, Reason: ptr.To(metav1.StatusReasonForbidden)}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}
	lift = func() {
		for _, o := range []client.Object{binding, policy} {
			if err := env.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %T %s: %v", o, name, err)
			}
		}
	}
	for _, o := range []client.Object{policy, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, name, err)
		}
	}
	t.Cleanup(lift)

	// The API server enforces a new policy once its informer has it.
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: operatortest.ManagerUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	asManager, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	probe := probeGeneration(refusedPrefix + "-probe")
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := asManager.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), refusalMessage) {
			return lift
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server does not enforce the test's policy after 30s: a dry-run create of %s as the manager answered %v", probe.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probeGeneration is a valid Generation of activation act (never stored:
// only dry-run).
func probeGeneration(act string) *iteronv1.Generation {
	digest := "sha256:" + strings.Repeat("0", 64)
	return &iteronv1.Generation{
		ObjectMeta: metav1.ObjectMeta{Name: act + "-prompt-system-g1-1", Namespace: "default"},
		Spec: iteronv1.GenerationSpec{
			ActivationName: act, NodeName: testNode, Module: "prompt_system", Generation: 1, Attempt: 1,
			CandidateSHA256: digest, AuthoritySHA256: digest,
			Implementation: iteronv1.Implementation{ID: "probe", Version: "1.0.0", ManifestSHA256: digest, ArtifactSHA256: digest,
				ArtifactRoot: "/nonexistent", Executable: "/nonexistent/provider", ProtocolVersion: 1},
			Deadlines:      iteronv1.Deadlines{RuntimeMs: 1000, CancellationMs: 1000},
			EvidenceLimits: iteronv1.EvidenceLimits{StdoutBytes: 1024, StderrBytes: 1024, Observations: 1},
		},
	}
}

// kubectlYAML is what `kubectl get implementationactivation <name> -o yaml`
// prints to an administrator.
func kubectlYAML(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	out, err := exec.Command(env.KubectlPath(), "--kubeconfig", kubeconfig, "get", "implementationactivation", a.Name, "-n", a.Namespace, "-o", "yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get implementationactivation %s -o yaml: %v\n%s", a.Name, err, out)
	}
	return string(out)
}

// statusSection is the status: block of kubectl's YAML.
func statusSection(yaml string) string {
	if i := strings.Index(yaml, "\nstatus:\n"); i >= 0 {
		return yaml[i+1:]
	}
	return yaml
}

func TestAGenerationRefusedByAnAdmissionPolicyShowsInTheConditionsAndIsRetriedOnceLifted(t *testing.T) {
	lift := refuseGenerations(t)
	act := newActivation(t, refusedPrefix, nil, source(t, artifacts.CounterV1, "prompt_system", "counter"))
	refusedGen := iteronv1.GenerationName(act.Name, "prompt_system", 1, 1)

	got := waitFor(t, act, "Stalled by the refusal", func(a *iteronv1.ImplementationActivation) bool {
		r := condition(a, iteronv1.ConditionReady)
		return stalled(a) && r != nil && r.Reason == "Forbidden"
	})
	// What a user sees.
	yaml := kubectlYAML(t, got)
	t.Logf("kubectl get implementationactivation %s -o yaml (status):\n%s", got.Name, statusSection(yaml))

	r, s, rec := condition(got, iteronv1.ConditionReady), condition(got, iteronv1.ConditionStalled), condition(got, iteronv1.ConditionReconciling)
	wantMessage := []string{"create Generation " + refusedGen, "is forbidden", "denied request: " + refusalMessage}
	for _, c := range []*metav1.Condition{r, s} {
		if c.Reason != string(metav1.StatusReasonForbidden) {
			t.Errorf("%s reason %q; want the API's StatusReason Forbidden", c.Type, c.Reason)
		}
		for _, m := range wantMessage {
			if !strings.Contains(c.Message, m) {
				t.Errorf("%s message %q does not say %q", c.Type, c.Message, m)
			}
		}
	}
	if r.Status != metav1.ConditionFalse || s.Status != metav1.ConditionTrue || rec.Status != metav1.ConditionFalse {
		t.Errorf("Ready=%s Stalled=%s Reconciling=%s; want False, True (a denial repeats), False", r.Status, s.Status, rec.Status)
	}
	if got.Status.ObservedGeneration != got.Generation {
		t.Errorf("observedGeneration %d, generation %d: a refusal is a resting state", got.Status.ObservedGeneration, got.Generation)
	}
	// kubectl shows the same: read its YAML back.
	var shown iteronv1.ImplementationActivation
	if err := sigsyaml.Unmarshal([]byte(yaml), &shown); err != nil {
		t.Fatalf("kubectl's YAML does not parse: %v", err)
	}
	if c := condition(&shown, iteronv1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Forbidden" || !strings.Contains(c.Message, refusalMessage) ||
		shown.Status.ObservedGeneration != shown.Generation {
		t.Errorf("kubectl shows Ready %+v, observedGeneration %d of %d; want False, Forbidden, the denial", c, shown.Status.ObservedGeneration, shown.Generation)
	}
	// Nothing else was created: no Generation, no process, no transaction.
	if gens := generations(t, got); len(gens) != 0 {
		t.Errorf("Generations exist after the refusal: %v", gens)
	}
	st := runtimeOf(t, got)
	if len(st.Generations) != 0 || st.Modules["prompt_system"].Active != "" || st.Ledger != nil && st.Ledger.Records != 0 {
		t.Errorf("the coordinator acted on a refused Generation: generations %v, module %+v, ledger %+v", st.Generations, st.Modules["prompt_system"], st.Ledger)
	}

	// Lifted, the refusal is retried by itself: no spec change, no annotation.
	lift()
	got = waitFor(t, act, "Ready once the policy is lifted", ready)
	if ms := moduleStatus(got, "prompt_system"); ms.GenerationName != refusedGen || ms.Phase != iteronv1.PhaseActive {
		t.Fatalf("module after the policy was lifted: %+v; want %s Active", ms, refusedGen)
	}
	waitGeneration(t, got.Namespace, refusedGen, "Active at committed", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Step == iteronv1.StepCommitted
	})
	if s := condition(got, iteronv1.ConditionStalled); s.Status != metav1.ConditionFalse {
		t.Fatalf("Stalled=%s (%s) after the refusal was lifted", s.Status, s.Reason)
	}
}
