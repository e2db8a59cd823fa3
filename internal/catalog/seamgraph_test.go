package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iteron.dev/operator/pkg/protocol"
)

var updateBuiltin = flag.Bool("update-builtin", false, "rewrite seamgraph.json from the seam graph table of docs/reference/catalog.md")

// specTable is the seam graph table of docs/reference/catalog.md, typed out by
// hand: the embedded graph must equal it, in this order.
var specTable = []struct {
	module string
	deps   []string
}{
	{"prompt_system", nil},
	{"prompt_tool_description", []string{"prompt_system"}},
	{"prompt_subagent", []string{"prompt_system"}},
	{"prompt_skill", []string{"prompt_system"}},
	{"prompt_compaction", []string{"prompt_system"}},
	{"prompt_verification", []string{"prompt_system"}},
	{"prompt_planner", []string{"prompt_system"}},
	{"prompt_memory_write", []string{"prompt_system"}},
	{"prompt_reduce", []string{"prompt_planner"}},
	{"prompt_recovery", []string{"prompt_verification"}},
	{"context_assembly", []string{"prompt_system"}},
	{"context_compaction", []string{"context_assembly"}},
	{"memory_recall", []string{"context_assembly"}},
	{"tool_exposure", []string{"prompt_tool_description"}},
	{"tool_arguments", []string{"tool_exposure"}},
	{"tool_edit_strategy", []string{"tool_arguments"}},
	{"tool_search_strategy", []string{"tool_exposure"}},
	{"provider_routing", []string{"context_assembly"}},
	{"provider_sampling", []string{"provider_routing"}},
	{"provider_retry", []string{"provider_routing"}},
	{"provider_prompt_cache", []string{"provider_routing"}},
	{"scheduler_parallelism", []string{"tool_exposure"}},
	{"planner_fanout", []string{"prompt_planner", "scheduler_parallelism"}},
	{"verification_quorum", []string{"prompt_verification"}},
	{"budget_allocation", []string{"provider_routing"}},
	{"session_stop", []string{"budget_allocation"}},
	{"session_checkpoint", []string{"session_stop"}},
	{"session_fork", []string{"session_checkpoint"}},
}

func specEntries() []ModuleEntry {
	entries := make([]ModuleEntry, 0, len(specTable))
	for _, row := range specTable {
		deps := row.deps
		if deps == nil {
			deps = []string{}
		}
		entries = append(entries, ModuleEntry{
			Module: row.module, Dependencies: deps, Contracts: protocol.BuiltinContracts(row.module),
			FailureSemantics: FailureSemantics(), HostInvariants: HostInvariants(),
		})
	}
	return entries
}

