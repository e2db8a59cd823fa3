package graph

import (
	"cmp"
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/strictjson"
)

// Node is a verified source as the graph sees it.
type Node struct {
	// Module is the module the source fills.
	Module string
	// ImplementationID is the verified manifest's implementation_id.
	ImplementationID string
	// Version is the manifest's implementation_version.
	Version catalog.Version
	// ArtifactSHA256 is the verified executable digest ("sha256:…").
	ArtifactSHA256 string
	// Dependencies are the manifest's implementation dependencies.
	Dependencies []catalog.Dependency
}

// Rejected is a source of the activation that failed verification: present,
// so it gates the modules that depend on it, but never admitted.
type Rejected struct {
	// Module is the module as written.
	Module string
	// ImplementationID is the implementation ID as written.
	ImplementationID string
	// Reason is the reason code of the failure (docs/reference/reasons.md).
	Reason string
	// Message is the failure, naming the field.
	Message string
}

// Input is one activation's verified and rejected sources, and the seam
// graph they are placed in.
type Input struct {
	// Graph is the node's seam graph (nil: the built-in graph).
	Graph *catalog.SeamGraph
	// Admitted are the sources that passed verification.
	Admitted []Node
	// Rejected are the sources that did not.
	Rejected []Rejected
}

// FromVerification turns a verification result into the graph's input.
func FromVerification(g *catalog.SeamGraph, res *verifier.Result) Input {
	in := Input{Graph: g}
	for _, s := range res.Sources {
		if s.Verified != nil {
			v := s.Verified
			in.Admitted = append(in.Admitted, Node{
				Module: v.Module, ImplementationID: v.ImplementationID, Version: v.Version,
				ArtifactSHA256: v.ArtifactSHA256, Dependencies: slices.Clone(v.Manifest.Dependencies),
			})
			continue
		}
		in.Rejected = append(in.Rejected, Rejected{
			Module: s.Module, ImplementationID: s.ImplementationID, Reason: s.Err.ReasonCode(), Message: s.Err.Error(),
		})
	}
	return in
}

// ModuleStatus is one source's place in the evaluated graph.
type ModuleStatus struct {
	// Module is the module ID.
	Module string `json:"module"`
	// ImplementationID is the source's implementation.
	ImplementationID string `json:"implementationID"`
	// Admitted is true when the module may be activated.
	Admitted bool `json:"admitted"`
	// Identity is module|implementation_id|version|artifact_sha256 (admitted only).
	Identity string `json:"identity,omitempty"`
	// Epoch is the digest over the identity and the direct dependencies'
	// identities (admitted only).
	Epoch string `json:"epoch,omitempty"`
	// DependsOn are the direct dependencies present in the activation, in
	// ModuleId order.
	DependsOn []string `json:"dependsOn,omitempty"`
	// Reason is the reason code when not admitted (docs/reference/reasons.md).
	Reason string `json:"reason,omitempty"`
	// Message explains Reason (at most 1 KiB).
	Message string `json:"message,omitempty"`
	// Diagnostics are what an admitted module runs without: each optional
	// requirement that nothing satisfies, in the graph's order (at most 8,
	// each at most 1 KiB).
	Diagnostics []string `json:"diagnostics,omitempty"`
}

// Evaluation is an activation placed in its graph: every source's status in
// ModuleId order (modules outside the graph last), and the orders of the
// admitted modules.
type Evaluation struct {
	// Modules are the statuses, in ModuleId order.
	Modules []ModuleStatus `json:"modules"`
	// ActivateOrder is every admitted module, dependencies first, ties in
	// ModuleId order.
	ActivateOrder []string `json:"activateOrder"`
	// DrainOrder is ActivateOrder reversed.
	DrainOrder []string `json:"drainOrder"`
}

// Status returns module's status, or false.
func (e *Evaluation) Status(module string) (ModuleStatus, bool) {
	i := slices.IndexFunc(e.Modules, func(s ModuleStatus) bool { return s.Module == module })
	if i < 0 {
		return ModuleStatus{}, false
	}
	return e.Modules[i], true
}

// Identity is a module's identity: module|implementation_id|version|artifact.
func Identity(module, implementationID string, version catalog.Version, artifactSHA256 string) string {
	return module + "|" + implementationID + "|" + version.String() + "|" + artifactSHA256
}

