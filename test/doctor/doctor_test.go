package doctor_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/doctor"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/strictjson"
)

func TestDoctorFindsNothingWrongWithAReadyActivation(t *testing.T) {
	act := newActivation(t, "healthy", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)
	name := moduleStatus(got, "prompt_system").GenerationName
	g := waitGeneration(t, got.Namespace, name, "Active with a pid", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0
	})

	r := diagnoseUntil(t, got, stateDir, func(r *doctor.Report) bool { return r.Healthy })
	// The local control plane has no Node objects: the node is unknown.
	if !r.Healthy || !slices.Equal(codes(r), []string{"info node_unknown"}) || r.ActiveCount != 1 {
		t.Fatalf("healthy %t, %d active, findings %q", r.Healthy, r.ActiveCount, codes(r))
	}
	if r.Ledger == nil || r.Ledger.Source != "file" || !r.Ledger.Verified || r.Ledger.Records != got.Status.Ledger.Records {
		t.Fatalf("ledger %+v; status says %d records", r.Ledger, got.Status.Ledger.Records)
	}
	i := slices.IndexFunc(r.Processes, func(p doctor.ProcessDiagnosis) bool { return int64(p.Pid) == g.Status.Pid })
	if i < 0 || r.Processes[i].Verdict != doctor.VerdictServing || r.Processes[i].ClaimedBy != "default/"+name {
		t.Fatalf("the serving provider (pid %d) in %+v", g.Status.Pid, r.Processes)
	}

	code, out, runs := cliUntil(t, 0, "doctor", act.Name, "-n", "default", "--state-dir", stateDir)
	t.Logf("kubectl iteron doctor %s --state-dir %s → exit %d (run %d)\n%s", act.Name, stateDir, code, runs, out)
	if code != 0 || !strings.Contains(out, "on node test-node: healthy") || !strings.Contains(out, "[info] node_unknown") {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

func TestDoctorExplainsATamperedArtifactAndTheDependencyChainItGates(t *testing.T) {
	act := newActivation(t, "tampered", nil,
		tamperedSource(t, "prompt_system", "sys"),
		source(t, artifacts.CounterV2, "context_assembly", "ctx"),
		source(t, artifacts.CounterV2, "provider_routing", "route"),
	)
	got := waitFor(t, act, "a verification failure in status", func(a *iteronv1.ImplementationActivation) bool {
		return a.Status.ObservedGeneration == a.Generation && moduleStatus(a, "prompt_system").Reason == reasons.VerificationFailed &&
			moduleStatus(a, "provider_routing").Reason == reasons.DependencyUnsatisfied
	})
	cause := moduleStatus(got, "prompt_system").Message

	r := diagnose(t, got, "", 0)
	want := []string{"problem module_not_active prompt_system", "problem dependency_blocked context_assembly", "problem dependency_blocked provider_routing", "info node_unknown"}
	if got := codes(r); !slices.Equal(got, want) {
		t.Fatalf("findings %q, want %q", got, want)
	}
	if f := finding(t, r, doctor.FindingModuleNotActive, "prompt_system"); !strings.Contains(f.Summary, "verification_failed") || !strings.Contains(f.Summary, "sha256:") {
		t.Fatalf("the verification finding does not name the digest: %q", f.Summary)
	}
	if f, want := finding(t, r, doctor.FindingDependencyBlocked, "context_assembly"), "context_assembly waits for prompt_system, which failed verification: "+cause; f.Summary != want {
		t.Fatalf("chain:\n got %q\nwant %q", f.Summary, want)
	}
	if f, want := finding(t, r, doctor.FindingDependencyBlocked, "provider_routing"), "provider_routing waits for context_assembly, which waits for prompt_system, which failed verification: "+cause; f.Summary != want {
		t.Fatalf("chain:\n got %q\nwant %q", f.Summary, want)
	}
	if md := moduleDiagnosis(t, r, "provider_routing"); len(md.Chain) != 3 || md.Chain[1].Module != "context_assembly" || md.LastBlock != nil {
		t.Fatalf("provider_routing: chain %+v, last block %+v (verification fails before any transaction)", md.Chain, md.LastBlock)
	}

	code, out, _ := cli(t, "doctor", act.Name, "-n", "default")
	t.Logf("kubectl iteron doctor %s → exit %d\n%s", act.Name, code, out)
	if code != 1 || !strings.Contains(out, "chain:      provider_routing waits for context_assembly, which waits for prompt_system, which failed verification: ") ||
		!strings.Contains(out, "NOT HEALTHY, 3 problems") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	code, jr := cliJSON(t, "doctor", act.Name, "-n", "default")
	if code != 1 || jr.Healthy || len(jr.Modules) != 3 || jr.Modules[2].ChainText == "" {
		t.Fatalf("json: exit %d, %+v", code, jr.Modules)
	}
}

func TestDoctorExplainsAFailedSwapWithItsLedgerBlockAndStderr(t *testing.T) {
	act := newActivation(t, "swap", nil, source(t, artifacts.CounterV1, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)
	oldName := moduleStatus(got, "prompt_system").GenerationName

	bad := source(t, artifacts.Faulty, "prompt_system", "faulty", "--fault", "crash", "--at", "migrate")
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = bad })
	got = waitFor(t, act, "Stalled", stalled)
	failedName := act.Name + "-prompt-system-g2-1"
	waitGeneration(t, act.Namespace, failedName, "Failed with its stderr", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseFailed && strings.Contains(g.Status.StderrTail, "faulty: crash at migrate")
	})

	r := diagnose(t, got, "", 0)
	if got := codes(r); !slices.Equal(got, []string{"problem swap_failed prompt_system", "info node_unknown"}) {
		t.Fatalf("findings %q", got)
	}
	md := moduleDiagnosis(t, r, "prompt_system")
	if md.Active == nil || md.Active.Name != oldName || md.Target == nil || md.Target.Name != failedName || md.Target.Phase != "Failed" || md.Target.Step == "" {
		t.Fatalf("generations: active %+v, target %+v", md.Active, md.Target)
	}
	if !strings.Contains(md.Target.StderrTail, "faulty: crash at migrate") {
		t.Fatalf("stderr tail %q", md.Target.StderrTail)
	}
	b := md.LastBlock
	if b == nil || b.Source != "status" || b.Phase != "migrate" || b.BlockKind != "provider" || !strings.HasPrefix(b.Reason, "provider_failed: ") || b.Ending != "rolled_back" {
		t.Fatalf("last block from status: %+v", b)
	}
	f := finding(t, r, doctor.FindingSwapFailed, "prompt_system")
	if want := fmt.Sprintf("still serves %s (counter): the change to %s (faulty, attempt 1) failed at migrate (rolled back): provider_failed: ", oldName, failedName); !strings.Contains(f.Summary, want) {
		t.Fatalf("summary %q does not say %q", f.Summary, want)
	}
	prefix := fmt.Sprintf("kubectl annotate implementationactivations.iteron.dev %s -n default iteron.dev/retry=", act.Name)
	if len(f.Commands) != 1 || !strings.HasPrefix(f.Commands[0], prefix) || !strings.HasSuffix(f.Commands[0], " --overwrite") {
		t.Fatalf("commands %q", f.Commands)
	}

	// On the node: the same block read from the ledger file, which verifies.
	local := diagnose(t, got, stateDir, 0)
	lb := moduleDiagnosis(t, local, "prompt_system").LastBlock
	if lb == nil || lb.Source != "file" || lb.Sequence != b.Sequence || lb.Phase != "migrate" || lb.BlockKind != "provider" || lb.Reason != b.Reason || lb.Ending != "rolled_back" {
		t.Fatalf("last block from the file %+v; from status %+v", lb, b)
	}
	if local.Ledger == nil || !local.Ledger.Verified || local.Ledger.Source != "file" {
		t.Fatalf("ledger %+v", local.Ledger)
	}

	code, out, _ := cli(t, "doctor", act.Name, "-n", "default", "--state-dir", stateDir)
	t.Logf("kubectl iteron doctor %s --state-dir → exit %d\n%s", act.Name, code, out)
	for _, want := range []string{
		"stderr tail of " + failedName, "| faulty: crash at migrate",
		fmt.Sprintf("last block: sequence %d, migrate blocked (provider): provider_failed: ", b.Sequence),
		"→ rolled_back", "$ " + prefix,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("the text does not say %q (exit %d):\n%s", want, code, out)
		}
	}
	if code != 1 {
		t.Fatalf("exit %d", code)
	}

	// The printed retry command starts a new attempt of the same target,
	// which fails the same way: the doctor then shows attempt 2.
	runPrinted(t, f.Commands[0])
	requested := strings.TrimSuffix(strings.TrimPrefix(f.Commands[0], prefix), " --overwrite")
	got = waitFor(t, act, "the retry handled and Stalled again", func(a *iteronv1.ImplementationActivation) bool {
		return a.Status.LastHandledRetryAt == requested && stalled(a)
	})
	waitGeneration(t, act.Namespace, act.Name+"-prompt-system-g2-2", "Failed", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseFailed
	})
	r = diagnose(t, got, "", 0)
	if md := moduleDiagnosis(t, r, "prompt_system"); md.Target == nil || md.Target.Attempt != 2 || r.Retry.Pending {
		t.Fatalf("after the retry: target %+v, retry %+v", md.Target, r.Retry)
	}
}

