package catalog

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"iteron.dev/operator/pkg/protocol"
)

// v3Entry is one module of a schema-version-3 graph file, as a JSON tree a
// test may edit before it is written.
func v3Entry(module string, deps ...any) map[string]any {
	if deps == nil {
		deps = []any{}
	}
	c := protocol.BuiltinContracts(module)
	contracts := map[string]any{}
	for _, r := range contractList(c) {
		contracts[r.role] = map[string]any{"id": r.ref.ID, "version": r.ref.Version}
	}
	return map[string]any{
		"module": module, "dependencies": deps, "contracts": contracts,
		"failure_semantics": FailureSemantics(), "host_invariants": HostInvariants(),
	}
}

func v3Graph(t testing.TB, version int, entries ...map[string]any) []byte {
	t.Helper()
	data, err := json.Marshal(map[string]any{"schema_version": version, "modules": entries})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func provides(e map[string]any, refs ...map[string]any) map[string]any {
	list := make([]any, len(refs))
	for i, r := range refs {
		list[i] = r
	}
	e["provides"] = list
	return e
}

const schemaA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// requirementsGraph is search_fast and search_exact providing acme/search@v1,
// store alone, and planner requiring store in [1.2.0, 2.0.0), memo
// optionally, and the search contract from search_exact.
func requirementsGraph() []map[string]any {
	return []map[string]any{
		v3Entry("store"),
		v3Entry("memo"),
		provides(v3Entry("search_fast"), map[string]any{"id": "acme/search@v1", "version": 1, "schema_sha256": schemaA}),
		provides(v3Entry("search_exact"), map[string]any{"id": "acme/search@v1", "version": 1}),
		v3Entry("planner", "store",
			map[string]any{"module": "memo", "optional": true},
			map[string]any{"contract": "acme/search@v1", "select": "search_exact", "version_range": map[string]any{"minimum": []int{1, 2, 0}, "maximum": []int{2, 0, 0}}},
		),
	}
}

func TestASchemaVersion3GraphCarriesTypedRequirements(t *testing.T) {
	path := filepath.Join(t.TempDir(), "graph.json")
	entries := requirementsGraph()
	entries[0]["contracts"].(map[string]any)["consumer"].(map[string]any)["schema_sha256"] = schemaA
	if err := os.WriteFile(path, v3Graph(t, 3, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := LoadSeamGraph(path)
	if err != nil {
		t.Fatal(err)
	}
	if g.SchemaVersion() != 3 {
		t.Errorf("schema version %d", g.SchemaVersion())
	}
	if deps := g.Dependencies("planner"); !reflect.DeepEqual(deps, []string{"store"}) {
		t.Errorf("plain dependencies of planner = %v", deps)
	}
	min, max := Version{1, 2, 0}, Version{2, 0, 0}
	want := []Requirement{
		{Module: "memo", Optional: true},
		{Contract: "acme/search@v1", Select: "search_exact", Range: VersionRange{Minimum: &min, Maximum: &max}},
	}
	if got := g.Requirements("planner"); !reflect.DeepEqual(got, want) {
		t.Errorf("requirements of planner = %+v, want %+v", got, want)
	}
	if got := g.Providers("acme/search@v1"); !reflect.DeepEqual(got, []string{"search_fast", "search_exact"}) {
		t.Errorf("providers = %v", got)
	}
	if got := g.SchemaHashes("search_fast"); !reflect.DeepEqual(got, map[string]string{"provides:acme/search@v1": schemaA}) {
		t.Errorf("schema hashes of search_fast = %v", got)
	}
	if got := g.SchemaHashes("store"); !reflect.DeepEqual(got, map[string]string{"consumer": schemaA}) {
		t.Errorf("schema hashes of store = %v", got)
	}
	if got := g.SchemaHashes("memo"); got != nil {
		t.Errorf("memo carries no schema hash, got %v", got)
	}
	// Accessors hand out copies.
	g.Requirements("planner")[1].Range.Minimum[0] = 9
	if g.Requirements("planner")[1].Range.Minimum[0] != 1 {
		t.Error("Requirements returned the graph's own range")
	}
	// A schema version 2 graph has neither.
	g2, err := ParseSeamGraph(graphJSON(t, customGraph()))
	if err != nil {
		t.Fatal(err)
	}
	if g2.SchemaVersion() != 2 || g2.Requirements("beta") != nil || g2.SchemaHashes("beta") != nil {
		t.Errorf("a version 2 graph: version %d, requirements %v, hashes %v", g2.SchemaVersion(), g2.Requirements("beta"), g2.SchemaHashes("beta"))
	}
}

func TestVersionRangesAreMinimumInclusiveMaximumExclusive(t *testing.T) {
	min, max := Version{1, 2, 0}, Version{2, 0, 0}
	tests := []struct {
		name string
		r    VersionRange
		v    Version
		in   bool
		text string
	}{
		{"the minimum itself is inside", VersionRange{Minimum: &min, Maximum: &max}, Version{1, 2, 0}, true, "[1.2.0, 2.0.0)"},
		{"a patch below the minimum is outside", VersionRange{Minimum: &min, Maximum: &max}, Version{1, 1, 9}, false, "[1.2.0, 2.0.0)"},
		{"the last patch before the maximum is inside", VersionRange{Minimum: &min, Maximum: &max}, Version{1, 99, 99}, true, "[1.2.0, 2.0.0)"},
		{"the maximum itself is outside", VersionRange{Minimum: &min, Maximum: &max}, Version{2, 0, 0}, false, "[1.2.0, 2.0.0)"},
		{"a minimum alone has no ceiling", VersionRange{Minimum: &min}, Version{7, 0, 0}, true, "≥ 1.2.0"},
		{"a maximum alone has no floor", VersionRange{Maximum: &max}, Version{0, 0, 1}, true, "< 2.0.0"},
		{"no bound admits anything", VersionRange{}, Version{3, 0, 0}, true, "any version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.Contains(tc.v); got != tc.in {
				t.Errorf("%s contains %s = %v, want %v", tc.r, tc.v, got, tc.in)
			}
			if tc.r.String() != tc.text {
				t.Errorf("String() = %q, want %q", tc.r.String(), tc.text)
			}
		})
	}
}

// TestRequirementRejections: a bad schema-version-3 graph is refused with
// the field named, and a version 2 graph may not use version 3's members.
func TestRequirementRejections(t *testing.T) {
	tests := []struct {
		name     string
		version  int
		edit     func([]map[string]any) []map[string]any
		field    string
		code     string
		sentinel error
		detail   string
	}{
		{name: "a schema version beyond 3 is refused", version: 4,
			field: "schema_version", code: "unsupported_version", sentinel: ErrUnsupportedVersion, detail: "not supported"},
		{name: "a dependency object in a version 2 graph is refused", version: 2,
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{"store", map[string]any{"module": "memo", "optional": true}}
				return []map[string]any{e[0], e[1], e[4]}
			},
			field: "modules[2].dependencies[1]", code: "verification_failed", sentinel: ErrInvalidValue, detail: "needs schema_version 3"},
		{name: "a version 2 graph of the same modules without requirements parses", version: 2, edit: func(e []map[string]any) []map[string]any {
			e[4]["dependencies"] = []any{"store"}
			return []map[string]any{e[0], e[1], e[4]}
		}},
		{name: "provides in a version 2 graph is refused", version: 2,
			edit:  func(e []map[string]any) []map[string]any { return e[:4] },
			field: "modules[2].provides", code: "verification_failed", sentinel: ErrInvalidValue, detail: "need schema_version 3"},
		{name: "a schema hash in a version 2 graph is refused", version: 2,
			edit: func(e []map[string]any) []map[string]any {
				e[0]["contracts"].(map[string]any)["stop"].(map[string]any)["schema_sha256"] = schemaA
				return e[:2]
			},
			field: "modules[0].contracts.stop.schema_sha256", code: "verification_failed", sentinel: ErrInvalidValue, detail: "need schema_version 3"},
		{name: "a schema hash that is not a digest is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[1]["contracts"].(map[string]any)["consumer"].(map[string]any)["schema_sha256"] = "sha256:ABC"
				return e
			},
			field: "modules[1].contracts.consumer.schema_sha256", code: "verification_failed", sentinel: ErrInvalidValue, detail: "64 lowercase hex"},
		{name: "a dependency that is a number is refused",
			edit:  func(e []map[string]any) []map[string]any { e[4]["dependencies"] = []any{7}; return e },
			field: "modules[4].dependencies[0]", code: "schema_mismatch", sentinel: ErrMalformed, detail: "module ID string or"},
		{name: "a requirement naming neither a module nor a contract is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"optional": true}}
				return e
			},
			field: "modules[4].dependencies[0]", code: "schema_mismatch", sentinel: ErrMissingField, detail: "names a module"},
		{name: "a requirement naming both a module and a contract is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "contract": "acme/search@v1"}}
				return e
			},
			field: "modules[4].dependencies[0]", code: "verification_failed", sentinel: ErrInvalidValue, detail: "not both"},
		{name: "an unknown member of a requirement is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "minimum_version": []int{1, 0, 0}}}
				return e
			},
			field: "modules[4].dependencies[0].minimum_version", code: "schema_mismatch", sentinel: ErrMalformed, detail: "unknown field"},
		{name: "a required module outside the graph is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "omega"}}
				return e
			},
			field: "modules[4].dependencies[0].module", code: "verification_failed", sentinel: ErrInvalidValue, detail: "not a module of this graph"},
		{name: "a module requiring itself is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "planner"}}
				return e
			},
			field: "modules[4].dependencies[0].module", code: "verification_failed", sentinel: ErrInvalidValue, detail: "cannot require itself"},
		{name: "a module both a plain dependency and a requirement is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{"store", map[string]any{"module": "store", "optional": true}}
				return e
			},
			field: "modules[4].dependencies[1].module", code: "verification_failed", sentinel: ErrDuplicate, detail: "also a plain dependency"},
		{name: "a contract nobody provides is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"contract": "acme/none@v1"}}
				return e
			},
			field: "modules[4].dependencies[0].contract", code: "verification_failed", sentinel: ErrInvalidValue, detail: "no other module"},
		{name: "a selection that does not provide the contract is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"contract": "acme/search@v1", "select": "store"}}
				return e
			},
			field: "modules[4].dependencies[0].select", code: "verification_failed", sentinel: ErrInvalidValue, detail: "search_fast, search_exact"},
		{name: "select on a module requirement is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "select": "store"}}
				return e
			},
			field: "modules[4].dependencies[0].select", code: "verification_failed", sentinel: ErrInvalidValue, detail: "names its module already"},
		{name: "an empty version range is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "version_range": map[string]any{}}}
				return e
			},
			field: "modules[4].dependencies[0].version_range", code: "schema_mismatch", sentinel: ErrMissingField, detail: "a minimum, a maximum or both"},
		{name: "a minimum not below the maximum is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "version_range": map[string]any{"minimum": []int{2, 0, 0}, "maximum": []int{2, 0, 0}}}}
				return e
			},
			field: "modules[4].dependencies[0].version_range", code: "verification_failed", sentinel: ErrInvalidValue, detail: "minimum 2.0.0 is not below maximum 2.0.0"},
		{name: "a maximum of 0.0.0 is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "version_range": map[string]any{"maximum": []int{0, 0, 0}}}}
				return e
			},
			field: "modules[4].dependencies[0].version_range.maximum", code: "verification_failed", sentinel: ErrInvalidValue, detail: "admits no version"},
		{name: "a version of two numbers is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "version_range": map[string]any{"minimum": []int{1, 2}}}}
				return e
			},
			field: "modules[4].dependencies[0].version_range.minimum", code: "schema_mismatch", sentinel: ErrMalformed},
		{name: "optional that is not a boolean is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "store", "optional": "yes"}}
				return e
			},
			field: "modules[4].dependencies[0].optional", code: "schema_mismatch", sentinel: ErrMalformed},
		{name: "the same target required twice is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[4]["dependencies"] = []any{map[string]any{"module": "memo"}, map[string]any{"module": "memo", "optional": true}}
				return e
			},
			field: "modules[4].dependencies[1]", code: "verification_failed", sentinel: ErrDuplicate, detail: "already required"},
		{name: "a provided contract listed twice is refused",
			edit: func(e []map[string]any) []map[string]any {
				provides(e[3], map[string]any{"id": "acme/x@v1", "version": 1}, map[string]any{"id": "acme/x@v1", "version": 1})
				return e
			},
			field: "modules[3].provides[1].id", code: "verification_failed", sentinel: ErrDuplicate},
		{name: "a provided contract of version 0 is refused",
			edit: func(e []map[string]any) []map[string]any {
				provides(e[3], map[string]any{"id": "acme/search@v1", "version": 0})
				return e
			},
			field: "modules[3].provides[0].version", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "more than 8 dependencies counting requirements are refused",
			edit: func(e []map[string]any) []map[string]any {
				var deps []any
				for _, m := range []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"} {
					e = append(e, v3Entry(m))
					deps = append(deps, m)
				}
				e[4]["dependencies"] = append(deps, map[string]any{"module": "store"}, map[string]any{"module": "memo"})
				return e
			},
			field: "modules[4].dependencies", code: "verification_failed", sentinel: ErrTooLarge, detail: "9 dependencies"},
		{name: "a cycle through a contract's providers is refused",
			edit: func(e []map[string]any) []map[string]any {
				e[2]["dependencies"] = []any{"planner"}
				e[4]["dependencies"] = []any{map[string]any{"contract": "acme/search@v1"}}
				return e
			},
			field: "modules", code: "dependency_cycle", sentinel: ErrCycle, detail: "search_fast → planner → search_fast"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			version := tc.version
			if version == 0 {
				version = 3
			}
			entries := requirementsGraph()
			if tc.edit != nil {
				entries = tc.edit(entries)
			}
			_, err := ParseSeamGraph(v3Graph(t, version, entries...))
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			expectError(t, err, tc.field, tc.code, tc.sentinel, tc.detail)
			if err != nil && !strings.HasPrefix(err.Error(), tc.field) {
				t.Errorf("error does not lead with its field: %v", err)
			}
		})
	}
}
