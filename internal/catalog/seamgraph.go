package catalog

import (
	_ "embed"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/protocol"
)

// Bounds and constants of the capability seam graph
// (docs/reference/catalog.md).
const (
	// SeamGraphSchemaVersion is the family's seam graph schema version (the
	// built-in graph's; SeamGraphRequirementsVersion extends it).
	SeamGraphSchemaVersion = 2
	// BuiltinModuleCount is the number of modules of the built-in graph.
	BuiltinModuleCount = 28
	// MaxCustomModules bounds a custom graph (and so an activation's sources).
	MaxCustomModules = 64
	// MaxGraphDependencies bounds one module's dependencies.
	MaxGraphDependencies = 8
	// MaxSeamGraphBytes bounds a seam graph file (128 KiB).
	MaxSeamGraphBytes = 128 << 10
)

// FailureSemantics are the four failure semantics every graph entry lists.
func FailureSemantics() []string {
	return []string{"fail_closed", "host_cancels_and_reaps", "reject_invalid_evidence", "host_owns_quarantine_and_fallback"}
}

// HostInvariants are the seven host invariants no provider can replace; every
// graph entry lists them.
func HostInvariants() []string {
	return []string{
		"activation_and_promotion", "capability_and_permission", "budget_and_deadline",
		"cancellation_and_process_reaping", "evidence_durability", "replay_and_identity",
		"trust_and_secret_handling",
	}
}

//go:embed seamgraph.json
var builtinSeamGraph []byte

// BuiltinSeamGraphJSON returns the embedded built-in graph file (a copy).
func BuiltinSeamGraphJSON() []byte { return slices.Clone(builtinSeamGraph) }

// ModuleEntry is one module of a seam graph: its dependencies (modules that
// must be activated before it), the contracts requests bind, its failure
// semantics and the host invariants.
type ModuleEntry struct {
	// Module is the snake_case module ID.
	Module string `json:"module"`
	// Dependencies are the modules this one depends on, as plain module
	// IDs: ordered before it and part of its epoch when they have a source,
	// never gating when they have none.
	Dependencies []string `json:"dependencies"`
	// Contracts are the twelve contract references of the module.
	Contracts protocol.ModuleContracts `json:"contracts"`
	// FailureSemantics are the four failure semantics (FailureSemantics()).
	FailureSemantics []string `json:"failure_semantics"`
	// HostInvariants are the seven host invariants (HostInvariants()).
	HostInvariants []string `json:"host_invariants"`
	// Requirements are the typed dependencies (schema version 3); with
	// Dependencies at most 8 in all.
	Requirements []Requirement `json:"-"`
	// Provides are contracts the module offers other modules' requirements
	// (schema version 3).
	Provides []ProvidedContract `json:"-"`
	// ContractSchemas are the schema hashes of Contracts by role (schema
	// version 3); nil when none is given.
	ContractSchemas map[string]string `json:"-"`

	// requirementIndex is each requirement's index in the file's
	// dependencies array, for errors.
	requirementIndex []int
}

// seamGraphFile is the file form: {"schema_version":2|3,"modules":[…]}.
type seamGraphFile struct {
	SchemaVersion *uint32            `json:"schema_version"`
	Modules       *[]moduleEntryWire `json:"modules"`
}

type moduleEntryWire struct {
	Module           *string            `json:"module"`
	Dependencies     *[]jsontext.Value  `json:"dependencies"`
	Contracts        *contractsWire     `json:"contracts"`
	FailureSemantics *[]string          `json:"failure_semantics"`
	HostInvariants   *[]string          `json:"host_invariants"`
	Provides         *[]contractRefWire `json:"provides"`
}

// SeamGraph is a validated capability seam graph; it is immutable, and every
// accessor returns copies. Its file order is the ModuleId order.
type SeamGraph struct {
	entries []ModuleEntry
	index   map[string]int
	builtin bool
	version uint32
}

var builtinGraph = sync.OnceValue(func() *SeamGraph {
	g, err := parseSeamGraph(builtinSeamGraph, true)
	if err != nil {
		// The embedded file is checked by this package's tests; a build
		// with a broken one must not start.
		panic("catalog: the embedded built-in seam graph is invalid: " + err.Error())
	}
	return g
})

// BuiltinSeamGraph returns the built-in graph of docs/reference/catalog.md: 28
// modules in ModuleId order, each with the contracts protocol.BuiltinContracts
// gives.
func BuiltinSeamGraph() *SeamGraph { return builtinGraph() }

