package oci_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/test/operatortest"
	"iteron.dev/operator/test/registrytest"
)

const baselineID = "counter-v1.baseline"

var (
	baselineOnce sync.Once
	baselineArt  *pushed
)

// baseline is the artifact every failure case starts from: an activation
// Active on it, then swapped to the failing one.
func baseline(t *testing.T) *pushed {
	t.Helper()
	baselineOnce.Do(func() { baselineArt = push(t, pub, "providers/baseline", impl{example: "counter-v1", id: baselineID}) })
	if baselineArt == nil {
		t.Fatal("the baseline artifact was not pushed")
	}
	return baselineArt
}

// onBaseline creates an activation on the baseline artifact, waits until
// it is Ready and returns it with the name of the generation serving.
func onBaseline(t *testing.T) (*iteronv1.ImplementationActivation, string) {
	t.Helper()
	b := baseline(t)
	act := newActivation(t, source(b, b.Ref, baselineID))
	got := operatortest.WaitFor(t, env.Client, act, "Ready on the baseline", operatortest.Ready)
	gen := call(t, got)
	return got, gen
}

// call invokes the counter through the module's dispatcher and returns the
// name of the generation that answered.
func call(t *testing.T, act *iteronv1.ImplementationActivation) string {
	t.Helper()
	d, ok := mgr.Coordinator.Dispatcher(act.Namespace, act.Name, "prompt_system")
	if !ok {
		t.Fatalf("no dispatcher for %s/prompt_system", act.Name)
	}
	r, err := d.Invoke(context.Background(), dispatch.Call{ID: fmt.Sprintf("oci-%d", seq.Add(1)), Input: protocol.MustPayload(`{"key":"k","add":1}`), Deadline: time.Now().Add(20 * time.Second)})
	if err != nil {
		t.Fatalf("invoke %s/prompt_system: %v", act.Name, err)
	}
	var out map[string]any
	if err := json.Unmarshal(r.Terminal.Body, &out); err != nil {
		t.Fatalf("the counter answered %q: %v", r.Terminal.Body, err)
	}
	return r.Name
}

// oldServes checks that the generation from before still serves: the
// module is Active on the baseline and a call is answered by oldGen.
func oldServes(t *testing.T, act *iteronv1.ImplementationActivation, oldGen string) string {
	t.Helper()
	var cur iteronv1.ImplementationActivation
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &cur); err != nil {
		t.Fatal(err)
	}
	ms := operatortest.ModuleStatus(&cur, "prompt_system")
	if ms.Phase != iteronv1.PhaseActive || ms.ImplementationID != baselineID {
		t.Errorf("the module is %s on %s; want Active on %s", ms.Phase, ms.ImplementationID, baselineID)
		return "NO: " + string(ms.Phase) + " " + ms.ImplementationID
	}
	if got := call(t, &cur); got != oldGen {
		t.Errorf("a call was answered by %s; want the old generation %s", got, oldGen)
		return "NO: answered by " + got
	}
	return fmt.Sprintf("yes (%s answered a call)", oldGen)
}

// moduleIs waits for prompt_system's status, for the current spec, to
// satisfy cond.
func moduleIs(t *testing.T, act *iteronv1.ImplementationActivation, what string, cond func(iteronv1.ModuleStatus) bool) iteronv1.ModuleStatus {
	t.Helper()
	got := operatortest.WaitFor(t, env.Client, act, what, func(a *iteronv1.ImplementationActivation) bool {
		return seen(a) && cond(operatortest.ModuleStatus(a, "prompt_system"))
	})
	return operatortest.ModuleStatus(got, "prompt_system")
}

// seen: the conditions were written for the current spec (status's own
// observedGeneration moves only once a spec is applied).
func seen(a *iteronv1.ImplementationActivation) bool {
	r := operatortest.Condition(a, iteronv1.ConditionReady)
	return r != nil && r.ObservedGeneration == a.Generation
}

func reasonOf(ms iteronv1.ModuleStatus) string {
	return ms.Reason + ": " + ms.Message
}

func noTmp(t *testing.T, store string) {
	t.Helper()
	if tmp, _ := os.ReadDir(filepath.Join(store, "tmp")); len(tmp) != 0 {
		var names []string
		for _, e := range tmp {
			names = append(names, e.Name())
		}
		t.Errorf("the store's tmp/ holds %v after the failed pull", names)
	}
}

