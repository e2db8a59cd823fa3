package oci_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/cmd/manager/app"
	exartifacts "iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
	"iteron.dev/operator/test/registrytest"
)

const (
	node      = "oci-node"
	namespace = "default"
	candidate = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
)

// The package's world: the control plane, the manager in-process with an
// artifact store, an anonymous TLS registry (pub) and one with htpasswd
// auth (priv), both trusted through one CA bundle.
var (
	env      *kubeapi.Environment
	mgr      *operatortest.Manager
	pub      *registrytest.Registry
	priv     *registrytest.Registry
	storeDir string
	credFile string
	base     string
	seq      atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if base, err = os.MkdirTemp("", "iteron-oci-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	providers := filepath.Join(base, "providers")
	storeDir = filepath.Join(base, "artifacts")
	for _, d := range []string{providers, filepath.Join(base, "state")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := exartifacts.MakeTraversable(providers); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("TMPDIR", providers)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if pub, err = registrytest.Start(ctx, registrytest.Options{Dir: filepath.Join(base, "registry-pub")}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pub.Stop()
	if priv, err = registrytest.Start(ctx, registrytest.Options{Dir: filepath.Join(base, "registry-priv"), Users: map[string]string{"iteron": "right"}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer priv.Stop()
	bundle := filepath.Join(base, "ca-bundle.pem")
	var pem []byte
	for _, f := range []string{pub.CAFile, priv.CAFile} {
		b, _ := os.ReadFile(f)
		pem = append(pem, b...)
	}
	credFile = filepath.Join(base, "registry-config.json")
	if err := os.WriteFile(bundle, pem, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := priv.DockerConfig(credFile, "iteron", "right"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("oci tests run against kube-apiserver %s and the distribution registry at %s and %s\n", env.ServerVersion, pub.Host, priv.Host)
	if mgr, err = operatortest.StartManager(ctx, env, operatortest.Options{
		Node: node, StateDir: filepath.Join(base, "state"), AllowedRoots: []string{providers},
		Artifacts: &app.ArtifactOptions{
			Store: storeDir, MaxBytes: 1 << 30, RegistryConfig: credFile, RegistryCA: bundle,
			PullTimeout: 30 * time.Second, RetryBase: 200 * time.Millisecond, RetryMax: 2 * time.Second,
		},
	}); err != nil {
		fmt.Fprintln(os.Stderr, "start the manager:", err)
		return 1
	}
	// The providers built for the tests land under TMPDIR, inside base.
	code := m.Run()
	cancel()
	mgr.Stop()
	printTable()
	return code
}

// row is one line of the failure table: what failed, the reason the
// module's status gave, whether the generation from before kept serving,
// and what the store held after.
type row struct {
	Case, Reason, OldServing, Store string
}

var (
	tableMu sync.Mutex
	table   []row
)

func record(t *testing.T, r row) {
	t.Helper()
	t.Logf("failure table: %s | %s | %s | %s", r.Case, r.Reason, r.OldServing, r.Store)
	tableMu.Lock()
	defer tableMu.Unlock()
	table = append(table, r)
}

func printTable() {
	tableMu.Lock()
	defer tableMu.Unlock()
	if len(table) == 0 {
		return
	}
	fmt.Println("\nfailure table (case | reason | old generation serving? | store contents after):")
	for _, r := range table {
		fmt.Printf("| %s | %s | %s | %s |\n", r.Case, r.Reason, r.OldServing, r.Store)
	}
}

// storeContents says which of an artifact's blobs the store holds, whether
// its source is laid out, and what tmp/ holds.
func storeContents(root string, p *pushed) string {
	has := func(d string) string {
		info, err := os.Lstat(filepath.Join(root, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
		if err == nil && info.Mode().IsRegular() {
			return "yes"
		}
		return "no"
	}
	var parts []string
	parts = append(parts, "manifest "+has(p.Digest), "catalog "+has(p.pkg.Parsed.Catalog.Digest))
	for _, e := range p.pkg.Parsed.Executables {
		parts = append(parts, "executable "+has(e.Layer.Digest))
	}
	src := "no"
	if _, err := os.Stat(filepath.Join(root, "sources", "sha256", strings.TrimPrefix(p.Digest, "sha256:"))); err == nil {
		src = "yes"
	}
	tmp, _ := os.ReadDir(filepath.Join(root, "tmp"))
	var names []string
	for _, e := range tmp {
		names = append(names, e.Name())
	}
	return fmt.Sprintf("%s; source laid out %s; tmp/ %v", strings.Join(parts, ", "), src, names)
}

// uniqueExecutable copies an example provider and appends a trailer, so
// every test pushes an executable the store has never seen (an ELF
// executable runs with trailing bytes).
func uniqueExecutable(t *testing.T, example string) string {
	t.Helper()
	src, err := os.ReadFile(providertest.Binary(t, example))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(providertest.Dir(t), example)
	trailer := fmt.Sprintf("\n#iteron-oci-test %s %d %d\n", t.Name(), seq.Add(1), time.Now().UnixNano())
	if err := os.WriteFile(dst, append(src, trailer...), 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// impl is one implementation to push.
type impl struct {
	example, id string
	unique      bool
}

// push packs the implementations of module prompt_system as one provider
// directory and pushes it to r (through the CLI's push path).
func push(t *testing.T, r *registrytest.Registry, repo string, impls ...impl) *pushed {
	t.Helper()
	dir := providertest.Dir(t)
	var specs []exartifacts.Spec
	for _, im := range impls {
		ex, _ := exartifacts.ExampleByName(im.example)
		bin := providertest.Binary(t, im.example)
		if im.unique {
			bin = uniqueExecutable(t, im.example)
		}
		specs = append(specs, exartifacts.Spec{Binary: bin, Executable: im.example, ImplementationID: im.id, Version: ex.Version, Module: "prompt_system", Protocol: ex.Protocol})
	}
	if _, err := exartifacts.Package(dir, specs...); err != nil {
		t.Fatal(err)
	}
	o := artifacts.RegistryOptions{CAFile: r.CAFile}
	if r == priv {
		o.Config = credFile
	}
	res, err := artifacts.Push(context.Background(), o, dir, r.Host+"/"+repo)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	pkg, err := artifacts.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pushed %s", res.Ref)
	return &pushed{PushResult: res, pkg: pkg}
}

// pushed is a pushed artifact and its package (the blobs it names).
type pushed struct {
	*artifacts.PushResult
	pkg *artifacts.Package
}

// exe is the digest of the executable of implementation id.
func (p *pushed) exe(id string) string {
	for _, s := range p.Sources {
		if s.ImplementationID == id {
			return s.ArtifactSHA256
		}
	}
	panic("no source " + id)
}

// source selects implementation id of a pushed artifact, by ref (which
// may name a proxy in front of the registry).
func source(res *pushed, ref, id string) iteronv1.ActivationSource {
	for _, s := range res.Sources {
		if s.ImplementationID == id {
			return iteronv1.ActivationSource{Module: s.Module, ImplementationID: id, OCI: &iteronv1.OCISource{Ref: ref},
				ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
		}
	}
	panic("no source " + id)
}

func newActivation(t *testing.T, srcs ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("oci-%d", seq.Add(1)), Namespace: namespace},
		Spec:       iteronv1.ImplementationActivationSpec{NodeName: node, CandidateSHA256: candidate, Sources: srcs},
	}
	if err := env.Client.Create(context.Background(), act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { operatortest.DeleteAndWait(t, env.Client, act) })
	return act
}

// generations lists an activation's Generation objects.
func generations(t *testing.T, act *iteronv1.ImplementationActivation) []iteronv1.Generation {
	t.Helper()
	var gens iteronv1.GenerationList
	if err := env.Client.List(context.Background(), &gens, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var out []iteronv1.Generation
	for _, g := range gens.Items {
		if g.Spec.ActivationName == act.Name {
			out = append(out, g)
		}
	}
	return out
}

// proxy is a loopback front of a registry, serving TLS with a certificate
// from the registry's CA; handle may answer a request itself (true)
// instead of passing it through.
type proxy struct {
	host string
}

func startProxy(t *testing.T, r *registrytest.Registry, handle func(w http.ResponseWriter, req *http.Request) bool) *proxy {
	t.Helper()
	target, _ := url.Parse(r.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = r.Client.Transport
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := r.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if handle != nil && handle(w, req) {
			return
		}
		rp.ServeHTTP(w, req)
	}), TLSConfig: tlsConfig, ErrorLog: log.New(io.Discard, "", 0),
		// HTTP/1.1, as a registry behind a plain proxy speaks it: a body cut
		// short is a connection that ends, not an HTTP/2 stream reset.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	return &proxy{host: l.Addr().String()}
}

// upstream reads path from the registry.
func upstream(r *registrytest.Registry, path string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, r.URL()+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", artifacts.MediaTypeImageManifest+", "+artifacts.MediaTypeImageIndex)
	resp, err := r.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func via(p *proxy, r *registrytest.Registry, ref string) string {
	return strings.Replace(ref, r.Host, p.host, 1)
}

// waitUntil polls cond (a condition on the world outside the API server).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
