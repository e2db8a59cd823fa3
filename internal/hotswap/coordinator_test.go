package hotswap

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

func TestMain(m *testing.M) { providertest.Main(m) }

var (
	executorOnce sync.Once
	executor     *procexec.Executor
	executorErr  error
)

// sharedExecutor is the one executor of the test binary (its spawner thread
// and subreaper are process-wide).
func sharedExecutor(t *testing.T) *procexec.Executor {
	t.Helper()
	executorOnce.Do(func() {
		dir, err := os.MkdirTemp("", "iteron-hotswap-procs-")
		if err != nil {
			executorErr = err
			return
		}
		providertest.RemoveAtExit(dir)
		executor, executorErr = procexec.NewExecutor(procexec.DefaultConfig(dir))
	})
	if executorErr != nil {
		t.Fatal(executorErr)
	}
	return executor
}

// harness is a coordinator over real providers and a real ledger.
type harness struct {
	t        *testing.T
	c        *Coordinator
	key      ActivationKey
	stateDir string
	lineages map[string]int64
	attempts map[string]int32
	mu       sync.Mutex
	phases   []string // module:phase, in order, from AfterPhase
	hook     func(module, phase string)
}

var uidCounter struct {
	sync.Mutex
	n int
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	uidCounter.Lock()
	uidCounter.n++
	uid := fmt.Sprintf("%08x-0000-4000-8000-000000000000", 0xa0000000+uidCounter.n)
	uidCounter.Unlock()
	return newHarnessAt(t, t.TempDir(), ActivationKey{Namespace: "default", Name: "stack", UID: uid})
}

// newHarnessAt is a coordinator over an existing state dir: a restarted
// manager.
// configure, when given, edits the Config before the coordinator is made.
func newHarnessAt(t *testing.T, stateDir string, key ActivationKey, configure ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, stateDir: stateDir, key: key, lineages: map[string]int64{}, attempts: map[string]int32{}}
	failOnIllegalPhaseEdges(t)
	cfg := Config{
		StateDir: h.stateDir, Launch: providers.NewExecutorLauncher(sharedExecutor(t)), Log: testr.New(t),
		AfterPhase: func(_ ActivationKey, module, phase string) {
			h.mu.Lock()
			h.phases = append(h.phases, module+":"+phase)
			hook := h.hook
			h.mu.Unlock()
			if hook != nil {
				hook(module, phase)
			}
		},
	}
	for _, f := range configure {
		f(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Logf("shutdown: %v", err)
		}
	})
	return h
}

// target makes the next generation's target for an implementation.
func (h *harness) target(impl artifacts.Implementation, edit ...func(*verifier.LaunchPlanFields)) ModuleTarget {
	m := impl.Manifest.Module
	h.lineages[m]++
	h.attempts[m] = 1
	return h.targetAt(impl, h.lineages[m], 1, edit...)
}

func (h *harness) targetAt(impl artifacts.Implementation, lineage int64, attempt int32, edit ...func(*verifier.LaunchPlanFields)) ModuleTarget {
	m := impl.Manifest.Module
	plan := providertest.Plan(h.t, impl, edit...)
	return ModuleTarget{
		Module: m, Plan: plan, Epoch: "sha256:" + strings.Repeat("0", 56) + fmt.Sprintf("%08x", lineage*100+int64(attempt)),
		GenerationName: fmt.Sprintf("stack-%s-g%d-%d", strings.ReplaceAll(m, "_", "-"), lineage, attempt), Lineage: lineage, Attempt: attempt,
	}
}

func (h *harness) apply(swap SwapPolicy, targets ...ModuleTarget) {
	h.t.Helper()
	if swap.Deadline == 0 {
		swap.Deadline = 20 * time.Second
	}
	d := Desired{Key: h.key, SpecGeneration: 1, CandidateSHA256: providertest.CandidateSHA256, Swap: swap}
	for _, t := range targets {
		d.Modules = append(d.Modules, t)
		d.ActivateOrder = append(d.ActivateOrder, t.Module)
	}
	d.DrainOrder = slices.Clone(d.ActivateOrder)
	slices.Reverse(d.DrainOrder)
	if err := h.c.Apply(d); err != nil {
		h.t.Fatal(err)
	}
}

