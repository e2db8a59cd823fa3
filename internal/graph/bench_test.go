package graph

import (
	"encoding/json"
	"fmt"
	"testing"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/protocol"
)

// layeredGraph is a custom seam graph of n modules (at most 64): module i
// depends on up to three earlier ones (i/2, i/3, i-1), so it has the depth
// and fan-in of a real graph.
func layeredGraph(b *testing.B, n int) *catalog.SeamGraph {
	b.Helper()
	entries := make([]catalog.ModuleEntry, n)
	for i := range entries {
		m := fmt.Sprintf("m%02d", i)
		deps := []string{}
		if i > 0 {
			seen := map[int]bool{}
			for _, d := range []int{i / 2, i / 3, i - 1} {
				if !seen[d] && d < i {
					seen[d] = true
					deps = append(deps, fmt.Sprintf("m%02d", d))
				}
			}
		}
		entries[i] = catalog.ModuleEntry{Module: m, Dependencies: deps, Contracts: protocol.BuiltinContracts(m),
			FailureSemantics: catalog.FailureSemantics(), HostInvariants: catalog.HostInvariants()}
	}
	data, err := json.Marshal(struct {
		SchemaVersion int                   `json:"schema_version"`
		Modules       []catalog.ModuleEntry `json:"modules"`
	}{catalog.SeamGraphSchemaVersion, entries})
	if err != nil {
		b.Fatal(err)
	}
	g, err := catalog.ParseSeamGraph(data)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkPlan measures what the activation controller computes for a
// change of one source: evaluating the new activation in its graph (orders,
// identities, epochs) and planning it against the old evaluation. The
// 28-module case is the built-in family graph, the 64-module case the
// largest custom graph.
func BenchmarkPlan(b *testing.B) {
	for _, c := range []struct {
		name  string
		graph func(*testing.B) *catalog.SeamGraph
	}{
		{"modules=28", func(*testing.B) *catalog.SeamGraph { return catalog.BuiltinSeamGraph() }},
		{"modules=64", func(b *testing.B) *catalog.SeamGraph { return layeredGraph(b, catalog.MaxCustomModules) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			g := c.graph(b)
			var nodes []Node
			for i, m := range g.Modules() {
				nodes = append(nodes, node(m, "impl-"+m, v1, byte(i)))
			}
			old, err := Evaluate(Input{Graph: g, Admitted: nodes})
			if err != nil {
				b.Fatal(err)
			}
			changed := withChange(nodes, g.Modules()[0], func(n *Node) { n.Version = catalog.Version{1, 1, 0} })
			b.ReportAllocs()
			b.ResetTimer()
			var p RuntimePlan
			for i := 0; i < b.N; i++ {
				next, err := Evaluate(Input{Graph: g, Admitted: changed})
				if err != nil {
					b.Fatal(err)
				}
				p = Plan(old, next)
			}
			b.StopTimer()
			if len(p.Reloaded) < 2 || len(p.Unchanged) == 0 {
				b.Fatalf("plan %+v: want the changed module and its direct consumers reloaded, the rest unchanged", p)
			}
		})
	}
}
