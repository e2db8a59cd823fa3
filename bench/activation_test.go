package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/graph"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
)

// familyDesired is the 28-module family graph (catalog.BuiltinSeamGraph),
// one real counter provider per module, as the activation controller would
// hand it to the coordinator: dependencies, epochs and the activate order
// come from internal/graph.
func familyDesired(b *testing.B) hotswap.Desired {
	b.Helper()
	impls := map[string]artifacts.Implementation{}
	var nodes []graph.Node
	for _, module := range catalog.BuiltinSeamGraph().Modules() {
		id := "counter-" + strings.ReplaceAll(module, "_", "-")
		impl := providertest.Implement(b, artifacts.Spec{Binary: artifacts.CounterV1, Module: module, ImplementationID: id})
		impls[module] = impl
		nodes = append(nodes, graph.Node{Module: module, ImplementationID: id, Version: catalog.Version{1, 0, 0}, ArtifactSHA256: impl.ArtifactSHA256})
	}
	ev, err := graph.Evaluate(graph.Input{Admitted: nodes})
	if err != nil {
		b.Fatal(err)
	}
	d := hotswap.Desired{SpecGeneration: 1, CandidateSHA256: providertest.CandidateSHA256,
		Swap: hotswap.SwapPolicy{Deadline: time.Minute, QuiesceTimeout: time.Second}, ActivateOrder: ev.ActivateOrder, DrainOrder: ev.DrainOrder}
	for _, ms := range ev.Modules {
		if !ms.Admitted {
			b.Fatalf("%s not admitted: %s", ms.Module, ms.Message)
		}
		d.Modules = append(d.Modules, hotswap.ModuleTarget{
			Module: ms.Module, Plan: providertest.Plan(b, impls[ms.Module]), Epoch: ms.Epoch, DependsOn: ms.DependsOn,
			GenerationName: "family-" + strings.ReplaceAll(ms.Module, "_", "-") + "-g1-1", Lineage: 1, Attempt: 1,
		})
	}
	return d
}

// applyUntilActive starts a coordinator over a fresh state dir, applies d
// and returns how long it took until every module was Active; the
// coordinator is shut down (not timed).
func applyUntilActive(b *testing.B, exec *procexec.Executor, d hotswap.Desired, parallel, n int) time.Duration {
	b.Helper()
	dir, err := os.MkdirTemp("", "iteron-bench-family-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	c, err := hotswap.New(hotswap.Config{StateDir: dir, Launch: providers.NewExecutorLauncher(exec), Log: logr.Discard(), MaxParallelActivations: parallel})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			b.Logf("shutdown: %v", err)
		}
	}()
	d.Key = hotswap.ActivationKey{Namespace: "bench", Name: "family", UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", parallel, n)}
	start := time.Now()
	if err := c.Apply(d); err != nil {
		b.Fatal(err)
	}
	deadline := start.Add(2 * time.Minute)
	for {
		st, _ := c.Status(d.Key.UID)
		active := 0
		for _, ms := range st.Modules {
			if ms.Phase == iteronv1.PhaseActive {
				active++
			}
		}
		if active == len(d.Modules) {
			return time.Since(start)
		}
		if len(st.Failures) > 0 || time.Now().After(deadline) {
			b.Fatalf("not all Active (%d of %d): failures %+v", active, len(d.Modules), st.Failures)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// BenchmarkFamilyApply measures apply → all 28 modules Active through the
// coordinator with a real provider per module, each iteration once with
// --max-parallel-activations=1 (every process started inside its own
// transaction) and once with the default (the CPU count), alternating
// which goes first. It reports both medians and serial ÷ parallel.
func BenchmarkFamilyApply(b *testing.B) {
	exec, err := procexec.NewExecutor(procexec.DefaultConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	d := familyDesired(b)
	parallel := hotswap.Config{}.MaxParallelActivations
	if parallel == 0 {
		parallel = defaultParallel()
	}
	var serialTimes, parallelTimes []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			serialTimes = append(serialTimes, applyUntilActive(b, exec, d, 1, i))
			parallelTimes = append(parallelTimes, applyUntilActive(b, exec, d, parallel, i))
		} else {
			parallelTimes = append(parallelTimes, applyUntilActive(b, exec, d, parallel, i))
			serialTimes = append(serialTimes, applyUntilActive(b, exec, d, 1, i))
		}
	}
	b.StopTimer()
	s, p := median(serialTimes), median(parallelTimes)
	b.ReportMetric(float64(s.Microseconds())/1000, "serial-ms")
	b.ReportMetric(float64(p.Microseconds())/1000, "parallel-ms")
	b.ReportMetric(float64(s)/float64(p), "serial/parallel")
	b.ReportMetric(float64(parallel), "max-parallel")
}

// defaultParallel is the manager's default --max-parallel-activations.
func defaultParallel() int { return runtime.NumCPU() }
