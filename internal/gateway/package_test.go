package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/activation"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
	"iteron.dev/operator/test/pkgruntimetest"
)

var (
	runtimesOnce sync.Once
	runtimeBins  map[string]string
	runtimeDir   string
	runtimesErr  error
	pkgLauncher  *pkgruntime.Launcher
	// runtimeSocketDir is the launcher's SocketDir (the fault tests check
	// that nothing of a failed runtime is left in it).
	runtimeSocketDir string
)

// packageRuntimes builds the example runtimes once per test binary and
// starts the one package-runtime launcher (beside the shared executor: one
// spawner and reaper for both).
func packageRuntimes(tb testing.TB) (map[string]string, *pkgruntime.Launcher) {
	tb.Helper()
	sharedExecutor(tb)
	runtimesOnce.Do(func() {
		runtimeDir, runtimesErr = os.MkdirTemp("", "iteron-gateway-runtimes-")
		if runtimesErr != nil {
			return
		}
		providertest.RemoveAtExit(runtimeDir)
		if runtimeBins, runtimesErr = pkgruntimetest.Build(runtimeDir); runtimesErr != nil {
			return
		}
		sockets, err := os.MkdirTemp("", "gwrt")
		if err != nil {
			runtimesErr = err
			return
		}
		providertest.RemoveAtExit(sockets)
		runtimeSocketDir = sockets
		pkgLauncher, runtimesErr = pkgruntime.NewLauncher(pkgruntime.LaunchConfig{
			ProviderUID: providerUID, ProviderGID: providerUID, RecordDir: filepath.Join(runtimeDir, "records"),
			SocketDir: sockets, KillTimeout: 5 * time.Second, SealCacheBytes: 64 << 20,
		})
	})
	if runtimesErr != nil {
		tb.Fatal(runtimesErr)
	}
	return runtimeBins, pkgLauncher
}

// withPackageRuntimes makes the harness launch package-runtime plans.
func withPackageRuntimes(tb testing.TB) harnessOption {
	_, l := packageRuntimes(tb)
	return func(h *hotswap.Config, _ *Config) { h.Launch = hotswap.WithPackageRuntimes(h.Launch, l) }
}

// runtimeRevisions are the package_revision_id each runtime answers with.
var runtimeRevisions = map[string]string{pkgruntimetest.KV: "kv-1.0.0", pkgruntimetest.Seed: "seed-kv-1"}

// runtimePlan lays binary out in a fresh artifact root and mints the plan
// of a package runtime filling module, answering as revision.
func runtimePlan(tb testing.TB, module, binary, revision string, edit ...func(*catalog.PackageRuntimeManifest)) activation.LaunchPlan {
	tb.Helper()
	root := providertest.Dir(tb)
	b, err := os.ReadFile(binary)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "runtime"), b, 0o755); err != nil {
		tb.Fatal(err)
	}
	digest, err := artifacts.FileSHA256(filepath.Join(root, "runtime"))
	if err != nil {
		tb.Fatal(err)
	}
	m := catalog.PackageRuntimeManifest{
		SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: revision, RuntimeProtocolVersion: catalog.PackageRuntimeProtocol,
		Module: module, ExportIDs: []string{"get", "put", "watch"}, RequestedCapabilities: []string{},
		Executable: "runtime", ArtifactSHA256: strings.TrimPrefix(digest, "sha256:"),
		Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 10_000, InvokeMs: 10_000, CancelMs: 500},
		Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 8, MaxWatches: 8},
	}
	for _, e := range edit {
		e(&m)
	}
	manifestDigest, err := catalog.PackageRuntimeManifestDigest(m)
	if err != nil {
		tb.Fatal(err)
	}
	authority, err := strictjson.DigestOf([]string{})
	if err != nil {
		tb.Fatal(err)
	}
	return activation.NewLaunchPlanForTest(tb, activation.LaunchPlanFields{
		Module: module, ImplementationID: revision, ProtocolVersion: 1,
		ManifestSHA256: manifestDigest, ArtifactSHA256: "sha256:" + strings.TrimPrefix(digest, "sha256:"), ArtifactRoot: root, Executable: filepath.Join(root, "runtime"),
		CandidateSHA256: providertest.CandidateSHA256, AdmittedCapabilities: []string{}, AuthoritySHA256: authority,
		RuntimeDeadline: 10 * time.Second, CancellationDeadline: 500 * time.Millisecond,
		EvidenceLimits: activation.EvidenceLimits{StderrBytes: 64 << 10},
		Contracts:      protocol.BuiltinContracts(module), FailurePolicy: "fail_closed", PackageRuntime: &m,
	})
}

