package oci_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/test/operatortest"
)

// storeBlob reports whether the manager's store holds a blob.
func storeBlob(t *testing.T, digest string) bool {
	t.Helper()
	s := mgr.App.ArtifactStore()
	return s != nil && s.HasBlob(digest)
}

func active(ms iteronv1.ModuleStatus) bool { return ms.Phase == iteronv1.PhaseActive }

func TestAPushedProviderAppliedByDigestIsActiveAndHotSwapsToASecondDigest(t *testing.T) {
	first := push(t, pub, "providers/swap", impl{example: "counter-v1", id: "counter-v1.swap", unique: true})
	second := push(t, pub, "providers/swap", impl{example: "counter-v1", id: "counter-v1.swap"}, impl{example: "counter-v2", id: "counter-v2.swap", unique: true})
	if first.Digest == second.Digest {
		t.Fatal("two artifacts with one digest")
	}
	act := newActivation(t, source(first, first.Ref, "counter-v1.swap"))
	got := operatortest.WaitFor(t, env.Client, act, "Ready", operatortest.Ready)
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("from %s: %s generation %d (%s)", first.Ref, ms.ImplementationID, ms.Generation, ms.Phase)
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
	t.Logf("hot swap to %s: %s generation %d", second.Ref, ms.ImplementationID, ms.Generation)
	if ms.Generation != 2 {
		t.Fatalf("the swap did not continue the lineage (hot swap): generation %d", ms.Generation)
	}
}

func TestTheRegistryStoppedMidPullKeepsTheOldGenerationServingUntilItIsBack(t *testing.T) {
	first := push(t, pub, "providers/midpull", impl{example: "counter-v1", id: "counter-v1.midpull"})
	second := push(t, pub, "providers/midpull", impl{example: "counter-v1", id: "counter-v1.midpull"}, impl{example: "counter-v2", id: "counter-v2.midpull", unique: true})
	exe := source(second, second.Ref, "counter-v2.midpull").ArtifactSHA256
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
	act := newActivation(t, source(first, via(p, pub, first.Ref), "counter-v1.midpull"))
	operatortest.WaitFor(t, env.Client, act, "Ready", operatortest.Ready)
	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(second, via(p, pub, second.Ref), "counter-v2.midpull")
	})
	select {
	case <-midway:
	case <-time.After(60 * time.Second):
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
	got := moduleIs(t, act, "artifact_unavailable with the old generation serving", func(ms iteronv1.ModuleStatus) bool {
		return ms.Reason == reasons.ArtifactUnavailable && !strings.Contains(ms.Message, "pulling") && active(ms) && ms.ImplementationID == "counter-v1.midpull"
	})
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("registry stopped mid-pull: phase %s, %s generation %d, reason %s: %s", ms.Phase, ms.ImplementationID, ms.Generation, ms.Reason, ms.Message)
	if storeBlob(t, exe) {
		t.Fatal("the half-downloaded executable is in the store")
	}
	if s := mgr.App.ArtifactStore(); s != nil {
		if tmp, _ := s.TmpEntries(); len(tmp) != 0 {
			t.Fatalf("the store's tmp/ holds %v after the failed pull", tmp)
		}
	}
	if err := pub.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	got = operatortest.WaitFor(t, env.Client, act, "Ready on the second digest once the registry is back", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Ready(a) && operatortest.ModuleStatus(a, "prompt_system").ImplementationID == "counter-v2.midpull"
	})
	t.Logf("registry back: %s", statusJSON(got))
}

func TestWrongCredentialsAreRefusedWithoutARetryStormUntilTheyChange(t *testing.T) {
	res := push(t, priv, "providers/auth", impl{example: "counter-v1", id: "counter-v1.auth", unique: true})
	if err := priv.DockerConfig(credFile, "iteron", "wrong"); err != nil {
		t.Fatal(err)
	}
	defer priv.DockerConfig(credFile, "iteron", "right")
	before := len(priv.Requests())
	act := newActivation(t, source(res, res.Ref, "counter-v1.auth"))
	got := operatortest.WaitFor(t, env.Client, act, "Stalled with artifact_refused", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Stalled(a) && operatortest.ModuleStatus(a, "prompt_system").Reason == reasons.ArtifactRefused
	})
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("wrong credentials: %s: %s", ms.Reason, ms.Message)
	if !strings.Contains(ms.Message, "401") {
		t.Fatalf("the message does not name the registry's answer: %s", ms.Message)
	}
	afterRefusal := len(priv.Requests())
	// The manager looks at the credentials every 2 s (RetryMax): watch three
	// of those looks.
	time.Sleep(6 * time.Second) // a window in which nothing may happen, after the refusal was seen
	window := len(priv.Requests()) - afterRefusal
	t.Logf("registry requests: %d until the refusal, %d in the 6 s after it", afterRefusal-before, window)
	if window != 0 || afterRefusal-before > 4 {
		t.Fatalf("a refused pull is retried: %d requests to reach the refusal, %d after it", afterRefusal-before, window)
	}
	if err := priv.DockerConfig(credFile, "iteron", "right"); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, env.Client, act, "Ready once the credentials are right", operatortest.Ready)
}

