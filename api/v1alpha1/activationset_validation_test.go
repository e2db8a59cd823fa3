package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

func validSet(name string) *iteronv1.ActivationSet {
	act := validActivation("unused")
	return &iteronv1.ActivationSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: iteronv1.ActivationSetSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"iteron.dev/pool": "a"}},
			Template:     iteronv1.ActivationTemplate{CandidateSHA256: act.Spec.CandidateSHA256, Sources: act.Spec.Sources},
		},
	}
}

func TestActivationSetSchemaRejectsBadSpecsNamingTheField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*iteronv1.ActivationSet)
		field  string
	}{
		{"maxUnavailable 0", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.MaxUnavailable = ptr.To(intstr.FromInt32(0)) }, "spec.strategy.maxUnavailable"},
		{"a negative maxUnavailable", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.MaxUnavailable = ptr.To(intstr.FromInt32(-2)) }, "spec.strategy.maxUnavailable"},
		{"maxUnavailable 0%", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.MaxUnavailable = ptr.To(intstr.FromString("0%")) }, "spec.strategy.maxUnavailable"},
		{"maxUnavailable 150%", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.MaxUnavailable = ptr.To(intstr.FromString("150%")) }, "spec.strategy.maxUnavailable"},
		{"maxUnavailable that is neither a number nor a percentage", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.MaxUnavailable = ptr.To(intstr.FromString("half"))
		}, "spec.strategy.maxUnavailable"},
		{"a canary of fewer than 1 node", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.Canary = &iteronv1.CanaryStrategy{Nodes: -1} }, "spec.strategy.canary.nodes"},
		{"a negative soak", func(s *iteronv1.ActivationSet) {
			s.Spec.Strategy.Canary = &iteronv1.CanaryStrategy{Nodes: 1, SoakSeconds: ptr.To[int32](-1)}
		}, "spec.strategy.canary.soakSeconds"},
		{"an unknown onFailure", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.OnFailure = "Retry" }, "spec.strategy.onFailure"},
		{"an unknown revertStateDisposition", func(s *iteronv1.ActivationSet) { s.Spec.Strategy.RevertStateDisposition = "Keep" }, "spec.strategy.revertStateDisposition"},
		{"a revisionHistoryLimit above 100", func(s *iteronv1.ActivationSet) { s.Spec.RevisionHistoryLimit = ptr.To[int32](101) }, "spec.revisionHistoryLimit"},
		{"a template path that is not clean", func(s *iteronv1.ActivationSet) { s.Spec.Template.Sources[0].CatalogPath = "/var/lib/../c.json" }, "spec.template.sources[0].catalogPath"},
		{"a template without a candidate digest", func(s *iteronv1.ActivationSet) { s.Spec.Template.CandidateSHA256 = "" }, "spec.template.candidateSHA256"},
		{"two template sources with the same implementationID", func(s *iteronv1.ActivationSet) {
			s.Spec.Template.Sources[1].ImplementationID = s.Spec.Template.Sources[0].ImplementationID
		}, "implementationID must be unique"},
		{"an unknown swap strategy in the template", func(s *iteronv1.ActivationSet) { s.Spec.Template.Swap.Strategy = "Warm" }, "spec.template.swap.strategy"},
		{"a name longer than 63 characters", func(s *iteronv1.ActivationSet) { s.Name = strings.Repeat("s", 64) }, "metadata.name must be at most 63 characters"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			set := validSet("reject")
			tc.mutate(set)
			expectInvalid(t, createDryRun(t, set), tc.field)
		})
	}
}