// ParseSeamGraph parses and validates a custom graph (our extension): at most
// 128 KiB, schema version 2 or 3 (typed requirements), 1–64 modules matching ^[a-z][a-z0-9_]{0,47}$,
// unique modules and contract IDs, at most 8 known dependencies each, every
// failure semantic and host invariant listed, and no dependency cycle (the
// error names the whole cycle).
func ParseSeamGraph(data []byte) (*SeamGraph, error) {
	g, err := parseSeamGraph(data, false)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// LoadSeamGraph reads a custom graph file (a regular file, read with the
// 128 KiB bound) and parses it with ParseSeamGraph.
func LoadSeamGraph(path string) (*SeamGraph, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("seam graph %s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSeamGraphBytes+1))
	if err != nil {
		return nil, fmt.Errorf("seam graph %s: %w", path, err)
	}
	g, perr := parseSeamGraph(data, false)
	if perr != nil {
		return nil, fmt.Errorf("seam graph %s: %w", path, perr)
	}
	return g, nil
}

func parseSeamGraph(data []byte, builtin bool) (*SeamGraph, *Error) {
	var file seamGraphFile
	if err := DecodeStrict(data, &file, MaxSeamGraphBytes, ""); err != nil {
		return nil, err
	}
	version, err := required("schema_version", file.SchemaVersion)
	if err != nil {
		return nil, err
	}
	switch {
	case builtin && version != SeamGraphSchemaVersion:
		return nil, invalidf("schema_version", ErrUnsupportedVersion, "the built-in graph has schema version %d, not %d", SeamGraphSchemaVersion, version)
	case version != SeamGraphSchemaVersion && version != SeamGraphRequirementsVersion:
		return nil, invalidf("schema_version", ErrUnsupportedVersion, "seam graph schema version %d is not supported (%d, or %d with typed requirements)", version, SeamGraphSchemaVersion, SeamGraphRequirementsVersion)
	}
	wires, err := required("modules", file.Modules)
	if err != nil {
		return nil, err
	}
	switch {
	case builtin && len(wires) != BuiltinModuleCount:
		return nil, invalidf("modules", ErrInvalidValue, "the built-in graph has %d modules, not %d", len(wires), BuiltinModuleCount)
	case len(wires) == 0:
		return nil, invalidf("modules", ErrInvalidValue, "a graph needs at least one module")
	case len(wires) > MaxCustomModules:
		return nil, invalidf("modules", ErrTooLarge, "%d modules exceed %d", len(wires), MaxCustomModules)
	}
	g := &SeamGraph{entries: make([]ModuleEntry, 0, len(wires)), index: make(map[string]int, len(wires)), builtin: builtin, version: version}
	for i, w := range wires {
		e, err := w.entry(Index("modules", i), version)
		if err != nil {
			return nil, err
		}
		if j, dup := g.index[e.Module]; dup {
			return nil, invalidf(Field(Index("modules", i), "module"), ErrDuplicate, "%q is already modules[%d]", e.Module, j)
		}
		g.index[e.Module] = i
		g.entries = append(g.entries, e)
	}
	if err := g.check(); err != nil {
		return nil, err
	}
	return g, nil
}

func (w moduleEntryWire) entry(field string, version uint32) (ModuleEntry, *Error) {
	var e ModuleEntry
	var err *Error
	if e.Module, err = required(Field(field, "module"), w.Module); err != nil {
		return e, err
	}
	if !IsModuleID(e.Module) {
		return e, invalidf(Field(field, "module"), ErrInvalidValue, "%q is not a module ID (^[a-z][a-z0-9_]{0,47}$)", e.Module)
	}
	deps, err := required(Field(field, "dependencies"), w.Dependencies)
	if err != nil {
		return e, err
	}
	e.Dependencies = []string{}
	for j, raw := range deps {
		d, r, err := dependency(Index(Field(field, "dependencies"), j), raw, version)
		if err != nil {
			return e, err
		}
		if r != nil {
			e.Requirements = append(e.Requirements, *r)
			e.requirementIndex = append(e.requirementIndex, j)
			continue
		}
		e.Dependencies = append(e.Dependencies, d)
	}
	contracts, err := required(Field(field, "contracts"), w.Contracts)
	if err != nil {
		return e, err
	}
	refs, schemas, err := contracts.refs(Field(field, "contracts"), version)
	if err != nil {
		return e, err
	}
	e.Contracts, e.ContractSchemas = moduleContracts(refs), schemas
	if w.Provides != nil {
		pf := Field(field, "provides")
		if version < SeamGraphRequirementsVersion {
			return e, invalidf(pf, ErrInvalidValue, "provided contracts need schema_version %d", SeamGraphRequirementsVersion)
		}
		if len(*w.Provides) > MaxProvidedContracts {
			return e, invalidf(pf, ErrTooLarge, "%d provided contracts exceed %d", len(*w.Provides), MaxProvidedContracts)
		}
		for j, pw := range *w.Provides {
			p, err := pw.provided(Index(pf, j))
			if err != nil {
				return e, err
			}
			if slices.ContainsFunc(e.Provides, func(o ProvidedContract) bool { return o.ID == p.ID }) {
				return e, invalidf(Field(Index(pf, j), "id"), ErrDuplicate, "%q is listed twice", p.ID)
			}
			e.Provides = append(e.Provides, p)
		}
	}
	if e.FailureSemantics, err = required(Field(field, "failure_semantics"), w.FailureSemantics); err != nil {
		return e, err
	}
	if e.HostInvariants, err = required(Field(field, "host_invariants"), w.HostInvariants); err != nil {
		return e, err
	}
	if err := checkExactSet(Field(field, "failure_semantics"), e.FailureSemantics, FailureSemantics()); err != nil {
		return e, err
	}
	if err := checkExactSet(Field(field, "host_invariants"), e.HostInvariants, HostInvariants()); err != nil {
		return e, err
	}
	return e, nil
}

// checkExactSet requires got to hold every member of want exactly once (in
// any order): a graph may not drop a host invariant or a failure semantic.
func checkExactSet(field string, got, want []string) *Error {
	for i, s := range got {
		if !slices.Contains(want, s) {
			return invalidf(Index(field, i), ErrInvalidValue, "%q is not one of %s", s, strings.Join(want, ", "))
		}
		if slices.Index(got, s) != i {
			return invalidf(Index(field, i), ErrDuplicate, "%q is listed twice", s)
		}
	}
	for _, s := range want {
		if !slices.Contains(got, s) {
			return invalidf(field, ErrInvalidValue, "%q is missing: every entry lists all of %s", s, strings.Join(want, ", "))
		}
	}
	return nil
}

// check validates what spans entries: contract IDs unique across the graph,
// dependency bounds and names, and acyclicity.
func (g *SeamGraph) check() *Error {
	contractOwner := make(map[string]string)
	for i, e := range g.entries {
		field := Index("modules", i)
		for _, c := range contractList(e.Contracts) {
			cf := Field(Field(field, "contracts"), c.role)
			if !IsContractID(c.ref.ID) {
				return invalidf(Field(cf, "id"), ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-/:@+]", c.ref.ID, MaxContractIDBytes)
			}
			if c.ref.Version < 1 {
				return invalidf(Field(cf, "version"), ErrInvalidValue, "contract version must be at least 1")
			}
			if owner, dup := contractOwner[c.ref.ID]; dup {
				return invalidf(Field(cf, "id"), ErrDuplicate, "contract %q is already used by %s", c.ref.ID, owner)
			}
			contractOwner[c.ref.ID] = e.Module + "." + c.role
		}
		if n := len(e.Dependencies) + len(e.Requirements); n > MaxGraphDependencies {
			return invalidf(Field(field, "dependencies"), ErrTooLarge, "%d dependencies exceed %d", n, MaxGraphDependencies)
		}
		for j, d := range e.Dependencies {
			df := Index(Field(field, "dependencies"), dependencyIndex(e, j))
			if _, ok := g.index[d]; !ok {
				return invalidf(df, ErrInvalidValue, "%q is not a module of this graph", d)
			}
			if slices.Index(e.Dependencies, d) != j {
				return invalidf(df, ErrDuplicate, "%q is listed twice", d)
			}
		}
	}
	if err := g.checkRequirements(); err != nil {
		return err
	}
	if cycle := g.findCycle(); cycle != nil {
		return invalidf("modules", ErrCycle, "dependency cycle: %s", strings.Join(cycle, " → "))
	}
	return nil
}

// findCycle returns the first dependency cycle found by a depth-first search
// in ModuleId order, as the closed path a → b → … → a, or nil.
func (g *SeamGraph) findCycle() []string {
	const (
		unvisited = iota
		onStack
		done
	)
	state := make([]int, len(g.entries))
	var stack []int
	var cycle []string
	var visit func(i int) bool
	visit = func(i int) bool {
		state[i] = onStack
		stack = append(stack, i)
		for _, d := range g.edges(i) {
			j := g.index[d]
			switch state[j] {
			case onStack:
				start := slices.Index(stack, j)
				for _, k := range stack[start:] {
					cycle = append(cycle, g.entries[k].Module)
				}
				cycle = append(cycle, g.entries[j].Module)
				return true
			case unvisited:
				if visit(j) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[i] = done
		return false
	}
	for i := range g.entries {
		if state[i] == unvisited && visit(i) {
			return cycle
		}
	}
	return nil
}

type roleRef struct {
	role string
	ref  protocol.ContractRef
}

func contractList(c protocol.ModuleContracts) []roleRef {
	return []roleRef{
		{"definition", c.Definition}, {"provider", c.Provider}, {"consumer", c.Consumer},
		{"observation", c.Observation}, {"load", c.Load}, {"start", c.Start}, {"cancel", c.Cancel},
		{"stop", c.Stop}, {"snapshot", c.Snapshot}, {"restore", c.Restore}, {"migrate", c.Migrate},
		{"readiness", c.Readiness},
	}
}

// edges are the modules entry i may depend on: its plain dependencies, the
// modules it requires, and every other provider of a contract it requires
// (the selected one only, when selected): a graph is acyclic for any
// activation.
func (g *SeamGraph) edges(i int) []string {
	e := g.entries[i]
	out := slices.Clone(e.Dependencies)
	for _, r := range e.Requirements {
		switch {
		case r.Module != "":
			out = append(out, r.Module)
		case r.Select != "":
			out = append(out, r.Select)
		default:
			for _, p := range g.contractProviders()[r.Contract] {
				if p != e.Module {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// dependencyIndex is the index in the file's dependencies array of e's j-th
// plain dependency (requirements sit between them).
func dependencyIndex(e ModuleEntry, j int) int {
	for _, k := range e.requirementIndex {
		if k <= j {
			j++
		}
	}
	return j
}

func moduleContracts(refs []roleRef) protocol.ModuleContracts {
	by := map[string]protocol.ContractRef{}
	for _, r := range refs {
		by[r.role] = r.ref
	}
	return protocol.ModuleContracts{
		Definition: by["definition"], Provider: by["provider"], Consumer: by["consumer"], Observation: by["observation"],
		Load: by["load"], Start: by["start"], Cancel: by["cancel"], Stop: by["stop"], Snapshot: by["snapshot"],
		Restore: by["restore"], Migrate: by["migrate"], Readiness: by["readiness"],
	}
}

// SchemaVersion is the graph file's schema version (2, or 3 with typed
// requirements).
func (g *SeamGraph) SchemaVersion() uint32 { return g.version }

// IsBuiltin reports whether g is the built-in graph.
func (g *SeamGraph) IsBuiltin() bool { return g.builtin }

// Len is the number of modules.
func (g *SeamGraph) Len() int { return len(g.entries) }

// Modules returns the module IDs in ModuleId order.
func (g *SeamGraph) Modules() []string {
	out := make([]string, len(g.entries))
	for i, e := range g.entries {
		out[i] = e.Module
	}
	return out
}

// Has reports whether module is in the graph.
func (g *SeamGraph) Has(module string) bool {
	_, ok := g.index[module]
	return ok
}

// Order is module's position in ModuleId order (0-based), or false.
func (g *SeamGraph) Order(module string) (int, bool) {
	i, ok := g.index[module]
	return i, ok
}

// Entry returns module's entry (a deep copy), or false.
func (g *SeamGraph) Entry(module string) (ModuleEntry, bool) {
	i, ok := g.index[module]
	if !ok {
		return ModuleEntry{}, false
	}
	e := g.entries[i]
	e.Dependencies = slices.Clone(e.Dependencies)
	e.Requirements = cloneRequirements(e.Requirements)
	e.Provides = slices.Clone(e.Provides)
	e.ContractSchemas = maps.Clone(e.ContractSchemas)
	e.requirementIndex = slices.Clone(e.requirementIndex)
	e.FailureSemantics = slices.Clone(e.FailureSemantics)
	e.HostInvariants = slices.Clone(e.HostInvariants)
	return e, true
}

// Dependencies returns the modules module depends on, as the graph lists
// them (nil for an unknown module).
func (g *SeamGraph) Dependencies(module string) []string {
	i, ok := g.index[module]
	if !ok {
		return nil
	}
	return slices.Clone(g.entries[i].Dependencies)
}

// Contracts returns the contracts requests to module must bind, or false.
func (g *SeamGraph) Contracts(module string) (protocol.ModuleContracts, bool) {
	i, ok := g.index[module]
	if !ok {
		return protocol.ModuleContracts{}, false
	}
	return g.entries[i].Contracts, true
}
