package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/test/otlptest"
)

// TestMain runs the tests, or one of the helper processes this test binary
// is re-executed as: a gateway client under another uid (clientEnv) or a
// go-plugin server for the benchmarks (pluginEnv).
func TestMain(m *testing.M) {
	if spec := os.Getenv(clientEnv); spec != "" {
		os.Exit(runClientProcess(spec))
	}
	if os.Getenv(pluginEnv) != "" {
		servePlugin()
		os.Exit(0)
	}
	if os.Getenv(otlptest.ChildEnv) != "" {
		otlptest.ServeChild()
		os.Exit(0)
	}
	providertest.Main(m)
}

var (
	executorOnce sync.Once
	executor     *procexec.Executor
	executorErr  error
)

// sharedExecutor is the one executor of the test binary.
func sharedExecutor(tb testing.TB) *procexec.Executor {
	tb.Helper()
	executorOnce.Do(func() {
		dir, err := os.MkdirTemp("", "iteron-gateway-procs-")
		if err != nil {
			executorErr = err
			return
		}
		providertest.RemoveAtExit(dir)
		// Providers run as providerUID, not the default 65534: the client
		// subprocesses of the authorization tests run as 65534, and the
		// executor's subreaper kills any child running as a provider uid
		// (it can only be a descendant that escaped its provider's group).
		cfg := procexec.DefaultConfig(dir)
		cfg.ProviderUID, cfg.ProviderGID = providerUID, providerUID
		executor, executorErr = procexec.NewExecutor(cfg)
	})
	if executorErr != nil {
		tb.Fatal(executorErr)
	}
	return executor
}

// providerUID is the uid (and gid) the test providers run as.
const providerUID = 65533

// socketDir returns a short directory (socket paths are at most 107 bytes)
// that every uid can traverse, removed after the test.
func socketDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "gw")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testGroup is the gateway socket's group in these tests: a gid no account
// has, so only a process given it explicitly can connect.
const testGroup = 4242

// harness is a real coordinator (real provider processes, real ledger) and
// a gateway serving it on a unix socket.
type harness struct {
	tb       testing.TB
	coord    *hotswap.Coordinator
	stateDir string
	socket   string
	server   *Server
	served   chan error
	client   *Client
	cfg      Config
	lineages map[string]int64 // activation/module → lineage
	// afterPhase, when set, is called at each durable phase of a transaction.
	mu         sync.Mutex
	afterPhase func(key hotswap.ActivationKey, module, phase string)
}

type harnessOption func(*hotswap.Config, *Config)

func newHarness(tb testing.TB, opts ...harnessOption) *harness {
	tb.Helper()
	h := &harness{tb: tb, stateDir: tb.TempDir(), lineages: map[string]int64{}}
	hcfg := hotswap.Config{
		StateDir: h.stateDir, Launch: providers.NewExecutorLauncher(sharedExecutor(tb)), Log: testr.NewWithInterface(&quietT{tb}, testr.Options{}),
		AfterPhase: func(key hotswap.ActivationKey, module, phase string) {
			h.mu.Lock()
			hook := h.afterPhase
			h.mu.Unlock()
			if hook != nil {
				hook(key, module, phase)
			}
		},
	}
	allow, err := ParseAllow([]string{"uid:0=*"})
	if err != nil {
		tb.Fatal(err)
	}
	h.cfg = Config{NodeName: "node-test", Allow: allow, SocketGroup: testGroup}
	for _, o := range opts {
		o(&hcfg, &h.cfg)
	}
	coord, err := hotswap.New(hcfg)
	if err != nil {
		tb.Fatal(err)
	}
	h.coord = coord
	h.cfg.Coordinator = coord
	h.socket = filepath.Join(socketDir(tb), "gateway.sock")
	h.cfg.Socket = h.socket
	tb.Cleanup(func() {
		h.stopServer()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := coord.Shutdown(ctx); err != nil {
			tb.Logf("coordinator shutdown: %v", err)
		}
	})
	h.startServer()
	return h
}

// quietT logs only when the test fails (the coordinator is chatty).
type quietT struct{ testing.TB }

func (q *quietT) Log(args ...any) {
	if q.TB.Failed() {
		q.TB.Log(args...)
	}
}

// startServer starts a gateway (a new instance) on the harness's socket.
func (h *harness) startServer() {
	h.tb.Helper()
	srv, err := New(h.cfg)
	if err != nil {
		h.tb.Fatal(err)
	}
	lis, err := Listen(h.socket, testGroup)
	if err != nil {
		h.tb.Fatal(err)
	}
	h.server, h.served = srv, make(chan error, 1)
	go func() { h.served <- srv.Serve(lis) }()
	c, err := Dial(h.socket)
	if err != nil {
		h.tb.Fatal(err)
	}
	h.client = c
}

// stopServer stops the gateway (as a manager's shutdown does).
func (h *harness) stopServer() {
	if h.server == nil {
		return
	}
	h.client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.server.Stop(ctx)
	if err := <-h.served; err != nil {
		h.tb.Errorf("Serve: %v", err)
	}
	h.server = nil
}

// activation is one activation of the harness.
type activationRef struct {
	key     hotswap.ActivationKey
	targets map[string]hotswap.ModuleTarget
	// revision is the Revision of the targets deployed next.
	revision string
	// rollout is the rollout span the next deployments link to (as a
	// stamp's iteron.dev/traceparent gives it).
	rollout trace.SpanContext
}

var uidCounter struct {
	sync.Mutex
	n int
}

// newActivation makes an activation key in namespace.
func newActivation(namespace, name string) *activationRef {
	uidCounter.Lock()
	uidCounter.n++
	uid := fmt.Sprintf("%08x-0000-4000-8000-000000000000", 0xb0000000+uidCounter.n)
	uidCounter.Unlock()
	return &activationRef{key: hotswap.ActivationKey{Namespace: namespace, Name: name, UID: uid}, targets: map[string]hotswap.ModuleTarget{}}
}

