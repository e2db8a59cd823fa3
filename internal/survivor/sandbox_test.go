package survivor

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/sandboxtest"
)

// TestTheSurvivorSandboxesItsLaunchesAndReportsWhatAnAuditedProviderDid
// launches test/sandbox's hostile provider, admitted read_only, through a
// survivor whose sandbox enforces and through one whose sandbox audits: the
// process's info carries the sandbox applied, a connect to loopback is
// refused by the first and allowed by the second, which counts it, and the
// manager's side reads the count (what its Generation's status shows).
func TestTheSurvivorSandboxesItsLaunchesAndReportsWhatAnAuditedProviderDid(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	impl := providertest.Implement(t, artifacts.Spec{Binary: providertest.Program(t, "iteron.dev/operator/test/sandbox/hostile"),
		ImplementationID: "hostile", Version: catalog.Version{1, 0, 0}, Protocol: 1, Module: "prompt_system", Capabilities: []string{catalog.CapabilityReadOnly}})
	plan := providertest.Plan(t, impl)
	for _, c := range []struct {
		mode       sandbox.Mode
		evidence   string
		ok         bool
		violations map[string]int64
	}{
		{sandbox.ModeEnforce, "mode=enforce level=isolated", false, nil},
		{sandbox.ModeAudit, "mode=audit level=limits", true, map[string]int64{"socket": 1}},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			sb := sandboxtest.New(t, sandbox.Policy{Mode: c.mode}, providertest.SandboxLauncher(t))
			n := startNode(t, func(cfg *ServerConfig) { cfg.Executor.Sandbox = sb })
			cl, _ := n.client(t)
			exe, err := procexec.SealExecutable(plan.Executable(), plan.ArtifactSHA256())
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			rp := launchLoaded(t, cl, plan, exe)
			defer rp.Close()
			if got := rp.Info().Sandbox; !strings.HasPrefix(got, c.evidence) {
				t.Errorf("the process's sandbox is %q; want %s…", got, c.evidence)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			in, _ := json.Marshal(map[string]string{"act": "connect", "arg": lis.Addr().String()})
			_, body, err := rp.Run(ctx, "r1", in, 10*time.Second, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var a struct {
				OK    bool
				Error string
			}
			if err := json.Unmarshal(body, &a); err != nil || a.OK != c.ok {
				t.Errorf("connect answered %s (%v); want ok=%v", body, err, c.ok)
			}
			// The count reaches the manager's side within a refresh.
			var got map[string]int64
			deadline := time.Now().Add(3 * violationsRefresh)
			for {
				got = rp.SandboxViolations()
				if len(got) == len(c.violations) && got["socket"] == c.violations["socket"] || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if len(got) != len(c.violations) || got["socket"] != c.violations["socket"] {
				t.Errorf("the manager's side counts %v; want %v", got, c.violations)
			}
			t.Logf("%s: %s; connect answered %s; violations %v", c.mode, rp.Info().Sandbox, body, got)
		})
	}
}
