package hotswap

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/providers"
)

// launchRecorder wraps the real launcher: it records every process started
// (module → pids) and holds each load until `together` loads are in flight
// or a second has passed, so that loads that can overlap do, and the most
// seen at once tells whether they ran together.
type launchRecorder struct {
	inner    providers.Launcher
	together int

	mu        sync.Mutex
	inLoad    int
	maxInLoad int
	changed   chan struct{}
	pids      map[string][]int
}

func newLaunchRecorder(inner providers.Launcher, together int) *launchRecorder {
	return &launchRecorder{inner: inner, together: together, changed: make(chan struct{}), pids: map[string][]int{}}
}

func (l *launchRecorder) launch(ctx context.Context, req providers.LaunchRequest) (providers.Provider, error) {
	plan := req.Plan
	p, err := l.inner(ctx, req)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.pids[plan.Module()] = append(l.pids[plan.Module()], p.Pid())
	l.mu.Unlock()
	return &gatedProvider{Provider: p, l: l}, nil
}

func (l *launchRecorder) snapshot() (maxInLoad int, pids map[string][]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pids = map[string][]int{}
	for m, p := range l.pids {
		pids[m] = slices.Clone(p)
	}
	return l.maxInLoad, pids
}

type gatedProvider struct {
	providers.Provider
	l *launchRecorder
}

func (g *gatedProvider) Load(ctx context.Context) error {
	l := g.l
	l.mu.Lock()
	l.inLoad++
	l.maxInLoad = max(l.maxInLoad, l.inLoad)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	deadline := time.After(time.Second)
wait:
	for {
		l.mu.Lock()
		enough, changed := l.inLoad >= l.together, l.changed
		l.mu.Unlock()
		if enough {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			break wait
		}
	}
	err := g.Provider.Load(ctx)
	l.mu.Lock()
	l.inLoad--
	l.mu.Unlock()
	return err
}

// parallelHarness is a harness whose coordinator launches through rec with
// the given bound.
func parallelHarness(t *testing.T, limit, together int) (*harness, *launchRecorder) {
	t.Helper()
	rec := newLaunchRecorder(providers.NewExecutorLauncher(sharedExecutor(t)), together)
	uidCounter.Lock()
	uidCounter.n++
	uid := fmt.Sprintf("%08x-0000-4000-8000-000000000000", 0xa0000000+uidCounter.n)
	uidCounter.Unlock()
	h := newHarnessAt(t, t.TempDir(), ActivationKey{Namespace: "default", Name: "stack", UID: uid}, func(c *Config) {
		c.Launch = rec.launch
		c.MaxParallelActivations = limit
	})
	return h, rec
}

func (h *harness) counterTarget(module string, deps ...string) ModuleTarget {
	t := h.target(providertest.Implement(h.t, artifacts.Spec{Binary: artifacts.CounterV1, Module: module, ImplementationID: "counter-" + strings.ReplaceAll(module, "_", "-")}))
	t.DependsOn = deps
	return t
}

// transactionRecords is the ledger's records, each module's transaction
// being verify, shadow_load, atomic_switch, committed.
func firstActivationRecords(modules ...string) []string {
	var out []string
	for _, m := range modules {
		out = append(out, m+":verify:applied", m+":shadow_load:applied", m+":atomic_switch:applied", m+":committed:committed")
	}
	return out
}