// noTmpBetweenAttempts is noTmp for a pull that is being retried: an
// attempt in flight holds its downloads under tmp/, and every failed
// attempt must leave nothing, so tmp/ is empty in the backoff between two
// attempts (at least 200 ms). A failed attempt that left a file keeps it
// non-empty for good.
func noTmpBetweenAttempts(t *testing.T, store string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tmp, _ := os.ReadDir(filepath.Join(store, "tmp"))
		if len(tmp) == 0 {
			return
		}
		if time.Now().After(deadline) {
			noTmp(t, store)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestAPushedProviderAppliedByDigestIsActiveAndHotSwapsToASecondDigest(t *testing.T) {
	first := push(t, pub, "providers/swap", impl{example: "counter-v1", id: "counter-v1.swap", unique: true})
	second := push(t, pub, "providers/swap", impl{example: "counter-v1", id: "counter-v1.swap"}, impl{example: "counter-v2", id: "counter-v2.swap", unique: true})
	if first.Digest == second.Digest {
		t.Fatal("two artifacts with one digest")
	}
	act := newActivation(t, source(first, first.Ref, "counter-v1.swap"))
	got := operatortest.WaitFor(t, env.Client, act, "Ready", operatortest.Ready)
	ms := operatortest.ModuleStatus(got, "prompt_system")
	gen1 := call(t, got)
	t.Logf("from %s: %s generation %d (%s), a call answered by %s", first.Ref, ms.ImplementationID, ms.Generation, ms.Phase, gen1)
	gens := generations(t, act)
	if len(gens) != 1 || !strings.HasPrefix(gens[0].Spec.Implementation.ArtifactRoot, storeDir+"/sources/sha256/"+strings.TrimPrefix(first.Digest, "sha256:")) {
		t.Fatalf("the Generation's artifact root is not the pulled source: %+v", gens)
	}
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(second, second.Ref, "counter-v2.swap")
	})
	got = operatortest.WaitFor(t, env.Client, act, "Ready on the second digest", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Ready(a) && operatortest.ModuleStatus(a, "prompt_system").ImplementationID == "counter-v2.swap"
	})
	ms = operatortest.ModuleStatus(got, "prompt_system")
	gen2 := call(t, got)
	t.Logf("hot swap to %s: %s generation %d, a call answered by %s", second.Ref, ms.ImplementationID, ms.Generation, gen2)
	if ms.Generation != 2 || gen2 == gen1 {
		t.Fatalf("the swap did not continue the lineage (hot swap): generation %d, answered by %s (before: %s)", ms.Generation, gen2, gen1)
	}
}

func TestTheRegistryStoppedMidPullKeepsTheOldGenerationServingUntilItIsBack(t *testing.T) {
	act, oldGen := onBaseline(t)
	next := push(t, pub, "providers/midpull", impl{example: "counter-v2", id: "counter-v2.midpull", unique: true})
	exe := next.exe("counter-v2.midpull")
	midway, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		stall := false
		once.Do(func() { stall = true })
		if !stall {
			return false
		}
		b, err := upstream(pub, req.URL.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		close(midway)
		<-release
		panic(http.ErrAbortHandler) // the registry went away mid-body
	})
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(next, via(p, pub, next.Ref), "counter-v2.midpull")
	})
	select {
	case <-midway:
	case <-time.After(60 * time.Second):
		close(release)
		t.Fatal("the manager never started the executable's download")
	}
	pub.Stop()
	restarted := false
	defer func() {
		if !restarted {
			pub.Restart(context.Background())
		}
	}()
	close(release)
	ms := moduleIs(t, act, "artifact_unavailable with the old generation serving", func(ms iteronv1.ModuleStatus) bool {
		return ms.Reason == reasons.ArtifactUnavailable && !strings.Contains(ms.Message, "pulling")
	})
	t.Logf("registry stopped mid-pull: phase %s, %s generation %d, %s", ms.Phase, ms.ImplementationID, ms.Generation, reasonOf(ms))
	serving := oldServes(t, act, oldGen)
	if mgr.App.ArtifactStore().HasBlob(exe) {
		t.Error("the half-downloaded executable is in the store")
	}
	noTmp(t, storeDir)
	contents := storeContents(storeDir, next)
	if err := pub.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	got := operatortest.WaitFor(t, env.Client, act, "Ready on the new digest once the registry is back", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Ready(a) && operatortest.ModuleStatus(a, "prompt_system").ImplementationID == "counter-v2.midpull"
	})
	newGen := call(t, got)
	t.Logf("registry back: Ready on counter-v2.midpull, a call answered by %s", newGen)
	record(t, row{"registry stopped mid-pull (SIGKILL while the executable streams; a proxy answers 502 while it is down)", reasonOf(ms), serving,
		contents + "; once back: Ready on the new digest, " + newGen + " answers"})
}

