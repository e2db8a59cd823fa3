package graph

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"iteron.dev/operator/internal/catalog"
)

// node builds an admitted source; artifact varies the artifact digest.
func node(module, id string, version catalog.Version, artifact byte, deps ...catalog.Dependency) Node {
	return Node{Module: module, ImplementationID: id, Version: version,
		ArtifactSHA256: "sha256:" + strings.Repeat(hex.EncodeToString([]byte{artifact}), 32), Dependencies: deps}
}

func dep(id string, version catalog.Version) catalog.Dependency {
	return catalog.Dependency{ImplementationID: id, MinimumVersion: version}
}

var v1 = catalog.Version{1, 0, 0}

// diamond is prompt_system at the top, planner_fanout at the bottom, reached
// through prompt_planner on one side and prompt_tool_description →
// tool_exposure → scheduler_parallelism on the other; prompt_reduce hangs off
// prompt_planner.
func diamond() []Node {
	return []Node{
		node("prompt_system", "ps", v1, 1),
		node("prompt_tool_description", "ptd", v1, 2),
		node("tool_exposure", "te", v1, 3),
		node("scheduler_parallelism", "sp", v1, 4),
		node("prompt_planner", "pp", v1, 5),
		node("planner_fanout", "pf", v1, 6),
		node("prompt_reduce", "pr", v1, 7),
	}
}