func graphJSON(t testing.TB, entries []ModuleEntry) []byte {
	t.Helper()
	data, err := json.MarshalIndent(struct {
		SchemaVersion int           `json:"schema_version"`
		Modules       []ModuleEntry `json:"modules"`
	}{SeamGraphSchemaVersion, entries}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(data, '\n')
}

func TestBuiltinGraphIsTheSpecTable(t *testing.T) {
	want := graphJSON(t, specEntries())
	if *updateBuiltin {
		if err := os.WriteFile("seamgraph.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Skip("seamgraph.json rewritten; run the tests again to check the embedded copy")
	}
	if !bytes.Equal(builtinSeamGraph, want) {
		t.Fatalf("seamgraph.json differs from the seam graph table of docs/reference/catalog.md; run go test -run TestBuiltinGraphIsTheSpecTable -update-builtin")
	}
	g := BuiltinSeamGraph()
	if !g.IsBuiltin() || g.Len() != 28 {
		t.Fatalf("builtin graph: builtin=%v len=%d", g.IsBuiltin(), g.Len())
	}
	if len(builtinSeamGraph) > MaxSeamGraphBytes {
		t.Fatalf("embedded graph is %d bytes, over the 128 KiB bound", len(builtinSeamGraph))
	}
	for i, row := range specTable {
		if got := g.Modules()[i]; got != row.module {
			t.Errorf("ModuleId order[%d] = %s, want %s", i, got, row.module)
		}
		if idx, ok := g.Order(row.module); !ok || idx != i {
			t.Errorf("Order(%s) = %d, %v", row.module, idx, ok)
		}
		if got := strings.Join(g.Dependencies(row.module), ","); got != strings.Join(row.deps, ",") {
			t.Errorf("Dependencies(%s) = %s, want %v", row.module, got, row.deps)
		}
		c, ok := g.Contracts(row.module)
		if !ok || c != protocol.BuiltinContracts(row.module) {
			t.Errorf("Contracts(%s) do not equal protocol.BuiltinContracts: %+v", row.module, c)
		}
	}
}

func TestBuiltinContractsSpellTheDottedModule(t *testing.T) {
	c, _ := BuiltinSeamGraph().Contracts("provider_prompt_cache")
	if c.Load.ID != "iteron/provider.prompt_cache/lifecycle/load@v1" || c.Load.Version != 1 {
		t.Fatalf("load contract = %+v", c.Load)
	}
	if c.Definition.ID != "iteron/provider.prompt_cache/definition@v1" {
		t.Fatalf("definition contract = %+v", c.Definition)
	}
	c, _ = BuiltinSeamGraph().Contracts("tool_edit_strategy")
	if c.Readiness.ID != "iteron/tool.edit_strategy/lifecycle/readiness@v1" {
		t.Fatalf("readiness contract = %+v", c.Readiness)
	}
}

func TestGraphAccessorsReturnCopies(t *testing.T) {
	g := BuiltinSeamGraph()
	deps := g.Dependencies("planner_fanout")
	deps[0] = "mutated"
	e, _ := g.Entry("planner_fanout")
	e.Dependencies[1] = "mutated"
	e.HostInvariants[0] = "mutated"
	if got := g.Dependencies("planner_fanout"); got[0] != "prompt_planner" || got[1] != "scheduler_parallelism" {
		t.Fatalf("graph mutated through an accessor: %v", got)
	}
	if e2, _ := g.Entry("planner_fanout"); e2.HostInvariants[0] != "activation_and_promotion" {
		t.Fatalf("graph mutated through Entry: %v", e2.HostInvariants)
	}
	if _, ok := g.Entry("no_such_module"); ok {
		t.Fatal("Entry of an unknown module reported found")
	}
	if g.Has("no_such_module") || g.Dependencies("no_such_module") != nil {
		t.Fatal("unknown module reported present")
	}
}

// customGraph returns a small valid custom graph: a ← b ← c, d alone.
func customGraph() []ModuleEntry {
	mk := func(m string, deps ...string) ModuleEntry {
		if deps == nil {
			deps = []string{}
		}
		return ModuleEntry{Module: m, Dependencies: deps, Contracts: protocol.BuiltinContracts(m),
			FailureSemantics: FailureSemantics(), HostInvariants: HostInvariants()}
	}
	return []ModuleEntry{mk("alpha"), mk("beta", "alpha"), mk("gamma", "beta"), mk("delta")}
}

func TestCustomGraphLoadsFromAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "graph.json")
	if err := os.WriteFile(path, graphJSON(t, customGraph()), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := LoadSeamGraph(path)
	if err != nil {
		t.Fatal(err)
	}
	if g.IsBuiltin() || g.Len() != 4 || strings.Join(g.Modules(), ",") != "alpha,beta,gamma,delta" {
		t.Fatalf("custom graph: %v", g.Modules())
	}
	if _, err := LoadSeamGraph(filepath.Dir(path)); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a directory as graph file: %v", err)
	}
}