func TestModulesReadyTogetherLoadTogetherAndCommitOneAfterTheOtherInPlanOrder(t *testing.T) {
	h, rec := parallelHarness(t, 4, 3)
	// Plan order: three independent modules, then one that needs the first.
	sys := h.counterTarget("prompt_system")
	tools := h.counterTarget("prompt_tool_description")
	sub := h.counterTarget("prompt_subagent")
	ctx := h.counterTarget("context_assembly", "prompt_system")
	h.apply(SwapPolicy{}, sys, tools, sub, ctx)
	st := h.settle()
	maxInLoad, pids := rec.snapshot()
	for _, m := range []string{"prompt_system", "prompt_tool_description", "prompt_subagent", "context_assembly"} {
		ms := st.Modules[m]
		if ms.Phase != iteronv1.PhaseActive || ms.Pid == 0 {
			t.Fatalf("%s: %+v; want Active with a process", m, ms)
		}
		if got := pids[m]; !slices.Equal(got, []int{ms.Pid}) {
			t.Fatalf("%s: launched %v, serving pid %d: want exactly one launch, the process that serves", m, got, ms.Pid)
		}
	}
	if maxInLoad != 3 {
		t.Fatalf("at most %d loads ran at once; want the 3 modules ready together loading together", maxInLoad)
	}
	want := firstActivationRecords("prompt_system", "prompt_tool_description", "prompt_subagent", "context_assembly")
	if got := h.ledgerPhases(); !slices.Equal(got, want) {
		t.Fatalf("ledger:\n%s\nwant one transaction at a time, in plan order:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := h.count("context_assembly", "a", 2)["count"]; got != float64(2) {
		t.Fatalf("count = %v", got)
	}
}

func TestNoMoreProcessesLoadAtOnceThanTheBound(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int
		want  int
	}{
		{"a bound of two loads two of three ready modules at once", 2, 2},
		{"a bound of one loads each module inside its own transaction", 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, rec := parallelHarness(t, c.limit, 3)
			h.apply(SwapPolicy{}, h.counterTarget("prompt_system"), h.counterTarget("prompt_tool_description"), h.counterTarget("prompt_subagent"))
			st := h.settle()
			for m, ms := range st.Modules {
				if ms.Phase != iteronv1.PhaseActive {
					t.Fatalf("%s: %+v; want Active", m, ms)
				}
			}
			if got, _ := rec.snapshot(); got != c.want {
				t.Fatalf("at most %d loads ran at once with a bound of %d; want %d", got, c.limit, c.want)
			}
			if got, want := h.ledgerPhases(), firstActivationRecords("prompt_system", "prompt_tool_description", "prompt_subagent"); !slices.Equal(got, want) {
				t.Fatalf("ledger:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestAFailedLaunchInAWaveLeavesNoProcessBehind(t *testing.T) {
	h, rec := parallelHarness(t, 4, 4)
	sys := h.counterTarget("prompt_system")
	tools := h.counterTarget("prompt_tool_description")
	bad := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, Module: "prompt_subagent", ImplementationID: "faulty-subagent",
		Argv: []string{"--fault", "crash", "--at", "load"}}))
	skill := h.counterTarget("prompt_skill")
	h.apply(SwapPolicy{}, sys, tools, bad, skill)
	st := h.settle()
	_, pids := rec.snapshot()

	// Every module of the wave was launched at once, each exactly once.
	for _, m := range []string{"prompt_system", "prompt_tool_description", "prompt_subagent", "prompt_skill"} {
		if len(pids[m]) != 1 {
			t.Fatalf("%s was launched %d times (%v); want once, in the wave", m, len(pids[m]), pids[m])
		}
	}
	// The modules before the failure in plan order use their processes.
	serving := map[int]bool{}
	for _, m := range []string{"prompt_system", "prompt_tool_description"} {
		ms := st.Modules[m]
		if ms.Phase != iteronv1.PhaseActive || ms.Pid != pids[m][0] {
			t.Fatalf("%s: %+v; want Active on its process launched in the wave (pid %d)", m, ms, pids[m][0])
		}
		serving[ms.Pid] = true
	}
	// The failed one is Failed at shadow_load; the one after it waits.
	if g := st.Generations[bad.GenerationName]; g.Phase != iteronv1.PhaseFailed || !strings.Contains(g.Message, "shadow_load") {
		t.Fatalf("the failed module's generation: %+v; want Failed at shadow_load", g)
	}
	if ms := st.Modules["prompt_skill"]; ms.Phase != iteronv1.PhaseInactive || ms.Pid != 0 {
		t.Fatalf("the module after the failure: %+v; want Inactive with no process", ms)
	}
	// Nothing leaked: every process launched and not serving is gone.
	for m, ps := range pids {
		for _, pid := range ps {
			if serving[pid] {
				continue
			}
			deadline := time.Now().Add(10 * time.Second)
			for !processGone(pid) {
				if time.Now().After(deadline) {
					t.Fatalf("the process of %s launched in the wave (pid %d) is still there", m, pid)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	want := append(firstActivationRecords("prompt_system", "prompt_tool_description"),
		"prompt_subagent:verify:applied", "prompt_subagent:shadow_load:blocked", "prompt_subagent:rolled_back:rolled_back")
	if got := h.ledgerPhases(); !slices.Equal(got, want) {
		t.Fatalf("ledger:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