func TestWrongCredentialsAreRefusedWithoutARetryStormUntilTheyChange(t *testing.T) {
	act, oldGen := onBaseline(t)
	next := push(t, priv, "providers/auth", impl{example: "counter-v2", id: "counter-v2.auth", unique: true})
	if err := priv.DockerConfig(credFile, "iteron", "wrong"); err != nil {
		t.Fatal(err)
	}
	defer priv.DockerConfig(credFile, "iteron", "right")
	requests := func() []registrytest.Request {
		t.Helper()
		qs, err := priv.SyncedRequests()
		if err != nil {
			t.Fatal(err)
		}
		return qs
	}
	before := len(requests())
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(next, next.Ref, "counter-v2.auth")
	})
	got := operatortest.WaitFor(t, env.Client, act, "Stalled with artifact_refused", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Stalled(a) && operatortest.ModuleStatus(a, "prompt_system").Reason == reasons.ArtifactRefused
	})
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("wrong credentials: %s", reasonOf(ms))
	if !strings.Contains(ms.Message, "401") {
		t.Fatalf("the message does not name the registry's answer: %s", ms.Message)
	}
	afterRefusal := len(requests())
	// The refusal was seen (the signal); now a window in which the manager
	// looks at the credentials every 2 s (RetryMax) three times and must
	// not ask the registry anything.
	time.Sleep(6 * time.Second)
	all := requests()
	window := len(all) - afterRefusal
	t.Logf("registry requests (its access log): %d until the refusal, %d in the 6 s after it", afterRefusal-before, window)
	if window != 0 || afterRefusal-before > 4 {
		t.Fatalf("a refused pull is retried: %d requests to reach the refusal, %d after it\n%v", afterRefusal-before, window, all[before:])
	}
	serving := oldServes(t, act, oldGen)
	noTmp(t, storeDir)
	contents := storeContents(storeDir, next)
	if err := priv.DockerConfig(credFile, "iteron", "right"); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, env.Client, act, "Ready once the credentials are right", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Ready(a) && operatortest.ModuleStatus(a, "prompt_system").ImplementationID == "counter-v2.auth"
	})
	record(t, row{"wrong credentials (htpasswd registry)", reasonOf(ms), serving,
		fmt.Sprintf("%s; %d registry requests to the refusal, %d in the 6 s after; Ready once the config.json is right", contents, afterRefusal-before, window)})
}

func TestABlobThatDiffersFromItsDescriptorIsRefusedBeforeAnythingIsWrittenOrSpawned(t *testing.T) {
	act, oldGen := onBaseline(t)
	next := push(t, pub, "providers/tamper", impl{example: "counter-v2", id: "counter-v2.tamper", unique: true})
	exe := next.exe("counter-v2.tamper")
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		b, err := upstream(pub, req.URL.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		b[len(b)/2] ^= 0x5a // same size, other bytes
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b)
		return true
	})
	gensBefore := len(generations(t, act))
	st, _ := mgr.Coordinator.Status(string(act.UID))
	coordBefore := len(st.Generations)
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(next, via(p, pub, next.Ref), "counter-v2.tamper")
	})
	ms := moduleIs(t, act, "verification_failed", func(ms iteronv1.ModuleStatus) bool { return ms.Reason == reasons.VerificationFailed })
	t.Logf("tampered blob: %s", reasonOf(ms))
	if !strings.Contains(ms.Message, exe) {
		t.Errorf("the message does not name the digest %s: %s", exe, ms.Message)
	}
	for _, b := range []string{exe, next.pkg.Parsed.Catalog.Digest, next.Digest} {
		if mgr.App.ArtifactStore().HasBlob(b) {
			t.Errorf("blob %s of the refused artifact was written to the store (the executable %s)", b, exe)
		}
	}
	if gens := generations(t, act); len(gens) != gensBefore {
		t.Errorf("a Generation was created for a refused artifact: %d before, %d now", gensBefore, len(gens))
	}
	if st, ok := mgr.Coordinator.Status(string(act.UID)); ok && len(st.Generations) != coordBefore {
		t.Errorf("the coordinator knows %d generations; %d before the refused artifact", len(st.Generations), coordBefore)
	}
	serving := oldServes(t, act, oldGen)
	noTmp(t, storeDir)
	record(t, row{"blob bytes differ from the descriptor (same size; test handler in front of the registry)", reasonOf(ms), serving,
		storeContents(storeDir, next) + "; no Generation created, nothing spawned"})
}