func TestABlobThatDiffersFromItsDescriptorIsRefusedBeforeAnythingIsWrittenOrSpawned(t *testing.T) {
	res := push(t, pub, "providers/tamper", impl{example: "counter-v1", id: "counter-v1.tamper", unique: true})
	exe := res.Sources[0].ArtifactSHA256
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		b, err := upstream(pub, req.URL.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		b[len(b)/2] ^= 0x5a
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b)
		return true
	})
	act := newActivation(t, source(res, via(p, pub, res.Ref), "counter-v1.tamper"))
	got := moduleIs(t, act, "verification_failed", func(ms iteronv1.ModuleStatus) bool { return ms.Reason == reasons.VerificationFailed })
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("tampered blob: %s: %s", ms.Reason, ms.Message)
	if !strings.Contains(ms.Message, exe) {
		t.Fatalf("the message does not name the digest %s: %s", exe, ms.Message)
	}
	if storeBlob(t, exe) {
		t.Fatal("the tampered blob was written to the store")
	}
	if gens := generations(t, act); len(gens) != 0 {
		t.Fatalf("Generations were created for a refused artifact: %v", gens)
	}
	if st, ok := mgr.Coordinator.Status(string(act.UID)); ok && len(st.Modules) > 0 {
		for m, s := range st.Modules {
			if s.Active != "" {
				t.Fatalf("module %s runs %s", m, s.Active)
			}
		}
	}
}

func TestATruncatedDownloadIsUnavailableAndNeverStored(t *testing.T) {
	res := push(t, pub, "providers/truncated", impl{example: "counter-v1", id: "counter-v1.truncated", unique: true})
	exe := res.Sources[0].ArtifactSHA256
	var served int
	var mu sync.Mutex
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		mu.Lock()
		served++
		mu.Unlock()
		b, err := upstream(pub, req.URL.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b[:len(b)-1000])
		panic(http.ErrAbortHandler)
	})
	act := newActivation(t, source(res, via(p, pub, res.Ref), "counter-v1.truncated"))
	got := moduleIs(t, act, "artifact_unavailable after a truncated download", func(ms iteronv1.ModuleStatus) bool {
		return ms.Reason == reasons.ArtifactUnavailable && strings.Contains(ms.Message, "unexpected EOF")
	})
	// Retried with backoff (200 ms doubling to 2 s): a second attempt comes.
	waitUntil(t, "a second attempt", func() bool { mu.Lock(); defer mu.Unlock(); return served >= 2 })
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("truncated: %s: %s (attempts so far: %d)", ms.Reason, ms.Message, served)
	if storeBlob(t, exe) {
		t.Fatal("a truncated blob is in the store")
	}
}

func TestALayerOverItsBoundIsRefusedWithoutFetchingIt(t *testing.T) {
	res := push(t, pub, "providers/bound", impl{example: "counter-v1", id: "counter-v1.bound", unique: true})
	exe := res.Sources[0]
	// A proxy that serves the manifest with the executable's size claimed
	// as 300 MiB (its digest then differs, so the ref names the new one).
	manifest, err := upstream(pub, "/v2/providers/bound/manifests/"+res.Digest)
	if err != nil {
		t.Fatal(err)
	}
	layer := fmt.Sprintf(`"size":%d`, 0)
	for _, l := range strings.Split(string(manifest), `{"mediaType"`) {
		if strings.Contains(l, exe.ArtifactSHA256) {
			i := strings.Index(l, `"size":`)
			layer = l[i : i+strings.IndexAny(l[i:], ",}")]
		}
	}
	big := strings.Replace(string(manifest), layer, `"size":314572800`, 1)
	bigDigest := "sha256:" + sha256Hex([]byte(big))
	blobGets := 0
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		switch {
		case strings.HasSuffix(req.URL.Path, "/manifests/"+bigDigest):
			w.Header().Set("Content-Type", artifacts.MediaTypeImageManifest)
			w.Header().Set("Docker-Content-Digest", bigDigest)
			w.Write([]byte(big))
			return true
		case strings.Contains(req.URL.Path, "/blobs/"):
			blobGets++
		}
		return false
	})
	ref := p.host + "/providers/bound@" + bigDigest
	act := newActivation(t, source(res, ref, "counter-v1.bound"))
	got := moduleIs(t, act, "verification_failed for the bound", func(ms iteronv1.ModuleStatus) bool { return ms.Reason == reasons.VerificationFailed })
	ms := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("over-bound layer: %s: %s (blob requests: %d)", ms.Reason, ms.Message, blobGets)
	if !strings.Contains(ms.Message, "256 MiB") || blobGets != 0 {
		t.Fatalf("want the bound named and no blob fetched; got %q and %d blob requests", ms.Message, blobGets)
	}
}

