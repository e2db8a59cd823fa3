package procexec

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/sandboxtest"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/internal/verifier"
)

func sandboxedExecutor(t *testing.T, p sandbox.Policy) (*Executor, *sandbox.Sandbox) {
	t.Helper()
	sb := sandboxtest.New(t, p, providertest.SandboxLauncher(t))
	cfg := DefaultConfig(t.TempDir())
	cfg.Sandbox = sb
	ex, err := NewExecutor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ex, sb
}

// providerOf is the provider under its launcher (the group's leader).
func providerOf(t *testing.T, p *Process) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/task/" + strconv.Itoa(p.Pid()) + "/children")
	if err != nil {
		t.Fatal(err)
	}
	kids := strings.Fields(string(b))
	if len(kids) != 1 {
		t.Fatalf("the launcher %d has children %v; want the provider alone", p.Pid(), kids)
	}
	pid, _ := strconv.Atoi(kids[0])
	return pid
}

func TestASandboxedProviderKeepsEveryLaunchGuaranteeAndLeavesNothing(t *testing.T) {
	ex, sb := sandboxedExecutor(t, sandbox.Policy{Mode: sandbox.ModeEnforce})
	impl := implement(t, artifacts.Stateless)
	p := loaded(t, ex, impl)
	ev, ok := p.Sandbox()
	if !ok || ev.Level != sandbox.LevelIsolated || ev.Network != sandbox.NetworkNone || ev.Landlock == 0 || !strings.HasPrefix(ev.Seccomp, "sha256:") {
		t.Errorf("evidence %s", ev)
	}
	provider := providerOf(t, p)
	// fds 0-3 as the launch gives them, and nothing of the launcher's (its
	// memfd, its config and status pipes, a cgroup file); a Go provider
	// opens descriptors of its own, which are none of those.
	fds, _ := os.ReadDir("/proc/" + strconv.Itoa(provider) + "/fd")
	for _, f := range fds {
		target, _ := os.Readlink("/proc/" + strconv.Itoa(provider) + "/fd/" + f.Name())
		if strings.HasPrefix(target, "/memfd:") != (f.Name() == "3") || strings.Contains(target, "cgroup") {
			t.Errorf("the provider holds fd %s → %s", f.Name(), target)
		}
	}
	if st, err := spawn.ReadStat(provider); err != nil || st.PGID != p.Pgid() {
		t.Errorf("the provider's group is %d (%v); want the launch's %d", st.PGID, err, p.Pgid())
	}
	run, err := p.Start(ctx(t), "r1", []byte(`{"text":"x","introspect":true}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := run.Result()
	if err != nil {
		t.Fatal(err)
	}
	var view struct {
		Env        []string          `json:"env"`
		UID        int               `json:"uid"`
		Groups     []int             `json:"groups"`
		Cwd        string            `json:"cwd"`
		NoNewPrivs string            `json:"no_new_privs"`
		Caps       map[string]string `json:"caps"`
	}
	if err := json.Unmarshal(obs.Observation, &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Env) != 0 || view.UID != 65534 || len(view.Groups) != 0 || view.Cwd != impl.ArtifactRoot || view.NoNewPrivs != "1" ||
		view.Caps["CapBnd"] != "0000000000000000" || view.Caps["CapEff"] != "0000000000000000" {
		t.Errorf("the provider sees %+v", view)
	}
	if err := p.Stop(ctx(t), "done"); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if rest := p.Remaining(); len(rest) != 0 {
		t.Errorf("left in the group: %v", rest)
	}
	for _, dir := range sandboxtest.LeftCgroups(t, sb) {
		t.Errorf("a provider's cgroup is left: %s", dir)
	}
}

func hostileImpl(t *testing.T) artifacts.Implementation {
	t.Helper()
	return providertest.Implement(t, artifacts.Spec{Binary: providertest.Program(t, "iteron.dev/operator/test/sandbox/hostile"),
		ImplementationID: "hostile", Version: catalog.Version{1, 0, 0}, Protocol: 1})
}

func TestAProviderOverItsMemoryBoundFailsWithAReasonOfItsOwn(t *testing.T) {
	ex, _ := sandboxedExecutor(t, sandbox.Policy{Mode: sandbox.ModeEnforce})
	p := loaded(t, ex, hostileImpl(t), func(f *verifier.LaunchPlanFields) {
		f.Sandbox = verifier.SandboxRequest{MemoryBytes: 64 << 20}
	})
	run, err := p.Start(ctx(t), "r1", []byte(`{"act":"memhog"}`), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = run.Result()
	f, ok := AsFault(err)
	if !ok || f.ReasonCode() != reasons.MemoryExceeded || !strings.Contains(f.Detail, "memory bound of 67108864") || !strings.Contains(f.Detail, "signal 9") {
		t.Fatalf("the hog's run ended with %v; want %s naming the bound and SIGKILL", err, reasons.MemoryExceeded)
	}
	<-p.Done()
	if rest := p.Remaining(); len(rest) != 0 {
		t.Errorf("left in the group: %v", rest)
	}
}

func TestALaunchRequiringWhatTheNodeCannotGiveIsRefusedBeforeAnythingStarts(t *testing.T) {
	ex, _ := sandboxedExecutor(t, sandbox.Policy{Mode: sandbox.ModeAudit})
	before := openFDs(t)
	_, err := ex.Launch(providertest.Plan(t, implement(t, artifacts.Stateless), func(f *verifier.LaunchPlanFields) {
		f.Sandbox = verifier.SandboxRequest{Require: "isolated"}
	}))
	f, ok := AsFault(err)
	if !ok || f.Kind != KindRefused || f.ReasonCode() != reasons.SandboxUnavailable || !strings.Contains(f.Detail, "audit") {
		t.Fatalf("Launch: %v; want a refusal with %s saying the node runs in audit mode", err, reasons.SandboxUnavailable)
	}
	if after := openFDs(t); !slices.Equal(before, after) {
		t.Errorf("descriptors before %v, after %v", before, after)
	}
	if len(ex.Live()) != 0 {
		t.Errorf("live processes after a refusal: %d", len(ex.Live()))
	}
}