func TestATruncatedDownloadIsUnavailableRetriedAndNeverStored(t *testing.T) {
	act, oldGen := onBaseline(t)
	next := push(t, pub, "providers/truncated", impl{example: "counter-v2", id: "counter-v2.truncated", unique: true})
	exe := next.exe("counter-v2.truncated")
	var served atomic.Int64
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		served.Add(1)
		b, err := upstream(pub, req.URL.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b[:len(b)-1000])
		panic(http.ErrAbortHandler) // the connection ends 1000 bytes short
	})
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(next, via(p, pub, next.Ref), "counter-v2.truncated")
	})
	ms := moduleIs(t, act, "artifact_unavailable after a truncated download", func(ms iteronv1.ModuleStatus) bool {
		return ms.Reason == reasons.ArtifactUnavailable && strings.Contains(ms.Message, exe)
	})
	// Retried with backoff (200 ms doubling to 2 s): a second attempt comes.
	waitUntil(t, "a second attempt", func() bool { return served.Load() >= 2 })
	t.Logf("truncated: %s (attempts so far: %d)", reasonOf(ms), served.Load())
	if mgr.App.ArtifactStore().HasBlob(exe) {
		t.Error("a truncated blob is in the store")
	}
	serving := oldServes(t, act, oldGen)
	noTmpBetweenAttempts(t, storeDir)
	record(t, row{"truncated download (the connection ends 1000 bytes short)", reasonOf(ms), serving,
		fmt.Sprintf("%s; retried with backoff (%d attempts seen)", storeContents(storeDir, next), served.Load())})
}

func TestALayerOverItsBoundIsRefusedWithoutFetchingIt(t *testing.T) {
	act, oldGen := onBaseline(t)
	next := push(t, pub, "providers/bound", impl{example: "counter-v2", id: "counter-v2.bound", unique: true})
	exe := next.pkg.Parsed.Executables[0].Layer
	// The same manifest with the executable's size claimed as 300 MiB, served
	// by a handler in front of the registry (its digest differs, so the ref
	// names the new one).
	big := strings.Replace(string(next.pkg.Manifest), fmt.Sprintf(`"digest":%q,"size":%d`, exe.Digest, exe.Size), fmt.Sprintf(`"digest":%q,"size":314572800`, exe.Digest), 1)
	if big == string(next.pkg.Manifest) {
		t.Fatalf("the executable's descriptor was not found in %s", next.pkg.Manifest)
	}
	bigDigest := "sha256:" + sha256Hex([]byte(big))
	var blobGets atomic.Int64
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		switch {
		case strings.HasSuffix(req.URL.Path, "/manifests/"+bigDigest):
			w.Header().Set("Content-Type", artifacts.MediaTypeImageManifest)
			w.Header().Set("Docker-Content-Digest", bigDigest)
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			w.Write([]byte(big))
			return true
		case strings.Contains(req.URL.Path, "/blobs/"):
			blobGets.Add(1)
		}
		return false
	})
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(next, p.host+"/providers/bound@"+bigDigest, "counter-v2.bound")
	})
	ms := moduleIs(t, act, "verification_failed for the bound", func(ms iteronv1.ModuleStatus) bool { return ms.Reason == reasons.VerificationFailed })
	t.Logf("over-bound layer: %s (blob requests: %d)", reasonOf(ms), blobGets.Load())
	if !strings.Contains(ms.Message, "256 MiB") || blobGets.Load() != 0 {
		t.Errorf("want the bound named and no blob fetched; got %q and %d blob requests", ms.Message, blobGets.Load())
	}
	serving := oldServes(t, act, oldGen)
	noTmp(t, storeDir)
	record(t, row{"executable layer over its bound (descriptor claims 300 MiB)", reasonOf(ms), serving,
		fmt.Sprintf("%s; %d blob requests", storeContents(storeDir, next), blobGets.Load())})
}

func TestATagWithoutADigestIsRefusedByTheAPIServer(t *testing.T) {
	act, oldGen := onBaseline(t)
	// The manager writes status meanwhile: an update from a stale read is a
	// conflict, read again.
	var err error
	for range 20 {
		var cur iteronv1.ImplementationActivation
		if err = env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Sources[0].OCI = &iteronv1.OCISource{Ref: pub.Host + "/providers/baseline:v1"}
		if err = env.Client.Update(context.Background(), &cur); !apierrors.IsConflict(err) {
			break
		}
	}
	t.Logf("tag only: %v", err)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.sources[0].oci.ref") || !strings.Contains(err.Error(), "a tag alone is refused") {
		t.Fatalf("a tag alone gives %v; want 422 naming spec.sources[0].oci.ref", err)
	}
	serving := oldServes(t, act, oldGen)
	blobs, _ := mgr.App.ArtifactStore().Blobs()
	record(t, row{"tag without a digest", "refused by the API server: " + err.Error(), serving,
		fmt.Sprintf("unchanged (the spec never changed; %d blobs)", len(blobs))})
}

