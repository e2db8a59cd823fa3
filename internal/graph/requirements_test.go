package graph

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/protocol"
)

// reqEntry is a module of a schema-version-3 graph file as a JSON tree.
func reqEntry(module string, deps ...any) map[string]any {
	if deps == nil {
		deps = []any{}
	}
	c := protocol.BuiltinContracts(module)
	raw, _ := json.Marshal(c)
	var contracts map[string]any
	_ = json.Unmarshal(raw, &contracts)
	return map[string]any{
		"module": module, "dependencies": deps, "contracts": contracts,
		"failure_semantics": catalog.FailureSemantics(), "host_invariants": catalog.HostInvariants(),
	}
}

func parseGraph(t testing.TB, entries ...map[string]any) *catalog.SeamGraph {
	t.Helper()
	data, err := json.Marshal(map[string]any{"schema_version": 3, "modules": entries})
	if err != nil {
		t.Fatal(err)
	}
	g, err := catalog.ParseSeamGraph(data)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func rng(min, max []int) map[string]any {
	r := map[string]any{}
	if min != nil {
		r["minimum"] = min
	}
	if max != nil {
		r["maximum"] = max
	}
	return r
}

const schemaOne = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// requirementGraph is the graph of the requirement cases: planner requires
// store in [1.2.0, 2.0.0) and, optionally, memo; ranker requires the
// acme/search@v1 contract that search_fast and search_exact provide, without
// a selection; picker requires it with search_exact selected.
func requirementGraph(t testing.TB) *catalog.SeamGraph {
	searchFast := reqEntry("search_fast")
	searchFast["provides"] = []any{map[string]any{"id": "acme/search@v1", "version": 1}}
	searchExact := reqEntry("search_exact")
	searchExact["provides"] = []any{map[string]any{"id": "acme/search@v1", "version": 1}}
	return parseGraph(t,
		reqEntry("store"), reqEntry("memo"), searchFast, searchExact,
		reqEntry("planner",
			map[string]any{"module": "store", "version_range": rng([]int{1, 2, 0}, []int{2, 0, 0})},
			map[string]any{"module": "memo", "optional": true, "version_range": rng([]int{1, 0, 0}, nil)}),
		reqEntry("ranker", map[string]any{"contract": "acme/search@v1"}),
		reqEntry("picker", map[string]any{"contract": "acme/search@v1", "select": "search_exact"}),
	)
}

// RequirementCase is one row of the requirement table: the sources of an
// activation and what the graph makes of one module.
type RequirementCase struct {
	Name        string
	Sources     []Node
	Rejected    []Rejected
	Module      string
	Admitted    bool
	Reason      string
	Message     string // substring
	Diagnostic  string // substring of the one diagnostic ("" for none)
	DependsOn   []string
	ActivateHas []string
}

func requirementCases() []RequirementCase {
	store := func(v catalog.Version) Node { return node("store", "store-impl", v, 1) }
	memo := func(v catalog.Version) Node { return node("memo", "memo-impl", v, 2) }
	planner := node("planner", "planner-impl", v1, 3)
	// strictPlanner's manifest depends on memo's implementation, which the
	// graph requires only optionally.
	strictPlanner := node("planner", "planner-impl", v1, 3, dep("memo-impl", v1))
	fast := node("search_fast", "fast-impl", v1, 4)
	exact := node("search_exact", "exact-impl", v1, 5)
	ranker := node("ranker", "ranker-impl", v1, 6)
	picker := node("picker", "picker-impl", v1, 7)
	return []RequirementCase{
		{Name: "a required dependency inside its range activates the consumer",
			Sources: []Node{store(catalog.Version{1, 4, 2}), memo(v1), planner}, Module: "planner", Admitted: true,
			DependsOn: []string{"store", "memo"}},
		{Name: "a required dependency below its range keeps the consumer Inactive",
			Sources: []Node{store(catalog.Version{1, 1, 9}), memo(v1), planner}, Module: "planner",
			Reason: "dependency_unsatisfied", Message: "planner needs store [1.2.0, 2.0.0), but store has store-impl at 1.1.9"},
		{Name: "a required dependency at its exclusive maximum keeps the consumer Inactive",
			Sources: []Node{store(catalog.Version{2, 0, 0}), memo(v1), planner}, Module: "planner",
			Reason: "dependency_unsatisfied", Message: "planner needs store [1.2.0, 2.0.0), but store has store-impl at 2.0.0"},
		{Name: "a required dependency without a source keeps the consumer Inactive",
			Sources: []Node{memo(v1), planner}, Module: "planner",
			Reason: "dependency_unsatisfied", Message: "planner needs store [1.2.0, 2.0.0), which has no source in the activation"},
		{Name: "a missing optional dependency activates the consumer with a diagnostic",
			Sources: []Node{store(catalog.Version{1, 2, 0}), planner}, Module: "planner", Admitted: true,
			Diagnostic: "optional dependency memo ≥ 1.0.0, which has no source in the activation; activated without it",
			DependsOn:  []string{"store"}},
		{Name: "an optional dependency outside its range activates the consumer without it",
			Sources: []Node{store(catalog.Version{1, 2, 0}), memo(catalog.Version{0, 9, 0}), planner}, Module: "planner", Admitted: true,
			Diagnostic: "optional dependency memo ≥ 1.0.0, but memo has memo-impl at 0.9.0; activated without it",
			DependsOn:  []string{"store"}},
		{Name: "an optional dependency that failed verification activates the consumer without it",
			Sources:  []Node{store(catalog.Version{1, 2, 0}), planner},
			Rejected: []Rejected{{Module: "memo", ImplementationID: "memo-impl", Reason: "verification_failed", Message: "digest mismatch"}},
			Module:   "planner", Admitted: true,
			Diagnostic: "optional dependency memo ≥ 1.0.0: memo is not admitted (verification_failed: digest mismatch); activated without it",
			DependsOn:  []string{"store"}},
		{Name: "two sources providing one contract without a selection are a conflict",
			Sources: []Node{fast, exact, ranker}, Module: "ranker",
			Reason:  "dependency_conflict",
			Message: "ranker requires contract acme/search@v1, which 2 sources provide: search_fast (fast-impl) and search_exact (exact-impl); the seam graph selects none"},
		{Name: "one source providing the contract binds it without a selection",
			Sources: []Node{fast, ranker}, Module: "ranker", Admitted: true, DependsOn: []string{"search_fast"}},
		{Name: "a selection binds the selected provider among two",
			Sources: []Node{fast, exact, picker}, Module: "picker", Admitted: true, DependsOn: []string{"search_exact"}},
		{Name: "an optional requirement never loosens a manifest dependency on the same module",
			Sources:  []Node{store(catalog.Version{1, 2, 0}), strictPlanner},
			Rejected: []Rejected{{Module: "memo", ImplementationID: "memo-impl", Reason: "verification_failed", Message: "digest mismatch"}},
			Module:   "planner",
			Reason:   "dependency_unsatisfied", Message: "planner needs memo (not admitted: verification_failed: digest mismatch)"},
		{Name: "a selected provider without a source keeps the consumer Inactive",
			Sources: []Node{fast, picker}, Module: "picker",
			Reason: "dependency_unsatisfied", Message: "picker needs contract acme/search@v1, which has no source in the activation"},
	}
}

// TestRequirementCases is the requirement table of docs/reference: each
// case, the module's admission, and its reason or diagnostic.
func TestRequirementCases(t *testing.T) {
	g := requirementGraph(t)
	for _, tc := range requirementCases() {
		t.Run(tc.Name, func(t *testing.T) {
			ev, err := Evaluate(Input{Graph: g, Admitted: tc.Sources, Rejected: tc.Rejected})
			if err != nil {
				t.Fatal(err)
			}
			st, ok := ev.Status(tc.Module)
			if !ok {
				t.Fatalf("no status for %s", tc.Module)
			}
			if st.Admitted != tc.Admitted || st.Reason != tc.Reason || !strings.Contains(st.Message, tc.Message) {
				t.Errorf("%s: admitted %v reason %q message %q; want admitted %v reason %q message containing %q",
					tc.Module, st.Admitted, st.Reason, st.Message, tc.Admitted, tc.Reason, tc.Message)
			}
			switch {
			case tc.Diagnostic == "" && len(st.Diagnostics) != 0:
				t.Errorf("unexpected diagnostics %q", st.Diagnostics)
			case tc.Diagnostic != "" && (len(st.Diagnostics) != 1 || !strings.Contains(st.Diagnostics[0], tc.Diagnostic)):
				t.Errorf("diagnostics %q, want one containing %q", st.Diagnostics, tc.Diagnostic)
			}
			if tc.Admitted {
				if !slices.Equal(st.DependsOn, tc.DependsOn) {
					t.Errorf("dependsOn %v, want %v", st.DependsOn, tc.DependsOn)
				}
				if !slices.Contains(ev.ActivateOrder, tc.Module) {
					t.Errorf("admitted but not in the activate order %v", ev.ActivateOrder)
				}
				for _, d := range st.DependsOn {
					if slices.Index(ev.ActivateOrder, d) > slices.Index(ev.ActivateOrder, tc.Module) {
						t.Errorf("%s activates before its dependency %s: %v", tc.Module, d, ev.ActivateOrder)
					}
				}
			} else if slices.Contains(ev.ActivateOrder, tc.Module) || st.Epoch != "" {
				t.Errorf("not admitted, yet in the activate order %v or with epoch %q", ev.ActivateOrder, st.Epoch)
			}
		})
	}
}

func TestASchemaHashTakesPartInTheEpochOfItsModuleAndItsConsumers(t *testing.T) {
	build := func(hash string) *catalog.SeamGraph {
		store := reqEntry("store")
		if hash != "" {
			store["contracts"].(map[string]any)["provider"].(map[string]any)["schema_sha256"] = hash
		}
		return parseGraph(t, store, reqEntry("memo"), reqEntry("planner", "store"), reqEntry("solo"))
	}
	sources := []Node{node("store", "s", v1, 1), node("memo", "m", v1, 2), node("planner", "p", v1, 3), node("solo", "o", v1, 4)}
	epochs := func(g *catalog.SeamGraph) map[string]string {
		ev, err := Evaluate(Input{Graph: g, Admitted: sources})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, s := range ev.Modules {
			out[s.Module] = s.Epoch
		}
		return out
	}
	plain, hashed, rehashed := epochs(build("")), epochs(build(schemaOne)), epochs(build("sha256:"+strings.Repeat("2", 64)))
	// Without a schema hash a version 3 graph yields exactly the epochs of
	// identities alone, as version 2 does.
	p := sources[2]
	want := Epoch(Identity(p.Module, p.ImplementationID, p.Version, p.ArtifactSHA256),
		[]string{Identity(sources[0].Module, sources[0].ImplementationID, sources[0].Version, sources[0].ArtifactSHA256)})
	if plain["planner"] != want {
		t.Errorf("planner's epoch without schema hashes = %s, want %s", plain["planner"], want)
	}
	for _, m := range []string{"store", "planner"} {
		if plain[m] == hashed[m] || hashed[m] == rehashed[m] {
			t.Errorf("%s's epoch does not follow store's schema hash: %s / %s / %s", m, plain[m], hashed[m], rehashed[m])
		}
	}
	for _, m := range []string{"memo", "solo"} {
		if plain[m] != hashed[m] || hashed[m] != rehashed[m] {
			t.Errorf("%s's epoch changed with a schema it does not bind", m)
		}
	}
	// A plan between the two reloads store and its consumer only.
	old, _ := Evaluate(Input{Graph: build(schemaOne), Admitted: sources})
	next, _ := Evaluate(Input{Graph: build("sha256:" + strings.Repeat("2", 64)), Admitted: sources})
	if plan := Plan(old, next); !slices.Equal(plan.Reloaded, []string{"store", "planner"}) {
		t.Errorf("reloaded %v, want [store planner]", plan.Reloaded)
	}
}