// TestSeamGraphRejections has one row per graph rule of
// docs/reference/catalog.md; each asserts the field the error names.
func TestSeamGraphRejections(t *testing.T) {
	many := func(n int) []ModuleEntry {
		entries := make([]ModuleEntry, n)
		for i := range entries {
			m := fmt.Sprintf("m%02d", i)
			entries[i] = ModuleEntry{Module: m, Dependencies: []string{}, Contracts: protocol.BuiltinContracts(m),
				FailureSemantics: FailureSemantics(), HostInvariants: HostInvariants()}
		}
		return entries
	}
	tests := []struct {
		name     string
		edit     func([]ModuleEntry) []ModuleEntry
		raw      string // used instead of edit when set
		field    string
		code     string
		sentinel error
		detail   string
	}{
		{name: "a graph of another schema version is refused", raw: `{"schema_version":1,"modules":[]}`,
			field: "schema_version", code: "unsupported_version", sentinel: ErrUnsupportedVersion},
		{name: "a graph without modules is refused", raw: `{"schema_version":2,"modules":[]}`,
			field: "modules", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a graph missing its module list is refused", raw: `{"schema_version":2}`,
			field: "modules", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "an unknown member of an entry is refused", raw: `{"schema_version":2,"modules":[{"module":"a","extra":1}]}`,
			field: "modules[0].extra", code: "schema_mismatch", sentinel: ErrMalformed, detail: "unknown field"},
		{name: "a duplicate key in an entry is refused", raw: `{"schema_version":2,"modules":[{"module":"a","module":"b"}]}`,
			field: "modules[0].module", code: "schema_mismatch", sentinel: ErrMalformed, detail: "duplicate"},
		{name: "a graph over 128 KiB is refused before parsing", raw: `{"schema_version":2,"modules":[` + strings.Repeat(" ", MaxSeamGraphBytes) + `]}`,
			field: "", code: "verification_failed", sentinel: ErrTooLarge},
		{name: "more than 64 modules are refused", edit: func([]ModuleEntry) []ModuleEntry { return many(65) },
			field: "modules", code: "verification_failed", sentinel: ErrTooLarge},
		{name: "a module ID outside the CRD pattern is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[1].Module = "Beta"; return e },
			field: "modules[1].module", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a module listed twice is refused",
			edit: func(e []ModuleEntry) []ModuleEntry {
				e[3].Module = "alpha"
				e[3].Contracts = protocol.BuiltinContracts("other")
				return e
			},
			field: "modules[3].module", code: "verification_failed", sentinel: ErrDuplicate},
		{name: "a contract ID used twice is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[3].Contracts.Stop = e[0].Contracts.Stop; return e },
			field: "modules[3].contracts.stop.id", code: "verification_failed", sentinel: ErrDuplicate, detail: "alpha.stop"},
		{name: "a contract ID with a forbidden byte is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[0].Contracts.Load.ID = "iteron/a b"; return e },
			field: "modules[0].contracts.load.id", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a contract of version 0 is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[0].Contracts.Migrate.Version = 0; return e },
			field: "modules[0].contracts.migrate.version", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "more than 8 dependencies are refused",
			edit: func([]ModuleEntry) []ModuleEntry {
				e := many(10)
				for i := 1; i < 10; i++ {
					e[0].Dependencies = append(e[0].Dependencies, e[i].Module)
				}
				return e
			},
			field: "modules[0].dependencies", code: "verification_failed", sentinel: ErrTooLarge},
		{name: "a dependency on a module outside the graph is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[2].Dependencies = []string{"omega"}; return e },
			field: "modules[2].dependencies[0]", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a dependency listed twice is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[2].Dependencies = []string{"beta", "beta"}; return e },
			field: "modules[2].dependencies[1]", code: "verification_failed", sentinel: ErrDuplicate},
		{name: "a cycle is refused with its whole path",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[0].Dependencies = []string{"gamma"}; return e },
			field: "modules", code: "dependency_cycle", sentinel: ErrCycle, detail: "alpha → gamma → beta → alpha"},
		{name: "a module depending on itself is a cycle",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[3].Dependencies = []string{"delta"}; return e },
			field: "modules", code: "dependency_cycle", sentinel: ErrCycle, detail: "delta → delta"},
		{name: "a dropped host invariant is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[1].HostInvariants = e[1].HostInvariants[1:]; return e },
			field: "modules[1].host_invariants", code: "verification_failed", sentinel: ErrInvalidValue, detail: "activation_and_promotion"},
		{name: "an unknown failure semantic is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[1].FailureSemantics[2] = "fail_open"; return e },
			field: "modules[1].failure_semantics[2]", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a repeated failure semantic is refused",
			edit:  func(e []ModuleEntry) []ModuleEntry { e[1].FailureSemantics[1] = "fail_closed"; return e },
			field: "modules[1].failure_semantics[1]", code: "verification_failed", sentinel: ErrDuplicate},
		{name: "null in place of a list is refused",
			raw:   `{"schema_version":2,"modules":[{"module":"a","dependencies":null}]}`,
			field: "modules[0].dependencies", code: "schema_mismatch", sentinel: ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.raw == "" {
				data = graphJSON(t, tc.edit(customGraph()))
			}
			_, err := ParseSeamGraph(data)
			expectError(t, err, tc.field, tc.code, tc.sentinel, tc.detail)
		})
	}
}

func TestBuiltinRuleWantsExactly28Modules(t *testing.T) {
	_, err := parseSeamGraph(graphJSON(t, specEntries()[:27]), true)
	expectError(t, err, "modules", "verification_failed", ErrInvalidValue, "27 modules, not 28")
	// The same 27 modules are a valid custom graph.
	if _, err := ParseSeamGraph(graphJSON(t, specEntries()[:27])); err != nil {
		t.Fatal(err)
	}
}

func expectError(t *testing.T, err error, field, code string, sentinel error, detail string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *catalog.Error naming %q, got %v", field, err)
	}
	if e.Field != field {
		t.Errorf("field = %q, want %q (error: %v)", e.Field, field, err)
	}
	if e.ReasonCode() != code {
		t.Errorf("reason code = %q, want %q (error: %v)", e.ReasonCode(), code, err)
	}
	if sentinel != nil && !errors.Is(err, sentinel) {
		t.Errorf("error does not wrap %v: %v", sentinel, err)
	}
	if !strings.Contains(err.Error(), detail) {
		t.Errorf("error %q does not say %q", err, detail)
	}
	if field != "" && !strings.HasPrefix(err.Error(), field+": ") {
		t.Errorf("error %q does not start with its field", err)
	}
}
