package sandbox_test

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/gateway"
)

// BenchmarkNeighbourLatencyBesideACPUSpinner measures the p99 of a
// neighbour's calls (the hostile provider's "ok", through the gateway)
// alone and beside a CPU spinner running at its default bound (a quarter
// of the node's CPUs, at most one), each provider in its sandbox, and
// reports their ratio. The calls share one connection, as a caller's do:
// dialing per call measured the connection's setup with them.
//
// A third phase runs the calls with every CPU busy with work that takes no
// CPU from anyone (one SCHED_IDLE loop per CPU, outside any sandbox): on a
// virtual machine, busy vCPUs wait for their host's scheduler, a cost no
// sandbox can remove. ratio-to-busy compares the spinner with that floor.
func BenchmarkNeighbourLatencyBesideACPUSpinner(b *testing.B) {
	neighbour := deploy(b, variant{"neighbour", none.caps}, nil)
	spinner := deploy(b, variant{"spinner", none.caps}, nil)
	// A caller keeps its connection to the gateway: each call is one
	// Invoke on it, as the gateway's clients make them.
	c, err := gateway.Dial(socket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	measure := func(n int) []time.Duration {
		var ds []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if a := callOn(b, c, neighbour, "ok", "", 10*time.Second); !a.OK {
				b.Fatalf("the neighbour answered %+v", a)
			}
			ds = append(ds, time.Since(t0))
		}
		return ds
	}
	// phase measures b.N calls and the hypervisor's steal meanwhile.
	phase := func() ([]time.Duration, float64) {
		steal := stealDuring(b)
		ds := measure(b.N)
		return ds, steal()
	}
	measure(20) // warm
	b.ResetTimer()
	alone, stealAloneRate := phase()
	done := make(chan answer, 1)
	spin := fmt.Sprintf("%dms", max(1000, int(3*time.Duration(b.N)*p(alone, 50)/time.Millisecond)))
	go func() { done <- call(b, spinner, "spin", spin, 60*time.Second) }()
	time.Sleep(300 * time.Millisecond)
	beside, stealBesideRate := phase()
	a := <-done
	stopLoops := idleLoops(b, runtime.NumCPU())
	time.Sleep(300 * time.Millisecond)
	busy, stealBusyRate := phase()
	stopLoops()
	b.StopTimer()
	pa, pb := p(alone, 99), p(beside, 99)
	b.ReportMetric(float64(pa.Microseconds()), "alone-p99-µs")
	b.ReportMetric(float64(pb.Microseconds()), "beside-p99-µs")
	b.ReportMetric(float64(pb)/float64(pa), "ratio")
	pc := p(busy, 99)
	b.ReportMetric(float64(pc.Microseconds()), "idle-loops-p99-µs")
	b.ReportMetric(float64(pb)/float64(pc), "ratio-to-busy")
	b.ReportMetric(stealAloneRate, "alone-steal-ms/s")
	b.ReportMetric(stealBesideRate, "beside-steal-ms/s")
	b.ReportMetric(stealBusyRate, "idle-loops-steal-ms/s")
	fmt.Fprintf(os.Stderr, "neighbour p50 alone %v, beside the spinner %v, beside %d SCHED_IDLE loops %v; p99 %v, %v and %v; the spinner got %s CPU per second; the hypervisor took %.1f, %.1f and %.1f ms of CPU per second from this machine (steal)\n",
		p(alone, 50), p(beside, 50), runtime.NumCPU(), p(busy, 50), pa, pb, pc, a.Detail, stealAloneRate, stealBesideRate, stealBusyRate)
}

// idleLoops starts n busy loops as SCHED_IDLE processes, which the kernel
// preempts for any other thread at once, and returns what stops them.
func idleLoops(tb testing.TB, n int) (stop func()) {
	tb.Helper()
	var loops []*exec.Cmd
	stop = func() {
		for _, c := range loops {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		loops = nil
	}
	for range n {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			stop()
			tb.Fatal(err)
		}
		loops = append(loops, c)
		if err := unix.SchedSetAttr(c.Process.Pid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
			stop()
			tb.Fatalf("sched_setattr(%d, SCHED_IDLE): %v", c.Process.Pid, err)
		}
	}
	tb.Cleanup(stop)
	return stop
}

// stealDuring starts measuring the CPU time the hypervisor took from this
// machine's CPUs (steal, /proc/stat): on a virtual machine the vCPUs wait
// their host's scheduler once they are all busy, a wait the guest kernel
// cannot see. The function it returns gives milliseconds of steal per
// second of wall-clock since the start.
func stealDuring(tb testing.TB) func() float64 {
	tb.Helper()
	read := func() time.Duration {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			tb.Fatal(err)
		}
		// cpu  user nice system idle iowait irq softirq steal ...
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			tb.Fatalf("/proc/stat's first line %q: want the cpu line with a steal field", line)
		}
		ticks, err := strconv.ParseInt(f[8], 10, 64)
		if err != nil {
			tb.Fatalf("/proc/stat steal %q: %v", f[8], err)
		}
		return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
	}
	start, t0 := read(), time.Now()
	return func() float64 {
		return float64(read()-start) / float64(time.Millisecond) / time.Since(t0).Seconds()
	}
}

func p(ds []time.Duration, pct int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*pct/100]
}
