package fleetscale

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/cmd/manager/app"
	"iteron.dev/operator/test/fleettest"
	"iteron.dev/operator/test/kubeapi"
)

var env *kubeapi.Environment

func TestMain(m *testing.M) {
	var err error
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		os.Exit(1)
	}
	fmt.Printf("fleetscale tests run against kube-apiserver %s\n", env.ServerVersion)
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

// Goals of the issue: the controller's own time per node and its API
// writes per node for one rollout.
const (
	goalOwnTimePerNode = 5 * time.Millisecond
	goalWritesPerNode  = 3.0
)

// counter counts and times the fleet controller's requests that change
// something (every verb but get, list and watch), by resource.
type counter struct {
	mu     sync.Mutex
	writes map[string]int
	// inReconcile is the time spent in writes a reconcile waits for
	// (events are sent by a background broadcaster).
	inReconcile time.Duration
}

func (c *counter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet {
			return rt.RoundTrip(req)
		}
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		d := time.Since(start)
		res := resourceOf(req.URL.Path)
		c.mu.Lock()
		c.writes[req.Method+" "+res]++
		if res != "events" {
			c.inReconcile += d
		}
		c.mu.Unlock()
		return resp, err
	})
}

func (c *counter) snapshot() (map[string]int, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.writes {
		out[k] = v
	}
	return out, c.inReconcile
}

func (c *counter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes, c.inReconcile = map[string]int{}, 0
}

// timing measures each reconcile: its wall time and the CPU time of the
// thread it ran on (locked to it for the reconcile): the controller's own
// work, which a busy machine does not inflate the way it inflates wall time.
type timing struct {
	mu        sync.Mutex
	wall, cpu time.Duration
	n         int
}

func (tm *timing) wrap(r reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cpu0, start := threadCPU(), time.Now()
		res, err := r.Reconcile(ctx, req)
		cpu, wall := threadCPU()-cpu0, time.Since(start)
		tm.mu.Lock()
		tm.wall, tm.cpu, tm.n = tm.wall+wall, tm.cpu+cpu, tm.n+1
		tm.mu.Unlock()
		return res, err
	})
}

func (tm *timing) get() (wall, cpu time.Duration, n int) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.wall, tm.cpu, tm.n
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf is the resource (and subresource) of an API path.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			rest := parts[i+2:]
			if len(rest) >= 3 {
				return rest[0] + "/" + rest[2]
			}
			return rest[0]
		}
	}
	if len(parts) > 0 {
		return parts[len(parts)-1]
	}
	return path
}

// statusWriter stands in for the node managers (100 of them do not fit a
// 2-core machine): it writes, for every activation whose spec it has not
// answered, the status a manager writes when a swap is done — after a
// simulated swap of swapTime — Ready for that generation. Its writes are
// not the controller's.
type statusWriter struct {
	c        client.Client
	swapTime time.Duration
	queue    chan client.ObjectKey
	writes   atomic.Int64
	mu       sync.Mutex
	unready  map[string]bool
	maxSeen  int
}

func (w *statusWriter) run(ctx context.Context, t *testing.T, informer cache.Informer) {
	w.queue = make(chan client.ObjectKey, 4096)
	w.unready = map[string]bool{}
	note := func(obj any) {
		a, ok := obj.(*iteronv1.ImplementationActivation)
		if !ok {
			return
		}
		w.mu.Lock()
		if a.Status.ObservedGeneration != a.Generation {
			w.unready[a.Name] = true
		} else {
			delete(w.unready, a.Name)
		}
		w.maxSeen = max(w.maxSeen, len(w.unready))
		w.mu.Unlock()
		if a.Status.ObservedGeneration != a.Generation && a.DeletionTimestamp == nil {
			w.queue <- client.ObjectKeyFromObject(a)
		}
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: note, UpdateFunc: func(_, n any) { note(n) },
	}); err != nil {
		t.Fatal(err)
	}
	for range 16 {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case key := <-w.queue:
					select {
					case <-ctx.Done():
						return
					case <-time.After(w.swapTime):
					}
					w.answer(ctx, key)
				}
			}
		}()
	}
}