func TestActivationSetSchemaAcceptsIntegersAndPercentagesAndAppliesDefaults(t *testing.T) {
	ctx := context.Background()
	for _, mu := range []intstr.IntOrString{intstr.FromInt32(1), intstr.FromInt32(500), intstr.FromString("1%"), intstr.FromString("25%"), intstr.FromString("100%")} {
		set := validSet("accept")
		set.Spec.Strategy.MaxUnavailable = &mu
		if err := createDryRun(t, set); err != nil {
			t.Errorf("maxUnavailable %s refused: %v", mu.String(), err)
		}
	}
	set := validSet("set-defaults")
	set.Spec.Strategy.Canary = &iteronv1.CanaryStrategy{}
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, set) })
	st, tpl := set.Spec.Strategy, set.Spec.Template
	if st.MaxUnavailable == nil || st.MaxUnavailable.String() != "1" || st.OnFailure != iteronv1.FailurePolicyHalt ||
		st.RevertStateDisposition != iteronv1.StateDispositionMigrate || st.Canary.Nodes != 1 || ptr.Deref(st.Canary.SoakSeconds, -1) != 60 ||
		ptr.Deref(set.Spec.RevisionHistoryLimit, -1) != 10 {
		t.Errorf("strategy defaults not applied: %+v (canary %+v), revisionHistoryLimit %v", st, st.Canary, set.Spec.RevisionHistoryLimit)
	}
	// The template's defaults are the activation's: a stamped activation
	// reads back equal to the template it was stamped from.
	if tpl.Swap.DeadlineSeconds != 30 || ptr.Deref(tpl.Swap.QuiesceTimeoutSeconds, -1) != 10 || tpl.Swap.Strategy != iteronv1.SwapStrategyHot ||
		tpl.Swap.StateDisposition != iteronv1.StateDispositionMigrate || ptr.Deref(tpl.Checkpoint.IntervalSeconds, -1) != 60 ||
		ptr.Deref(tpl.GenerationHistoryLimit, -1) != 10 {
		t.Errorf("template defaults not applied: swap=%+v checkpoint=%+v historyLimit=%v", tpl.Swap, tpl.Checkpoint, tpl.GenerationHistoryLimit)
	}
}

// TestMaximalActivationSetFitsTheCELCostBudget stores the largest template
// and the largest status the schema allows.
func TestMaximalActivationSetFitsTheCELCostBudget(t *testing.T) {
	ctx := context.Background()
	set := validSet(strings.Repeat("s", 63))
	set.Spec.Template.CapabilityCeiling = []iteronv1.Capability{iteronv1.CapabilityReadOnly, iteronv1.CapabilityReversibleLocal, iteronv1.CapabilityCodeExecuting, iteronv1.CapabilityTrustMutating, iteronv1.CapabilityIrreversibleExternal}
	longPath := func(i int, leaf string) string {
		p := fmt.Sprintf("/var/lib/iteron/providers/%02d/%s/", i, leaf)
		return p + strings.Repeat("p", 512-len(p))
	}
	set.Spec.Template.Sources = nil
	for i := range 64 {
		module := fmt.Sprintf("m%02d", i)
		module += strings.Repeat("x", 48-len(module))
		id := fmt.Sprintf("impl-%02d-", i)
		id += strings.Repeat("i", 96-len(id))
		set.Spec.Template.Sources = append(set.Spec.Template.Sources, iteronv1.ActivationSource{
			Module: module, ImplementationID: id, CatalogPath: longPath(i, "c"), ArtifactRoot: longPath(i, "r"),
			ManifestSHA256: digestA, ArtifactSHA256: digestB,
		})
	}
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatalf("maximal set refused: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, set) })
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	st := &set.Status
	st.Phase, st.CurrentRevision, st.UpdateRevision, st.SoakedRevision = iteronv1.RolloutHalted, long("c", 253), long("u", 253), long("u", 253)
	st.LastHandledResumeAt = long("r", 64)
	st.Halt = &iteronv1.RolloutHalt{Revision: long("u", 253), ToRevision: long("c", 253), Action: iteronv1.FailurePolicyRevert,
		StateDisposition: iteronv1.StateDispositionDiscard, At: metav1.Now(), Message: long("m", 1024)}
	for i := range 16 {
		node := fmt.Sprintf("%02d", i) + long("n", 251)
		st.Halt.Nodes = append(st.Halt.Nodes, node)
		st.Failed = append(st.Failed, iteronv1.FailedNode{Node: node, Activation: long("a", 40), Revision: long("u", 253), Reason: long("R", 128), Message: long("m", 512)})
		st.Conflicts = append(st.Conflicts, iteronv1.NodeConflict{Node: node, Activation: long("a", 40), Reason: iteronv1.ConflictNotOwned, Message: long("m", 512)})
	}
	for i := range 32 {
		st.WaveNodes = append(st.WaveNodes, fmt.Sprintf("%02d", i)+long("w", 251))
	}
	for _, typ := range []string{iteronv1.ConditionReady, iteronv1.ConditionReconciling, iteronv1.ConditionStalled} {
		st.Conditions = append(st.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: "RolloutHalted", Message: long("m", 1024), LastTransitionTime: metav1.Now()})
	}
	if err := env.Client.Status().Update(ctx, set); err != nil {
		t.Fatalf("maximal status refused: %v", err)
	}
	raw, _ := json.Marshal(set)
	if len(raw) > 512<<10 {
		t.Errorf("a maximal set is %d bytes; keep it far below etcd's 1.5 MiB request limit", len(raw))
	}
	set.Status.Failed = append(set.Status.Failed, set.Status.Failed[0])
	expectInvalid(t, env.Client.Status().Update(ctx, set), "status.failed")
}

