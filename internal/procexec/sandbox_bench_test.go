package procexec

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/sandboxtest"
)

// BenchmarkSandboxedLaunch measures Launch + Load of counter v2 with the
// sandbox (--sandbox=enforce, the provider admitted nothing: every
// namespace, the private root, Landlock, seccomp, the cgroup bounds)
// against the same launch without it, alternating within each iteration so
// that both see the same machine load. "cold" copies and hashes the
// executable at every launch; "warm" launches a digest already sealed. It
// reports both medians, their ratio, and the median of each step of the
// sandboxed launch (the host's and the launcher's; the rest is the
// provider's own start and its load).
//
// "burst" is warm launches back to back, as when an activation starts its
// modules: after the launchers started ahead are used, each launch starts
// its own.
func BenchmarkSandboxedLaunch(b *testing.B) {
	for _, mode := range []struct {
		name  string
		cache int64
		burst bool
	}{{"cold", 0, false}, {"warm", DefaultExecutableCacheBytes, false}, {"burst", DefaultExecutableCacheBytes, true}} {
		b.Run(mode.name, func(b *testing.B) { benchmarkSandboxedLaunch(b, mode.cache, mode.burst) })
	}
}

func benchmarkSandboxedLaunch(b *testing.B, cache int64, burst bool) {
	sb := sandboxtest.New(b, sandbox.Policy{Mode: sandbox.ModeEnforce}, providertest.SandboxLauncher(b))
	newEx := func(s *sandbox.Sandbox) *Executor {
		cfg := DefaultConfig(b.TempDir())
		cfg.ExecutableCacheBytes, cfg.Sandbox = cache, s
		ex, err := NewExecutor(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return ex
	}
	sandboxed, plain := newEx(sb), newEx(nil)
	impl := providertest.Implement(b, artifacts.Spec{Binary: artifacts.CounterV2})
	plan := providertest.Plan(b, impl)
	ctx := context.Background()
	launch := func(ex *Executor) (time.Duration, []sandbox.Step) {
		t0 := time.Now()
		p, err := ex.Launch(plan)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Load(ctx); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		var steps []sandbox.Step
		if p.sandbox != nil {
			steps = p.sandbox.Steps()
		}
		b.StopTimer()
		p.Close()
		b.StartTimer()
		return d, steps
	}
	var ours, base []time.Duration
	stepTimes := map[string][]time.Duration{}
	var order []string
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Launches apart, as a node's are but in a burst: its launchers
		// started ahead are ready (BenchmarkSandboxedLaunchBurst measures
		// the burst).
		if !burst {
			b.StopTimer()
			sb.AwaitReady(5 * time.Second)
			b.StartTimer()
		}
		d, steps := launch(sandboxed)
		ours = append(ours, d)
		for _, s := range steps {
			if _, ok := stepTimes[s.Name]; !ok {
				order = append(order, s.Name)
			}
			stepTimes[s.Name] = append(stepTimes[s.Name], s.Duration)
		}
		d, _ = launch(plain)
		base = append(base, d)
	}
	b.StopTimer()
	po, pb := percentile(ours, 50), percentile(base, 50)
	b.ReportMetric(us(po), "sandboxed-p50-µs")
	b.ReportMetric(us(pb), "plain-p50-µs")
	b.ReportMetric(float64(po)/float64(pb), "ratio")
	var lines []string
	var sum time.Duration
	for _, name := range order {
		// A step some launches take and others do not (a launcher started
		// for the launch, or a ready one taken) is shown with how many
		// took it; the rest of the median counts the steps most took.
		m, n := percentile(stepTimes[name], 50), len(stepTimes[name])
		if 2*n > len(ours) {
			sum += m
		}
		lines = append(lines, fmt.Sprintf("  %-55s %8.0f µs  (%d of %d launches)", name, us(m), n, len(ours)))
	}
	lines = append(lines, fmt.Sprintf("  %-55s %8.0f µs", "provider: start and load (the rest of the median)", us(po-sum)))
	if b.N > 1 {
		// On stderr: go test truncates a benchmark's log.
		fmt.Fprintf(os.Stderr, "%s: median of each step of a sandboxed launch (%d launches):\n%s\n", b.Name(), len(ours), strings.Join(lines, "\n"))
	}
}

// BenchmarkSandboxedStartToTerminal measures one run, start → terminal
// observation, of counter v2 in its sandbox against the same run of an
// unsandboxed counter v2, alternating: what the sandbox adds to a call
// (seccomp on every syscall, the namespaces, the cgroup) once the
// provider runs.
func BenchmarkSandboxedStartToTerminal(b *testing.B) {
	sb := sandboxtest.New(b, sandbox.Policy{Mode: sandbox.ModeEnforce}, providertest.SandboxLauncher(b))
	cfg := DefaultConfig(b.TempDir())
	cfg.Sandbox = sb
	sandboxed, err := NewExecutor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	plain, err := NewExecutor(DefaultConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	impl := providertest.Implement(b, artifacts.Spec{Binary: artifacts.CounterV2})
	plan := providertest.Plan(b, impl)
	ctx := context.Background()
	start := func(ex *Executor) *Process {
		p, err := ex.Launch(plan)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Load(ctx); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		return p
	}
	ps, pp := start(sandboxed), start(plain)
	runOnce := func(p *Process, i int) time.Duration {
		t0 := time.Now()
		r, err := p.Start(ctx, fmt.Sprintf("r%d", i), []byte(`{"key":"k","add":1}`), 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Result(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var ours, base []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ours = append(ours, runOnce(ps, i))
		base = append(base, runOnce(pp, i))
	}
	b.StopTimer()
	po, pb := percentile(ours, 50), percentile(base, 50)
	b.ReportMetric(us(po), "sandboxed-p50-µs")
	b.ReportMetric(us(pb), "plain-p50-µs")
	b.ReportMetric(float64(po)/float64(pb), "ratio")
	b.ReportMetric(us(percentile(ours, 99)), "sandboxed-p99-µs")
	b.ReportMetric(us(percentile(base, 99)), "plain-p99-µs")
}
