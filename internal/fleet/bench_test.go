package fleet

import (
	"fmt"
	"testing"
)

// BenchmarkComputeForAHundredNodes is one reconcile's decision for 100
// nodes in the middle of a rollout.
func BenchmarkComputeForAHundredNodes(b *testing.B) {
	w := newWorld(0, canary(1, 30))
	for i := range 100 {
		w.nodes = append(w.nodes, fmt.Sprintf("node-%03d", i))
	}
	w.allOn("v1")
	for i := range 30 {
		w.on(w.nodes[i], "v2", wave(int32(i/10+1)))
	}
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	w.set.Status.SoakedRevision = w.revs["v2"].Name
	in := w.input("v2")
	b.ReportAllocs()
	for b.Loop() {
		Compute(in)
	}
}
