package gitops_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// argoHealth is what an Argo CD health script returns: the table
// {status = ..., message = ...}.
type argoHealth struct {
	Status  string
	Message string
}

// argoHealthStatuses are the statuses Argo CD accepts from a health script;
// anything else it turns into Unknown.
var argoHealthStatuses = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true,
}

// runArgoHealthScript runs a health script the way Argo CD's Lua VM does: a
// fresh gopher-lua state with the standard libraries skipped and only the
// package, base and table libraries opened (Argo CD adds a reduced os library,
// which this script does not use), a one-second deadline, the object bound to
// the global `obj` as nested tables, and the script's returned table read as
// {status, message}. It is stricter than Argo CD in one way: any key besides
// status and message is an error rather than ignored.
func runArgoHealthScript(script string, obj map[string]any) (argoHealth, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return argoHealth{}, fmt.Errorf("open Lua library %q: %w", lib.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)

	value, err := luaValueOf(L, obj, "obj")
	if err != nil {
		return argoHealth{}, err
	}
	L.SetGlobal("obj", value)
	if err := L.DoString(script); err != nil {
		return argoHealth{}, fmt.Errorf("run the health script: %w", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return argoHealth{}, fmt.Errorf("the health script returned %s, not a table", L.Get(-1).Type())
	}
	var h argoHealth
	var bad []string
	ret.ForEach(func(k, v lua.LValue) {
		s, isString := v.(lua.LString)
		switch {
		case k.String() == "status" && isString:
			h.Status = string(s)
		case k.String() == "message" && isString:
			h.Message = string(s)
		default:
			bad = append(bad, fmt.Sprintf("%s=%s(%s)", k, v.Type(), v))
		}
	})
	if len(bad) > 0 {
		sort.Strings(bad)
		return h, fmt.Errorf("the health script returned unexpected fields: %s", strings.Join(bad, ", "))
	}
	if !argoHealthStatuses[h.Status] {
		return h, fmt.Errorf("the health script returned status %q, which Argo CD would report as Unknown", h.Status)
	}
	return h, nil
}

// luaValueOf converts decoded JSON (unstructured content) to Lua values the
// way Argo CD does: objects and arrays become tables (arrays 1-based), numbers
// LNumber, and so on. An unexpected Go type is an error naming its path.
func luaValueOf(L *lua.LState, v any, path string) (lua.LValue, error) {
	switch x := v.(type) {
	case nil:
		return lua.LNil, nil
	case map[string]any:
		t := L.NewTable()
		for k, item := range x {
			lv, err := luaValueOf(L, item, path+"."+k)
			if err != nil {
				return nil, err
			}
			t.RawSetString(k, lv)
		}
		return t, nil
	case []any:
		t := L.NewTable()
		for i, item := range x {
			lv, err := luaValueOf(L, item, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			t.RawSetInt(i+1, lv)
		}
		return t, nil
	case string:
		return lua.LString(x), nil
	case bool:
		return lua.LBool(x), nil
	case int64:
		return lua.LNumber(x), nil
	case float64:
		return lua.LNumber(x), nil
	default:
		return nil, fmt.Errorf("%s: unexpected %T in unstructured content", path, v)
	}
}

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.RepoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// activationState is one situation of an activation, created for real: the
// spec (paused or not), the status written through the status subresource,
// then optionally a spec change the manager has not observed yet, or a
// deletion held by the finalizer.
type activationState struct {
	paused bool
	// noStatus leaves the status as the API server created it: empty.
	noStatus bool
	// conditions are written in this order (the order matters to kstatus).
	conditions []metav1.Condition
	// specChangedAfterStatus changes the spec after the status was written,
	// so metadata.generation is one ahead of status.observedGeneration.
	specChangedAfterStatus bool
	// deleting deletes the activation while the finalizer holds it.
	deleting bool
}

// realizeActivation creates the activation of s in the API server and returns
// it as read back, checking that the server kept what was written.
func realizeActivation(t *testing.T, s activationState) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	act := newActivation(uniqueName("act"))
	act.Spec.Paused = s.paused
	if s.deleting {
		act.Finalizers = []string{iteronv1.FinalizerActivation}
	}
	if err := env.Client.Create(ctx, act); err != nil {
		t.Fatalf("create activation: %v", err)
	}
	deleteAfterTest(t, act)
	if !s.noStatus {
		act.Status.ObservedGeneration = act.Generation
		act.Status.ModuleCount = int32(len(act.Spec.Sources))
		act.Status.Conditions = nil
		for _, c := range s.conditions {
			c.ObservedGeneration = act.Generation
			act.Status.Conditions = append(act.Status.Conditions, c)
		}
		if err := env.Client.Status().Update(ctx, act); err != nil {
			t.Fatalf("write status: %v", err)
		}
	}
	if s.specChangedAfterStatus {
		before := act.Generation
		act.Spec.CandidateSHA256 = digestB
		if err := env.Client.Update(ctx, act); err != nil {
			t.Fatalf("change spec: %v", err)
		}
		if act.Generation != before+1 {
			t.Fatalf("metadata.generation = %d after a spec change; want %d", act.Generation, before+1)
		}
	}
	if s.deleting {
		if err := env.Client.Delete(ctx, act); err != nil {
			t.Fatalf("delete activation: %v", err)
		}
	}
	u := readBack(t, act, "ImplementationActivation")
	var got []string
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m := c.(map[string]any)
		got = append(got, fmt.Sprintf("%s=%s", m["type"], m["status"]))
	}
	var want []string
	for _, c := range s.conditions {
		want = append(want, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	if s.noStatus {
		want = nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the API server holds conditions %v; wrote %v", got, want)
	}
	return u
}

const (
	msgReady       = "every module is Active at the desired generation"
	msgSwap        = "hot swap of prompt_system to counter-v2: migrate"
	msgStalled     = "swap of prompt_system failed at readiness: state digest differs; not retried for this target"
	msgDegraded    = "prompt_system moved to counter-v2; context_assembly did not (activation_failed)"
	msgNotReady    = "context_assembly is not Active: dependency_unsatisfied"
	msgUnknown     = "the activation reconciler does not act yet"
	msgPaused      = "Paused: spec changes are not acted on; running providers keep serving"
	msgNotObserved = "Waiting for the manager of node worker-1 to observe generation 2 (status describes generation 1)"
)

var (
	readyTrue         = cond(iteronv1.ConditionReady, metav1.ConditionTrue, iteronv1.ReasonSucceeded, msgReady)
	readyFalse        = cond(iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonDependencyUnsatisfied, msgNotReady)
	readyUnknown      = cond(iteronv1.ConditionReady, metav1.ConditionUnknown, iteronv1.ReasonNotImplemented, msgUnknown)
	reconcilingTrue   = cond(iteronv1.ConditionReconciling, metav1.ConditionTrue, iteronv1.ReasonProgressing, msgSwap)
	reconcilingFalse  = cond(iteronv1.ConditionReconciling, metav1.ConditionFalse, iteronv1.ReasonSucceeded, "")
	stalledTrue       = cond(iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonActivationFailed, msgStalled)
	stalledFalse      = cond(iteronv1.ConditionStalled, metav1.ConditionFalse, iteronv1.ReasonSucceeded, "")
	degradedTrue      = cond(iteronv1.ConditionDegraded, metav1.ConditionTrue, iteronv1.ReasonActivationFailed, msgDegraded)
	degradedFalse     = cond(iteronv1.ConditionDegraded, metav1.ConditionFalse, iteronv1.ReasonSucceeded, "")
	verifiedTrue      = cond(iteronv1.ConditionVerified, metav1.ConditionTrue, iteronv1.ReasonSucceeded, "every source verified")
	stalledNoMessage  = cond(iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonLedgerCorrupt, "")
	readyFalseStalled = cond(iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonActivationFailed, "prompt_system is not Active: activation_failed")
)

// TestArgoCDHealthCheckMapsEveryStateOfARealActivation runs
// config/argocd/health.lua on activations whose status the API server stored,
// one row per rule of the script's precedence, plus the rows that pin the
// precedence between rules.
func TestArgoCDHealthCheckMapsEveryStateOfARealActivation(t *testing.T) {
	script := readRepoFile(t, "config/argocd/health.lua")
	cases := []struct {
		name  string
		state activationState
		want  argoHealth
	}{
		{"a paused activation is Suspended",
			activationState{paused: true, conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse}},
			argoHealth{"Suspended", msgPaused}},
		{"a paused activation is Suspended even when Stalled",
			activationState{paused: true, conditions: []metav1.Condition{readyFalseStalled, stalledTrue}},
			argoHealth{"Suspended", msgPaused}},
		{"a paused activation with a spec change the manager has not observed is Suspended",
			activationState{paused: true, conditions: []metav1.Condition{readyTrue}, specChangedAfterStatus: true},
			argoHealth{"Suspended", msgPaused}},
		{"an activation with no status yet is Progressing",
			activationState{noStatus: true},
			argoHealth{"Progressing", "Waiting for the manager of node worker-1 to observe generation 1 (status describes generation 0)"}},
		{"a Ready activation whose new spec the manager has not observed is Progressing",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse}, specChangedAfterStatus: true},
			argoHealth{"Progressing", msgNotObserved}},
		{"a Stalled activation whose new spec the manager has not observed is Progressing",
			activationState{conditions: []metav1.Condition{readyFalseStalled, stalledTrue}, specChangedAfterStatus: true},
			argoHealth{"Progressing", msgNotObserved}},
		{"a Stalled activation is Degraded with the Stalled message",
			activationState{conditions: []metav1.Condition{readyFalseStalled, reconcilingFalse, stalledTrue, degradedFalse}},
			argoHealth{"Degraded", msgStalled}},
		{"a Stalled activation that also reports Reconciling (listed first) is Degraded",
			activationState{conditions: []metav1.Condition{reconcilingTrue, stalledTrue, readyFalseStalled}},
			argoHealth{"Degraded", msgStalled}},
		{"a Stalled activation that also reports Degraded shows the Stalled message",
			activationState{conditions: []metav1.Condition{degradedTrue, stalledTrue, readyFalseStalled}},
			argoHealth{"Degraded", msgStalled}},
		{"a Stalled condition with an empty message shows its reason",
			activationState{conditions: []metav1.Condition{readyFalseStalled, stalledNoMessage}},
			argoHealth{"Degraded", iteronv1.ReasonLedgerCorrupt}},
		{"a Degraded activation is Degraded with the Degraded message",
			activationState{conditions: []metav1.Condition{readyFalse, reconcilingFalse, stalledFalse, degradedTrue}},
			argoHealth{"Degraded", msgDegraded}},
		{"a Degraded activation that is also Reconciling is Degraded",
			activationState{conditions: []metav1.Condition{reconcilingTrue, degradedTrue, readyFalse}},
			argoHealth{"Degraded", msgDegraded}},
		{"an activation in the middle of a hot swap (Reconciling, still Ready) is Progressing",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingTrue, stalledFalse, degradedFalse, verifiedTrue}},
			argoHealth{"Progressing", msgSwap}},
		{"a Ready activation is Healthy",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse, degradedFalse, verifiedTrue}},
			argoHealth{"Healthy", msgReady}},
		{"an activation that is not Ready and neither Stalled nor Reconciling is Degraded",
			activationState{conditions: []metav1.Condition{readyFalse, reconcilingFalse, stalledFalse}},
			argoHealth{"Degraded", msgNotReady}},
		{"an activation whose Ready is Unknown is Progressing",
			activationState{conditions: []metav1.Condition{readyUnknown}},
			argoHealth{"Progressing", msgUnknown}},
		{"an observed activation with no Ready condition is Progressing",
			activationState{conditions: []metav1.Condition{reconcilingFalse, stalledFalse}},
			argoHealth{"Progressing", "Waiting for the manager of node worker-1 to report Ready"}},
		{"an observed activation with no conditions at all is Progressing",
			activationState{},
			argoHealth{"Progressing", "Waiting for the manager of node worker-1 to report Ready"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := realizeActivation(t, tc.state)
			got, err := runArgoHealthScript(script, u.Object)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("health = %+v\n          want %+v", got, tc.want)
			}
		})
	}
}