func (w *statusWriter) answer(ctx context.Context, key client.ObjectKey) {
	var a iteronv1.ImplementationActivation
	if err := w.c.Get(ctx, key, &a); err != nil || a.Status.ObservedGeneration == a.Generation {
		return
	}
	gen := a.Generation
	a.Status.ObservedGeneration = gen
	for _, c := range []metav1.Condition{
		{Type: iteronv1.ConditionReady, Status: metav1.ConditionTrue, Reason: iteronv1.ReasonSucceeded, Message: "all 1 modules Active"},
		{Type: iteronv1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "the desired state holds"},
		{Type: iteronv1.ConditionStalled, Status: metav1.ConditionFalse, Reason: iteronv1.ReasonSucceeded, Message: "not stalled"},
	} {
		c.ObservedGeneration = gen
		meta.SetStatusCondition(&a.Status.Conditions, c)
	}
	if err := w.c.Status().Update(ctx, &a); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			fmt.Fprintln(os.Stderr, "status writer:", err)
		}
		if apierrors.IsConflict(err) {
			w.queue <- key
		}
		return
	}
	w.writes.Add(1)
}

// TestARolloutOverAHundredNodesStaysWithinTheControllerBudget rolls a set
// over 100 Node objects (canary 1, then waves of 10%) with a status writer
// in place of the managers, and measures the fleet controller: its
// reconcile time per wave, its own time per node (reconcile time less the
// writes it waited for), and its API writes per node.
func TestARolloutOverAHundredNodesStaysWithinTheControllerBudget(t *testing.T) {
	measureRollout(t, scaleRun{nodes: 100, prefix: "scale", strategy: iteronv1.RolloutStrategy{
		Canary:         &iteronv1.CanaryStrategy{Nodes: 1, SoakSeconds: ptr.To[int32](1)},
		MaxUnavailable: ptr.To(intstr.FromString("10%")),
	}, waves: 11, label: "canary 1 soaked 1 s, maxUnavailable 10% = 10 nodes"})
}

// TestARolloutOverAThousandNodesJudgedByAnalysisStaysWithinTheControllerBudget
// rolls a set over 1 000 Node objects in steps (a canary of 1 node, then
// 10% of the nodes, then waves of 10% = 100 nodes) with every wave judged
// by two analyses answered by a test server on loopback (a
// Prometheus-compatible query API and a webhook), the managers replaced by
// the status writer (1 000 managers do not fit this machine: they are
// simulated), and measures the fleet controller as above.
func TestARolloutOverAThousandNodesJudgedByAnalysisStaysWithinTheControllerBudget(t *testing.T) {
	var queries, hooks atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/query" {
			queries.Add(1)
			_, _ = io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0.001"]}]}}`)
			return
		}
		hooks.Add(1)
		_, _ = io.WriteString(w, `{"verdict":"pass"}`)
	}))
	defer srv.Close()
	ctx := context.Background()
	for _, p := range []*iteronv1.AnalysisProvider{
		{ObjectMeta: metav1.ObjectMeta{Name: "scale-prometheus"}, Spec: iteronv1.AnalysisProviderSpec{Prometheus: &iteronv1.PrometheusProvider{Address: srv.URL}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "scale-gate"}, Spec: iteronv1.AnalysisProviderSpec{Webhook: &iteronv1.WebhookProvider{URL: srv.URL + "/gate"}}},
	} {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = env.Client.Delete(ctx, p) }()
	}
	measureRollout(t, scaleRun{nodes: 1000, prefix: "big", strategy: iteronv1.RolloutStrategy{
		Steps: []iteronv1.RolloutStep{
			{Wave: &iteronv1.WaveStep{Nodes: ptr.To[int32](1)}},
			{Wave: &iteronv1.WaveStep{Percent: ptr.To[int32](10)}},
		},
		MaxUnavailable: ptr.To(intstr.FromString("10%")),
		Analysis: &iteronv1.RolloutAnalysis{Metrics: []iteronv1.AnalysisMetric{
			{Name: "error-rate", Provider: "scale-prometheus", Query: `sum(rate(iteron_gateway_calls_total{revision="{{revision}}",node=~"{{nodes}}",code!="ok"}[1m]))`,
				SuccessCondition: "result.all(v, v < 0.05)", IntervalSeconds: ptr.To[int32](1)},
			{Name: "gate", Provider: "scale-gate", IntervalSeconds: ptr.To[int32](1)},
		}},
	}, waves: 11, label: "steps: 1 node, then 10%; then waves of maxUnavailable 10% = 100 nodes; each wave judged by 2 analyses (1 measurement each, 1 s after the wave is Ready)",
		check: func(t *testing.T, done *iteronv1.ActivationSet) {
			t.Logf("the test server answered %d queries and %d webhook calls (2 analyses × 11 waves)", queries.Load(), hooks.Load())
			if queries.Load() != 11 || hooks.Load() != 11 {
				t.Errorf("%d queries and %d webhook calls; want 11 each (one per wave)", queries.Load(), hooks.Load())
			}
			for _, r := range done.Status.AnalysisRuns {
				if r.Revision == done.Status.UpdateRevision && r.Phase != iteronv1.AnalysisSuccessful {
					t.Errorf("analysis run %+v", r)
				}
			}
		}})
}

