package applyscale

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

// The setup of the issue: activations of the 28 modules of the family
// graph, one counter provider per module, on one manager.
const (
	activationsBefore = 10 // 280 providers
	modules           = catalog.BuiltinModuleCount
)

var (
	env          *kubeapi.Environment
	base         string
	providersDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		// Nothing to measure: start nothing (make test runs this).
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if base, err = os.MkdirTemp("", "iteron-applyscale-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	providersDir = filepath.Join(base, "providers")
	if err := os.MkdirAll(providersDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// providertest lays providers out under TMPDIR: the manager's allowed root.
	os.Setenv("TMPDIR", providersDir)
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("applyscale runs against kube-apiserver %s\n", env.ServerVersion)
	return m.Run()
}

// requests counts the manager's API requests: all of them, and those that
// change something (every verb but GET).
type requests struct {
	all, writes atomic.Int64
	last        atomic.Int64 // unix nanoseconds of the last request
}

func (r *requests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true" {
			// A watch is one long request opened at start, not work.
			return rt.RoundTrip(req)
		}
		r.all.Add(1)
		if req.Method != http.MethodGet {
			r.writes.Add(1)
		}
		r.last.Store(time.Now().UnixNano())
		return rt.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// quiet waits until the manager sent no request for 500 ms (at most 10 s):
// what one activation costs includes the status writes after Ready.
func (r *requests) quiet() {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && time.Since(time.Unix(0, r.last.Load())) < 500*time.Millisecond {
		time.Sleep(50 * time.Millisecond)
	}
}

// familySources lays out one counter provider per module of the family
// graph, shared by every activation of a run (sources are read-only paths).
func familySources(b *testing.B) []iteronv1.ActivationSource {
	var sources []iteronv1.ActivationSource
	for _, module := range catalog.BuiltinSeamGraph().Modules() {
		sources = append(sources, operatortest.Source(b, artifacts.CounterV1, module, "counter-"+strings.ReplaceAll(module, "_", "-")))
	}
	if len(sources) != modules {
		b.Fatalf("%d sources laid out, want %d", len(sources), modules)
	}
	return sources
}

// applyAndWait creates an activation of every module and returns how long
// it took until its status was Ready, and until the coordinator had every
// module Active (the rest is the controllers writing status).
func applyAndWait(b *testing.B, mgr *operatortest.Manager, node, name string, srcs []iteronv1.ActivationSource) (ready, active time.Duration) {
	b.Helper()
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: iteronv1.ImplementationActivationSpec{
			NodeName: node, CandidateSHA256: providertest.CandidateSHA256, Sources: srcs,
			Swap: iteronv1.SwapPolicy{DeadlineSeconds: 60},
		},
	}
	ctx := context.Background()
	start := time.Now()
	if err := env.Client.Create(ctx, act); err != nil {
		b.Fatal(err)
	}
	deadline := start.Add(2 * time.Minute)
	var got iteronv1.ImplementationActivation
	var known time.Duration
	for {
		if active == 0 {
			if st, ok := mgr.Coordinator.Status(string(act.UID)); ok {
				if known == 0 && len(st.Modules) > 0 {
					known = time.Since(start)
				}
				n := 0
				for _, ms := range st.Modules {
					if ms.Phase == iteronv1.PhaseActive {
						n++
					}
				}
				if n == len(srcs) {
					active = time.Since(start)
				}
			}
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(act), &got); err != nil {
			b.Fatal(err)
		}
		if operatortest.Ready(&got) {
			if active == 0 {
				active = time.Since(start)
			}
			b.Logf("%s: applied to the coordinator after %v, every module Active after %v, Ready after %v", name, known.Round(time.Millisecond), active.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			return time.Since(start), active
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s not Ready after 2 minutes: %+v", name, got.Status.Conditions)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reconciles reads the in-process manager's metrics: how many reconciles
// each controller ran and the seconds they took, and the same for each
// transaction phase and ledger fdatasync of the coordinator.
func reconciles(b *testing.B) map[string][2]float64 {
	b.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" {
					name = l.GetValue()
				}
			}
			switch f.GetName() {
			case "controller_runtime_reconcile_total":
				v := out["controller "+name]
				v[0] += m.GetCounter().GetValue()
				out["controller "+name] = v
			case "controller_runtime_reconcile_time_seconds":
				v := out["controller "+name]
				v[1] += m.GetHistogram().GetSampleSum()
				out["controller "+name] = v
			case "iteron_phase_duration_seconds", "iteron_ledger_fdatasync_seconds":
				key := f.GetName()
				for _, l := range m.GetLabel() {
					if l.GetName() == "phase" {
						key += " " + l.GetValue()
					}
				}
				v := out[key]
				v[0] += float64(m.GetHistogram().GetSampleCount())
				v[1] += m.GetHistogram().GetSampleSum()
				out[key] = v
			}
		}
	}
	return out
}

// logWork logs what the manager did since before (count, seconds).
func logWork(b *testing.B, what string, before map[string][2]float64) {
	after := reconciles(b)
	keys := slices.Sorted(maps.Keys(after))
	for _, k := range keys {
		if d := after[k][0] - before[k][0]; d > 0 && !strings.HasSuffix(k, "controller ") {
			b.Logf("%s: %s ×%.0f, %.3fs", what, k, d, after[k][1]-before[k][1])
		}
	}
}

// rssMiB is this process's resident set: the manager runs in it.
func rssMiB(b *testing.B) float64 {
	b.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

var (
	nodeSeq atomic.Int64
	started atomic.Bool
)

// BenchmarkApplyScale runs a fresh manager on an empty node (in-process, built by cmd/manager/app with its default flags, as
// the manager's service account): one activation of the 28 family modules
// (apply → Ready on an empty node, and the manager's API requests per
// module until it is quiet), nine more (280 providers: the manager's RSS),
// then an eleventh (apply → Ready with 280 providers running, and its
// ratio to the first). Run it with -benchtime 1x, once per test binary
// (controller-runtime refuses a second manager's controllers of the same
// name in one process): make bench-apply runs it BENCH_APPLY_COUNT times.
func BenchmarkApplyScale(b *testing.B) {
	if b.N != 1 || started.Swap(true) {
		b.Skip("one run per test binary: -benchtime 1x -count 1 (make bench-apply)")
	}
	srcs := familySources(b)
	laidOut := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		node := fmt.Sprintf("applyscale-%d", nodeSeq.Add(1))
		stateDir := filepath.Join(base, node)
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			b.Fatal(err)
		}
		reqs := &requests{}
		ctx, cancel := context.WithCancel(context.Background())
		mgr, err := operatortest.StartManager(ctx, env, operatortest.Options{Node: node, StateDir: stateDir, AllowedRoots: []string{providersDir}, WrapTransport: reqs.wrap})
		if err != nil {
			b.Fatal(err)
		}
		if !mgr.App.Manager.GetCache().WaitForCacheSync(ctx) {
			b.Fatal("the manager's cache never synced")
		}
		for mgr.Coordinator.Recovering() {
			time.Sleep(10 * time.Millisecond)
		}
		reqs.quiet()
		// A node's artifacts were installed before anything applies them:
		// wait until these are older than the verifier's racy window, so
		// that the first activation is not the only one that must hash
		// every executable (a digest is remembered only for a file that
		// has not changed for two seconds).
		time.Sleep(time.Until(laidOut.Add(2500 * time.Millisecond)))
		b.StartTimer()

		all0, writes0 := reqs.all.Load(), reqs.writes.Load()
		rec0 := reconciles(b)
		first, firstActive := applyAndWait(b, mgr, node, node+"-01", srcs)
		reqs.quiet()
		all, writes := reqs.all.Load()-all0, reqs.writes.Load()-writes0
		logWork(b, "first activation", rec0)
		load1 := loadAverage()
		for n := 2; n <= activationsBefore; n++ {
			applyAndWait(b, mgr, node, fmt.Sprintf("%s-%02d", node, n), srcs)
		}
		reqs.quiet()
		rss := rssMiB(b)
		var mem runtime.MemStats
		runtime.ReadMemStats(&mem)
		rec10 := reconciles(b)
		eleventh, eleventhActive := applyAndWait(b, mgr, node, fmt.Sprintf("%s-%02d", node, activationsBefore+1), srcs)
		load11 := loadAverage()
		logWork(b, "eleventh activation", rec10)
		b.StopTimer()

		b.ReportMetric(float64(first.Microseconds())/1000, "first-ms")
		b.ReportMetric(float64(eleventh.Microseconds())/1000, "eleventh-ms")
		b.ReportMetric(float64(eleventh)/float64(first), "eleventh/first")
		b.ReportMetric(float64(firstActive.Microseconds())/1000, "first-active-ms")
		b.ReportMetric(float64(eleventhActive.Microseconds())/1000, "eleventh-active-ms")
		b.ReportMetric(float64(all)/modules, "requests/module")
		b.ReportMetric(float64(writes)/modules, "writes/module")
		b.ReportMetric(rss, "rss-MiB@280")
		b.ReportMetric(float64(mem.HeapInuse)/(1<<20), "heap-inuse-MiB@280")
		b.Logf("node %s: first Ready %v, all Active in the coordinator %v (load %s); eleventh Ready %v, Active %v (load %s); %d requests (%d writes) for %d modules, RSS %.1f MiB with %d providers",
			node, first.Round(time.Millisecond), firstActive.Round(time.Millisecond), load1, eleventh.Round(time.Millisecond), eleventhActive.Round(time.Millisecond), load11, all, writes, modules, rss, activationsBefore*modules)

		cancel()
		mgr.Stop()
		os.RemoveAll(stateDir)
		b.StartTimer()
	}
}
