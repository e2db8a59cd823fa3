package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	exartifacts "iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/test/registrytest"
)

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestPullVerifiesAnArtifactPushedByAnotherClientAndRefusesATamperedCopy
// pushes a provider with raw registry API calls and a manifest serialized
// by encoding/json (not our packer: other member order, indentation), pulls
// it with `kubectl iteron pull`, then pulls it again through a handler that
// changes one byte of the executable.
func TestPullVerifiesAnArtifactPushedByAnotherClientAndRefusesATamperedCopy(t *testing.T) {
	r, err := registrytest.Start(context.Background(), registrytest.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	dir := providertest.Dir(t)
	ex, _ := exartifacts.ExampleByName(exartifacts.CounterV1)
	const id = "counter-v1.raw"
	if _, err := exartifacts.Package(dir, exartifacts.Spec{Binary: providertest.Binary(t, exartifacts.CounterV1), Executable: "counter",
		ImplementationID: id, Version: ex.Version, Module: "prompt_system", Protocol: ex.Protocol}); err != nil {
		t.Fatal(err)
	}
	cat, err := os.ReadFile(filepath.Join(dir, "catalog.json"))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.ReadFile(filepath.Join(dir, id, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	config := []byte("{}")
	desc := func(mediaType string, b []byte, ann map[string]string) map[string]any {
		return map[string]any{"mediaType": mediaType, "digest": digestOf(b), "size": len(b), "annotations": ann}
	}
	manifest, err := json.MarshalIndent(map[string]any{
		"schemaVersion": 2, "mediaType": artifacts.MediaTypeImageManifest, "artifactType": artifacts.ArtifactType,
		"config": map[string]any{"mediaType": artifacts.MediaTypeEmpty, "digest": digestOf(config), "size": 2},
		"layers": []any{
			desc(artifacts.MediaTypeCatalog, cat, map[string]string{artifacts.AnnotationTitle: "catalog.json"}),
			desc(artifacts.MediaTypeExecutable, exe, map[string]string{artifacts.AnnotationTitle: "counter", artifacts.AnnotationModule: "prompt_system",
				artifacts.AnnotationImplementationID: id, artifacts.AnnotationFileMode: "0755"}),
		},
		"annotations": map[string]string{"org.opencontainers.image.created": "2026-12-01T00:00:00Z"},
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	digest, err := r.PushRaw("providers/raw", map[string][]byte{digestOf(config): config, digestOf(cat): cat, digestOf(exe): exe}, manifest, artifacts.MediaTypeImageManifest)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Host + "/providers/raw@" + digest
	store := filepath.Join(t.TempDir(), "store")
	code, out, errOut := runCLI(t, "", "pull", ref, "--to", store, "--registry-ca", r.CAFile)
	t.Logf("kubectl iteron pull %s (pushed with raw registry calls):\nexit %d\n%s%s", ref, code, out, errOut)
	if code != 0 || !strings.Contains(out, "verified (1 implementations)") || !strings.Contains(out, "artifactSHA256: "+digestOf(exe)) {
		t.Fatalf("the pull of a raw-pushed artifact: exit %d\n%s%s", code, out, errOut)
	}

	// A tampered copy: same size, one byte changed, served by a handler in
	// front of the registry with a certificate from the registry's CA.
	tlsConfig, err := r.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(r.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = r.Client.Transport
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: tlsConfig, ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+digestOf(exe)) {
			b := append([]byte(nil), exe...)
			b[len(b)/2] ^= 0x01
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			w.Write(b)
			return
		}
		rp.ServeHTTP(w, req)
	})}
	go srv.ServeTLS(l, "", "")
	defer srv.Close()
	tampered := l.Addr().String() + "/providers/raw@" + digest
	store2 := filepath.Join(t.TempDir(), "store")
	code, out, errOut = runCLI(t, "", "pull", tampered, "--to", store2, "--registry-ca", r.CAFile)
	t.Logf("kubectl iteron pull %s (the executable tampered with):\nexit %d\n%s%s", tampered, code, out, errOut)
	if code != 1 || !strings.Contains(errOut, "verification_failed") || !strings.Contains(errOut, digestOf(exe)) {
		t.Fatalf("a tampered copy: exit %d, want 1 with verification_failed naming %s\n%s%s", code, digestOf(exe), out, errOut)
	}
	s, err := artifacts.OpenStore(store2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.HasBlob(digestOf(exe)) {
		t.Fatal("the tampered executable was written to the store")
	}
	if srcs, _ := s.Sources(); len(srcs) != 0 {
		t.Fatalf("a source was laid out from a tampered copy: %v", srcs)
	}
}

// TestAnArtifactWithSeveralImplementationsOfOneModulePullsAndEachVerifies
// pushes what `go run ./hack/catalog -oci` lays out for prompt_system —
// counter v1, counter v2 and stateless, three implementations of one module
// in one artifact — to a real registry on loopback, and pulls it: each
// implementation is verified on its own (an activation names one source per
// module), reported, and printed as a source to paste. Then one
// implementation's copy in the store is changed on disk: the pull names that
// implementation and its digest, exits 1, and still lists the two others as
// verified.
func TestAnArtifactWithSeveralImplementationsOfOneModulePullsAndEachVerifies(t *testing.T) {
	ctx := context.Background()
	r, err := registrytest.Start(ctx, registrytest.Options{Dir: t.TempDir(), PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	root, err := exartifacts.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	laid := t.TempDir()
	build := exec.Command("go", "run", "./hack/catalog", "-out", laid, "-modules", "prompt_system", "-oci")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go run ./hack/catalog -oci: %v\n%s", err, out)
	}
	if err := exartifacts.RecordSources(ctx, root, "./hack/catalog"); err != nil {
		t.Fatal(err)
	}
	ids := []string{"counter-v1.prompt_system", "counter-v2.prompt_system", "stateless.prompt_system"}

	code, pushed, errOut := runCLI(t, "", "push", "--plain-http", filepath.Join(laid, "oci", "prompt_system"), r.Host+"/x:1")
	t.Logf("kubectl iteron push --plain-http DIR %s/x:1:\nexit %d\n%s%s", r.Host, code, pushed, errOut)
	first, _, _ := strings.Cut(pushed, "\n")
	ref, ok := strings.CutPrefix(first, "pushed ")
	if code != 0 || !ok || strings.Count(pushed, "implementationID: ") != len(ids) {
		t.Fatalf("the push: exit %d, want 0, the pinned reference and %d sources\n%s%s", code, len(ids), pushed, errOut)
	}
	_, pushedSources, _ := strings.Cut(pushed, "sources:\n")

	store := filepath.Join(t.TempDir(), "store")
	code, out, errOut := runCLI(t, "", "pull", "--plain-http", ref, "--to", store)
	t.Logf("kubectl iteron pull --plain-http %s --to DIR:\nexit %d\n%s%s", ref, code, out, errOut)
	if code != 0 || errOut != "" || !strings.Contains(out, fmt.Sprintf("verified (%d implementations):\n", len(ids))) {
		t.Fatalf("the pull: exit %d, want 0 with %d implementations verified\n%s%s", code, len(ids), out, errOut)
	}
	for _, id := range ids {
		if !strings.Contains(out, "  prompt_system "+id+": catalog ") {
			t.Errorf("%s is not reported verified", id)
		}
	}
	// The sources to paste are the push's, digest for digest.
	if _, pulledSources, _ := strings.Cut(out, "sources:\n"); pulledSources != pushedSources {
		t.Errorf("the pull prints other sources than the push:\npush:\n%s\npull:\n%s", pushedSources, pulledSources)
	}

	// One implementation's bytes changed in the store: that one fails,
	// named with the digest it should have, and the others still verify.
	s, err := artifacts.OpenStore(store, 0)
	if err != nil {
		t.Fatal(err)
	}
	digest := ref[strings.LastIndex(ref, "@")+1:]
	layout, ok := s.Lookup(digest)
	if !ok {
		t.Fatalf("%s is not in the store after the pull", digest)
	}
	exe := filepath.Join(layout.Roots[ids[1]], "counter-v2")
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.Chmod(exe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI(t, "", "pull", "--plain-http", ref, "--to", store)
	t.Logf("kubectl iteron pull again, %s changed in the store:\nexit %d\n%s%s", ids[1], code, out, errOut)
	want := fmt.Sprintf("does not verify (1 of 3 implementations): implementation %s: verification_failed: artifact_sha256: ", ids[1])
	if code != 1 || !strings.Contains(errOut, want) || !strings.Contains(out, "verified (2 implementations):\n") ||
		!strings.Contains(out, "  prompt_system "+ids[0]+": ") || !strings.Contains(out, "  prompt_system "+ids[2]+": ") ||
		strings.Contains(out, "sources:") {
		t.Fatalf("exit %d; want 1, %q, the two others verified and no sources to paste\n%s%s", code, want, out, errOut)
	}
}