// Epoch is "sha256:" over the compact JSON array [identity, dependency
// identities...]; pass the dependencies' identities in ModuleId order.
func Epoch(identity string, dependencyIdentities []string) string {
	b, err := strictjson.Canonical(append([]string{identity}, dependencyIdentities...))
	if err != nil {
		// Identities are built from validated ASCII fields; a caller with
		// invalid UTF-8 still gets a total function.
		h := sha256.Sum256([]byte(strings.Join(append([]string{identity}, dependencyIdentities...), "\n")))
		return "sha256:" + hex.EncodeToString(h[:])
	}
	return strictjson.Digest(b)
}

// maxMessageBytes bounds a status message (the CRD's bound).
const maxMessageBytes = v1alpha1.MaxMessageBytes

type vertex struct {
	module   string
	order    int
	node     *Node     // admitted
	rejected *Rejected // failed verification
	deps     []int     // direct dependencies present in the activation (vertex indexes), ModuleId order
	// unmet is the first implementation dependency or required
	// requirement not satisfied, in words.
	unmet string
	// conflict names the first contract requirement with several
	// providers and no selection.
	conflict string
	// optional maps a dependency (vertex index) bound by an optional
	// requirement to the requirement in words: it gates nothing.
	optional map[int]string
	// diagnostics are the admitted module's unmet optional requirements.
	diagnostics []string

	resolved bool
	admitted bool
	reason   string
	message  string
	// cause is the root cause in words, carried up a dependency chain.
	cause string
	chain []string
}

// Evaluate places an activation in its seam graph. The error is for input
// no verification produces (a module twice, an admitted module outside the
// graph, an implementation ID twice); every dependency problem is a status,
// never an error or a panic.
func Evaluate(in Input) (*Evaluation, error) {
	g := in.Graph
	if g == nil {
		g = catalog.BuiltinSeamGraph()
	}
	var vs []*vertex
	byModule := map[string]int{}
	byImpl := map[string]int{}
	add := func(v *vertex, implID string) error {
		if _, dup := byModule[v.module]; dup {
			return fmt.Errorf("graph: module %q has two sources", v.module)
		}
		if _, dup := byImpl[implID]; dup && implID != "" {
			return fmt.Errorf("graph: implementation %q fills two modules", implID)
		}
		byModule[v.module] = len(vs)
		if implID != "" {
			byImpl[implID] = len(vs)
		}
		vs = append(vs, v)
		return nil
	}
	for i := range in.Admitted {
		n := &in.Admitted[i]
		order, ok := g.Order(n.Module)
		if !ok {
			return nil, fmt.Errorf("graph: admitted module %q is not in the seam graph", n.Module)
		}
		if err := add(&vertex{module: n.Module, order: order, node: n}, n.ImplementationID); err != nil {
			return nil, err
		}
	}
	for i := range in.Rejected {
		r := &in.Rejected[i]
		order, ok := g.Order(r.Module)
		if !ok {
			// Outside the graph (the reason it was rejected, most likely):
			// after every graph module, in input order.
			order = g.Len() + i
		}
		if err := add(&vertex{module: r.Module, order: order, rejected: r}, r.ImplementationID); err != nil {
			return nil, err
		}
	}
	// Work in ModuleId order from here on: the input order must not matter.
	slices.SortFunc(vs, func(a, b *vertex) int { return cmp.Compare(a.order, b.order) })
	for i, v := range vs {
		byModule[v.module] = i
		if v.node != nil {
			byImpl[v.node.ImplementationID] = i
		} else if v.rejected.ImplementationID != "" {
			byImpl[v.rejected.ImplementationID] = i
		}
	}
	for _, v := range vs {
		if v.node == nil {
			continue
		}
		v.deps, v.unmet = directDependencies(g, v, vs, byModule, byImpl)
		bindRequirements(g, v, vs, byModule)
	}

	markCycles(vs)
	for _, v := range vs {
		resolve(v, vs)
	}

	ev := &Evaluation{Modules: make([]ModuleStatus, 0, len(vs))}
	for _, v := range vs {
		st := ModuleStatus{Module: v.module, Admitted: v.admitted, Reason: v.reason, Message: v.message}
		if v.node != nil {
			st.ImplementationID = v.node.ImplementationID
		} else {
			st.ImplementationID = v.rejected.ImplementationID
		}
		for _, d := range v.deps {
			st.DependsOn = append(st.DependsOn, vs[d].module)
		}
		if v.admitted {
			n := v.node
			st.Identity = Identity(n.Module, n.ImplementationID, n.Version, n.ArtifactSHA256)
			depIDs := make([]string, 0, len(v.deps))
			for _, d := range v.deps {
				dn := vs[d].node
				depIDs = append(depIDs, epochMember(g, Identity(dn.Module, dn.ImplementationID, dn.Version, dn.ArtifactSHA256), dn.Module))
			}
			st.Epoch = Epoch(epochMember(g, st.Identity, n.Module), depIDs)
			st.Diagnostics = v.diagnostics
		}
		ev.Modules = append(ev.Modules, st)
	}
	ev.ActivateOrder = topologicalOrder(vs)
	ev.DrainOrder = slices.Clone(ev.ActivateOrder)
	slices.Reverse(ev.DrainOrder)
	return ev, nil
}