// TestTheTemplateSchemaIsTheActivationSpecSchema keeps spec.template of an
// ActivationSet and spec of an ImplementationActivation one schema (less
// nodeName and paused): a field, a default or a rule added to one and not
// the other would make every stamped activation differ from its template
// after defaulting, and the controller would set it back forever.
func TestTheTemplateSchemaIsTheActivationSpecSchema(t *testing.T) {
	load := func(file string) apiextensionsv1.JSONSchemaProps {
		data, err := os.ReadFile(filepath.Join(env.RepoRoot, "config", "crd", "bases", file))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := utilyaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		return *crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	}
	spec := load("iteron.dev_implementationactivations.yaml").Properties["spec"]
	tpl := load("iteron.dev_activationsets.yaml").Properties["spec"].Properties["template"]
	delete(spec.Properties, "nodeName")
	delete(spec.Properties, "paused")
	spec.Required = without(spec.Required, "nodeName")
	for _, s := range []*apiextensionsv1.JSONSchemaProps{&spec, &tpl} {
		s.Description = ""
		for name, p := range s.Properties {
			p.Description = ""
			s.Properties[name] = p
		}
	}
	if !reflect.DeepEqual(spec, tpl) {
		a, _ := json.MarshalIndent(spec, "", " ")
		b, _ := json.MarshalIndent(tpl, "", " ")
		t.Fatalf("spec.template differs from the activation's spec (less nodeName and paused):\nactivation spec:\n%s\ntemplate:\n%s", a, b)
	}
	// The Go types too: every field of the spec but nodeName and paused is
	// a field of the template, with the same JSON name and type.
	st, tt := reflect.TypeFor[iteronv1.ImplementationActivationSpec](), reflect.TypeFor[iteronv1.ActivationTemplate]()
	n := 0
	for i := range st.NumField() {
		f := st.Field(i)
		if f.Name == "NodeName" || f.Name == "Paused" {
			continue
		}
		n++
		g, ok := tt.FieldByName(f.Name)
		if !ok || g.Type != f.Type || g.Tag != f.Tag {
			t.Errorf("ActivationTemplate.%s is missing or differs from ImplementationActivationSpec.%s (%s %s)", f.Name, f.Name, f.Type, f.Tag)
		}
	}
	if tt.NumField() != n {
		t.Errorf("ActivationTemplate has %d fields; ImplementationActivationSpec has %d besides nodeName and paused", tt.NumField(), n)
	}
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

func TestSampleActivationSetIsAccepted(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(env.RepoRoot, "config", "samples", "iteron_v1alpha1_activationset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sample iteronv1.ActivationSet
	if err := utilyaml.Unmarshal(data, &sample); err != nil {
		t.Fatal(err)
	}
	if len(sample.Spec.Template.Sources) == 0 || sample.Spec.Strategy.Canary == nil {
		t.Fatalf("the sample has no sources or no canary: %+v", sample.Spec)
	}
	if err := createDryRun(t, &sample); err != nil {
		t.Fatalf("the sample set was refused: %v", err)
	}
}