// scaleRun is one measured rollout.
type scaleRun struct {
	nodes    int
	prefix   string
	strategy iteronv1.RolloutStrategy
	waves    int32
	label    string
	check    func(*testing.T, *iteronv1.ActivationSet)
}

func measureRollout(t *testing.T, run scaleRun) {
	nodes := run.nodes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := fleettest.InstallRBAC(env); err != nil {
		t.Fatal(err)
	}
	level := zapcore.ErrorLevel
	if fleettest.Verbose() {
		level = zapcore.DebugLevel
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))

	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("%s-%04d", run.prefix, i))
	}
	created := time.Now()
	fleettest.CreateNodes(t, env.Client, map[string]string{"iteron.dev/pool": run.prefix}, names...)
	t.Logf("%d Node objects created in %s", nodes, time.Since(created).Round(time.Millisecond))

	// The status writer, as an administrator.
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	informer, err := c.GetInformer(ctx, &iteronv1.ImplementationActivation{})
	if err != nil {
		t.Fatal(err)
	}
	writer := &statusWriter{c: env.Client, swapTime: 200 * time.Millisecond}
	writer.run(ctx, t, informer)
	go func() { _ = c.Start(ctx) }()
	c.WaitForCacheSync(ctx)

	// The fleet controller, in-process, as its service account, every
	// request it makes counted.
	count := &counter{writes: map[string]int{}}
	cfg := fleettest.As(env.Config, fleettest.FleetUser)
	cfg.QPS, cfg.Burst = 200, 400
	cfg.WrapTransport = count.wrap
	tm := &timing{}
	f, err := app.NewFleet(cfg, app.FleetOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0", Log: ctrl.Log, WrapReconciler: tm.wrap,
		SkipControllerNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	fleetDone := make(chan struct{})
	go func() {
		defer close(fleetDone)
		if err := f.Run(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "fleet controller:", err)
		}
	}()
	defer func() { cancel(); <-fleetDone }()

	key := client.ObjectKey{Namespace: "default", Name: run.prefix}
	set := &iteronv1.ActivationSet{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec: iteronv1.ActivationSetSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"iteron.dev/pool": run.prefix}},
			Template:     template("counter-v1"),
			Strategy:     run.strategy,
		},
	}
	start := time.Now()
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitSet(t, env.Client, key, "Completed on v1", 5*time.Minute, fleettest.Completed)
	t.Logf("first deployment: %d activations stamped and Ready in %s", nodes, time.Since(start).Round(time.Millisecond))

	// The rollout v1 → v2, measured.
	count.reset()
	wall0, cpu0, n0 := tm.get()
	writer.mu.Lock()
	writer.maxSeen = 0
	writer.mu.Unlock()
	writerWrites0 := writer.writes.Load()
	waves := &waveLog{tm: tm}
	waves.watch(t, key, informerFor(ctx, t, c))
	proc0 := processCPU(t)
	if path := os.Getenv("ITERON_FLEET_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	start = time.Now()
	if err := retryUpdate(ctx, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template("counter-v2") }); err != nil {
		t.Fatal(err)
	}
	done := fleettest.WaitSet(t, env.Client, key, "Completed on v2", 5*time.Minute, fleettest.Completed)
	elapsed := time.Since(start)
	proc := processCPU(t) - proc0
	wall1, cpu1, n1 := tm.get()
	writes, inWrites := count.snapshot()
	waves.stop()

	total, nonEvent := 0, 0
	var kinds []string
	for k, v := range writes {
		total += v
		if !strings.HasSuffix(k, " events") {
			nonEvent += v
		}
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(kinds)
	wall, cpu := wall1-wall0, cpu1-cpu0
	perNodeCPU := cpu / time.Duration(nodes)
	perNodeWrites := float64(total) / float64(nodes)
	writer.mu.Lock()
	maxUnready := writer.maxSeen
	writer.mu.Unlock()
	budget := nodes / 10

	t.Logf("rollout v1 → v2 of %d nodes (%s, a simulated swap of %s per node): %s, %d waves, phase %s",
		nodes, run.label, writer.swapTime, elapsed.Round(time.Millisecond), done.Status.Wave, done.Status.Phase)
	for _, w := range waves.rows() {
		t.Log(w)
	}
	t.Logf("reconciles: %d; wall time %s (%s per node), of which %s waiting for its own writes; the controller's own time (CPU of the reconciling thread): %s, %s per node (goal ≤ %s)",
		n1-n0, wall.Round(time.Millisecond), (wall / time.Duration(nodes)).Round(time.Microsecond), inWrites.Round(time.Millisecond),
		cpu.Round(time.Millisecond), perNodeCPU.Round(time.Microsecond), goalOwnTimePerNode)
	t.Logf("API writes by the controller: %d (%.2f per node; goal ≤ %.0f), %d of them not events: %s", total, perNodeWrites, goalWritesPerNode, nonEvent, strings.Join(kinds, " "))
	t.Logf("CPU time of this whole test process during the rollout (the controller, its cache decoding watch events, the status writer and its cache): %s (%s per node)",
		proc.Round(time.Millisecond), (proc / time.Duration(nodes)).Round(time.Microsecond))
	t.Logf("status writer (the simulated managers): %d writes during the rollout; at most %d activations not Ready at once", writer.writes.Load()-writerWrites0, maxUnready)

	if perNodeWrites > goalWritesPerNode {
		t.Errorf("%.2f API writes per node; goal ≤ %.0f", perNodeWrites, goalWritesPerNode)
	}
	if perNodeCPU > goalOwnTimePerNode {
		t.Errorf("%s of controller time per node; goal ≤ %s", perNodeCPU, goalOwnTimePerNode)
	}
	if maxUnready > budget {
		t.Errorf("%d activations were not Ready at once; maxUnavailable is %d", maxUnready, budget)
	}
	if done.Status.UpdatedNodes != int32(nodes) || done.Status.ReadyNodes != int32(nodes) || done.Status.Wave != run.waves {
		t.Errorf("status at the end: updated %d, ready %d, wave %d; want %d updated and Ready after %d waves", done.Status.UpdatedNodes, done.Status.ReadyNodes, done.Status.Wave, nodes, run.waves)
	}
	if run.check != nil {
		run.check(t, done)
	}
	// The set goes while its controller runs (its finalizer), so that the
	// next measured rollout does not share the controller with it.
	if err := env.Client.Delete(ctx, set); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if err := env.Client.Get(ctx, key, &iteronv1.ActivationSet{}); apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ActivationSet %s was not released by its finalizer within 3 minutes", key)
		}
	}
}

