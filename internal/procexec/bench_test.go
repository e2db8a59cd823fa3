package procexec

import (
	"bufio"
	"context"
	"crypto/sha256"
	"io"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/pkg/protocol"
)

// percentile returns the p-th percentile (0..100) of samples.
func percentile(samples []time.Duration, p float64) time.Duration {
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// BenchmarkSpawnVerifyLoad measures Launch + Load of counter v2 (sealed
// copy while hashing, exec from the spawner thread as uid 65534 with
// NoNewPrivs, durable record, re-hash after start, load round trip) against
// a baseline in the same iteration: SHA-256 of the same bytes, a bare
// fork/exec of the same file, and one NDJSON round trip (the same load
// request and its answer). It reports the medians and their ratio.
//
// "cold" copies and hashes the file at every launch (no cache of sealed
// copies: a first launch of an artifact); "warm" launches a digest already
// sealed (a renewal or relaunch), where only the re-hash after the start
// reads the file.
func BenchmarkSpawnVerifyLoad(b *testing.B) {
	for _, mode := range []struct {
		name  string
		cache int64
	}{{"cold", 0}, {"warm", DefaultExecutableCacheBytes}} {
		b.Run(mode.name, func(b *testing.B) { benchmarkSpawn(b, mode.cache) })
	}
}

func benchmarkSpawn(b *testing.B, cache int64) {
	cfg := DefaultConfig(b.TempDir())
	cfg.ExecutableCacheBytes = cache
	ex, err := NewExecutor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	impl := providertest.Implement(b, artifacts.Spec{Binary: artifacts.CounterV2})
	plan := providertest.Plan(b, impl)
	c := plan.Contracts()
	loadReq := &protocol.Request{
		Envelope: protocol.Envelope{Protocol: protocol.ProtocolV2, RequestID: "host-1", ImplementationID: plan.ImplementationID(), Module: plan.Module()},
		Payload: &protocol.LoadRequest{LifecycleContract: c.Load, DefinitionContract: c.Definition, ProviderContract: c.Provider,
			ConsumerContract: c.Consumer, ObservationSchema: c.Observation, ArtifactSHA256: plan.ArtifactSHA256(), AdmittedCapabilities: []string{}},
	}
	loadLine, err := protocol.MarshalRequest(loadReq, protocol.V2, &c)
	if err != nil {
		b.Fatal(err)
	}
	loadLine = append(loadLine, '\n')
	ctx := context.Background()
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	var ours, base []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// The executor.
		t0 := time.Now()
		p, err := ex.Launch(plan)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Load(ctx); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(t0))
		b.StopTimer()
		p.Close()
		b.StartTimer()

		// The baseline.
		t0 = time.Now()
		f, err := os.Open(impl.Executable)
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		io.CopyBuffer(h, f, make([]byte, 64<<10))
		f.Close()
		_ = h.Sum(nil)
		inR, inW, _ := os.Pipe()
		outR, outW, _ := os.Pipe()
		pid, err := syscall.ForkExec(impl.Executable, []string{impl.Executable}, &syscall.ProcAttr{
			Dir: impl.ArtifactRoot, Env: []string{}, Files: []uintptr{inR.Fd(), outW.Fd(), devnull.Fd()},
		})
		if err != nil {
			b.Fatal(err)
		}
		inR.Close()
		outW.Close()
		inW.Write(loadLine)
		if _, err := bufio.NewReader(outR).ReadBytes('\n'); err != nil {
			b.Fatal(err)
		}
		base = append(base, time.Since(t0))
		b.StopTimer()
		inW.Close()
		outR.Close()
		syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
		b.StartTimer()
	}
	b.StopTimer()
	po, pb := percentile(ours, 50), percentile(base, 50)
	b.ReportMetric(us(po), "ours-p50-µs")
	b.ReportMetric(us(pb), "base-p50-µs")
	b.ReportMetric(float64(po)/float64(pb), "ratio")
}

// BenchmarkFaultToGroupReaped measures, for a provider whose group holds 4
// processes (faulty with 3 grandchildren that ignore SIGTERM and hold its
// stdout), the time from a fault being detected (a malformed frame at
// start) to the whole group killed and reaped (Teardown().Reaped), and to
// the teardown's end (pipes drained and closed, record removed). It
// reports p50 and p99.
func BenchmarkFaultToGroupReaped(b *testing.B) {
	ex, err := NewExecutor(DefaultConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	impl := providertest.Implement(b, artifacts.Spec{Binary: artifacts.Faulty,
		Argv: []string{"--fault", "fork-grandchild", "--at", "load", "--children", "3", "--fault", "malformed", "--at", "start"}})
	plan := providertest.Plan(b, impl)
	ctx := context.Background()
	var reaped, done []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		p, err := ex.Launch(plan)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Load(ctx); err != nil {
			b.Fatal(err)
		}
		for len(p.Remaining()) < 4 {
			time.Sleep(100 * time.Microsecond) // the grandchildren are forked
		}
		b.StartTimer()
		_, err = p.Start(ctx, "r", []byte(`{"key":"a","add":1}`), 5*time.Second)
		if f, ok := AsFault(err); !ok || f.Kind != KindMalformedFrame {
			b.Fatalf("Start: %v", err)
		}
		td := p.Teardown()
		if len(td.Unreaped) > 0 {
			b.Fatalf("unreaped: %v", td.Unreaped)
		}
		reaped = append(reaped, td.Reaped)
		done = append(done, td.Duration)
	}
	b.StopTimer()
	b.ReportMetric(us(percentile(reaped, 50)), "reaped-p50-µs")
	b.ReportMetric(us(percentile(reaped, 99)), "reaped-p99-µs")
	b.ReportMetric(us(percentile(done, 50)), "done-p50-µs")
	b.ReportMetric(us(percentile(done, 99)), "done-p99-µs")
}