// TestArgoCDConfigMapCarriesTheHealthScriptVerbatim keeps the argocd-cm
// fragment users copy from drifting away from the scripts the tests run.
func TestArgoCDConfigMapCarriesTheHealthScriptVerbatim(t *testing.T) {
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(readRepoFile(t, "config/argocd/argocd-cm.yaml")), &cm); err != nil {
		t.Fatalf("config/argocd/argocd-cm.yaml: %v", err)
	}
	if cm.Kind != "ConfigMap" || cm.Name != "argocd-cm" {
		t.Fatalf("config/argocd/argocd-cm.yaml is %s %q; want ConfigMap argocd-cm", cm.Kind, cm.Name)
	}
	scripts := map[string]string{
		"resource.customizations.health.iteron.dev_ImplementationActivation": "config/argocd/health.lua",
		"resource.customizations.health.iteron.dev_ActivationSet":            "config/argocd/activationset-health.lua",
	}
	for key, file := range scripts {
		got, ok := cm.Data[key]
		if !ok {
			t.Fatalf("argocd-cm has no key %s; it has %v", key, mapKeys(cm.Data))
		}
		if script := readRepoFile(t, file); got != script {
			t.Fatalf("argocd-cm's %s differs from %s at byte %d", key, file, firstDifference(got, script))
		}
	}
	if len(cm.Data) != len(scripts) {
		t.Fatalf("argocd-cm fragment sets %v; want only the health checks' keys (merging it must not change other settings)", mapKeys(cm.Data))
	}
	// The API server accepts it as a ConfigMap (key syntax, size).
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cm.Namespace}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &cm, client.DryRunAll); err != nil {
		t.Fatalf("the API server refuses config/argocd/argocd-cm.yaml: %v", err)
	}
}

// TestArgoCDHealthScriptFailsLoudlyWithoutItsInputs guards the runner itself:
// a script that returns garbage or uses a library Argo CD does not open must
// fail, or the table above could pass on a broken harness.
func TestArgoCDHealthScriptFailsLoudlyWithoutItsInputs(t *testing.T) {
	cases := []struct {
		name, script, wantErr string
	}{
		{"a script that returns a string", `return "Healthy"`, "returned string, not a table"},
		{"a script that returns an unknown status", `return {status = "Fine"}`, `status "Fine"`},
		{"a script that returns an extra field", `return {status = "Healthy", reason = "x"}`, "unexpected fields: reason"},
		{"a script that uses the string library Argo CD does not open", `return {status = string.upper("healthy")}`, "string"},
		{"a script that loops forever hits the one-second deadline", `while true do end`, "context deadline exceeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runArgoHealthScript(tc.script, map[string]any{"metadata": map[string]any{"generation": int64(1)}})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v; want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func mapKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func firstDifference(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