// kvPlan is the SDK's kv runtime filling module.
func kvPlan(tb testing.TB, module string) activation.LaunchPlan {
	bins, _ := packageRuntimes(tb)
	return runtimePlan(tb, module, bins[pkgruntimetest.KV], runtimeRevisions[pkgruntimetest.KV])
}

// seedPlan is the proto-only runtime filling module.
func seedPlan(tb testing.TB, module string) activation.LaunchPlan {
	bins, _ := packageRuntimes(tb)
	return runtimePlan(tb, module, bins[pkgruntimetest.Seed], runtimeRevisions[pkgruntimetest.Seed])
}

// put stores value (JSON) at key through the gateway.
func (h *harness) put(a *activationRef, module, key, value string) *gatewayv1.InvokeResponse {
	h.tb.Helper()
	resp, err := h.invoke(nil, &gatewayv1.InvokeRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		Export: "put", InputJson: `{"key":"` + key + `","value":` + value + `}`})
	if err != nil {
		h.tb.Fatalf("put %s=%s in %s: %v", key, value, module, err)
	}
	if !resp.GetOk() || resp.GetValueJson() != value {
		h.tb.Fatalf("put %s=%s in %s answered ok=%v value %s error %q", key, value, module, resp.GetOk(), resp.GetValueJson(), resp.GetError())
	}
	return resp
}

// watchStream is an open gateway Watch whose events arrive on a channel.
type watchStream struct {
	events chan *gatewayv1.WatchEvent
	err    chan error
	cancel context.CancelFunc
}

// watch opens a Watch of key on module and reads it in the background.
func (h *harness) watch(a *activationRef, module, id, key string) *watchStream {
	h.tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := h.client.Watch(ctx, &gatewayv1.WatchRequest{Namespace: a.key.Namespace, Activation: a.key.Name, Module: module,
		InvocationId: id, Export: "watch", InputJson: `{"key":"` + key + `"}`})
	if err != nil {
		cancel()
		h.tb.Fatalf("watch %s: %v", module, err)
	}
	w := &watchStream{events: make(chan *gatewayv1.WatchEvent, 64), err: make(chan error, 1), cancel: cancel}
	go func(stream grpc.ServerStreamingClient[gatewayv1.WatchEvent]) {
		for {
			ev, err := stream.Recv()
			if err != nil {
				w.err <- err
				return
			}
			w.events <- ev
		}
	}(stream)
	h.tb.Cleanup(cancel)
	return w
}

