package fleettest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Health is how GitOps tools read a set: Argo CD's health (the shipped Lua
// check) and kstatus (Flux, cli-utils).
type Health struct {
	Argo, ArgoMessage string
	KStatus           kstatus.Status
	KMessage          string
}

func (h Health) String() string {
	return fmt.Sprintf("Argo CD %s, kstatus %s", h.Argo, h.KStatus)
}

// SetHealth computes both for a set as the API server returned it, with
// config/argocd/activationset-health.lua from the repository at root.
func SetHealth(root string, set *iteronv1.ActivationSet) (Health, error) {
	script, err := os.ReadFile(filepath.Join(root, "config", "argocd", "activationset-health.lua"))
	if err != nil {
		return Health{}, err
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(set)
	if err != nil {
		return Health{}, err
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(iteronv1.GroupVersion.String())
	u.SetKind("ActivationSet")
	var h Health
	if h.Argo, h.ArgoMessage, err = ArgoHealth(string(script), u.Object); err != nil {
		return h, err
	}
	res, err := kstatus.Compute(u)
	if err != nil {
		return h, err
	}
	h.KStatus, h.KMessage = res.Status, res.Message
	return h, nil
}

// argoStatuses are the statuses Argo CD accepts from a health script.
var argoStatuses = map[string]bool{"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true}

// ArgoHealth runs a health script the way Argo CD's Lua VM does (as
// test/gitops does): gopher-lua with only the package, base and table
// libraries, a one-second deadline, the object as the global obj, and the
// returned table read as {status, message}; any other key is an error.
func ArgoHealth(script string, obj map[string]any) (string, string, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return "", "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	value, err := luaValueOf(L, obj, "obj")
	if err != nil {
		return "", "", err
	}
	L.SetGlobal("obj", value)
	if err := L.DoString(script); err != nil {
		return "", "", fmt.Errorf("run the health script: %w", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the health script returned %s, not a table", L.Get(-1).Type())
	}
	var status, message string
	var bad []string
	ret.ForEach(func(k, v lua.LValue) {
		s, isString := v.(lua.LString)
		switch {
		case k.String() == "status" && isString:
			status = string(s)
		case k.String() == "message" && isString:
			message = string(s)
		default:
			bad = append(bad, fmt.Sprintf("%s=%s", k, v))
		}
	})
	if len(bad) > 0 {
		sort.Strings(bad)
		return status, message, fmt.Errorf("the health script returned unexpected fields: %s", strings.Join(bad, ", "))
	}
	if !argoStatuses[status] {
		return status, message, fmt.Errorf("the health script returned status %q, which Argo CD would report as Unknown", status)
	}
	return status, message, nil
}

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
