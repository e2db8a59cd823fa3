package survivor

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/internal/procexec"
)

const benchServerEnv = "ITERON_SURVIVOR_BENCH_SERVER"

func runBenchServer(dir string) int { return 0 }

// BenchmarkSurvivorHop measures the hop the survivor adds on the final
// path: one run of counter v2 (a whole request → terminal observation)
// driven by the manager's side directly on the provider's pipes (direct:
// what a manager without --survivor-socket does) and through the survivor
// (survivor: the control socket, whole frames, the outcome recorded and
// acknowledged, as the gateway's calls do). At most ~17000 runs fit a
// process's 8 MiB stdin budget. Run it alone:
//
//	go test -run XXX -bench SurvivorHop -benchtime 10000x ./internal/survivor
func BenchmarkSurvivorHop(b *testing.B) {
	input := []byte(`{"key":"k","add":1}`)
	b.Run("direct", func(b *testing.B) {
		dir := shortDir(b)
		exec, err := procexec.NewExecutor(procexec.DefaultConfig(filepath.Join(dir, "procs")))
		if err != nil {
			b.Fatal(err)
		}
		plan, _ := counter(b)
		p, err := exec.Launch(plan)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		ctx := context.Background()
		if _, err := p.Load(ctx); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := range b.N {
			run, err := p.Start(ctx, fmt.Sprintf("r%d", i), jsontext.Value(input), 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := run.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("survivor", func(b *testing.B) {
		n := startNode(b)
		c, _ := n.client(b)
		plan, exe := counter(b)
		rp := launchLoaded(b, c, plan, exe)
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			id := fmt.Sprintf("r%d", i)
			call := &Invocation{Namespace: "default", InvocationID: id, Fingerprint: "f", Activation: "a", Module: plan.Module(), Generation: 1, GenerationName: "g"}
			if _, _, err := rp.Run(ctx, id, input, 10*time.Second, call, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