// counterImpl lays out counter v2 as implementation id for module.
func counterImpl(tb testing.TB, module, id string, edit ...func(*artifacts.Spec)) artifacts.Implementation {
	spec := artifacts.Spec{Binary: artifacts.CounterV2, Module: module, ImplementationID: id}
	for _, e := range edit {
		e(&spec)
	}
	return providertest.Implement(tb, spec)
}

// deploy makes impl the next generation of its module in a and applies
// a's targets (a hot swap when the module already runs).
func (h *harness) deploy(a *activationRef, impl artifacts.Implementation, swap hotswap.SwapPolicy, edit ...func(*verifier.LaunchPlanFields)) hotswap.ModuleTarget {
	h.tb.Helper()
	return h.deployPlan(a, providertest.Plan(h.tb, impl, edit...), swap)
}

// deployPlan makes plan the next generation of its module in a and applies
// a's targets.
func (h *harness) deployPlan(a *activationRef, plan verifier.LaunchPlan, swap hotswap.SwapPolicy) hotswap.ModuleTarget {
	h.tb.Helper()
	m := plan.Module()
	k := a.key.Name + "/" + m
	h.lineages[k]++
	lineage := h.lineages[k]
	t := hotswap.ModuleTarget{
		Module: m, Plan: plan, Lineage: lineage, Attempt: 1,
		Epoch:          "sha256:" + strings.Repeat("0", 48) + fmt.Sprintf("%016x", lineage),
		GenerationName: fmt.Sprintf("%s-%s-g%d-1", a.key.Name, strings.ReplaceAll(m, "_", "-"), lineage),
		Revision:       a.revision,
	}
	a.targets[m] = t
	if swap.Deadline == 0 {
		swap.Deadline = 30 * time.Second
	}
	if swap.QuiesceTimeout == 0 {
		swap.QuiesceTimeout = 5 * time.Second
	}
	d := hotswap.Desired{Key: a.key, SpecGeneration: lineage, CandidateSHA256: providertest.CandidateSHA256, Swap: swap, RolloutSpan: a.rollout}
	for _, mod := range sortedKeys(a.targets) {
		d.Modules = append(d.Modules, a.targets[mod])
		d.ActivateOrder = append(d.ActivateOrder, mod)
	}
	for i := len(d.ActivateOrder) - 1; i >= 0; i-- {
		d.DrainOrder = append(d.DrainOrder, d.ActivateOrder[i])
	}
	if err := h.coord.Apply(d); err != nil {
		h.tb.Fatal(err)
	}
	return t
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// settle waits until the coordinator has nothing left to do for a and
// module serves target.
func (h *harness) settle(a *activationRef, target hotswap.ModuleTarget) hotswap.ActivationStatus {
	h.tb.Helper()
	deadline := time.Now().Add(90 * time.Second)
	time.Sleep(10 * time.Millisecond)
	for {
		st, ok := h.coord.Status(a.key.UID)
		if ok && !st.Busy {
			if ms := st.Modules[target.Module]; ms.Active != target.GenerationName {
				h.tb.Fatalf("module %s settled on %q, want %s: %+v (failures %+v)", target.Module, ms.Active, target.GenerationName, ms, st.Failures)
			}
			return st
		}
		if time.Now().After(deadline) {
			h.tb.Fatalf("the coordinator did not settle: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// counterResult is the counter's terminal observation.
type counterResult struct {
	Version string `json:"implementation_version"`
	Key     string `json:"key"`
	Count   int64  `json:"count"`
	Total   int64  `json:"total"`
}

func decodeCounter(tb testing.TB, obs string) counterResult {
	tb.Helper()
	var r counterResult
	if err := json.Unmarshal([]byte(obs), &r); err != nil {
		tb.Fatalf("observation %q: %v", obs, err)
	}
	return r
}

// invoke calls the gateway.
func (h *harness) invoke(ctx context.Context, req *gatewayv1.InvokeRequest) (*gatewayv1.InvokeResponse, error) {
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
	}
	return h.client.Invoke(ctx, req)
}

// count invokes the counter in a and returns its result and response.
func (h *harness) count(a *activationRef, module, key string, add int) (counterResult, *gatewayv1.InvokeResponse) {
	h.tb.Helper()
	resp, err := h.invoke(nil, &gatewayv1.InvokeRequest{
		Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		InputJson: fmt.Sprintf(`{"key":%q,"add":%d}`, key, add),
	})
	if err != nil {
		h.tb.Fatalf("invoke %s: %v", module, err)
	}
	return decodeCounter(h.tb, resp.ObservationJson), resp
}

// wantFailure checks that err is a gateway status with code and reason, and
// that its message starts with "<reason>: " and contains every fragment.
func expectFailure(tb testing.TB, err error, code codes.Code, reason string, fragments ...string) *gatewayv1.Failure {
	tb.Helper()
	if err == nil {
		tb.Fatalf("no error; want %s (%s)", code, reason)
	}
	st, _ := status.FromError(err)
	f, ok := ReasonOf(err)
	if st.Code() != code || !ok || f.Reason != reason || !strings.HasPrefix(st.Message(), reason+": ") {
		tb.Fatalf("error %v (detail %+v); want code %s, reason %s, message prefixed %q", err, f, code, reason, reason+": ")
	}
	for _, frag := range fragments {
		if !strings.Contains(st.Message(), frag) {
			tb.Fatalf("message %q does not contain %q", st.Message(), frag)
		}
	}
	return f
}

// waitFor polls cond until it holds or 30 s pass.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
