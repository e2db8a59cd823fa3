package artifacts_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	exartifacts "iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/test/registrytest"
)

var (
	regOnce sync.Once
	reg     *registrytest.Registry
	regErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv("ITERON_PULL_HELPER") != "" {
		pullHelper()
		return
	}
	providertest.Main(m)
}

// registry is the package's one TLS registry (anonymous).
func registry(t *testing.T) *registrytest.Registry {
	t.Helper()
	regOnce.Do(func() {
		dir, err := os.MkdirTemp("", "iteron-registry-")
		if err != nil {
			regErr = err
			return
		}
		providertest.RemoveAtExit(dir) // after the registry stops (newest first)
		reg, regErr = registrytest.Start(context.Background(), registrytest.Options{Dir: dir})
		if regErr == nil {
			providertest.AtExit(reg.Stop)
		}
	})
	if regErr != nil {
		t.Fatalf("registry: %v", regErr)
	}
	return reg
}

// providerDir packs the counter-v1 example as one implementation.
func providerDir(t *testing.T, id string) string {
	t.Helper()
	dir := providertest.Dir(t)
	ex, _ := exartifacts.ExampleByName(exartifacts.CounterV1)
	if _, err := exartifacts.Package(dir, exartifacts.Spec{Binary: providertest.Binary(t, exartifacts.CounterV1), Executable: "provider",
		ImplementationID: id, Version: ex.Version, Module: "prompt_system", Protocol: ex.Protocol}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newPuller(t *testing.T, r *registrytest.Registry, o artifacts.RegistryOptions) (*artifacts.Puller, *artifacts.Store) {
	t.Helper()
	store, err := artifacts.OpenStore(filepath.Join(t.TempDir(), "store"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.CAFile == "" && o.Transport == nil && r != nil {
		o.CAFile = r.CAFile
	}
	p, err := artifacts.NewPuller(artifacts.PullerOptions{RegistryOptions: o, Store: store, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p, store
}

func codeOf(err error) string {
	var ae *artifacts.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func TestAPushedProviderPullsIntoTheStoreAndLaysOutItsSource(t *testing.T) {
	r := registry(t)
	dir := providerDir(t, "counter.pushed")
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, dir, r.Host+"/providers/counter:v1")
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	t.Logf("pushed %s: %+v", res.Ref, res.Sources)
	if !strings.HasPrefix(res.Ref, r.Host+"/providers/counter@sha256:") {
		t.Fatalf("pinned ref %q", res.Ref)
	}
	again, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, dir, r.Host+"/providers/counter")
	if err != nil || again.Digest != res.Digest {
		t.Fatalf("a second push of the same directory gives %v, %v; want the same digest %s (packing is deterministic)", again, err, res.Digest)
	}
	p, store := newPuller(t, r, artifacts.RegistryOptions{})
	l, err := p.Pull(context.Background(), res.Ref)
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	root, ok := l.Root("counter.pushed")
	if !ok {
		t.Fatalf("layout %+v has no root for counter.pushed", l)
	}
	got, err := exartifacts.FileSHA256(filepath.Join(root, "provider"))
	if err != nil || "sha256:"+got != res.Sources[0].ArtifactSHA256 {
		t.Fatalf("laid-out executable hashes to %s (%v), pushed %s", got, err, res.Sources[0].ArtifactSHA256)
	}
	info, _ := os.Stat(filepath.Join(root, "provider"))
	if info.Mode().Perm()&0o222 != 0 {
		t.Fatalf("laid-out executable is writable: %v", info.Mode())
	}
	blobs, _ := store.Blobs()
	if len(blobs) != 4 { // manifest, config, catalog, executable
		t.Fatalf("store blobs %v, want 4", blobs)
	}
	if tmp, _ := store.TmpEntries(); len(tmp) != 0 {
		t.Fatalf("tmp/ holds %v after a pull", tmp)
	}
}

// rawPush pushes dir's package with plain registry HTTP calls (another OCI
// client than ours: a monolithic POST per blob, a PUT of the manifest).
func rawPush(t *testing.T, r *registrytest.Registry, repo string, pkg *artifacts.Package, dir string) {
	t.Helper()
	blobs := map[string][]byte{"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a": []byte("{}")}
	cat, _ := os.ReadFile(filepath.Join(dir, "catalog.json"))
	blobs[pkg.Parsed.Catalog.Digest] = cat
	for _, e := range pkg.Parsed.Executables {
		b, _ := os.ReadFile(filepath.Join(dir, e.ImplementationID, e.Name))
		blobs[e.Layer.Digest] = b
	}
	for d, b := range blobs {
		// POST opens an upload session; PUT to its Location with the digest
		// closes it with the whole blob (the registry API's monolithic upload).
		resp, err := r.Client.Post(fmt.Sprintf("%s/v2/%s/blobs/uploads/", r.URL(), repo), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc, err := resp.Location()
		if resp.StatusCode != http.StatusAccepted || err != nil {
			t.Fatalf("raw upload session %s: %s %v", d, resp.Status, err)
		}
		q := loc.Query()
		q.Set("digest", d)
		loc.RawQuery = q.Encode()
		req, _ := http.NewRequest(http.MethodPut, loc.String(), bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err = r.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("raw blob upload %s: %s", d, resp.Status)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/%s/manifests/%s", r.URL(), repo, pkg.Digest), bytes.NewReader(pkg.Manifest))
	req.Header.Set("Content-Type", artifacts.MediaTypeImageManifest)
	resp, err := r.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("raw manifest put: %s", resp.Status)
	}
}

// proxy serves the registry's API over plain HTTP on loopback, passing
// every request through, except that edit may change a blob's response.
type proxy struct {
	URL  string
	host string
	srv  *http.Server
}

func startProxy(t *testing.T, r *registrytest.Registry, handle func(w http.ResponseWriter, req *http.Request, upstream http.Handler) bool) *proxy {
	t.Helper()
	target, _ := url.Parse(r.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = r.Client.Transport
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if handle != nil && handle(w, req, rp) {
			return
		}
		rp.ServeHTTP(w, req)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &proxy{URL: "http://" + l.Addr().String(), host: l.Addr().String(), srv: srv}
}

// fetchUpstream reads a blob from the registry.
func fetchUpstream(t *testing.T, r *registrytest.Registry, path string) []byte {
	resp, err := r.Client.Get(r.URL() + path)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

func TestAnArtifactPushedByAnotherClientVerifiesAndATamperedCopyIsRefusedWithTheDigestNamed(t *testing.T) {
	r := registry(t)
	dir := providerDir(t, "counter.raw")
	pkg, err := artifacts.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	rawPush(t, r, "providers/raw", pkg, dir)
	ref := r.Host + "/providers/raw@" + pkg.Digest
	p, _ := newPuller(t, r, artifacts.RegistryOptions{})
	if _, err := p.Pull(context.Background(), ref); err != nil {
		t.Fatalf("pull of a raw-pushed artifact: %v", err)
	}
	exe := pkg.Parsed.Executables[0].Layer
	px := startProxy(t, r, func(w http.ResponseWriter, req *http.Request, _ http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe.Digest) {
			return false
		}
		b := fetchUpstream(t, r, req.URL.Path)
		b[len(b)/2] ^= 0xff // same length, other bytes
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b)
		return true
	})
	p2, store := newPuller(t, nil, artifacts.RegistryOptions{PlainHTTP: true})
	_, err = p2.Pull(context.Background(), px.host+"/providers/raw@"+pkg.Digest)
	t.Logf("tampered pull: %v", err)
	if codeOf(err) != reasons.VerificationFailed || !strings.Contains(err.Error(), exe.Digest) {
		t.Fatalf("a tampered blob gives %v; want verification_failed naming %s", err, exe.Digest)
	}
	if store.HasBlob(exe.Digest) {
		t.Fatal("the tampered blob was written to the store")
	}
	// The config and the catalog matched, but the pull failed: nothing of
	// it is in blobs/.
	if b, _ := store.Blobs(); len(b) != 0 || store.Used() != 0 {
		t.Fatalf("a failed pull left blobs %v (%d bytes) in the store", b, store.Used())
	}
	if tmp, _ := store.TmpEntries(); len(tmp) != 0 {
		t.Fatalf("tmp/ holds %v after a refused blob", tmp)
	}
	if srcs, _ := store.Sources(); len(srcs) != 0 {
		t.Fatalf("a source was laid out: %v", srcs)
	}
}

func TestATruncatedDownloadIsUnavailableAndLeavesNothing(t *testing.T) {
	r := registry(t)
	dir := providerDir(t, "counter.trunc")
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, dir, r.Host+"/providers/trunc")
	if err != nil {
		t.Fatal(err)
	}
	exe := res.Sources[0].ArtifactSHA256
	px := startProxy(t, r, func(w http.ResponseWriter, req *http.Request, _ http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		b := fetchUpstream(t, r, req.URL.Path)
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b[:len(b)/3])
		panic(http.ErrAbortHandler) // the connection drops mid-body
	})
	p, store := newPuller(t, nil, artifacts.RegistryOptions{PlainHTTP: true})
	_, err = p.Pull(context.Background(), strings.Replace(res.Ref, r.Host, px.host, 1))
	t.Logf("truncated pull: %v", err)
	if codeOf(err) != reasons.ArtifactUnavailable {
		t.Fatalf("a truncated download gives %v; want artifact_unavailable", err)
	}
	if store.HasBlob(exe) {
		t.Fatal("a truncated blob is in the store")
	}
	if tmp, _ := store.TmpEntries(); len(tmp) != 0 {
		t.Fatalf("tmp/ holds %v", tmp)
	}
}

func TestALayerOverItsBoundIsRefusedBeforeAnyBlobIsFetched(t *testing.T) {
	r := registry(t)
	dir := providerDir(t, "counter.big")
	pkg, err := artifacts.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The same artifact with its executable's descriptor claiming 300 MiB.
	exe := pkg.Parsed.Executables[0].Layer
	big := bytes.Replace(pkg.Manifest, []byte(fmt.Sprintf(`"size":%d`, exe.Size)), []byte(`"size":314572800`), 1)
	rawPush(t, r, "providers/big", pkg, dir)
	sum := sha256.Sum256(big)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/providers/big/manifests/%s", r.URL(), digest), bytes.NewReader(big))
	req.Header.Set("Content-Type", artifacts.MediaTypeImageManifest)
	resp, err := r.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put: %s", resp.Status)
	}
	before := r.Count("GET", "/providers/big/blobs/")
	p, store := newPuller(t, r, artifacts.RegistryOptions{})
	_, err = p.Pull(context.Background(), r.Host+"/providers/big@"+digest)
	t.Logf("over-bound pull: %v", err)
	if codeOf(err) != reasons.VerificationFailed || !strings.Contains(err.Error(), "256 MiB") {
		t.Fatalf("an over-bound layer gives %v; want verification_failed naming the bound", err)
	}
	if n := r.Count("GET", "/providers/big/blobs/") - before; n != 0 {
		t.Fatalf("%d blob requests after the manifest refused the layer", n)
	}
	if b, _ := store.Blobs(); len(b) != 0 {
		t.Fatalf("store holds %v", b)
	}
}

func TestConcurrentPullsOfOneDigestDownloadOnce(t *testing.T) {
	r := registry(t)
	dir := providerDir(t, "counter.once")
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, dir, r.Host+"/providers/once")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := newPuller(t, r, artifacts.RegistryOptions{})
	exe := res.Sources[0].ArtifactSHA256
	before := r.Count("GET", "/providers/once/blobs/"+exe)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = p.Pull(context.Background(), res.Ref) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := r.Count("GET", "/providers/once/blobs/"+exe) - before; n != 1 {
		t.Fatalf("8 concurrent pulls fetched the executable %d times; want 1", n)
	}
}

func TestWrongCredentialsAreRefusedAndNotRetriedUntilTheyChange(t *testing.T) {
	ctx := context.Background()
	r, err := registrytest.Start(ctx, registrytest.Options{Dir: t.TempDir(), Users: map[string]string{"iteron": "right"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := r.DockerConfig(cfg, "iteron", "right"); err != nil {
		t.Fatal(err)
	}
	res, err := artifacts.Push(ctx, artifacts.RegistryOptions{CAFile: r.CAFile, Config: cfg}, providerDir(t, "counter.auth"), r.Host+"/providers/auth")
	if err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	if err := r.DockerConfig(cfg, "iteron", "wrong"); err != nil {
		t.Fatal(err)
	}
	p, _ := newPuller(t, r, artifacts.RegistryOptions{Config: cfg})
	res2 := artifacts.NewResolver(p, 10*time.Millisecond, 50*time.Millisecond)
	done := make(chan string, 16)
	res2.OnDone = func(ref string) { done <- ref }
	synced := func() int {
		qs, err := r.SyncedRequests()
		if err != nil {
			t.Fatal(err)
		}
		return len(qs)
	}
	before := synced()
	if _, err := res2.Resolve(res.Ref, "spec-1"); codeOf(err) != reasons.ArtifactUnavailable {
		t.Fatalf("first resolve: %v; want a pending pull", err)
	}
	<-done
	var last error
	for range 50 {
		_, last = res2.Resolve(res.Ref, "spec-1")
	}
	t.Logf("after 50 resolves: %v", last)
	if codeOf(last) != reasons.ArtifactRefused || !strings.Contains(last.Error(), "401") {
		t.Fatalf("wrong credentials give %v; want artifact_refused naming 401", last)
	}
	n := synced() - before
	t.Logf("registry requests for 51 resolves with wrong credentials: %d", n)
	if n > 3 {
		t.Fatalf("%d registry requests: a refused pull is being retried", n)
	}
	// New credentials: tried again, and it succeeds.
	if err := r.DockerConfig(cfg, "iteron", "right"); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(cfg, time.Now().Add(time.Second), time.Now().Add(time.Second))
	if _, err := res2.Resolve(res.Ref, "spec-1"); codeOf(err) != reasons.ArtifactUnavailable {
		t.Fatalf("after the credentials changed: %v; want a new pull", err)
	}
	<-done
	if _, err := res2.Resolve(res.Ref, "spec-1"); err != nil {
		t.Fatalf("with the right credentials: %v", err)
	}
}

func TestAnIndexIsAcceptedOnlyWithExactlyOneManifestForThePlatform(t *testing.T) {
	r := registry(t)
	dir := providerDir(t, "counter.index")
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, dir, r.Host+"/providers/index")
	if err != nil {
		t.Fatal(err)
	}
	pkg, _ := artifacts.Pack(dir)
	pushIndex := func(platforms ...string) string {
		var entries []string
		for _, pl := range platforms {
			os, arch, _ := strings.Cut(pl, "/")
			entries = append(entries, fmt.Sprintf(`{"mediaType":%q,"digest":%q,"size":%d,"platform":{"architecture":%q,"os":%q}}`,
				artifacts.MediaTypeImageManifest, res.Digest, len(pkg.Manifest), arch, os))
		}
		idx := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":%q,"manifests":[%s]}`, artifacts.MediaTypeImageIndex, strings.Join(entries, ",")))
		sum := sha256.Sum256(idx)
		d := "sha256:" + hex.EncodeToString(sum[:])
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/providers/index/manifests/%s", r.URL(), d), bytes.NewReader(idx))
		req.Header.Set("Content-Type", artifacts.MediaTypeImageIndex)
		resp, err := r.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("put index: %s", resp.Status)
		}
		return r.Host + "/providers/index@" + d
	}
	plat := artifacts.NodePlatform()
	here := plat.OS + "/" + plat.Architecture
	for _, tc := range []struct {
		name      string
		platforms []string
		ok        bool
	}{
		{"one manifest for this platform among others", []string{here, "windows/arm64"}, true},
		{"no manifest for this platform", []string{"windows/arm64"}, false},
		{"two manifests for this platform", []string{here, here}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newPuller(t, r, artifacts.RegistryOptions{})
			_, err := p.Pull(context.Background(), pushIndex(tc.platforms...))
			t.Logf("%v: %v", tc.platforms, err)
			if tc.ok != (err == nil) || !tc.ok && codeOf(err) != reasons.VerificationFailed {
				t.Fatalf("index of %v: %v", tc.platforms, err)
			}
		})
	}
}

func TestGCRemovesExactlyTheUnreferencedSourcesAndBlobs(t *testing.T) {
	r := registry(t)
	p, store := newPuller(t, r, artifacts.RegistryOptions{})
	var refs []*artifacts.PushResult
	for _, id := range []string{"counter.gc-a", "counter.gc-b"} {
		res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, providerDir(t, id), r.Host+"/providers/gc")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Pull(context.Background(), res.Ref); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, res)
	}
	blobs, _ := store.Blobs()
	t.Logf("before GC: %d blobs (%d bytes)", len(blobs), store.Used())
	// Both sources share the config and the executable; each has its own
	// manifest and catalog.
	keepA := map[string]bool{refs[0].Digest: true}
	rep, err := store.GC(context.Background(), keepA, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GC: %+v", rep)
	if len(rep.RemovedSources) != 1 || rep.RemovedSources[0] != refs[1].Digest {
		t.Fatalf("removed sources %v; want exactly %s", rep.RemovedSources, refs[1].Digest)
	}
	if len(rep.RemovedBlobs) != 2 {
		t.Fatalf("removed blobs %v; want B's manifest and catalog only", rep.RemovedBlobs)
	}
	la, ok := store.Lookup(refs[0].Digest)
	if !ok {
		t.Fatal("the kept source is gone")
	}
	for _, b := range la.Blobs {
		if !store.HasBlob(b) {
			t.Fatalf("the kept source's blob %s was removed", b)
		}
	}
	// A bounded collection stops after its steps and finishes next time.
	rep, err = store.GC(context.Background(), map[string]bool{}, 1)
	if err != nil || !rep.Incomplete || len(rep.RemovedSources) != 1 {
		t.Fatalf("bounded GC: %+v, %v", rep, err)
	}
	rep, err = store.GC(context.Background(), map[string]bool{}, 0)
	if err != nil || rep.Incomplete {
		t.Fatalf("second GC: %+v, %v", rep, err)
	}
	if b, _ := store.Blobs(); len(b) != 0 || store.Used() != 0 {
		t.Fatalf("an empty keep set leaves %v (%d bytes)", b, store.Used())
	}
}

// pullHelper is the test binary re-executed to pull and be killed mid-pull.
func pullHelper() {
	store, err := artifacts.OpenStore(os.Getenv("ITERON_PULL_STORE"), 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p, err := artifacts.NewPuller(artifacts.PullerOptions{RegistryOptions: artifacts.RegistryOptions{PlainHTTP: true}, Store: store})
	if err != nil {
		os.Exit(2)
	}
	_, err = p.Pull(context.Background(), os.Getenv("ITERON_PULL_HELPER"))
	fmt.Fprintln(os.Stderr, "helper pull ended:", err)
	os.Exit(3)
}

func TestAPullerKilledMidPullLeavesNoPartialBlobThatIsEverUsed(t *testing.T) {
	r := registry(t)
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, providerDir(t, "counter.killed"), r.Host+"/providers/killed")
	if err != nil {
		t.Fatal(err)
	}
	exe := res.Sources[0].ArtifactSHA256
	midway := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	px := startProxy(t, r, func(w http.ResponseWriter, req *http.Request, _ http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		b := fetchUpstream(t, r, req.URL.Path)
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		once.Do(func() { close(midway) })
		<-release
		panic(http.ErrAbortHandler)
	})
	defer close(release)
	storeDir := filepath.Join(t.TempDir(), "store")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ITERON_PULL_HELPER="+strings.Replace(res.Ref, r.Host, px.host, 1), "ITERON_PULL_STORE="+storeDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-midway:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the helper never reached the executable's download; stderr:\n%s", stderr.String())
	}
	// The executable is half written to tmp/ now: kill the puller there.
	var partial []string
	for deadline := time.Now().Add(10 * time.Second); len(partial) == 0 && time.Now().Before(deadline); {
		partial, _ = filepath.Glob(filepath.Join(storeDir, "tmp", "blob-*"))
		if len(partial) == 0 {
			time.Sleep(10 * time.Millisecond) // polling the file system for the partial file
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	t.Logf("killed mid-pull with partial files %v", partial)
	if len(partial) == 0 {
		t.Fatal("no partial download was seen in tmp/")
	}
	store, err := artifacts.OpenStore(storeDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if store.HasBlob(exe) {
		t.Fatal("the half-downloaded executable is in blobs/")
	}
	if tmp, _ := store.TmpEntries(); len(tmp) != 0 {
		t.Fatalf("tmp/ still holds %v after reopening", tmp)
	}
	if _, ok := store.Lookup(res.Digest); ok {
		t.Fatal("a source was laid out from a killed pull")
	}
	p, err := artifacts.NewPuller(artifacts.PullerOptions{RegistryOptions: artifacts.RegistryOptions{CAFile: r.CAFile}, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Pull(context.Background(), res.Ref)
	if err != nil {
		t.Fatalf("pull after the kill: %v", err)
	}
	root, _ := l.Root("counter.killed")
	got, _ := exartifacts.FileSHA256(filepath.Join(root, "provider"))
	if "sha256:"+got != exe {
		t.Fatalf("the executable laid out after the kill hashes to %s, want %s", got, exe)
	}
}

// TestResolvesWhileTheSourceAppearsNeverLoseThePull resolves one reference
// from several goroutines in a tight loop while its pull lays the source
// out: a Resolve that sees the layout before the pull's goroutine has taken
// the resolver's lock drops the digest's state, and the pull must then end
// without it (it dereferenced the dropped state: a nil-pointer panic seen
// with two activations of one digest).
func TestResolvesWhileTheSourceAppearsNeverLoseThePull(t *testing.T) {
	r := registry(t)
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, providerDir(t, "counter.race"), r.Host+"/providers/race")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		p, _ := newPuller(t, r, artifacts.RegistryOptions{})
		rs := artifacts.NewResolver(p, 10*time.Millisecond, 50*time.Millisecond)
		done := make(chan struct{}, 16)
		rs.OnDone = func(string) { done <- struct{}{} }
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if l, err := rs.Resolve(res.Ref, "spec"); err == nil && l != nil {
						return
					} else if err != nil && codeOf(err) != reasons.ArtifactUnavailable {
						t.Errorf("round %d: %v", i, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the pull never ended", i)
		}
		if n := len(done); n != 0 {
			t.Fatalf("round %d: %d more pulls of a digest already laid out", i, n)
		}
	}
}

func TestTheFirstTransactionOfAPulledSourceTakesItsPullOnceAndASourceAlreadyThereHasNone(t *testing.T) {
	r := registry(t)
	res, err := artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: r.CAFile}, providerDir(t, "counter.pulltiming"), r.Host+"/providers/pulltiming")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := newPuller(t, r, artifacts.RegistryOptions{})
	rs := artifacts.NewResolver(p, 10*time.Millisecond, 50*time.Millisecond)
	done := make(chan struct{}, 1)
	rs.OnDone = func(string) { done <- struct{}{} }
	before := time.Now()
	if _, err := rs.Resolve(res.Ref, "spec"); codeOf(err) != reasons.ArtifactUnavailable {
		t.Fatalf("the first resolve answered %v; want the pull pending", err)
	}
	<-done
	l, err := rs.Resolve(res.Ref, "spec")
	if err != nil {
		t.Fatal(err)
	}
	root := ""
	for _, dir := range l.Roots {
		root = dir
	}
	if _, ok := rs.TakePull(l.Dir + "-elsewhere/x"); ok {
		t.Fatal("a directory that only shares the source's prefix took its pull")
	}
	pr, ok := rs.TakePull(root)
	if !ok || pr.Digest != l.Digest || pr.Dir != l.Dir || pr.Start.Before(before) || pr.End.Before(pr.Start) {
		t.Fatalf("TakePull(%s) = %+v, %v; want the pull of %s into %s, started after %s", root, pr, ok, l.Digest, l.Dir, before)
	}
	if _, ok := rs.TakePull(root); ok {
		t.Fatal("the pull was taken twice: a later transaction would show a pull it did not wait for")
	}
	// A new resolver over the same store finds the source laid out: no pull.
	rs2 := artifacts.NewResolver(p, 10*time.Millisecond, 50*time.Millisecond)
	if _, err := rs2.Resolve(res.Ref, "spec"); err != nil {
		t.Fatal(err)
	}
	if _, ok := rs2.TakePull(root); ok {
		t.Fatal("a source already in the store has a pull record")
	}
}