// processCPU is the user and system CPU time this process used so far.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func template(id string) iteronv1.ActivationTemplate {
	d := "sha256:" + strings.Repeat("a", 64)
	return fleettest.Template(d, iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: id, CatalogPath: "/var/lib/iteron/providers/" + id + "/catalog.json",
		ArtifactRoot: "/var/lib/iteron/providers/" + id, ManifestSHA256: d, ArtifactSHA256: d})
}

func retryUpdate(ctx context.Context, key client.ObjectKey, edit func(*iteronv1.ActivationSet)) error {
	for {
		var s iteronv1.ActivationSet
		if err := env.Client.Get(ctx, key, &s); err != nil {
			return err
		}
		edit(&s)
		err := env.Client.Update(ctx, &s)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func informerFor(ctx context.Context, t *testing.T, c cache.Cache) cache.Informer {
	i, err := c.GetInformer(ctx, &iteronv1.ActivationSet{})
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// waveLog records when each wave starts (status.wave changes) and the
// controller's reconcile time so far at that moment.
type waveLog struct {
	tm      *timing
	mu      sync.Mutex
	entries []waveEntry
	reg     toolscache.ResourceEventHandlerRegistration
	inf     cache.Informer
}

type waveEntry struct {
	wave  int32
	nodes []string
	// updated is status.updatedNodes when the wave began, the wave's
	// nodes included: minus the previous wave's, it is the wave's size
	// (status lists at most 32 of its nodes).
	updated   int32
	at        time.Time
	wall, cpu time.Duration
	n         int
}

func (w *waveLog) watch(t *testing.T, key client.ObjectKey, inf cache.Informer) {
	last := int32(-1)
	on := func(obj any) {
		s, ok := obj.(*iteronv1.ActivationSet)
		if !ok || s.Name != key.Name || s.Status.UpdateRevision == "" || s.Status.Wave == last {
			return
		}
		last = s.Status.Wave
		wall, cpu, n := w.tm.get()
		w.mu.Lock()
		w.entries = append(w.entries, waveEntry{wave: s.Status.Wave, nodes: s.Status.WaveNodes, updated: s.Status.UpdatedNodes, at: time.Now(), wall: wall, cpu: cpu, n: n})
		w.mu.Unlock()
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, n any) { on(n) }})
	if err != nil {
		t.Fatal(err)
	}
	w.reg, w.inf = reg, inf
}

func (w *waveLog) stop() { _ = w.inf.RemoveEventHandler(w.reg) }

// rows describe each wave: its nodes, how long it lasted, the reconciles
// in it and their time.
func (w *waveLog) rows() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	wall, cpu, n := w.tm.get()
	var out []string
	var before int32 // status.updatedNodes before this wave
	for i, e := range w.entries {
		next := waveEntry{at: time.Now(), wall: wall, cpu: cpu, n: n}
		if i+1 < len(w.entries) {
			next = w.entries[i+1]
		}
		if e.wave == 0 {
			continue
		}
		label := fmt.Sprintf("wave %2d", e.wave)
		if e.wave == 1 {
			label = "wave  1 (canary)"
		}
		size := int(e.updated - before)
		before = e.updated
		k := time.Duration(max(1, size))
		out = append(out, fmt.Sprintf("  %s: %3d nodes (%s …), lasted %s, %2d reconciles, wall %s, CPU %s (%s per node)",
			label, size, first(e.nodes), next.at.Sub(e.at).Round(time.Millisecond), next.n-e.n,
			(next.wall-e.wall).Round(time.Millisecond), (next.cpu-e.cpu).Round(time.Microsecond), ((next.cpu-e.cpu)/k).Round(time.Microsecond)))
	}
	return out
}

func first(nodes []string) string {
	if len(nodes) == 0 {
		return ""
	}
	return nodes[0]
}
