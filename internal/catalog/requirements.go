package catalog

import (
	"slices"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// SeamGraphRequirementsVersion is the seam graph schema version that adds
// typed requirements (our extension): dependency objects with a version
// range and optional, provided contracts, and contract schema hashes. The
// family's files stay at SeamGraphSchemaVersion and are read unchanged.
const SeamGraphRequirementsVersion = 3

// MaxProvidedContracts bounds one module's provides list.
const MaxProvidedContracts = 16

// VersionRange bounds the implementation_version of the source a
// requirement binds: at least Minimum (inclusive) and below Maximum
// (exclusive). A nil bound is open.
type VersionRange struct {
	// Minimum is the lowest accepted version; nil accepts any.
	Minimum *Version
	// Maximum is the first version no longer accepted; nil accepts any.
	Maximum *Version
}

// Contains reports whether v lies in the range.
func (r VersionRange) Contains(v Version) bool {
	if r.Minimum != nil && v.Compare(*r.Minimum) < 0 {
		return false
	}
	return r.Maximum == nil || v.Compare(*r.Maximum) < 0
}

// IsAny reports whether the range has no bound.
func (r VersionRange) IsAny() bool { return r.Minimum == nil && r.Maximum == nil }

// String prints the range as status messages show it: "[1.2.0, 2.0.0)",
// "≥ 1.2.0", "< 2.0.0" or "any version".
func (r VersionRange) String() string {
	switch {
	case r.Minimum != nil && r.Maximum != nil:
		return "[" + r.Minimum.String() + ", " + r.Maximum.String() + ")"
	case r.Minimum != nil:
		return "≥ " + r.Minimum.String()
	case r.Maximum != nil:
		return "< " + r.Maximum.String()
	}
	return "any version"
}

// Requirement is a typed dependency of a schema-version-3 graph entry: on a
// module, or on a contract that modules provide. Unlike a plain dependency
// (a module ID string), a requirement that is not optional gates its
// consumer when nothing satisfies it, including when its module has no
// source in the activation.
type Requirement struct {
	// Module is the module required ("" when Contract is set).
	Module string
	// Contract is a contract ID some modules list in provides ("" when
	// Module is set).
	Contract string
	// Select chooses, with Contract, which providing module binds it; ""
	// binds the only provider present, and two present are a conflict.
	Select string
	// Range bounds the bound source's implementation_version.
	Range VersionRange
	// Optional requirements never gate: an unsatisfied one is a diagnostic
	// of an admitted consumer.
	Optional bool
}

// Target names what the requirement binds, as messages say it: the module,
// or "contract <id>".
func (r Requirement) Target() string {
	if r.Contract != "" {
		return "contract " + r.Contract
	}
	return r.Module
}

// ProvidedContract is a contract a module's implementations offer to other
// modules (schema version 3): several modules may provide the same one.
type ProvidedContract struct {
	// ID is the contract ID.
	ID string
	// Version is the contract's version number (≥ 1).
	Version uint32
	// SchemaSHA256 is the digest of the contract's schema ("sha256:…"), or
	// "": it takes part in the epoch of the providing module and of every
	// module that binds it.
	SchemaSHA256 string
}

// requirementWire is a dependency object as decoded.
type requirementWire struct {
	Module       *string           `json:"module"`
	Contract     *string           `json:"contract"`
	Select       *string           `json:"select"`
	VersionRange *versionRangeWire `json:"version_range"`
	Optional     *bool             `json:"optional"`
}

type versionRangeWire struct {
	Minimum *Version `json:"minimum"`
	Maximum *Version `json:"maximum"`
}

// contractRefWire is a ContractRef as a graph file writes it; schema_sha256
// is allowed from schema version 3 on.
type contractRefWire struct {
	ID           string  `json:"id"`
	Version      uint32  `json:"version"`
	SchemaSHA256 *string `json:"schema_sha256"`
}

type contractsWire struct {
	Definition  contractRefWire `json:"definition"`
	Provider    contractRefWire `json:"provider"`
	Consumer    contractRefWire `json:"consumer"`
	Observation contractRefWire `json:"observation"`
	Load        contractRefWire `json:"load"`
	Start       contractRefWire `json:"start"`
	Cancel      contractRefWire `json:"cancel"`
	Stop        contractRefWire `json:"stop"`
	Snapshot    contractRefWire `json:"snapshot"`
	Restore     contractRefWire `json:"restore"`
	Migrate     contractRefWire `json:"migrate"`
	Readiness   contractRefWire `json:"readiness"`
}

// dependency decodes one element of a dependencies array: a module ID
// string (every version), or a requirement object (version 3).
func dependency(field string, raw jsontext.Value, version uint32) (string, *Requirement, *Error) {
	switch raw.Kind() {
	case '"':
		var s string
		if err := DecodeStrict(raw, &s, MaxSeamGraphBytes, field); err != nil {
			return "", nil, err
		}
		return s, nil, nil
	case '{':
		if version < SeamGraphRequirementsVersion {
			return "", nil, invalidf(field, ErrInvalidValue, "a dependency object (a typed requirement) needs schema_version %d; schema version %d lists module IDs", SeamGraphRequirementsVersion, version)
		}
		var w requirementWire
		if err := DecodeStrict(raw, &w, MaxSeamGraphBytes, field); err != nil {
			return "", nil, err
		}
		r, err := w.requirement(field)
		return "", r, err
	}
	return "", nil, invalidf(field, ErrMalformed, "a dependency is a module ID string or (schema version %d) an object {module | contract, select, version_range, optional}", SeamGraphRequirementsVersion)
}

func (w requirementWire) requirement(field string) (*Requirement, *Error) {
	r := &Requirement{}
	switch {
	case w.Module != nil && w.Contract != nil:
		return nil, invalidf(field, ErrInvalidValue, "a requirement names a module or a contract, not both")
	case w.Module != nil:
		r.Module = *w.Module
		if !IsModuleID(r.Module) {
			return nil, invalidf(Field(field, "module"), ErrInvalidValue, "%q is not a module ID (^[a-z][a-z0-9_]{0,47}$)", r.Module)
		}
		if w.Select != nil {
			return nil, invalidf(Field(field, "select"), ErrInvalidValue, "select chooses among a contract's providers; a module requirement names its module already")
		}
	case w.Contract != nil:
		r.Contract = *w.Contract
		if !IsContractID(r.Contract) {
			return nil, invalidf(Field(field, "contract"), ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-/:@+]", r.Contract, MaxContractIDBytes)
		}
		if w.Select != nil {
			r.Select = *w.Select
			if !IsModuleID(r.Select) {
				return nil, invalidf(Field(field, "select"), ErrInvalidValue, "%q is not a module ID (^[a-z][a-z0-9_]{0,47}$)", r.Select)
			}
		}
	default:
		return nil, invalidf(field, ErrMissingField, "a requirement names a module (\"module\") or a contract (\"contract\")")
	}
	if w.Optional != nil {
		r.Optional = *w.Optional
	}
	if vr := w.VersionRange; vr != nil {
		rf := Field(field, "version_range")
		if vr.Minimum == nil && vr.Maximum == nil {
			return nil, invalidf(rf, ErrMissingField, "a version range has a minimum, a maximum or both (leave version_range out for any version)")
		}
		r.Range = VersionRange{Minimum: vr.Minimum, Maximum: vr.Maximum}
		if vr.Maximum != nil && *vr.Maximum == (Version{}) {
			return nil, invalidf(Field(rf, "maximum"), ErrInvalidValue, "maximum [0,0,0] admits no version (the maximum is exclusive)")
		}
		if vr.Minimum != nil && vr.Maximum != nil && vr.Minimum.Compare(*vr.Maximum) >= 0 {
			return nil, invalidf(rf, ErrInvalidValue, "minimum %s is not below maximum %s (the minimum is inclusive, the maximum exclusive)", vr.Minimum, vr.Maximum)
		}
	}
	return r, nil
}

// refs returns the twelve contracts as the protocol uses them, and the
// schema hashes by role.
func (c contractsWire) refs(field string, version uint32) ([]roleRef, map[string]string, *Error) {
	wires := []struct {
		role string
		w    contractRefWire
	}{
		{"definition", c.Definition}, {"provider", c.Provider}, {"consumer", c.Consumer},
		{"observation", c.Observation}, {"load", c.Load}, {"start", c.Start}, {"cancel", c.Cancel},
		{"stop", c.Stop}, {"snapshot", c.Snapshot}, {"restore", c.Restore}, {"migrate", c.Migrate},
		{"readiness", c.Readiness},
	}
	var refs []roleRef
	var schemas map[string]string
	for _, x := range wires {
		refs = append(refs, roleRef{role: x.role})
		refs[len(refs)-1].ref.ID, refs[len(refs)-1].ref.Version = x.w.ID, x.w.Version
		if x.w.SchemaSHA256 == nil {
			continue
		}
		sf := Field(Field(field, x.role), "schema_sha256")
		if err := checkSchemaHash(sf, *x.w.SchemaSHA256, version); err != nil {
			return nil, nil, err
		}
		if schemas == nil {
			schemas = map[string]string{}
		}
		schemas[x.role] = *x.w.SchemaSHA256
	}
	return refs, schemas, nil
}

func checkSchemaHash(field, h string, version uint32) *Error {
	if version < SeamGraphRequirementsVersion {
		return invalidf(field, ErrInvalidValue, "schema hashes need schema_version %d", SeamGraphRequirementsVersion)
	}
	if !IsDigest(h) {
		return invalidf(field, ErrInvalidValue, "%q is not sha256: and 64 lowercase hex digits", h)
	}
	return nil
}

func (w contractRefWire) provided(field string) (ProvidedContract, *Error) {
	p := ProvidedContract{ID: w.ID, Version: w.Version}
	if !IsContractID(p.ID) {
		return p, invalidf(Field(field, "id"), ErrInvalidValue, "%q is not 1–%d bytes of [A-Za-z0-9._-/:@+]", p.ID, MaxContractIDBytes)
	}
	if p.Version < 1 {
		return p, invalidf(Field(field, "version"), ErrInvalidValue, "contract version must be at least 1")
	}
	if w.SchemaSHA256 != nil {
		if err := checkSchemaHash(Field(field, "schema_sha256"), *w.SchemaSHA256, SeamGraphRequirementsVersion); err != nil {
			return p, err
		}
		p.SchemaSHA256 = *w.SchemaSHA256
	}
	return p, nil
}

// checkRequirements validates what spans entries: a module requirement
// names a module of the graph other than its own, a contract requirement a
// contract some other module provides, a selection one of those providers;
// no target twice in one entry.
func (g *SeamGraph) checkRequirements() *Error {
	providers := g.contractProviders()
	for i, e := range g.entries {
		field := Index("modules", i)
		for j, r := range e.Requirements {
			df := Index(Field(field, "dependencies"), e.requirementIndex[j])
			switch {
			case r.Module != "":
				if _, ok := g.index[r.Module]; !ok {
					return invalidf(Field(df, "module"), ErrInvalidValue, "%q is not a module of this graph", r.Module)
				}
				if r.Module == e.Module {
					return invalidf(Field(df, "module"), ErrInvalidValue, "%s cannot require itself", e.Module)
				}
				if slices.Contains(e.Dependencies, r.Module) {
					return invalidf(Field(df, "module"), ErrDuplicate, "%q is also a plain dependency of %s", r.Module, e.Module)
				}
			default:
				ps := slices.DeleteFunc(slices.Clone(providers[r.Contract]), func(m string) bool { return m == e.Module })
				if len(ps) == 0 {
					return invalidf(Field(df, "contract"), ErrInvalidValue, "no other module of this graph provides %q", r.Contract)
				}
				if r.Select != "" && !slices.Contains(ps, r.Select) {
					return invalidf(Field(df, "select"), ErrInvalidValue, "%q does not provide %q (its providers: %s)", r.Select, r.Contract, strings.Join(ps, ", "))
				}
			}
			for k, o := range e.Requirements[:j] {
				if o.Module == r.Module && o.Contract == r.Contract {
					return invalidf(df, ErrDuplicate, "%s is already required by requirement %d of %s", r.Target(), k, e.Module)
				}
			}
		}
	}
	return nil
}

// contractProviders maps each provided contract to its providing modules in
// ModuleId order.
func (g *SeamGraph) contractProviders() map[string][]string {
	out := map[string][]string{}
	for _, e := range g.entries {
		for _, p := range e.Provides {
			out[p.ID] = append(out[p.ID], e.Module)
		}
	}
	return out
}

// Requirements returns module's typed requirements (schema version 3), in
// file order (nil for an unknown module or a graph without them).
func (g *SeamGraph) Requirements(module string) []Requirement {
	i, ok := g.index[module]
	if !ok {
		return nil
	}
	return cloneRequirements(g.entries[i].Requirements)
}

// Providers returns the modules that provide contract, in ModuleId order.
func (g *SeamGraph) Providers(contract string) []string {
	return g.contractProviders()[contract]
}

// Provided returns module's provided contract id, or false.
func (g *SeamGraph) Provided(module, contract string) (ProvidedContract, bool) {
	i, ok := g.index[module]
	if !ok {
		return ProvidedContract{}, false
	}
	for _, p := range g.entries[i].Provides {
		if p.ID == contract {
			return p, true
		}
	}
	return ProvidedContract{}, false
}

// SchemaHashes returns the schema hashes module's entry carries, keyed by
// role ("consumer", …) for its twelve contracts and by "provides:<id>" for
// its provided contracts; nil when it carries none.
func (g *SeamGraph) SchemaHashes(module string) map[string]string {
	i, ok := g.index[module]
	if !ok {
		return nil
	}
	e := g.entries[i]
	var out map[string]string
	put := func(k, v string) {
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	for role, h := range e.ContractSchemas {
		put(role, h)
	}
	for _, p := range e.Provides {
		if p.SchemaSHA256 != "" {
			put("provides:"+p.ID, p.SchemaSHA256)
		}
	}
	return out
}

func cloneRequirements(rs []Requirement) []Requirement {
	if rs == nil {
		return nil
	}
	out := make([]Requirement, len(rs))
	for i, r := range rs {
		out[i] = r
		if r.Range.Minimum != nil {
			v := *r.Range.Minimum
			out[i].Range.Minimum = &v
		}
		if r.Range.Maximum != nil {
			v := *r.Range.Maximum
			out[i].Range.Maximum = &v
		}
	}
	return out
}

// String is the requirement as the graph file writes it, for messages.
func (r Requirement) String() string {
	s := r.Target()
	if r.Select != "" {
		s += " (select " + r.Select + ")"
	}
	if !r.Range.IsAny() {
		s += " " + r.Range.String()
	}
	if r.Optional {
		s += " (optional)"
	}
	return s
}