// next is the stream's next event; the test fails if the stream ends or
// nothing arrives within 30 s.
func (w *watchStream) next(tb testing.TB, what string) *gatewayv1.WatchEvent {
	tb.Helper()
	select {
	case ev := <-w.events:
		return ev
	case err := <-w.err:
		tb.Fatalf("%s: the watch ended: %v", what, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("%s: no event within 30s", what)
	}
	return nil
}

func describe(ev *gatewayv1.WatchEvent) string {
	return "seq=" + strconv.FormatUint(ev.GetSequence(), 10) + " generation=" + ev.GetGenerationName() + " initial=" + boolString(ev.GetInitial()) + " value=" + ev.GetValueJson()
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestACutoverOfOneRuntimeMovesItsWatchAndLeavesTheOtherModulesProcessAndStreamAlone(t *testing.T) {
	h := newHarness(t, withPackageRuntimes(t))
	a := newActivation("default", "stack")
	const unchanged, changed = "prompt_system", "prompt_planner"
	h.deployPlan(a, kvPlan(t, unchanged), hotswap.SwapPolicy{})
	tChanged := h.deployPlan(a, kvPlan(t, changed), hotswap.SwapPolicy{})
	st := h.settle(a, tChanged)
	pidUnchanged, pidChanged := st.Modules[unchanged].Pid, st.Modules[changed].Pid
	if pidUnchanged == 0 || pidChanged == 0 {
		t.Fatalf("pids before the cutover: %s %d, %s %d", unchanged, pidUnchanged, changed, pidChanged)
	}
	h.put(a, unchanged, "x", "1")
	h.put(a, changed, "y", `"before"`)

	wu := h.watch(a, unchanged, "watch-unchanged", "x")
	wc := h.watch(a, changed, "watch-changed", "y")
	first := wu.next(t, "unchanged module's initial event")
	if !first.GetInitial() || first.GetValueJson() != "1" {
		t.Fatalf("unchanged module's first event: %s", describe(first))
	}
	firstChanged := wc.next(t, "changed module's initial event")
	if !firstChanged.GetInitial() || firstChanged.GetValueJson() != `"before"` || firstChanged.GetGeneration() != 1 {
		t.Fatalf("changed module's first event: %s", describe(firstChanged))
	}

	// The cutover: the changed module moves to another implementation (the
	// proto-only runtime), a cold replace.
	tNew := h.deployPlan(a, seedPlan(t, changed), hotswap.SwapPolicy{})
	st = h.settle(a, tNew)

	moved := wc.next(t, "the moved watch's first event on the new runtime")
	if !moved.GetInitial() || moved.GetGeneration() != 2 || moved.GetGenerationName() != tNew.GenerationName || moved.GetValueJson() != "null" {
		t.Fatalf("the moved watch's event: %s; want the initial event of %s (the new runtime starts empty: null)", describe(moved), tNew.GenerationName)
	}
	h.put(a, changed, "y", `"after"`)
	if ev := wc.next(t, "the moved watch's next change"); ev.GetInitial() || ev.GetValueJson() != `"after"` || ev.GetGenerationName() != tNew.GenerationName {
		t.Fatalf("the moved watch's next event: %s", describe(ev))
	}

	// The unchanged module: same process, same stream, nothing in between.
	if got := st.Modules[unchanged].Pid; got != pidUnchanged {
		t.Fatalf("module %s's pid went from %d to %d across another module's cutover", unchanged, pidUnchanged, got)
	}
	if got := st.Modules[changed].Pid; got == pidChanged || got == 0 {
		t.Fatalf("module %s's pid is %d after its cutover (was %d)", changed, got, pidChanged)
	}
	select {
	case ev := <-wu.events:
		t.Fatalf("the unchanged module's watch got an event nobody caused: %s", describe(ev))
	case err := <-wu.err:
		t.Fatalf("the unchanged module's watch ended across the cutover: %v", err)
	default:
	}
	h.put(a, unchanged, "x", "2")
	ev := wu.next(t, "the unchanged module's next change")
	if ev.GetInitial() || ev.GetValueJson() != "2" || ev.GetSequence() != 2 || ev.GetGeneration() != 1 {
		t.Fatalf("the unchanged module's event after the cutover: %s; want seq=2, not initial, value 2, generation 1", describe(ev))
	}
	t.Logf("before the cutover: %s pid %d, %s pid %d", unchanged, pidUnchanged, changed, pidChanged)
	t.Logf("after the cutover:  %s pid %d (unchanged), %s pid %d (%s)", unchanged, st.Modules[unchanged].Pid, changed, st.Modules[changed].Pid, tNew.GenerationName)
	t.Logf("unchanged module's watch: %s, then %s (one stream, no initial in between)", describe(first), describe(ev))
	t.Logf("changed module's watch: %s, then moved: %s", describe(firstChanged), describe(moved))
}