func TestDoctorSaysAPausedActivationDoesNotApplyItsSpec(t *testing.T) {
	act := newActivation(t, "paused", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	waitFor(t, act, "Ready", ready)
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Paused = true })
	waitFor(t, act, "paused", func(a *iteronv1.ImplementationActivation) bool {
		c := condition(a, iteronv1.ConditionReconciling)
		return a.Status.ObservedGeneration == a.Generation && c != nil && c.Reason == iteronv1.ReasonPaused
	})
	// Pausing alone changes nothing that runs: the activation stays Ready,
	// and the doctor says it is paused.
	code, out, _ := cli(t, "doctor", act.Name, "-n", "default")
	t.Logf("kubectl iteron doctor %s (paused, nothing else changed) → exit %d\n%s", act.Name, code, out)
	if code != 0 || !strings.Contains(out, "[info] paused") {
		t.Fatalf("a paused activation that runs its spec: exit %d\n%s", code, out)
	}

	next := source(t, artifacts.CounterV2, "prompt_system", "counter-b")
	const retryAt = "2026-11-29T12:00:00Z"
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = next
		a.Annotations = map[string]string{iteronv1.AnnotationRetry: retryAt}
	})
	got := waitFor(t, act, "observed while paused", func(a *iteronv1.ImplementationActivation) bool {
		return a.Status.ObservedGeneration == a.Generation && a.Spec.Sources[0].ImplementationID == "counter-b"
	})

	r := diagnose(t, got, "", 0)
	want := []string{"problem retry_pending", "problem spec_not_applied prompt_system", "info node_unknown", "info paused"}
	if got := codes(r); !slices.Equal(got, want) {
		t.Fatalf("findings %q, want %q", got, want)
	}
	f := finding(t, r, doctor.FindingSpecNotApplied, "prompt_system")
	if !strings.Contains(f.Summary, "runs counter ("+moduleStatus(got, "prompt_system").GenerationName+") but the spec asks for counter-b (spec.paused is true") {
		t.Fatalf("summary %q", f.Summary)
	}
	unpause := fmt.Sprintf(`kubectl patch implementationactivations.iteron.dev %s -n default --type=merge -p '{"spec":{"paused":false}}'`, act.Name)
	if !slices.Equal(f.Commands, []string{unpause}) {
		t.Fatalf("commands %q, want %q", f.Commands, unpause)
	}
	code, out, _ = cli(t, "doctor", act.Name, "-n", "default")
	t.Logf("kubectl iteron doctor %s → exit %d\n%s", act.Name, code, out)
	if code != 1 || !strings.Contains(out, "$ "+unpause) || !strings.Contains(out, "a paused activation acts on no request") {
		t.Fatalf("exit %d\n%s", code, out)
	}

	runPrinted(t, unpause)
	waitFor(t, act, "Ready at counter-b with the retry handled", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && moduleStatus(a, "prompt_system").ImplementationID == "counter-b" && a.Status.LastHandledRetryAt == retryAt
	})
	if code, out, _ := cliUntil(t, 0, "doctor", act.Name, "-n", "default"); code != 0 {
		t.Fatalf("after unpausing: exit %d\n%s", code, out)
	}
}

