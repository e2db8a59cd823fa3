package doctor

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

func TestDiagnoseFindings(t *testing.T) {
	const verifyMsg = "sources[0].artifactSHA256: the executable hashes to sha256:1111…, the source pins sha256:2222…"
	tests := []struct {
		name    string
		build   func() *Input
		want    []string // severity code module, in order
		healthy bool
		check   func(t *testing.T, r *Report)
	}{
		{
			name:    "a Ready activation whose modules all serve is healthy with no finding",
			build:   func() *Input { return input(activation("prompt_system", "context_assembly")) },
			healthy: true,
			check: func(t *testing.T, r *Report) {
				if r.ActiveCount != 2 || r.ModuleCount != 2 || len(r.Modules) != 0 {
					t.Fatalf("counts %d/%d, modules %v", r.ActiveCount, r.ModuleCount, r.Modules)
				}
			},
		},
		{
			name: "a module Active without an optional dependency is healthy and the doctor quotes its diagnostic",
			build: func() *Input {
				a := activation("prompt_system", "context_assembly")
				module(a, "context_assembly").Diagnostics = []string{"optional dependency memo ≥ 1.0.0, which has no source in the activation; activated without it"}
				return input(a)
			},
			want:    []string{"info optional_dependency_missing context_assembly"},
			healthy: true,
			check: func(t *testing.T, r *Report) {
				f := finding(t, r, FindingOptionalDependencyMissing, "context_assembly")
				if !strings.Contains(f.Summary, "module context_assembly is Active without an optional dependency: optional dependency memo ≥ 1.0.0, which has no source") {
					t.Fatalf("summary %q", f.Summary)
				}
				if r.ActiveCount != 2 {
					t.Fatalf("active count %d", r.ActiveCount)
				}
			},
		},
		{
			name: "a dependency conflict is a blocked dependency with the selection as the fix",
			build: func() *Input {
				a := activation("prompt_system", "context_assembly")
				ms := module(a, "context_assembly")
				ms.Phase, ms.GenerationName, ms.Generation, ms.ImplementationID = iteronv1.PhaseInactive, "", 0, ""
				ms.Reason, ms.Message = reasons.DependencyConflict, "context_assembly requires contract acme/search@v1, which 2 sources provide: a (x) and b (y); the seam graph selects none"
				setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonDependencyConflict, "module context_assembly: …")
				return input(a)
			},
			want: []string{"problem dependency_blocked context_assembly"},
			check: func(t *testing.T, r *Report) {
				f := finding(t, r, FindingDependencyBlocked, "context_assembly")
				if !strings.Contains(f.Summary, "dependency_conflict: context_assembly requires contract acme/search@v1") || !strings.Contains(f.Hint, "\"select\"") {
					t.Fatalf("finding %+v", f)
				}
			},
		},
		{
			name: "a module that failed verification is not active and its consumers wait on the chain",
			build: func() *Input {
				a := activation("prompt_system", "context_assembly", "provider_routing")
				for _, m := range a.Status.Modules {
					ms := module(a, m.Module)
					ms.Phase, ms.GenerationName, ms.Generation, ms.ImplementationID = iteronv1.PhaseInactive, "", 0, ""
				}
				module(a, "prompt_system").Reason, module(a, "prompt_system").Message = reasons.VerificationFailed, verifyMsg
				module(a, "context_assembly").Reason = reasons.DependencyUnsatisfied
				module(a, "context_assembly").Message = "context_assembly needs prompt_system (not admitted: verification_failed: …)"
				module(a, "provider_routing").Reason = reasons.DependencyUnsatisfied
				setCondition(a, iteronv1.ConditionVerified, metav1.ConditionFalse, iteronv1.ReasonVerificationFailed, verifyMsg)
				setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonVerificationFailed, verifyMsg)
				return input(a)
			},
			want: []string{"problem module_not_active prompt_system", "problem dependency_blocked context_assembly", "problem dependency_blocked provider_routing"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingModuleNotActive, "prompt_system"); !strings.Contains(f.Summary, verifyMsg) || !strings.Contains(f.Hint, "kubectl iteron digest artifact") {
					t.Fatalf("verification finding: %+v", f)
				}
				want := "provider_routing waits for context_assembly, which waits for prompt_system, which failed verification: " + verifyMsg
				if f := finding(t, r, FindingDependencyBlocked, "provider_routing"); f.Summary != want {
					t.Fatalf("chain:\n got %q\nwant %q", f.Summary, want)
				}
				md := r.Modules[2]
				if md.Module != "provider_routing" || len(md.Chain) != 3 || md.Chain[2].Reason != reasons.VerificationFailed {
					t.Fatalf("chain links: %+v", md.Chain)
				}
			},
		},
		{
			name: "a failed swap keeps the old generation serving and offers the retry command",
			build: func() *Input {
				a := activation("prompt_system")
				a.Generation, a.Status.ObservedGeneration = 2, 2
				a.Status.Conditions = readyConditions(2)
				a.Spec.Sources[0].ImplementationID = "faulty"
				ms := module(a, "prompt_system")
				ms.Reason, ms.Message = reasons.ProviderFailed, "migrate: the provider exited (status 2)"
				setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonProviderFailed, "module prompt_system: …")
				setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProviderFailed, "module prompt_system: …")
				a.Status.Ledger.Recent = []iteronv1.LedgerRecordSummary{
					{Sequence: 3, TransactionID: "t1", Module: "prompt_system", Phase: "committed", Outcome: "committed"},
					{Sequence: 8, TransactionID: "t2", Module: "prompt_system", Phase: "migrate", Outcome: "blocked", Reason: "provider_failed: migrate: the provider exited (status 2)"},
					{Sequence: 9, TransactionID: "t2", Module: "prompt_system", Phase: "rolled_back", Outcome: "rolled_back", Reason: "provider_failed: migrate: the provider exited (status 2)"},
				}
				old := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
				old.Status.Pid = 4242
				bad := generation(a, "prompt_system", 2, 1, "faulty", iteronv1.PhaseFailed, iteronv1.StepMigrate)
				bad.Status.Reason, bad.Status.Message, bad.Status.StderrTail = reasons.ProviderFailed, "the provider exited", "faulty: crash at migrate\n"
				return input(a, old, bad)
			},
			want: []string{"problem swap_failed prompt_system"},
			check: func(t *testing.T, r *Report) {
				f := finding(t, r, FindingSwapFailed, "prompt_system")
				if !strings.Contains(f.Summary, "still serves stack-prompt-system-g1-1 (prompt_system-impl)") || !strings.Contains(f.Summary, "the change to stack-prompt-system-g2-1 (faulty, attempt 1) failed at migrate (rolled back): provider_failed: migrate: the provider exited (status 2)") {
					t.Fatalf("summary %q", f.Summary)
				}
				if want := []string{"kubectl annotate implementationactivations.iteron.dev stack -n team iteron.dev/retry=2026-11-29T12:00:00Z --overwrite"}; !slices.Equal(f.Commands, want) {
					t.Fatalf("commands %q, want %q", f.Commands, want)
				}
				md := r.Modules[0]
				b := md.LastBlock
				if b == nil || b.Phase != "migrate" || b.BlockKind != "provider" || b.Ending != "rolled_back" || b.Sequence != 8 || b.Source != "status" {
					t.Fatalf("last block %+v", b)
				}
				if md.Target == nil || md.Target.StderrTail != "faulty: crash at migrate\n" || md.Target.Step != "migrate" || md.Active == nil || md.Active.Pid != 4242 {
					t.Fatalf("generations: active %+v target %+v", md.Active, md.Target)
				}
			},
		},
		{
			name: "a block that a later committed transaction superseded is not shown",
			build: func() *Input {
				a := activation("prompt_system")
				ms := module(a, "prompt_system")
				ms.Phase, ms.Reason, ms.Message = iteronv1.PhaseFailed, reasons.ProviderFailed, "crashed 5 times in 10 minutes"
				a.Status.Ledger.Recent = []iteronv1.LedgerRecordSummary{
					{Sequence: 8, TransactionID: "t2", Module: "prompt_system", Phase: "migrate", Outcome: "blocked", Reason: "deadline_exceeded: migrate"},
					{Sequence: 9, TransactionID: "t2", Module: "prompt_system", Phase: "rolled_back", Outcome: "rolled_back", Reason: "deadline_exceeded: migrate"},
					{Sequence: 19, TransactionID: "t3", Module: "prompt_system", Phase: "committed", Outcome: "committed"},
				}
				return input(a)
			},
			want: []string{"problem module_not_active prompt_system"},
			check: func(t *testing.T, r *Report) {
				if b := r.Modules[0].LastBlock; b != nil {
					t.Fatalf("a superseded block is shown: %+v", b)
				}
				if f := finding(t, r, FindingModuleNotActive, "prompt_system"); len(f.Commands) != 1 || !strings.Contains(f.Commands[0], "iteron.dev/retry=") {
					t.Fatalf("a failed provider gets the retry command: %+v", f)
				}
			},
		},
		{
			name: "a module that waits after another module's failed transaction is plan_waiting",
			build: func() *Input {
				a := activation("prompt_system", "context_assembly")
				a.Spec.Sources[0].ImplementationID, a.Spec.Sources[1].ImplementationID = "sys-b", "ctx-b"
				module(a, "prompt_system").Reason, module(a, "prompt_system").Message = reasons.DeadlineExceeded, "readiness: deadline of 30s exceeded"
				setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonDeadlineExceeded, "…")
				return input(a)
			},
			want: []string{"problem swap_failed prompt_system", "problem plan_waiting context_assembly"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingPlanWaiting, "context_assembly"); !strings.Contains(f.Summary, "module prompt_system failed earlier in the same plan") {
					t.Fatalf("summary %q", f.Summary)
				}
			},
		},
		{
			name: "an artifact digest that differs from the one the active generation runs is not applied",
			build: func() *Input {
				a := activation("prompt_system")
				a.Spec.Sources[0].ArtifactSHA256 = "sha256:" + strings.Repeat("b", 64)
				g := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
				g.Spec.Implementation.ArtifactSHA256 = "sha256:" + strings.Repeat("a", 64)
				return input(a, g)
			},
			want: []string{"problem spec_not_applied prompt_system"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingSpecNotApplied, "prompt_system"); !strings.Contains(f.Summary, "the spec pins artifact sha256:bbbb") {
					t.Fatalf("summary %q", f.Summary)
				}
			},
		},
		{
			name: "a paused activation whose spec changed says the change is not applied and how to unpause",
			build: func() *Input {
				a := activation("prompt_system")
				a.Generation, a.Status.ObservedGeneration, a.Spec.Paused = 2, 2, true
				a.Status.Conditions = readyConditions(2)
				setCondition(a, iteronv1.ConditionReconciling, metav1.ConditionFalse, iteronv1.ReasonPaused, "spec.paused is true")
				a.Spec.Sources[0].ImplementationID = "counter-v2"
				return input(a)
			},
			want: []string{"problem spec_not_applied prompt_system", "info paused"},
			check: func(t *testing.T, r *Report) {
				f := finding(t, r, FindingSpecNotApplied, "prompt_system")
				if !strings.Contains(f.Summary, "runs prompt_system-impl (stack-prompt-system-g1-1) but the spec asks for counter-v2 (spec.paused is true") {
					t.Fatalf("summary %q", f.Summary)
				}
				if want := []string{`kubectl patch implementationactivations.iteron.dev stack -n team --type=merge -p '{"spec":{"paused":false}}'`}; !slices.Equal(f.Commands, want) {
					t.Fatalf("commands %q", f.Commands)
				}
			},
		},
		{
			name: "a paused activation that runs its spec is healthy with a paused note",
			build: func() *Input {
				a := activation("prompt_system")
				a.Spec.Paused = true
				return input(a)
			},
			want:    []string{"info paused"},
			healthy: true,
		},
		{
			name: "a paused activation whose Ready the manager left False says pausing is why and how to unpause",
			build: func() *Input {
				a := activation("prompt_system")
				a.Generation, a.Status.ObservedGeneration, a.Spec.Paused = 2, 2, true
				a.Status.Conditions = readyConditions(2)
				setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProgressing, "transactions in progress")
				setCondition(a, iteronv1.ConditionReconciling, metav1.ConditionFalse, iteronv1.ReasonPaused, "spec.paused is true")
				return input(a)
			},
			want: []string{"problem not_ready", "info paused"},
			check: func(t *testing.T, r *Report) {
				f := finding(t, r, FindingNotReady, "")
				if !strings.Contains(f.Hint, "spec.paused is true: the manager does not apply the current spec") || len(f.Commands) != 1 || !strings.Contains(f.Commands[0], `{"spec":{"paused":false}}`) {
					t.Fatalf("%+v", f)
				}
			},
		},
		{
			name: "a retry annotation the manager has not handled is pending",
			build: func() *Input {
				a := activation("prompt_system")
				a.Annotations = map[string]string{iteronv1.AnnotationRetry: "2026-11-29T11:59:00Z"}
				a.Status.LastHandledRetryAt = "2026-11-28T10:00:00Z"
				return input(a)
			},
			want: []string{"problem retry_pending"},
			check: func(t *testing.T, r *Report) {
				if !r.Retry.Pending || r.Retry.Requested != "2026-11-29T11:59:00Z" || r.Retry.Handled != "2026-11-28T10:00:00Z" {
					t.Fatalf("retry %+v", r.Retry)
				}
			},
		},
		{
			name: "a retry requested while paused is never handled and says so",
			build: func() *Input {
				a := activation("prompt_system")
				a.Spec.Paused = true
				a.Annotations = map[string]string{iteronv1.AnnotationRetry: "2026-11-29T11:59:00Z"}
				return input(a)
			},
			want: []string{"problem retry_pending", "info paused"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingRetryPending, ""); !strings.Contains(f.Summary, "a paused activation acts on no request") || len(f.Commands) != 1 {
					t.Fatalf("%+v", f)
				}
			},
		},
		{
			name: "a handled retry annotation is not pending",
			build: func() *Input {
				a := activation("prompt_system")
				a.Annotations = map[string]string{iteronv1.AnnotationRetry: "2026-11-29T11:59:00Z"}
				a.Status.LastHandledRetryAt = "2026-11-29T11:59:00Z"
				return input(a)
			},
			healthy: true,
		},
		{
			name: "a status that describes an older spec is not observed, and its stale Ready does not count",
			build: func() *Input {
				a := activation("prompt_system")
				a.Generation = 3
				a.Status.ObservedGeneration = 2
				return input(a)
			},
			want: []string{"problem not_observed"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingNotObserved, ""); !strings.Contains(f.Summary, "status describes spec generation 2 but the spec is at generation 3") {
					t.Fatalf("summary %q", f.Summary)
				}
				for _, c := range r.Conditions {
					if !c.Stale {
						t.Fatalf("condition %s is not marked stale", c.Type)
					}
				}
			},
		},
		{
			name: "an activation no manager ever wrote is not observed and its modules were never acted on",
			build: func() *Input {
				a := activation("prompt_system")
				a.Status = iteronv1.ImplementationActivationStatus{}
				return input(a)
			},
			want: []string{"problem not_observed", "problem spec_not_applied prompt_system"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingNotObserved, ""); !strings.Contains(f.Summary, "no manager has written this activation's status") || !strings.Contains(f.Hint, "--node-name=worker-1") {
					t.Fatalf("%+v", f)
				}
				if r.Conditions[0].Status != "Missing" {
					t.Fatalf("conditions %+v", r.Conditions)
				}
			},
		},
		{
			name: "a ledger that status says did not verify is corrupt",
			build: func() *Input {
				a := activation("prompt_system")
				a.Status.Ledger.Verified = false
				setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonLedgerCorrupt, "the ledger is unusable: rule chain at sequence 7")
				return input(a)
			},
			want: []string{"problem ledger_corrupt"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingLedgerCorrupt, ""); !strings.Contains(f.Summary, "rule chain at sequence 7") {
					t.Fatalf("%+v", f)
				}
			},
		},
		{
			name: "Ready False with a transaction in progress and nothing else is not_ready",
			build: func() *Input {
				a := activation("prompt_system")
				setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProgressing, "transactions in progress")
				setCondition(a, iteronv1.ConditionReconciling, metav1.ConditionTrue, iteronv1.ReasonProgressing, "transactions in progress")
				return input(a)
			},
			want: []string{"problem not_ready"},
			check: func(t *testing.T, r *Report) {
				if f := finding(t, r, FindingNotReady, ""); !strings.Contains(f.Hint, "in progress") {
					t.Fatalf("%+v", f)
				}
			},
		},
		{
			name: "Stalled with nothing more specific is reported as stalled",
			build: func() *Input {
				a := activation("prompt_system")
				setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonAuthorityChanged, "the ceiling changed")
				return input(a)
			},
			want: []string{"problem stalled"},
		},
		{
			name: "objects that could not be read are an info finding, not a failure",
			build: func() *Input {
				in := input(activation("prompt_system"))
				in.Unread = []string{"Events in team: forbidden"}
				return in
			},
			want:    []string{"info partial_view"},
			healthy: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Diagnose(tt.build(), nil, Options{Now: now})
			if got := codes(r); !slices.Equal(got, tt.want) {
				t.Fatalf("findings %q, want %q", got, tt.want)
			}
			if r.Healthy != tt.healthy {
				t.Fatalf("healthy %t, want %t", r.Healthy, tt.healthy)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestDiagnoseNode(t *testing.T) {
	deleting := func(a *iteronv1.ImplementationActivation) {
		ts := metav1.NewTime(now.Add(-5 * time.Minute))
		a.DeletionTimestamp = &ts
	}
	const patch0 = `kubectl patch implementationactivations.iteron.dev stack -n team --type=json -p '[{"op":"test","path":"/metadata/finalizers/0","value":"iteron.dev/retire"},{"op":"remove","path":"/metadata/finalizers/0"}]'`
	tests := []struct {
		name     string
		lookup   NodeLookup
		edit     func(*iteronv1.ImplementationActivation)
		state    NodeState
		want     []string
		commands []string
		summary  string
	}{
		{
			name:   "a deleted activation whose Node is gone while other Nodes exist has a stuck finalizer and the patch that removes it",
			lookup: NodeLookup{OtherNodes: true}, edit: deleting, state: NodeMissing,
			want: []string{"problem finalizer_stuck"}, commands: []string{patch0},
			summary: "Node worker-1 no longer exists: no manager will ever release it",
		},
		{
			name:   "the patch names the finalizer's own index when another finalizer precedes it",
			lookup: NodeLookup{OtherNodes: true},
			edit: func(a *iteronv1.ImplementationActivation) {
				deleting(a)
				a.Finalizers = []string{"example.com/other", iteronv1.FinalizerActivation}
			},
			state: NodeMissing, want: []string{"problem finalizer_stuck"},
			commands: []string{`kubectl patch implementationactivations.iteron.dev stack -n team --type=json -p '[{"op":"test","path":"/metadata/finalizers/1","value":"iteron.dev/retire"},{"op":"remove","path":"/metadata/finalizers/1"}]'`},
		},
		{
			name:   "a deleted activation in a cluster with no Node objects at all is unknown, not missing",
			lookup: NodeLookup{}, edit: deleting, state: NodeUnknown,
			want: []string{"problem deletion_pending"}, commands: []string{patch0},
			summary: "Node worker-1: unknown: the cluster has no Node objects at all",
		},
		{
			name:   "a deleted activation whose Nodes cannot be read is unknown",
			lookup: NodeLookup{Err: "list Nodes: nodes is forbidden"}, edit: deleting, state: NodeUnknown,
			want: []string{"problem deletion_pending"}, commands: []string{patch0},
			summary: "Nodes could not be read: list Nodes: nodes is forbidden",
		},
		{
			name:   "a deleted activation whose Node exists waits for that manager and gets no removal command",
			lookup: NodeLookup{Exists: true, OtherNodes: true}, edit: deleting, state: NodePresent,
			want:    []string{"problem deletion_pending"},
			summary: "the manager of node worker-1 (which exists) has not released its finalizer",
		},
		{
			name:   "a deleted activation whose finalizer is already gone has nothing to clear",
			lookup: NodeLookup{OtherNodes: true},
			edit: func(a *iteronv1.ImplementationActivation) {
				deleting(a)
				a.Finalizers = []string{"example.com/other"}
			},
			state: NodeMissing,
		},
		{
			name:   "a live activation on a missing Node is served by no manager",
			lookup: NodeLookup{OtherNodes: true}, state: NodeMissing,
			want: []string{"problem node_missing"},
		},
		{
			name:   "a live activation in a cluster without Node objects is an info note",
			lookup: NodeLookup{}, state: NodeUnknown,
			want: []string{"info node_unknown"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := activation("prompt_system")
			if tt.edit != nil {
				tt.edit(a)
			}
			in := input(a)
			in.Node = tt.lookup
			r := Diagnose(in, nil, Options{Now: now})
			if r.Node.State != tt.state {
				t.Fatalf("node state %s, want %s", r.Node.State, tt.state)
			}
			if got := codes(r); !slices.Equal(got, tt.want) {
				t.Fatalf("findings %q, want %q", got, tt.want)
			}
			if len(tt.want) == 0 {
				return
			}
			f := r.Findings[0]
			if !slices.Equal(f.Commands, tt.commands) {
				t.Fatalf("commands\n got %q\nwant %q", f.Commands, tt.commands)
			}
			if !strings.Contains(f.Summary, tt.summary) {
				t.Fatalf("summary %q does not say %q", f.Summary, tt.summary)
			}
			if r.Deleting != nil && !strings.Contains(f.Summary, "deletion requested 5m0s ago") {
				t.Fatalf("summary %q does not say how long the deletion has waited", f.Summary)
			}
		})
	}
}

func TestVerificationAdviceFitsTheProblem(t *testing.T) {
	// A real symlink, checked by the verifier's own code: the message the
	// doctor reads is the one the manager writes.
	dir := t.TempDir()
	target := filepath.Join(dir, "real.json")
	if err := os.WriteFile(target, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	symlinkErr := verifier.CheckNoSymlinks(link)
	if symlinkErr == nil {
		t.Fatal("CheckNoSymlinks accepted a symlink")
	}
	for _, tc := range []struct {
		name, message string
		want          []string
		notWant       []string
	}{
		{
			name:    "a path outside the allowed roots: move the files or change --allowed-roots",
			message: "spec.sources[0].catalogPath: /srv/p/c.json " + verifier.PhraseOutsideAllowedRoots + " (/var/lib/iteron/providers)",
			want:    []string{"spec.sources[0].catalogPath", "outside the allowed roots", "Move the catalog and artifact root", "--allowed-roots"},
			notWant: []string{"digest"},
		},
		{
			name:    "a symlink: name its target",
			message: "spec.sources[0].catalogPath: " + symlinkErr.Error(),
			want:    []string{"spec.sources[0].catalogPath", link + " points to " + target, "Name the target's path"},
			notWant: []string{"digest"},
		},
		{
			name:    "a path that resolves through a symlink higher up: name where it resolves",
			message: "spec.sources[1].artifactRoot: /srv/p/a resolves to /data/p/a " + verifier.PhraseResolvesThroughSymlink,
			want:    []string{"spec.sources[1].artifactRoot", "/srv/p/a resolves to /data/p/a", "Name /data/p/a in the source"},
			notWant: []string{"digest"},
		},
		{
			name:    "a digest that differs: compare digests",
			message: "spec.sources[0].artifactSHA256: executable /x hashes to sha256:11, not sha256:22",
			want:    []string{"kubectl iteron digest artifact"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hint := verificationHint(tc.message, "worker-1")
			for _, w := range tc.want {
				if !strings.Contains(hint, w) {
					t.Errorf("hint lacks %q:\n%s", w, hint)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(hint, w) {
					t.Errorf("hint has %q:\n%s", w, hint)
				}
			}
		})
	}
}