func TestATagWithoutADigestIsRefusedByTheAPIServer(t *testing.T) {
	act := &iteronv1.ImplementationActivation{}
	act.Name, act.Namespace = "oci-tag-only", namespace
	act.Spec = iteronv1.ImplementationActivationSpec{NodeName: node, CandidateSHA256: candidate, Sources: []iteronv1.ActivationSource{{
		Module: "prompt_system", ImplementationID: "counter-v1", OCI: &iteronv1.OCISource{Ref: pub.Host + "/providers/counter:v1"},
		ManifestSHA256: candidate, ArtifactSHA256: candidate,
	}}}
	err := env.Client.Create(context.Background(), act)
	t.Logf("tag only: %v", err)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.sources[0].oci.ref") || !strings.Contains(err.Error(), "a tag alone is refused") {
		t.Fatalf("a tag alone gives %v; want 422 naming spec.sources[0].oci.ref", err)
	}
}

func TestTwoActivationsOfOneDigestPullItOnce(t *testing.T) {
	res := push(t, pub, "providers/shared", impl{example: "counter-v1", id: "counter-v1.shared", unique: true})
	exe := res.Sources[0].ArtifactSHA256
	before := pub.Count("GET", "/blobs/"+exe)
	a := newActivation(t, source(res, res.Ref, "counter-v1.shared"))
	b := newActivation(t, source(res, res.Ref, "counter-v1.shared"))
	operatortest.WaitFor(t, env.Client, a, "Ready", operatortest.Ready)
	operatortest.WaitFor(t, env.Client, b, "Ready", operatortest.Ready)
	n := pub.Count("GET", "/blobs/"+exe) - before
	t.Logf("two activations of %s: %d GETs of the executable", res.Ref, n)
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
	srcs, _ := store.Sources()
	t.Logf("sources before GC: %v", srcs)
	// The dropped source was resolved moments ago: the grace period keeps it.
	rep, err := mgr.App.CollectArtifacts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := store.Lookup(drop.Digest); !ok {
		t.Fatalf("a source resolved within the grace period was collected: %+v", rep)
	}
	// Past the grace period: a collection keeping only what is named.
	named, err := mgr.App.ArtifactKeepSet(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	rep, err = store.GC(context.Background(), named, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GC: removed sources %v, blobs %v; kept %d sources, %d blobs", rep.RemovedSources, rep.RemovedBlobs, rep.KeptSources, rep.KeptBlobs)
	if !containsOnly(rep.RemovedSources, drop.Digest) {
		t.Fatalf("removed sources %v; want exactly %s", rep.RemovedSources, drop.Digest)
	}
	want := []string{drop.Digest, drop.Sources[0].ArtifactSHA256}
	for _, w := range want {
		if !contains(rep.RemovedBlobs, w) {
			t.Fatalf("blob %s (the dropped manifest or executable) was not removed: %v", w, rep.RemovedBlobs)
		}
	}
	l, ok := store.Lookup(keep.Digest)
	if !ok {
		t.Fatal("the kept activation's source was collected")
	}
	for _, b := range l.Blobs {
		if !store.HasBlob(b) {
			t.Fatalf("the kept source's blob %s was collected", b)
		}
	}
	// What runs keeps running and can be relaunched: its source verifies.
	operatortest.WaitFor(t, env.Client, kept, "still Ready", operatortest.Ready)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func containsOnly(list []string, s string) bool { return len(list) == 1 && list[0] == s }