func evaluate(t *testing.T, admitted []Node, rejected ...Rejected) *Evaluation {
	t.Helper()
	ev, err := Evaluate(Input{Admitted: admitted, Rejected: rejected})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func withChange(nodes []Node, module string, edit func(*Node)) []Node {
	out := slices.Clone(nodes)
	for i := range out {
		if out[i].Module == module {
			edit(&out[i])
		}
	}
	return out
}

func TestANoOpPlanIsEmpty(t *testing.T) {
	ev := evaluate(t, diamond())
	p := Plan(ev, evaluate(t, diamond()))
	if !p.Empty() || len(p.ActivateOrder) != 0 || len(p.DrainOrder) != 0 || len(p.Blocked) != 0 {
		t.Fatalf("no-op plan is not empty: %+v", p)
	}
	if len(p.Unchanged) != 7 {
		t.Fatalf("unchanged = %v", p.Unchanged)
	}
}

func TestPlansReloadTheChangedModuleAndItsDirectConsumersOnly(t *testing.T) {
	tests := []struct {
		name         string
		module       string
		edit         func(*Node)
		wantReloaded []string
		wantOrder    []string
	}{
		{"changing a leaf reloads only the leaf", "prompt_reduce",
			func(n *Node) { n.ArtifactSHA256 = "sha256:" + strings.Repeat("ee", 32) },
			[]string{"prompt_reduce"}, []string{"prompt_reduce"}},
		{"changing one side of the diamond reloads it and planner_fanout", "prompt_planner",
			func(n *Node) { n.Version = catalog.Version{1, 1, 0} },
			[]string{"prompt_planner", "prompt_reduce", "planner_fanout"}, []string{"prompt_planner", "prompt_reduce", "planner_fanout"}},
		{"changing the other side of the diamond reloads it and planner_fanout", "scheduler_parallelism",
			func(n *Node) { n.ImplementationID = "sp2" },
			[]string{"scheduler_parallelism", "planner_fanout"}, []string{"scheduler_parallelism", "planner_fanout"}},
		{"changing the top reloads its direct consumers, not the diamond's bottom", "prompt_system",
			func(n *Node) { n.ArtifactSHA256 = "sha256:" + strings.Repeat("ee", 32) },
			[]string{"prompt_system", "prompt_tool_description", "prompt_planner"},
			[]string{"prompt_system", "prompt_tool_description", "prompt_planner"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Plan(evaluate(t, diamond()), evaluate(t, withChange(diamond(), tc.module, tc.edit)))
			want := slices.Clone(tc.wantReloaded)
			sortModuleID(want)
			if !slices.Equal(p.Reloaded, want) {
				t.Fatalf("reloaded = %v, want %v", p.Reloaded, want)
			}
			if !slices.Equal(p.ActivateOrder, tc.wantOrder) {
				t.Fatalf("activate order = %v, want %v", p.ActivateOrder, tc.wantOrder)
			}
			if len(p.Added)+len(p.Removed)+len(p.Blocked) != 0 || len(p.Unchanged) != 7-len(want) {
				t.Fatalf("plan touched more than the change: %+v", p)
			}
		})
	}
}

func sortModuleID(modules []string) {
	g := catalog.BuiltinSeamGraph()
	slices.SortFunc(modules, func(a, b string) int {
		ia, _ := g.Order(a)
		ib, _ := g.Order(b)
		return ia - ib
	})
}

func TestAnImplementationDependencyRelinksTheEpoch(t *testing.T) {
	// memory_recall depends on prompt_system's implementation directly, not
	// through the seam graph: a change of ps reloads memory_recall too.
	nodes := []Node{node("prompt_system", "ps", v1, 1), node("context_assembly", "ca", v1, 2),
		node("memory_recall", "mr", v1, 3, dep("ps", v1))}
	changed := withChange(nodes, "prompt_system", func(n *Node) { n.Version = catalog.Version{1, 0, 1} })
	p := Plan(evaluate(t, nodes), evaluate(t, changed))
	if want := []string{"prompt_system", "context_assembly", "memory_recall"}; !slices.Equal(p.Reloaded, want) {
		t.Fatalf("reloaded = %v, want %v", p.Reloaded, want)
	}
	st, _ := evaluate(t, nodes).Status("memory_recall")
	if !slices.Equal(st.DependsOn, []string{"prompt_system", "context_assembly"}) {
		t.Fatalf("dependsOn = %v", st.DependsOn)
	}
}

func TestIdentityAndEpochAreExactlyAsDocumented(t *testing.T) {
	ev := evaluate(t, diamond())
	st, _ := ev.Status("planner_fanout")
	id := func(module, implID string, b byte) string {
		return module + "|" + implID + "|1.0.0|sha256:" + strings.Repeat(hex.EncodeToString([]byte{b}), 32)
	}
	if st.Identity != id("planner_fanout", "pf", 6) {
		t.Fatalf("identity = %s", st.Identity)
	}
	// The epoch, computed here by hand: the compact JSON array of the
	// identity and the direct dependencies' identities in ModuleId order.
	raw := `["` + id("planner_fanout", "pf", 6) + `","` + id("prompt_planner", "pp", 5) + `","` + id("scheduler_parallelism", "sp", 4) + `"]`
	sum := sha256.Sum256([]byte(raw))
	if want := "sha256:" + hex.EncodeToString(sum[:]); st.Epoch != want {
		t.Fatalf("epoch = %s, want %s over %s", st.Epoch, want, raw)
	}
	top, _ := ev.Status("prompt_system")
	sum = sha256.Sum256([]byte(`["` + id("prompt_system", "ps", 1) + `"]`))
	if want := "sha256:" + hex.EncodeToString(sum[:]); top.Epoch != want {
		t.Fatalf("epoch of a module without dependencies = %s, want %s", top.Epoch, want)
	}
}

func TestAnAbsentSeamDependencyDoesNotGate(t *testing.T) {
	// planner_fanout's seam dependencies are not in the activation at all.
	ev := evaluate(t, []Node{node("planner_fanout", "pf", v1, 1), node("session_fork", "sf", v1, 2)})
	for _, s := range ev.Modules {
		if !s.Admitted || len(s.DependsOn) != 0 {
			t.Fatalf("%s: %+v", s.Module, s)
		}
	}
	if !slices.Equal(ev.ActivateOrder, []string{"planner_fanout", "session_fork"}) {
		t.Fatalf("order = %v", ev.ActivateOrder)
	}
}

func TestUnsatisfiedDependenciesCascadeWithTheChainNamed(t *testing.T) {
	rejected := Rejected{Module: "prompt_system", ImplementationID: "ps", Reason: "verification_failed",
		Message: "sources[0].catalog_path: /var/lib/x is a symlink"}
	tests := []struct {
		name     string
		admitted []Node
		rejected []Rejected
		want     map[string]string // module → reason: message (admitted modules absent)
		order    []string
	}{
		{
			name:     "a failed source gates its consumers and theirs, naming the chain",
			admitted: []Node{node("context_assembly", "ca", v1, 2), node("memory_recall", "mr", v1, 3), node("prompt_planner", "pp", v1, 4), node("tool_exposure", "te", v1, 5)},
			rejected: []Rejected{rejected},
			want: map[string]string{
				"prompt_system":    "verification_failed: sources[0].catalog_path: /var/lib/x is a symlink",
				"context_assembly": "dependency_unsatisfied: context_assembly needs prompt_system (not admitted: verification_failed: sources[0].catalog_path: /var/lib/x is a symlink)",
				"memory_recall":    "dependency_unsatisfied: memory_recall needs context_assembly needs prompt_system (not admitted: verification_failed: sources[0].catalog_path: /var/lib/x is a symlink)",
				"prompt_planner":   "dependency_unsatisfied: prompt_planner needs prompt_system (not admitted: verification_failed: sources[0].catalog_path: /var/lib/x is a symlink)",
			},
			order: []string{"tool_exposure"},
		},
		{
			name:     "a missing implementation dependency gates the module and its consumers",
			admitted: []Node{node("prompt_system", "ps", v1, 1, dep("base", v1)), node("context_assembly", "ca", v1, 2)},
			want: map[string]string{
				"prompt_system":    "dependency_unsatisfied: prompt_system needs implementation base ≥ 1.0.0, which is not in the activation",
				"context_assembly": "dependency_unsatisfied: context_assembly needs prompt_system (it needs implementation base ≥ 1.0.0, which is not in the activation)",
			},
			order: []string{},
		},
		{
			name:     "an implementation dependency below its minimum version gates the module",
			admitted: []Node{node("prompt_system", "ps", v1, 1), node("memory_recall", "mr", v1, 2, dep("ps", catalog.Version{1, 2, 0}))},
			want: map[string]string{
				"memory_recall": "dependency_unsatisfied: memory_recall needs implementation ps ≥ 1.2.0, but prompt_system has 1.0.0",
			},
			order: []string{"prompt_system"},
		},
		{
			name:     "an implementation dependency at exactly its minimum version is satisfied",
			admitted: []Node{node("prompt_system", "ps", catalog.Version{1, 2, 0}, 1), node("memory_recall", "mr", v1, 2, dep("ps", catalog.Version{1, 2, 0}))},
			want:     map[string]string{},
			order:    []string{"prompt_system", "memory_recall"},
		},
		{
			name:     "an implementation dependency on a failed source gates through it",
			admitted: []Node{node("memory_recall", "mr", v1, 2, dep("ps", v1))},
			rejected: []Rejected{rejected},
			want: map[string]string{
				"prompt_system": "verification_failed: sources[0].catalog_path: /var/lib/x is a symlink",
				"memory_recall": "dependency_unsatisfied: memory_recall needs prompt_system (not admitted: verification_failed: sources[0].catalog_path: /var/lib/x is a symlink)",
			},
			order: []string{},
		},
		{
			name: "an implementation cycle fails every member with the full path, and gates their consumers",
			admitted: []Node{
				node("prompt_system", "ps", v1, 1),
				node("prompt_planner", "pp", v1, 2, dep("sp", v1)),
				node("scheduler_parallelism", "sp", v1, 3, dep("pf", v1)),
				node("planner_fanout", "pf", v1, 4),
				node("prompt_reduce", "pr", v1, 5),
			},
			want: map[string]string{
				"prompt_planner": "dependency_cycle: prompt_planner is on a dependency cycle: prompt_planner → scheduler_parallelism → planner_fanout → prompt_planner",
				// planner_fanout's seam edge to scheduler_parallelism closes a
				// shorter cycle through these two: each member names a
				// shortest cycle through itself.
				"scheduler_parallelism": "dependency_cycle: scheduler_parallelism is on a dependency cycle: scheduler_parallelism → planner_fanout → scheduler_parallelism",
				"planner_fanout":        "dependency_cycle: planner_fanout is on a dependency cycle: planner_fanout → scheduler_parallelism → planner_fanout",
				"prompt_reduce":         "dependency_unsatisfied: prompt_reduce needs prompt_planner (dependency cycle: prompt_planner → scheduler_parallelism → planner_fanout → prompt_planner)",
			},
			order: []string{"prompt_system"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := evaluate(t, tc.admitted, tc.rejected...)
			for _, s := range ev.Modules {
				want, gated := tc.want[s.Module]
				if !gated {
					if !s.Admitted || s.Reason != "" || s.Epoch == "" {
						t.Errorf("%s not admitted: %s: %s", s.Module, s.Reason, s.Message)
					}
					continue
				}
				if s.Admitted || s.Epoch != "" {
					t.Errorf("%s admitted, want %s", s.Module, want)
				}
				if got := s.Reason + ": " + s.Message; got != want {
					t.Errorf("%s:\n got  %s\n want %s", s.Module, got, want)
				}
			}
			if !slices.Equal(ev.ActivateOrder, tc.order) {
				t.Errorf("activate order = %v, want %v", ev.ActivateOrder, tc.order)
			}
		})
	}
}

func TestOrdersAreDeterministicAcross100ShuffledInputs(t *testing.T) {
	// Every module of the built-in graph, each with a source.
	var all []Node
	for i, m := range catalog.BuiltinSeamGraph().Modules() {
		all = append(all, node(m, "impl-"+m, v1, byte(i)))
	}
	// One implementation edge against ModuleId order, to make the ties
	// matter: prompt_reduce waits for session_fork's implementation.
	all[8].Dependencies = []catalog.Dependency{dep("impl-session_fork", v1)}
	first := evaluate(t, all)
	if len(first.ActivateOrder) != 28 {
		t.Fatalf("order has %d modules: %v", len(first.ActivateOrder), first.ActivateOrder)
	}
	rejected := []Rejected{{Module: "not_a_module", ImplementationID: "x", Reason: "schema_mismatch", Message: "m"},
		{Module: "Bad", ImplementationID: "y", Reason: "verification_failed", Message: "n"}}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 100 {
		shuffled := slices.Clone(all)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		rs := slices.Clone(rejected)
		ev := evaluate(t, shuffled, rs...)
		if !slices.Equal(ev.ActivateOrder, first.ActivateOrder) || !slices.Equal(ev.DrainOrder, first.DrainOrder) {
			t.Fatalf("shuffle %d: order %v differs from %v", i, ev.ActivateOrder, first.ActivateOrder)
		}
		for j, s := range ev.Modules[:28] {
			if !reflect.DeepEqual(s, first.Modules[j]) {
				t.Fatalf("shuffle %d: status of %s differs: %+v vs %+v", i, s.Module, s, first.Modules[j])
			}
		}
		if got := []string{ev.Modules[28].Module, ev.Modules[29].Module}; !slices.Equal(got, []string{"not_a_module", "Bad"}) {
			t.Fatalf("modules outside the graph not last in input order: %v", got)
		}
	}
	assertTopological(t, first, all)
	rev := slices.Clone(first.ActivateOrder)
	slices.Reverse(rev)
	if !slices.Equal(rev, first.DrainOrder) {
		t.Fatal("drain order is not the reverse of the activate order")
	}
	// The implementation edge moved prompt_reduce after session_fork's chain.
	if slices.Index(first.ActivateOrder, "prompt_reduce") < slices.Index(first.ActivateOrder, "session_fork") {
		t.Fatalf("prompt_reduce activated before its implementation dependency: %v", first.ActivateOrder)
	}
}

// assertTopological checks every dependency comes before its consumer and
// that, among modules ready at the same time, ModuleId order wins.
func assertTopological(t *testing.T, ev *Evaluation, nodes []Node) {
	t.Helper()
	pos := map[string]int{}
	for i, m := range ev.ActivateOrder {
		pos[m] = i
	}
	for _, s := range ev.Modules {
		for _, d := range s.DependsOn {
			if pos[d] >= pos[s.Module] {
				t.Errorf("%s activated before its dependency %s", s.Module, d)
			}
		}
	}
	// Recompute the greedy order independently: at each step the first
	// module in ModuleId order whose dependencies are all placed.
	placed := map[string]bool{}
	var want []string
	for len(want) < len(ev.ActivateOrder) {
		for _, s := range ev.Modules {
			if !s.Admitted || placed[s.Module] {
				continue
			}
			ready := true
			for _, d := range s.DependsOn {
				ready = ready && placed[d]
			}
			if ready {
				placed[s.Module] = true
				want = append(want, s.Module)
				break
			}
		}
	}
	if !slices.Equal(want, ev.ActivateOrder) {
		t.Errorf("activate order %v is not the ModuleId-tie-broken order %v", ev.ActivateOrder, want)
	}
}

func TestPlansAddRemoveAndBlock(t *testing.T) {
	old := evaluate(t, []Node{node("prompt_system", "ps", v1, 1), node("context_assembly", "ca", v1, 2),
		node("memory_recall", "mr", v1, 3), node("provider_routing", "prr", v1, 4)})
	next := evaluate(t, []Node{node("prompt_system", "ps", v1, 1), node("memory_recall", "mr", v1, 3),
		node("tool_exposure", "te", v1, 5)},
		Rejected{Module: "provider_retry", ImplementationID: "pre", Reason: "verification_failed", Message: "bad"})
	p := Plan(old, next)
	want := RuntimePlan{
		Added: []string{"tool_exposure"}, Removed: []string{"context_assembly", "provider_routing"},
		Reloaded: []string{"memory_recall"}, Unchanged: []string{"prompt_system"}, Blocked: []string{"provider_retry"},
		// memory_recall lost its dependency context_assembly (a new epoch),
		// and is ready before tool_exposure in ModuleId order.
		ActivateOrder: []string{"memory_recall", "tool_exposure"}, DrainOrder: []string{"provider_routing", "context_assembly"},
	}
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"added", p.Added, want.Added}, {"removed", p.Removed, want.Removed}, {"reloaded", p.Reloaded, want.Reloaded},
		{"unchanged", p.Unchanged, want.Unchanged}, {"blocked", p.Blocked, want.Blocked},
		{"activate order", p.ActivateOrder, want.ActivateOrder}, {"drain order", p.DrainOrder, want.DrainOrder},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if p.Empty() {
		t.Error("a plan with changes reports empty")
	}
	st := p.Status()
	if !slices.Equal(st.Removed, want.Removed) || !slices.Equal(st.DrainOrder, want.DrainOrder) {
		t.Errorf("status = %+v", st)
	}

	first := Plan(nil, old)
	if !slices.Equal(first.Added, []string{"prompt_system", "context_assembly", "memory_recall", "provider_routing"}) ||
		!slices.Equal(first.ActivateOrder, first.Added) {
		t.Errorf("first activation = %+v", first)
	}
	retire := Plan(old, nil)
	if !slices.Equal(retire.DrainOrder, []string{"provider_routing", "memory_recall", "context_assembly", "prompt_system"}) {
		t.Errorf("deleting the activation drains in %v", retire.DrainOrder)
	}
}

func TestEvaluateRefusesInputVerificationNeverProduces(t *testing.T) {
	cases := map[string]Input{
		"a module with two sources": {Admitted: []Node{node("prompt_system", "a", v1, 1)},
			Rejected: []Rejected{{Module: "prompt_system", ImplementationID: "b"}}},
		"an implementation in two modules":     {Admitted: []Node{node("prompt_system", "a", v1, 1), node("context_assembly", "a", v1, 2)}},
		"an admitted module outside the graph": {Admitted: []Node{node("no_such_module", "a", v1, 1)}},
	}
	for name, in := range cases {
		if _, err := Evaluate(in); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLongMessagesAreBoundedAtARuneBoundary(t *testing.T) {
	msg := strings.Repeat("é", 600) // 1200 bytes
	ev := evaluate(t, []Node{node("context_assembly", "ca", v1, 2)},
		Rejected{Module: "prompt_system", ImplementationID: "ps", Reason: "verification_failed", Message: msg})
	for _, s := range ev.Modules {
		if len(s.Message) > 1024 || !strings.HasSuffix(s.Message, "…") || !utf8Valid(s.Message) {
			t.Errorf("%s: message of %d bytes: %q…", s.Module, len(s.Message), s.Message[:40])
		}
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