// strandedActivation creates an activation for a node no manager serves,
// holding the manager's finalizer (which only a manager adds), and deletes
// it: the API server keeps it, being deleted, until the finalizer goes.
func strandedActivation(t *testing.T, prefix, node string, beforeDelete func()) *iteronv1.ImplementationActivation {
	t.Helper()
	seq := nameSeq.Add(1)
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, seq), Namespace: "default", Finalizers: []string{iteronv1.FinalizerActivation}},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: node, CandidateSHA256: providertest.CandidateSHA256,
			Sources: []iteronv1.ActivationSource{source(t, artifacts.CounterV2, "prompt_system", "counter")}},
	}
	ctx := context.Background()
	if err := env.Client.Create(ctx, act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var cur iteronv1.ImplementationActivation
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(act), &cur); err == nil {
			cur.Finalizers = nil
			_ = env.Client.Update(ctx, &cur)
		}
	})
	if beforeDelete != nil {
		beforeDelete()
	}
	if err := env.Client.Delete(ctx, act); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(act), act); err != nil || act.DeletionTimestamp == nil {
		t.Fatalf("the activation should be held by its finalizer: %v %+v", err, act.ObjectMeta)
	}
	return act
}

func waitGone(t *testing.T, act *iteronv1.ImplementationActivation) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there: %v", act.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestDoctorCallsTheNodeUnknownWhenTheClusterHasNoNodeObjects(t *testing.T) {
	var nodes corev1.NodeList
	if err := env.Client.List(context.Background(), &nodes); err != nil || len(nodes.Items) != 0 {
		t.Fatalf("this case needs a cluster without Node objects (the local control plane has none): %d Nodes, %v", len(nodes.Items), err)
	}
	act := strandedActivation(t, "ghost", "doctor-ghost-node", nil)

	r := diagnose(t, act, "", 0)
	if r.Node.State != doctor.NodeUnknown || !strings.Contains(r.Node.Detail, "no Node objects at all") {
		t.Fatalf("node %+v: a cluster with no Node objects must read unknown, not missing", r.Node)
	}
	want := []string{"problem not_observed", "problem deletion_pending", "problem spec_not_applied prompt_system"}
	if got := codes(r); !slices.Equal(got, want) {
		t.Fatalf("findings %q, want %q", got, want)
	}
	f := finding(t, r, doctor.FindingDeletionPending, "")
	if !strings.Contains(f.Summary, "Node doctor-ghost-node: unknown") || !strings.Contains(f.Hint, "Only if you know that no manager will ever run for doctor-ghost-node") {
		t.Fatalf("%+v", f)
	}
	code, out, _ := cli(t, "doctor", act.Name, "-n", "default")
	t.Logf("kubectl iteron doctor %s → exit %d\n%s", act.Name, code, out)
	if code != 1 || !strings.Contains(out, "Node doctor-ghost-node: unknown: the cluster has no Node objects at all") || strings.Contains(out, "finalizer_stuck") || strings.Contains(out, "doctor-ghost-node: missing") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	runPrinted(t, f.Commands[0])
	waitGone(t, act)
}