// settle waits until the coordinator has nothing left to do.
func (h *harness) settle() ActivationStatus {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	time.Sleep(20 * time.Millisecond)
	for {
		st, ok := h.c.Status(h.key.UID)
		if ok && !st.Busy {
			return st
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the coordinator did not settle: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// invoke calls a module through its dispatcher.
func (h *harness) invoke(module, input string) (dispatch.Result, error) {
	h.t.Helper()
	d, ok := h.c.Dispatcher(h.key.Namespace, h.key.Name, module)
	if !ok {
		h.t.Fatalf("no dispatcher for %s", module)
	}
	id := fmt.Sprintf("call-%d", time.Now().UnixNano())
	return d.Invoke(context.Background(), dispatch.Call{ID: id, Input: protocol.MustPayload(input), Deadline: time.Now().Add(10 * time.Second)})
}

// count invokes the counter and returns its terminal observation.
func (h *harness) count(module, key string, add int) map[string]any {
	h.t.Helper()
	r, err := h.invoke(module, fmt.Sprintf(`{"key":%q,"add":%d}`, key, add))
	if err != nil {
		h.t.Fatalf("invoke %s: %v", module, err)
	}
	var out map[string]any
	if err := json.Unmarshal(r.Terminal.Body, &out); err != nil {
		h.t.Fatal(err)
	}
	out["_served_by"] = r.Name
	return out
}

// ledgerPhases replays the activation's ledger from disk and returns each
// record as module:phase:outcome.
// transactionsOf counts the module's transactions in the ledger (each opens
// with verify): the first activation, then every relaunch or renewal.
func (h *harness) transactionsOf(module string) int {
	h.t.Helper()
	n := 0
	for _, p := range h.ledgerPhases() {
		if p == module+":verify:applied" {
			n++
		}
	}
	return n
}

func (h *harness) ledgerPhases() []string {
	h.t.Helper()
	dir, err := ledger.ActivationDir(h.stateDir, h.key.UID)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	if _, err := ledger.Replay(dir, ledger.VerifyOptions{}, func(r *ledger.Record) error {
		out = append(out, fmt.Sprintf("%s:%s:%s", r.Module, r.Phase, r.Outcome))
		return nil
	}); err != nil {
		h.t.Fatalf("the ledger does not verify: %v", err)
	}
	return out
}

// processGone reports whether no process with pid exists (zombies count as
// gone only once reaped).
func processGone(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", fmt.Sprint(pid)))
	return os.IsNotExist(err)
}

func TestFirstActivationStartsModulesInDependencyOrder(t *testing.T) {
	h := newHarness(t)
	sys := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1, Module: "prompt_system"}))
	ctx := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1, Module: "context_assembly", ImplementationID: "counter-ctx"}))
	route := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1, Module: "provider_routing", ImplementationID: "counter-route"}))
	ctx.DependsOn = []string{"prompt_system"}
	route.DependsOn = []string{"context_assembly"}
	h.apply(SwapPolicy{}, sys, ctx, route)
	st := h.settle()
	for _, m := range []string{"prompt_system", "context_assembly", "provider_routing"} {
		if ms := st.Modules[m]; ms.Phase != iteronv1.PhaseActive || ms.Pid == 0 {
			t.Fatalf("%s: %+v; want Active with a process", m, ms)
		}
	}
	var committed []string
	for _, p := range h.ledgerPhases() {
		if strings.HasSuffix(p, ":committed:committed") {
			committed = append(committed, strings.Split(p, ":")[0])
		}
	}
	if want := []string{"prompt_system", "context_assembly", "provider_routing"}; !slices.Equal(committed, want) {
		t.Fatalf("commit order %v, want %v", committed, want)
	}
	if got := h.count("provider_routing", "a", 2)["count"]; got != float64(2) {
		t.Fatalf("count = %v", got)
	}
}

func TestHotSwapMigratesStateAndReapsTheOldProcess(t *testing.T) {
	h := newHarness(t)
	committedBefore := testutil.ToFloat64(transactionsTotal.WithLabelValues("default", "stack", "prompt_system", "committed"))
	appendsBefore := testutil.ToFloat64(ledgerAppends.WithLabelValues("default", "stack"))
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	h.apply(SwapPolicy{}, v1)
	st := h.settle()
	oldPid := st.Modules["prompt_system"].Pid
	h.count("prompt_system", "a", 3)
	h.count("prompt_system", "b", 4)

	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, v2)
	st = h.settle()
	ms := st.Modules["prompt_system"]
	if ms.Active != v2.GenerationName || ms.Phase != iteronv1.PhaseActive {
		t.Fatalf("module after the swap: %+v", ms)
	}
	if old := st.Generations[v1.GenerationName]; old.Phase != iteronv1.PhaseInactive || old.Pid != 0 {
		t.Fatalf("old generation after the swap: %+v", old)
	}
	if !processGone(oldPid) {
		t.Fatalf("the old provider (pid %d) is still there", oldPid)
	}
	out := h.count("prompt_system", "a", 1)
	if out["count"] != float64(4) || out["total"] != float64(8) || out["implementation_version"] != "2.0.0" {
		t.Fatalf("after the swap: %v; want a=4 total=8 from v2 (state migrated)", out)
	}
	gs := st.Generations[v2.GenerationName]
	snap, ok, err := h.c.snapshots.Latest(h.key.UID, "prompt_system")
	if err != nil || !ok || snap.StateSHA256 != gs.StateSHA256 || snap.Kind != SnapshotRestored {
		t.Fatalf("durable restored snapshot %+v (%v %v); want the new generation's state %s", snap, ok, err, gs.StateSHA256)
	}
	want := []string{
		"prompt_system:verify:applied", "prompt_system:shadow_load:applied", "prompt_system:atomic_switch:applied", "prompt_system:committed:committed",
		"prompt_system:verify:applied", "prompt_system:shadow_load:applied", "prompt_system:quiesce:applied", "prompt_system:snapshot:applied",
		"prompt_system:migrate:applied", "prompt_system:restore:applied", "prompt_system:readiness:applied", "prompt_system:atomic_switch:applied",
		"prompt_system:drain:applied", "prompt_system:committed:committed",
	}
	if got := h.ledgerPhases(); !slices.Equal(got, want) {
		t.Fatalf("ledger:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if d := testutil.ToFloat64(transactionsTotal.WithLabelValues("default", "stack", "prompt_system", "committed")) - committedBefore; d != 2 {
		t.Fatalf("iteron_transactions_total{code=committed} grew by %v, want 2", d)
	}
	if d := testutil.ToFloat64(ledgerAppends.WithLabelValues("default", "stack")) - appendsBefore; d != float64(len(want)) {
		t.Fatalf("iteron_ledger_appends_total grew by %v, want %d", d, len(want))
	}
}