// directDependencies returns v's dependencies present in the activation
// (seam-graph and implementation), and the first unmet implementation
// dependency in words.
func directDependencies(g *catalog.SeamGraph, v *vertex, vs []*vertex, byModule, byImpl map[string]int) ([]int, string) {
	var deps []int
	for _, d := range g.Dependencies(v.module) {
		if i, ok := byModule[d]; ok {
			deps = append(deps, i)
		}
	}
	unmet := ""
	for _, d := range v.node.Dependencies {
		i, ok := byImpl[d.ImplementationID]
		switch {
		case !ok:
			if unmet == "" {
				unmet = fmt.Sprintf("implementation %s ≥ %s, which is not in the activation", d.ImplementationID, d.MinimumVersion)
			}
		case vs[i].node != nil && vs[i].node.Version.Compare(d.MinimumVersion) < 0:
			if unmet == "" {
				unmet = fmt.Sprintf("implementation %s ≥ %s, but %s has %s", d.ImplementationID, d.MinimumVersion, vs[i].module, vs[i].node.Version)
			}
		default:
			// Present: admitted at a sufficient version, or rejected (which
			// gates through the dependency's status).
			deps = append(deps, i)
		}
	}
	slices.Sort(deps)
	return slices.Compact(deps), unmet
}

// markCycles finds the strongly connected components of the admitted
// vertices (Tarjan) and marks every vertex on a cycle with dependency_cycle
// and the full cycle path through it.
func markCycles(vs []*vertex) {
	index := make([]int, len(vs))
	low := make([]int, len(vs))
	onStack := make([]bool, len(vs))
	for i := range index {
		index[i] = -1
	}
	var stack []int
	next := 0
	var strongConnect func(v int)
	strongConnect = func(v int) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range vs[v].deps {
			if vs[w].node == nil {
				continue
			}
			if index[w] < 0 {
				strongConnect(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var scc []int
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			scc = append(scc, w)
			if w == v {
				break
			}
		}
		if len(scc) == 1 && !slices.Contains(vs[v].deps, v) {
			return
		}
		slices.Sort(scc)
		for _, m := range scc {
			path := cyclePath(vs, m, scc)
			x := vs[m]
			x.resolved, x.reason = true, reasons.DependencyCycle
			x.cause = "dependency cycle: " + path
			x.message = truncate(x.module + " is on a dependency cycle: " + path)
			x.chain = []string{x.module}
		}
	}
	for i, v := range vs {
		if v.node != nil && index[i] < 0 {
			strongConnect(i)
		}
	}
}

// cyclePath returns a shortest cycle through start inside its component, as
// "a → b → … → a", found breadth-first with neighbours in ModuleId order.
func cyclePath(vs []*vertex, start int, scc []int) string {
	prev := map[int]int{}
	queue := []int{start}
	seen := map[int]bool{start: true}
	end := -1
	for len(queue) > 0 && end < 0 {
		v := queue[0]
		queue = queue[1:]
		for _, w := range vs[v].deps {
			if !slices.Contains(scc, w) {
				continue
			}
			if w == start {
				end = v
				break
			}
			if !seen[w] {
				seen[w], prev[w] = true, v
				queue = append(queue, w)
			}
		}
	}
	path := []string{vs[start].module}
	for v := end; v != start; v = prev[v] {
		path = append(path, vs[v].module)
	}
	// path is start, end, …, back towards start: reverse the tail so it
	// reads in dependency direction start → … → end → start.
	slices.Reverse(path[1:])
	return strings.Join(append(path, vs[start].module), " → ")
}

// resolve decides v's admission after its dependencies'. Cycle members are
// decided already, so the recursion runs over a DAG and terminates.
func resolve(v *vertex, vs []*vertex) {
	if v.resolved {
		return
	}
	v.resolved = true
	switch {
	case v.rejected != nil:
		v.reason = v.rejected.Reason
		v.message = truncate(v.rejected.Message)
		v.cause = "not admitted: " + v.rejected.Reason + ": " + v.rejected.Message
		v.chain = []string{v.module}
		return
	case v.unmet != "":
		v.reason = reasons.DependencyUnsatisfied
		v.message = truncate(v.module + " needs " + v.unmet)
		v.cause = "it needs " + v.unmet
		v.chain = []string{v.module}
		return
	case v.conflict != "":
		v.reason = reasons.DependencyConflict
		v.message = truncate(v.module + " requires " + v.conflict)
		v.cause = "it requires " + v.conflict
		v.chain = []string{v.module}
		return
	}
	for _, d := range slices.Clone(v.deps) {
		dep := vs[d]
		resolve(dep, vs)
		if dep.admitted {
			continue
		}
		if req, ok := v.optional[d]; ok {
			// An optional requirement never gates: the module runs
			// without it, and says so.
			v.deps = slices.DeleteFunc(v.deps, func(x int) bool { return x == d })
			v.diagnose("optional dependency " + req + ": " + dep.module + " is not admitted (" + dep.reasonOrCause() + "); activated without it")
			continue
		}
		v.reason = reasons.DependencyUnsatisfied
		v.chain = append([]string{v.module}, dep.chain...)
		v.cause = dep.cause
		v.message = truncate(strings.Join(v.chain, " needs ") + " (" + dep.cause + ")")
		return
	}
	v.admitted = true
}

// reasonOrCause is a not-admitted vertex's reason and message in words.
func (v *vertex) reasonOrCause() string {
	if v.message == "" {
		return v.reason
	}
	return v.reason + ": " + v.message
}

// maxDiagnostics bounds a module's diagnostics (the CRD's bound).
const maxDiagnostics = 8

// diagnose adds a diagnostic, bounded in number and length.
func (v *vertex) diagnose(d string) {
	if len(v.diagnostics) < maxDiagnostics {
		v.diagnostics = append(v.diagnostics, truncate(d))
	}
}

// truncate bounds a message to 1 KiB at a rune boundary.
func truncate(s string) string {
	if len(s) <= maxMessageBytes {
		return s
	}
	const ellipsis = "…"
	cut := maxMessageBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// topologicalOrder is Kahn's algorithm over the admitted vertices, always
// taking the ready vertex first in ModuleId order.
func topologicalOrder(vs []*vertex) []string {
	pending := make([]int, len(vs))
	consumers := make([][]int, len(vs))
	ready := &orderHeap{}
	for i, v := range vs {
		if !v.admitted {
			continue
		}
		for _, d := range v.deps {
			pending[i]++
			consumers[d] = append(consumers[d], i)
		}
		if pending[i] == 0 {
			heap.Push(ready, i)
		}
	}
	order := []string{}
	for ready.Len() > 0 {
		i := heap.Pop(ready).(int)
		order = append(order, vs[i].module)
		for _, c := range consumers[i] {
			if pending[c]--; pending[c] == 0 {
				heap.Push(ready, c)
			}
		}
	}
	return order
}

// orderHeap is a min-heap of vertex indexes; vertices are sorted in ModuleId
// order, so the smallest index is the first in ModuleId order.
type orderHeap []int

func (h orderHeap) Len() int           { return len(h) }
func (h orderHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h orderHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *orderHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *orderHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
