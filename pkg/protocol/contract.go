package protocol

import "strings"

// ContractRef names one contract of a module's seam-graph entry, e.g.
// {"id":"iteron/prompt.system/lifecycle/load@v1","version":1}.
type ContractRef struct {
	// ID is the contract identity, "iteron/<dotted module>/<role>@v1" in the
	// built-in graph.
	ID string `json:"id"`
	// Version is the contract's version number.
	Version uint32 `json:"version"`
}

// ModuleContracts are the twelve contracts of one module's seam-graph entry
// that requests bind (docs/reference/catalog.md). They come from the graph,
// never from a provider.
type ModuleContracts struct {
	Definition  ContractRef `json:"definition"`
	Provider    ContractRef `json:"provider"`
	Consumer    ContractRef `json:"consumer"`
	Observation ContractRef `json:"observation"`
	Load        ContractRef `json:"load"`
	Start       ContractRef `json:"start"`
	Cancel      ContractRef `json:"cancel"`
	Stop        ContractRef `json:"stop"`
	Snapshot    ContractRef `json:"snapshot"`
	Restore     ContractRef `json:"restore"`
	Migrate     ContractRef `json:"migrate"`
	Readiness   ContractRef `json:"readiness"`
}

// DottedModule returns the contract form of a snake_case module ID: only the
// first '_' becomes '.' (prompt_system → prompt.system, tool_edit_strategy →
// tool.edit_strategy).
func DottedModule(module string) string {
	return strings.Replace(module, "_", ".", 1)
}

// BuiltinContracts returns the contracts the built-in seam graph gives a
// module: "iteron/<dotted module>/<role>@v1", version 1, for every role. The
// seam graph (internal/catalog) is built from this one formula.
func BuiltinContracts(module string) ModuleContracts {
	ref := func(role string) ContractRef {
		return ContractRef{ID: "iteron/" + DottedModule(module) + "/" + role + "@v1", Version: 1}
	}
	return ModuleContracts{
		Definition:  ref("definition"),
		Provider:    ref("provider"),
		Consumer:    ref("consumer"),
		Observation: ref("observation"),
		Load:        ref("lifecycle/load"),
		Start:       ref("lifecycle/start"),
		Cancel:      ref("lifecycle/cancel"),
		Stop:        ref("lifecycle/stop"),
		Snapshot:    ref("lifecycle/snapshot"),
		Restore:     ref("lifecycle/restore"),
		Migrate:     ref("lifecycle/migrate"),
		Readiness:   ref("lifecycle/readiness"),
	}
}
