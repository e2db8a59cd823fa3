package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/cmd/manager/app"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/cgroups"
	"iteron.dev/operator/internal/sandbox/sandboxtest"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

const testNode = "sandbox-node"

var (
	suite    *operatortest.Suite
	socket   string
	launcher string
	seq      atomic.Int64
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("the sandbox suite needs root (namespaces, cgroups, providers as uid 65534): skipped")
		return 0
	}
	own, err := cgroups.Detect()
	if err != nil || len(own.Missing()) > 0 {
		fmt.Println("this machine's cgroups lack the memory, cpu or pids controller: skipped", err)
		return 0
	}
	// Everything the providers of this suite do is bounded twice: by the
	// bounds under test and by this guard, made first.
	guard, removeGuard, err := own.Below("iteron-test-guard-"+strconv.Itoa(os.Getpid()), "sandbox-suite", sandboxtest.GuardLimits)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := removeGuard(); err != nil {
			fmt.Fprintln(os.Stderr, "removing the guard cgroup:", err)
		}
	}()
	bin, err := os.MkdirTemp("", "iteron-sandbox-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(bin)
	root, err := kubeapi.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := kubeapi.BuildSandboxLauncher(root, bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sock, err := os.MkdirTemp("", "itsb-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(sock)
	socket, launcher = filepath.Join(sock, "gw.sock"), filepath.Join(bin, "iteron-sandbox")
	code := operatortest.RunWith(m, "sandbox", testNode, func(o *operatortest.Options) {
		o.Sandbox = &app.SandboxOptions{Policy: sandbox.Policy{Mode: sandbox.ModeEnforce}, Launcher: launcher, Cgroups: guard}
		o.CapabilityCeiling = catalog.Capabilities()
		o.Gateway = &app.GatewayOptions{Socket: socket, Allow: gateway.Allow{UIDs: map[uint32][]string{uint32(os.Getuid()): {"*"}}}}
	}, func(s *operatortest.Suite) { suite = s })
	return code
}

// variant is one way the hostile provider is admitted: its catalog
// requests caps, the node (whose ceiling is every capability) admits them.
type variant struct {
	name string
	caps []string
}

var (
	none     = variant{"none", []string{catalog.CapabilityReadOnly}}
	execV    = variant{"code_executing", []string{catalog.CapabilityCodeExecuting}}
	external = variant{"irreversible_external", []string{catalog.CapabilityIrreversibleExternal}}
	local    = variant{"reversible_local", []string{catalog.CapabilityReadOnly, catalog.CapabilityReversibleLocal}}
	all      = variant{"all five", catalog.Capabilities()}
)

// deployed is one activation of the hostile provider.
type deployed struct {
	act *iteronv1.ImplementationActivation
	gen *iteronv1.Generation
}

// deploy activates the hostile provider admitted v, with the sandbox
// request sb (nil: the node's defaults), and waits until it serves.
func deploy(t testing.TB, v variant, sb *iteronv1.SourceSandbox) deployed {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: providertest.Program(t, "iteron.dev/operator/test/sandbox/hostile"),
		ImplementationID: "hostile", Version: catalog.Version{1, 0, 0}, Protocol: 1, Module: "prompt_system", Capabilities: v.caps})
	src := providertest.Catalog(t, impl)[0]
	name := fmt.Sprintf("hostile-%d", seq.Add(1))
	act := &iteronv1.ImplementationActivation{}
	act.Name, act.Namespace = name, "default"
	act.Spec = iteronv1.ImplementationActivationSpec{
		NodeName: testNode, CandidateSHA256: providertest.CandidateSHA256,
		Sources: []iteronv1.ActivationSource{{
			Module: "prompt_system", ImplementationID: "hostile", CatalogPath: src.CatalogPath, ArtifactRoot: src.ArtifactRoot,
			ManifestSHA256: src.ManifestSHA256, ArtifactSHA256: src.ArtifactSHA256, Sandbox: sb,
		}},
	}
	if err := suite.Env.Client.Create(context.Background(), act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { operatortest.DeleteAndWait(t, suite.Env.Client, act) })
	got := operatortest.WaitFor(t, suite.Env.Client, act, "Ready", operatortest.Ready)
	ms := operatortest.ModuleStatus(got, "prompt_system")
	gen := operatortest.WaitGeneration(t, suite.Env.Client, act.Namespace, ms.GenerationName, "Active with its sandbox shown", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Sandbox != nil
	})
	return deployed{act: got, gen: gen}
}

// answer is what a call of the hostile provider came back with.
type answer struct {
	Act    string `json:"act"`
	OK     bool   `json:"ok"`
	Error  string `json:"error"`
	Detail string `json:"detail"`
	// Reason is the gateway's failure reason when the call failed.
	Reason, Message string
}

// call asks d's provider to do act with arg, through the gateway.
func call(t testing.TB, d deployed, act, arg string, deadline time.Duration) answer {
	t.Helper()
	return callVia(t, socket, d, act, arg, deadline)
}

// callVia is call through the gateway at sock.
func callVia(t testing.TB, sock string, d deployed, act, arg string, deadline time.Duration) answer {
	t.Helper()
	c, err := gateway.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return callOn(t, c, d, act, arg, deadline)
}

// callOn is call over the gateway connection c.
func callOn(t testing.TB, c *gateway.Client, d deployed, act, arg string, deadline time.Duration) answer {
	t.Helper()
	in, _ := json.Marshal(map[string]string{"act": act, "arg": arg})
	ctx, cancel := context.WithTimeout(context.Background(), deadline+10*time.Second)
	defer cancel()
	resp, err := c.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: d.act.Namespace, Activation: d.act.Name, Module: "prompt_system",
		InputJson: string(in), DeadlineMs: uint64(deadline.Milliseconds())})
	if err != nil {
		st, _ := status.FromError(err)
		a := answer{Act: act, Message: st.Message()}
		for _, det := range st.Details() {
			if f, ok := det.(*gatewayv1.Failure); ok {
				a.Reason, a.Message = f.Reason, f.Message
			}
		}
		return a
	}
	var a answer
	if err := json.Unmarshal([]byte(resp.ObservationJson), &a); err != nil {
		t.Fatalf("the provider answered %q: %v", resp.ObservationJson, err)
	}
	return a
}
