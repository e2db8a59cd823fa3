package sandbox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/doctor"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/test/operatortest"
)

func TestAForkBombStopsAtItsTasksBoundAndItsNeighbourIsUnaffected(t *testing.T) {
	neighbour := deploy(t, variant{"neighbour", none.caps}, nil)
	bomb := deploy(t, none, &iteronv1.SourceSandbox{Tasks: ptr.To[int32](64)})
	done := make(chan answer, 1)
	go func() { done <- call(t, bomb, "forkbomb", "2s", 30*time.Second) }()
	// The bomb's processes, counted from the node (its group): the
	// launcher and at most 64 tasks.
	peak, leader := 0, int(bomb.gen.Status.Pid)
	var a answer
	for waiting := true; waiting; {
		select {
		case a = <-done:
			waiting = false
		case <-time.After(20 * time.Millisecond):
			if m, _ := spawn.GroupMembers(leader); len(m) > peak {
				peak = len(m)
			}
		}
	}
	if peak > 65 || peak < 10 {
		t.Errorf("the bomb's group peaked at %d processes; want it to reach its bound (64 tasks, and the launcher), not pass it", peak)
	}
	// The provider either reports what its namespace holds, or dies of its
	// own bomb (its Go runtime wants a thread the bound no longer gives):
	// both are the bomb contained.
	if n, _ := strconv.Atoi(a.Detail); a.OK && n > 64 || !a.OK && a.Reason != reasons.ProviderFailed {
		t.Errorf("the bomb answered %+v", a)
	}
	t.Logf("fork bomb: its group peaked at %d processes (tasks bound 64); the call answered %+v", peak, a)
	if a := call(t, neighbour, "procs", "", 10*time.Second); !a.OK || a.Detail != "2" {
		t.Errorf("the neighbour answered %+v after the bomb; want it to serve, seeing its 2 processes", a)
	}
	// The shadow_load record carries what the bomb's sandbox applied.
	st, ok := suite.Manager.Coordinator.Status(string(bomb.act.UID))
	if !ok {
		t.Fatal("no status for the bomb's activation")
	}
	state, err := ledger.Verify(st.LedgerFile, ledger.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var note string
	for _, r := range state.Recent {
		if r.Phase == ledger.PhaseShadowLoad {
			note = r.Reason
		}
	}
	if !strings.HasPrefix(note, "sandbox: mode=enforce level=isolated ns=cgroup,ipc,mnt,net,pid,uts network=none exec=no memory=536870912 cpu="+strconv.FormatInt(sandbox.DefaultCPUMillis, 10)+"m tasks=64 ") {
		t.Errorf("the shadow_load record's note is %q", note)
	}
	pids := map[string]int{"bomb": int(bomb.gen.Status.Pid), "neighbour": int(neighbour.gen.Status.Pid)}
	deleteNow(t, bomb)
	deleteNow(t, neighbour)
	nothingLeft(t, pids)
}

func TestAMemoryHogIsKilledAndReportedWithAReasonOfItsOwn(t *testing.T) {
	neighbour := deploy(t, variant{"neighbour", none.caps}, nil)
	mem := resource.MustParse("64Mi")
	hog := deploy(t, none, &iteronv1.SourceSandbox{Memory: &mem})
	if got := hog.gen.Status.Sandbox; got.MemoryBytes != 64<<20 || got.Level != "isolated" {
		t.Errorf("status.sandbox %+v", got)
	}
	a := call(t, hog, "memhog", "", 30*time.Second)
	if a.OK || a.Reason != reasons.MemoryExceeded || !strings.Contains(a.Message, "memory bound of 67108864 bytes") {
		t.Fatalf("the hog's call answered %+v; want %s naming the bound", a, reasons.MemoryExceeded)
	}
	t.Logf("memory hog: %s: %s", a.Reason, a.Message)
	if a := call(t, neighbour, "ok", "", 10*time.Second); !a.OK {
		t.Errorf("the neighbour answered %+v after the hog", a)
	}
	pids := map[string]int{"neighbour": int(neighbour.gen.Status.Pid)}
	deleteNow(t, hog)
	deleteNow(t, neighbour)
	nothingLeft(t, pids)
}

func TestACPUSpinnerIsThrottledAndItsNeighbourServes(t *testing.T) {
	neighbour := deploy(t, variant{"neighbour", none.caps}, nil)
	cpu := resource.MustParse("200m")
	spinner := deploy(t, none, &iteronv1.SourceSandbox{CPU: &cpu})
	done := make(chan answer, 1)
	go func() { done <- call(t, spinner, "spin", "3s", 30*time.Second) }()
	time.Sleep(500 * time.Millisecond)
	if a := call(t, neighbour, "ok", "", 10*time.Second); !a.OK {
		t.Errorf("the neighbour answered %+v beside the spinner", a)
	}
	a := <-done
	ratio, _ := strconv.ParseFloat(a.Detail, 64)
	if !a.OK || ratio > 0.3 {
		t.Errorf("the spinner answered %+v; want at most 0.3 CPU per second of wall time under a bound of 0.2", a)
	}
	t.Logf("CPU spinner: %.2f CPU-seconds per second under a 200m bound (the neighbour's latency beside it: BenchmarkNeighbourLatencyBesideACPUSpinner)", ratio)
	deleteNow(t, spinner)
	deleteNow(t, neighbour)
}

func TestABoundAboveTheNodesCeilingIsRefusedAndTheOldGenerationKeepsServing(t *testing.T) {
	d := deploy(t, none, nil)
	old := d.gen.Name
	// A new implementation whose source asks more memory than the node's
	// ceiling (4Gi).
	impl := providertest.Implement(t, artifacts.Spec{Binary: providertest.Program(t, "iteron.dev/operator/test/sandbox/hostile"),
		ImplementationID: "hostile-2", Version: catalog.Version{1, 1, 0}, Protocol: 1, Module: "prompt_system", Capabilities: none.caps, Argv: []string{}})
	src := providertest.Catalog(t, impl)[0]
	big := resource.MustParse("8Gi")
	operatortest.UpdateSpec(t, suite.Env.Client, d.act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: "hostile-2", CatalogPath: src.CatalogPath,
			ArtifactRoot: src.ArtifactRoot, ManifestSHA256: src.ManifestSHA256, ArtifactSHA256: src.ArtifactSHA256,
			Sandbox: &iteronv1.SourceSandbox{Memory: &big}}
	})
	failed := waitFailedGeneration(t, d.act, "hostile-2")
	if failed.Status.Reason != reasons.SandboxUnavailable || !strings.Contains(failed.Status.Message, "--sandbox-max-memory") {
		t.Errorf("the new generation failed with %s: %s; want %s naming the ceiling's flag", failed.Status.Reason, failed.Status.Message, reasons.SandboxUnavailable)
	}
	t.Logf("refused: %s: %s", failed.Status.Reason, failed.Status.Message)
	var cur iteronv1.ImplementationActivation
	if err := suite.Env.Client.Get(context.Background(), client.ObjectKeyFromObject(d.act), &cur); err != nil {
		t.Fatal(err)
	}
	if ms := operatortest.ModuleStatus(&cur, "prompt_system"); ms.Phase != iteronv1.PhaseActive || ms.GenerationName != old {
		t.Errorf("the module is %s on %s; want Active on the old generation %s", ms.Phase, ms.GenerationName, old)
	}
	if a := call(t, d, "ok", "", 10*time.Second); !a.OK {
		t.Errorf("the old generation does not serve: %+v", a)
	}
}