func TestDoctorPrintsTheCommandThatReleasesAFinalizerHeldForAMissingNode(t *testing.T) {
	ctx := context.Background()
	for _, n := range []string{"doctor-kept-node", "doctor-gone-node"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if err := env.Client.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.IgnoreNotFound(env.Client.Delete(ctx, node)) })
	}
	act := strandedActivation(t, "stuck", "doctor-gone-node", func() {
		if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "doctor-gone-node"}}); err != nil {
			t.Fatal(err)
		}
	})

	r := diagnose(t, act, "", 0)
	if r.Node.State != doctor.NodeMissing {
		t.Fatalf("node %+v", r.Node)
	}
	want := []string{"problem not_observed", "problem finalizer_stuck", "problem spec_not_applied prompt_system"}
	if got := codes(r); !slices.Equal(got, want) {
		t.Fatalf("findings %q, want %q", got, want)
	}
	f := finding(t, r, doctor.FindingFinalizerStuck, "")
	patch := fmt.Sprintf(`kubectl patch implementationactivations.iteron.dev %s -n default --type=json -p '[{"op":"test","path":"/metadata/finalizers/0","value":"iteron.dev/retire"},{"op":"remove","path":"/metadata/finalizers/0"}]'`, act.Name)
	if !slices.Equal(f.Commands, []string{patch}) || !strings.Contains(f.Summary, "Node doctor-gone-node no longer exists") {
		t.Fatalf("finding %+v\nwant command %s", f, patch)
	}
	code, out, _ := cli(t, "doctor", act.Name, "-n", "default")
	t.Logf("kubectl iteron doctor %s → exit %d\n%s", act.Name, code, out)
	if code != 1 || !strings.Contains(out, "Node doctor-gone-node: missing") || !strings.Contains(out, "$ "+patch) {
		t.Fatalf("exit %d\n%s", code, out)
	}
	// The printed command, run as printed, releases the activation.
	t.Logf("%s", runPrinted(t, patch))
	waitGone(t, act)
}