func TestTwoActivationsOfOneDigestPullItOnce(t *testing.T) {
	res := push(t, pub, "providers/shared", impl{example: "counter-v1", id: "counter-v1.shared", unique: true})
	exe := res.exe("counter-v1.shared")
	before := pub.Count("GET", "/blobs/"+exe)
	a := newActivation(t, source(res, res.Ref, "counter-v1.shared"))
	b := newActivation(t, source(res, res.Ref, "counter-v1.shared"))
	operatortest.WaitFor(t, env.Client, a, "Ready", operatortest.Ready)
	operatortest.WaitFor(t, env.Client, b, "Ready", operatortest.Ready)
	n := pub.Count("GET", "/blobs/"+exe) - before
	t.Logf("two activations of %s: %d GET(s) of the executable in the registry's access log", res.Ref, n)
	if n != 1 {
		t.Fatalf("the executable was fetched %d times; want 1", n)
	}
}

func TestGCRemovesExactlyWhatNoActivationOrGenerationNames(t *testing.T) {
	keep := push(t, pub, "providers/gc", impl{example: "counter-v1", id: "counter-v1.gc-keep", unique: true})
	drop := push(t, pub, "providers/gc", impl{example: "counter-v1", id: "counter-v1.gc-drop", unique: true})
	kept := newActivation(t, source(keep, keep.Ref, "counter-v1.gc-keep"))
	operatortest.WaitFor(t, env.Client, kept, "Ready", operatortest.Ready)
	dropped := newActivation(t, source(drop, drop.Ref, "counter-v1.gc-drop"))
	operatortest.WaitFor(t, env.Client, dropped, "Ready", operatortest.Ready)
	operatortest.DeleteAndWait(t, env.Client, dropped)
	store := mgr.App.ArtifactStore()
	// The dropped source was resolved moments ago: the grace period keeps it.
	rep, err := mgr.App.CollectArtifacts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := store.Lookup(drop.Digest); !ok {
		t.Fatalf("a source resolved within the grace period was collected: %+v", rep)
	}
	// Past the grace period: a collection keeping only what is named. What
	// it must remove is computed here from the store and the keep set.
	named, err := mgr.App.ArtifactKeepSet(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if !named[keep.Digest] || named[drop.Digest] {
		t.Fatalf("the keep set %v: want %s in it and %s not", named, keep.Digest, drop.Digest)
	}
	sources, _ := store.Sources()
	blobs, _ := store.Blobs()
	var wantSources []string
	used := map[string]bool{}
	for _, s := range sources {
		l, ok := store.Lookup(s)
		if !ok {
			t.Fatalf("source %s unreadable", s)
		}
		if named[s] {
			for _, b := range l.Blobs {
				used[b] = true
			}
		} else {
			wantSources = append(wantSources, s)
		}
	}
	var wantBlobs []string
	for _, b := range blobs {
		if !used[b] {
			wantBlobs = append(wantBlobs, b)
		}
	}
	rep, err = store.GC(context.Background(), named, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GC of %d sources, %d blobs: removed %d sources, %d blobs (%d bytes); kept %d sources, %d blobs", len(sources), len(blobs),
		len(rep.RemovedSources), len(rep.RemovedBlobs), rep.FreedBytes, rep.KeptSources, rep.KeptBlobs)
	sort.Strings(rep.RemovedBlobs)
	if fmt.Sprint(rep.RemovedSources) != fmt.Sprint(wantSources) || fmt.Sprint(rep.RemovedBlobs) != fmt.Sprint(wantBlobs) {
		t.Fatalf("removed sources %v, blobs %v;\nwant sources %v, blobs %v", rep.RemovedSources, rep.RemovedBlobs, wantSources, wantBlobs)
	}
	for _, w := range []string{drop.Digest, drop.exe("counter-v1.gc-drop")} {
		if store.HasBlob(w) {
			t.Errorf("blob %s (the dropped manifest or executable) is still there", w)
		}
	}
	for b := range used {
		if !store.HasBlob(b) {
			t.Errorf("blob %s of a named source was collected", b)
		}
	}
	// What runs keeps running and can be relaunched: its source verifies.
	got := operatortest.WaitFor(t, env.Client, kept, "still Ready", operatortest.Ready)
	t.Logf("the kept activation still answers: %s", call(t, got))
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