// waitFailedGeneration waits for a Failed generation of act running
// implementation id.
func waitFailedGeneration(t *testing.T, act *iteronv1.ImplementationActivation, id string, explain ...func() string) *iteronv1.Generation {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var list iteronv1.GenerationList
		if err := suite.Env.Client.List(context.Background(), &list, client.InNamespace(act.Namespace)); err != nil {
			t.Fatal(err)
		}
		for i, g := range list.Items {
			if g.Spec.ActivationName == act.Name && g.Spec.Implementation.ID == id && g.Status.Phase == iteronv1.PhaseFailed {
				return &list.Items[i]
			}
		}
		if time.Now().After(deadline) {
			var more []string
			for _, e := range explain {
				more = append(more, e())
			}
			t.Fatalf("no Failed generation of %s for %s:\n%s", id, act.Name, strings.Join(more, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAnAuditedNodeRefusesARequiredLevelAndCountsWhatEnforceWouldRefuse
// runs the manager binary, in audit mode, for a node of its own (one
// controller-runtime manager per process), started inside the guard cgroup.
func TestAnAuditedNodeRefusesARequiredLevelAndCountsWhatEnforceWouldRefuse(t *testing.T) {
	const node = "sandbox-audit-node"
	audited := startManagerBinary(t, node, "--sandbox=audit")
	lis := loopbackListener(t)
	impl := providertest.Implement(t, artifacts.Spec{Binary: providertest.Program(t, "iteron.dev/operator/test/sandbox/hostile"),
		ImplementationID: "hostile", Version: catalog.Version{1, 0, 0}, Protocol: 1, Module: "prompt_system", Capabilities: none.caps})
	src := providertest.Catalog(t, impl)[0]
	for _, c := range []struct {
		name    string
		require iteronv1.SandboxLevel
	}{{"isolated-required", iteronv1.SandboxLevelIsolated}, {"audited", ""}} {
		act := &iteronv1.ImplementationActivation{}
		act.Name, act.Namespace = c.name, "default"
		act.Spec = iteronv1.ImplementationActivationSpec{NodeName: node, CandidateSHA256: providertest.CandidateSHA256,
			Sources: []iteronv1.ActivationSource{{Module: "prompt_system", ImplementationID: "hostile", CatalogPath: src.CatalogPath,
				ArtifactRoot: src.ArtifactRoot, ManifestSHA256: src.ManifestSHA256, ArtifactSHA256: src.ArtifactSHA256,
				Sandbox: &iteronv1.SourceSandbox{Require: c.require}}}}
		if err := suite.Env.Client.Create(context.Background(), act); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { operatortest.DeleteAndWait(t, suite.Env.Client, act) })
		if c.require != "" {
			g := waitFailedGeneration(t, act, "hostile", audited.log.String)
			if g.Status.Reason != reasons.SandboxUnavailable || !strings.Contains(g.Status.Message, "audit") {
				t.Errorf("a source requiring Isolated on an audited node: %s: %s; want %s saying the node audits", g.Status.Reason, g.Status.Message, reasons.SandboxUnavailable)
			}
			t.Logf("refused: %s: %s", g.Status.Reason, g.Status.Message)
			continue
		}
		got := operatortest.WaitFor(t, suite.Env.Client, act, "Ready", operatortest.Ready)
		a := callVia(t, audited.socket, deployed{act: got}, "connect", lis.addr, 10*time.Second)
		time.Sleep(50 * time.Millisecond)
		if !a.OK || lis.wrote.Load() != 1 {
			t.Errorf("audit refused the connect: %+v", a)
		}
		ms := operatortest.ModuleStatus(got, "prompt_system")
		gen := operatortest.WaitGeneration(t, suite.Env.Client, act.Namespace, ms.GenerationName, "Active with its sandbox", func(g *iteronv1.Generation) bool {
			return g.Status.Sandbox != nil
		})
		if sb := gen.Status.Sandbox; sb.Mode != "audit" || sb.Level != "limits" || len(sb.Namespaces) != 0 || sb.MemoryBytes != sandbox.DefaultMemoryBytes {
			t.Errorf("status.sandbox %+v; want audit at the limits level, no namespaces, the default bounds", sb)
		}
		metric := fmt.Sprintf(`iteron_sandbox_violations_total{module="prompt_system",syscall="socket"} 1`)
		if m := audited.metrics(t); !strings.Contains(m, metric) {
			t.Errorf("the metrics lack %s:\n%s", metric, grepLines(m, "iteron_sandbox"))
		}
		if log := audited.log.String(); !strings.Contains(log, "sandbox violation (audit: allowed)") || !strings.Contains(log, `"syscall":"socket"`) {
			t.Errorf("the manager's log does not name the violation:\n%s", grepLines(log, "sandbox"))
		}
		// The Generation's status counts it (no transition follows the
		// call: an audited Generation is mirrored again while it runs), and
		// the doctor says it.
		counted := operatortest.WaitGeneration(t, suite.Env.Client, act.Namespace, ms.GenerationName, "the violation counted in status.sandbox", func(g *iteronv1.Generation) bool {
			return g.Status.Sandbox != nil && g.Status.Sandbox.Violations["socket"] == 1
		})
		t.Logf("status.sandbox.violations of %s: %v", counted.Name, counted.Status.Sandbox.Violations)
		want := "audit: " + counted.Name + " did what --sandbox=enforce refuses: socket 1"
		if text := doctorText(t, got); !strings.Contains(text, want) || !strings.Contains(text, "prompt_system: "+counted.Name+": mode=audit level=limits") {
			t.Errorf("the doctor's report lacks %q and the sandbox line:\n%s", want, text)
		} else {
			t.Logf("kubectl iteron doctor:\n%s", grepLines(text, counted.Name))
		}
		// The serving source is swapped for one that requires the
		// isolated level, which this node cannot give: the new generation
		// is refused and the audited one keeps serving.
		impl2 := providertest.Implement(t, artifacts.Spec{Binary: providertest.Program(t, "iteron.dev/operator/test/sandbox/hostile"),
			ImplementationID: "hostile-2", Version: catalog.Version{1, 1, 0}, Protocol: 1, Module: "prompt_system", Capabilities: none.caps, Argv: []string{}})
		src2 := providertest.Catalog(t, impl2)[0]
		operatortest.UpdateSpec(t, suite.Env.Client, got, func(a *iteronv1.ImplementationActivation) {
			a.Spec.Sources[0] = iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: "hostile-2", CatalogPath: src2.CatalogPath,
				ArtifactRoot: src2.ArtifactRoot, ManifestSHA256: src2.ManifestSHA256, ArtifactSHA256: src2.ArtifactSHA256,
				Sandbox: &iteronv1.SourceSandbox{Require: iteronv1.SandboxLevelIsolated}}
		})
		refused := waitFailedGeneration(t, got, "hostile-2", audited.log.String)
		if refused.Status.Reason != reasons.SandboxUnavailable || !strings.Contains(refused.Status.Message, "sandbox.require") {
			t.Errorf("a swap to a source requiring Isolated on an audited node: %s: %s; want %s naming sandbox.require", refused.Status.Reason, refused.Status.Message, reasons.SandboxUnavailable)
		}
		var cur iteronv1.ImplementationActivation
		if err := suite.Env.Client.Get(context.Background(), client.ObjectKeyFromObject(got), &cur); err != nil {
			t.Fatal(err)
		}
		if ms := operatortest.ModuleStatus(&cur, "prompt_system"); ms.Phase != iteronv1.PhaseActive || ms.GenerationName != counted.Name {
			t.Errorf("the module is %s on %s; want Active on the old generation %s", ms.Phase, ms.GenerationName, counted.Name)
		}
		if a := callVia(t, audited.socket, deployed{act: got}, "ok", "", 10*time.Second); !a.OK {
			t.Errorf("the old generation does not serve: %+v", a)
		}
		t.Logf("swap refused: %s: %s; %s still serves", refused.Status.Reason, refused.Status.Message, counted.Name)
	}
}

// doctorText is what `kubectl iteron doctor` prints for act (the doctor
// package on the API server's objects, as the CLI runs it).
func doctorText(t *testing.T, act *iteronv1.ImplementationActivation) string {
	t.Helper()
	in, err := doctor.Gather(context.Background(), suite.Env.Client, act.Namespace, act.Name, doctor.GatherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := doctor.WriteText(&b, doctor.Diagnose(in, nil, doctor.Options{})); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