// stat reads a process's process group and start time as the executor
// records them.
func stat(t *testing.T, pid int) (pgid int, start uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	pgid, _ = strconv.Atoi(f[2])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return pgid, start
}

func TestDoctorFindsAnOrphanedProviderProcessAndHowToStopIt(t *testing.T) {
	act := newActivation(t, "orphan", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)
	waitGeneration(t, got.Namespace, moduleStatus(got, "prompt_system").GenerationName, "Active with a pid", func(g *iteronv1.Generation) bool {
		return g.Status.Pid > 0
	})

	// A real provider left running in its own process group with the
	// executor's durable record, as a manager that died leaves one.
	cmd := exec.Command(providertest.Binary(t, artifacts.CounterV2))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		stdin.Close()
		syscall.Kill(-pid, syscall.SIGKILL)
		cmd.Wait()
	})
	pgid, start := stat(t, pid)
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	rec := procexec.Record{PID: pid, PGID: pgid, StartTime: start, BootID: strings.TrimSpace(string(boot)), UID: os.Getuid(),
		Module: "prompt_system", ImplementationID: "counter", ArtifactSHA256: got.Spec.Sources[0].ArtifactSHA256}
	line, err := strictjson.Canonical(rec)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(stateDir, "procs", fmt.Sprintf("%d-%d.json", pid, start))
	if err := os.WriteFile(file, append(line, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(file) })

	// Within the grace period an unclaimed group may be a swap's shadow.
	r := diagnoseUntil(t, got, stateDir, func(r *doctor.Report) bool { return r.Healthy })
	if got := codes(r); !slices.Equal(got, []string{"info node_unknown", "info unconfirmed_process prompt_system"}) || !r.Healthy {
		t.Fatalf("a fresh unclaimed group: findings %q, healthy %t", got, r.Healthy)
	}

	code, out, _ := cli(t, "doctor", act.Name, "-n", "default", "--state-dir", stateDir, "--orphan-grace=-1s")
	t.Logf("kubectl iteron doctor %s --state-dir %s --orphan-grace=-1s → exit %d\n%s", act.Name, stateDir, code, out)
	kill := fmt.Sprintf("kill -- -%d", pgid)
	if code != 1 || !strings.Contains(out, "orphaned_process prompt_system") || !strings.Contains(out, "$ "+kill) || !strings.Contains(out, "$ rm -f "+file) {
		t.Fatalf("exit %d\n%s", code, out)
	}
	code, jr := cliJSON(t, "doctor", act.Name, "-n", "default", "--state-dir", stateDir, "--orphan-grace=-1s")
	var orphan *doctor.Finding
	for i := range jr.Findings {
		if jr.Findings[i].Code == doctor.FindingOrphanedProcess {
			orphan = &jr.Findings[i]
		}
	}
	if code != 1 || orphan == nil || !slices.Equal(orphan.Commands, []string{kill, "rm -f " + file}) || !strings.Contains(orphan.Summary, fmt.Sprintf("provider group %d (leader pid %d, module prompt_system", pgid, pid)) {
		t.Fatalf("json: exit %d, orphan %+v", code, orphan)
	}
	verdicts := map[string]int{}
	for _, p := range jr.Processes {
		verdicts[p.Verdict]++
	}
	if verdicts[doctor.VerdictOrphaned] != 1 || verdicts[doctor.VerdictServing] != 1 {
		t.Fatalf("verdicts %v; want the orphan and the serving provider", verdicts)
	}

	for _, c := range orphan.Commands {
		runPrinted(t, c)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the orphan exited cleanly; it should have been killed by the signal")
	}
	if code, out, _ := cliUntil(t, 0, "doctor", act.Name, "-n", "default", "--state-dir", stateDir, "--orphan-grace=-1s"); code != 0 {
		t.Fatalf("after running the printed commands: exit %d\n%s", code, out)
	}
}

func TestDoctorReportsTheRuleAndSequenceOfALedgerThatDoesNotVerify(t *testing.T) {
	act := newActivation(t, "ledger", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)

	// A copy of the node's real ledger, with one record changed on disk:
	// the manager's own ledger stays intact.
	src, err := ledger.ActivationDir(stateDir, string(got.UID))
	if err != nil {
		t.Fatal(err)
	}
	copyDir := t.TempDir()
	dst, _ := ledger.ActivationDir(copyDir, string(got.UID))
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		last = filepath.Join(dst, e.Name())
		if err := os.WriteFile(last, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(last)
	lines := strings.SplitAfter(string(b), "\n")
	lines[1] = strings.Replace(lines[1], `"elapsed_ms":`, `"elapsed_ms":9`, 1)
	if err := os.WriteFile(last, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}

	r := diagnose(t, got, copyDir, 0)
	if got := codes(r); !slices.Equal(got, []string{"problem ledger_corrupt", "info node_unknown"}) {
		t.Fatalf("findings %q", got)
	}
	if l := r.Ledger; l == nil || l.Verified || l.Rule != string(ledger.RuleRecordHash) || l.Sequence != 1 || l.Line != 2 {
		t.Fatalf("ledger %+v", r.Ledger)
	}
	code, out, _ := cli(t, "doctor", act.Name, "-n", "default", "--state-dir", copyDir)
	t.Logf("kubectl iteron doctor %s --state-dir %s → exit %d\n%s", act.Name, copyDir, code, out)
	if code != 1 || !strings.Contains(out, "DOES NOT VERIFY: rule record_hash at sequence 1") || !strings.Contains(out, "ledger_corrupt: the ledger "+dst+" does not verify: rule record_hash at sequence 1") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	// `kubectl iteron ledger verify` names the same rule and sequence.
	if out, err := exec.Command(cliBin, "ledger", "verify", dst).CombinedOutput(); err == nil || !strings.Contains(string(out), "rule record_hash at sequence 1") {
		t.Fatalf("ledger verify: %v\n%s", err, out)
	}
}

func TestDoctorExitsTwoForAnActivationThatDoesNotExist(t *testing.T) {
	code, out, stderr := cli(t, "doctor", "no-such-activation", "-n", "default")
	if code != 2 || out != "" || !strings.Contains(stderr, `implementationactivations.iteron.dev "no-such-activation" not found`) {
		t.Fatalf("exit %d\nstdout %q\nstderr %q", code, out, stderr)
	}
}
