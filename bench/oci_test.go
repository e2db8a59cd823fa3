package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	exartifacts "iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/test/registrytest"
)

// ociWorld is a loopback TLS registry holding one 64 MiB provider.
type ociWorld struct {
	reg    *registrytest.Registry
	dir    string
	pushed *artifacts.PushResult
	exe    string // the executable's digest
}

const ociExecutableBytes = 64 << 20

// ociSetup starts the registry and pushes the provider; cleanup stops the
// registry and removes everything.
func ociSetup() (w *ociWorld, cleanup func(), ociErr error) {
	w = &ociWorld{}
	cleanup = func() {
		if w.reg != nil {
			w.reg.Stop()
		}
		if w.dir != "" {
			os.RemoveAll(w.dir)
		}
	}
	func() {
		if w.dir, ociErr = os.MkdirTemp("", "iteron-bench-oci-"); ociErr != nil {
			return
		}
		if w.reg, ociErr = registrytest.Start(context.Background(), registrytest.Options{Dir: filepath.Join(w.dir, "registry")}); ociErr != nil {
			return
		}
		// 64 MiB of random bytes as the executable (the verifier hashes it;
		// nothing runs it).
		bin := filepath.Join(w.dir, "provider")
		data := make([]byte, ociExecutableBytes)
		if _, ociErr = rand.Read(data); ociErr != nil {
			return
		}
		if ociErr = os.WriteFile(bin, data, 0o755); ociErr != nil {
			return
		}
		src := filepath.Join(w.dir, "src")
		ex, _ := exartifacts.ExampleByName(exartifacts.CounterV1)
		if _, ociErr = exartifacts.Package(src, exartifacts.Spec{Binary: bin, Executable: "provider", ImplementationID: "big-1",
			Version: ex.Version, Module: "prompt_system", Protocol: ex.Protocol, Capabilities: []string{"read_only"}}); ociErr != nil {
			return
		}
		if w.pushed, ociErr = artifacts.Push(context.Background(), artifacts.RegistryOptions{CAFile: w.reg.CAFile}, src, w.reg.Host+"/bench/big"); ociErr != nil {
			return
		}
		w.exe = w.pushed.Sources[0].ArtifactSHA256
	}()
	return w, cleanup, ociErr
}

// storeResolver resolves OCI sources from a store already pulled into.
type storeResolver struct{ s *artifacts.Store }

func (r storeResolver) Resolve(ref, _ string) (*artifacts.Layout, error) {
	p, err := artifacts.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if l, ok := r.s.Lookup(p.Digest); ok {
		return l, nil
	}
	return nil, &artifacts.Error{Code: reasons.ArtifactUnavailable, Ref: ref, Detail: "not pulled"}
}

func (r storeResolver) Store() *artifacts.Store { return r.s }

// pullVerify is what `kubectl iteron pull` and the manager do: pull by
// digest into a fresh store (TLS, digests while streaming, temp file,
// fsync, rename, layout), then verify the source with the verifier.
func (w *ociWorld) pullVerify(b *testing.B, dir string) (pull, verify time.Duration) {
	store, err := artifacts.OpenStore(dir, 0)
	if err != nil {
		b.Fatal(err)
	}
	p, err := artifacts.NewPuller(artifacts.PullerOptions{RegistryOptions: artifacts.RegistryOptions{CAFile: w.reg.CAFile}, Store: store})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, err := p.Pull(context.Background(), w.pushed.Ref); err != nil {
		b.Fatal(err)
	}
	pull = time.Since(start)
	ceiling, _ := catalog.ParseCeiling("read_only")
	v, err := verifier.NewVerifier(verifier.Config{Ceiling: ceiling, Artifacts: storeResolver{store}})
	if err != nil {
		b.Fatal(err)
	}
	s := w.pushed.Sources[0]
	doc := &verifier.Document{Form: verifier.FormDocument, CandidateSHA256: fmt.Sprintf("sha256:%064x", 1), Sources: []verifier.Source{{
		Module: s.Module, ImplementationID: s.ImplementationID, OCIRef: w.pushed.Ref, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
	}}}
	start = time.Now()
	res, err := v.Verify(doc)
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		b.Fatal(err)
	}
	return pull, time.Since(start)
}

// getHashSync is the baseline: the same executable blob fetched with one
// plain HTTP GET from the same registry (same TLS), hashed while it streams
// into a file, the file fsynced.
func (w *ociWorld) getHashSync(b *testing.B, dir string) time.Duration {
	start := time.Now()
	resp, err := w.reg.Client.Get(w.reg.URL() + "/v2/bench/big/blobs/" + w.exe)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("GET blob: %s", resp.Status)
	}
	f, err := os.Create(filepath.Join(dir, "blob"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(io.MultiWriter(f, h), resp.Body, make([]byte, 256<<10)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != w.exe {
		b.Fatalf("the GET hashed to %s, want %s", got, w.exe)
	}
	return time.Since(start)
}

// BenchmarkOCIPullVerify64MiB measures, in one run, pull+verify of a
// provider whose executable is 64 MiB from a loopback TLS registry (the
// distribution registry, bin/registry) against the same executable's bytes
// fetched with one plain HTTP GET, hashed and fsynced. Each iteration does
// both, back to back (so both see the same machine load), each into a fresh
// directory; it reports their times, the pull and the verifier separately,
// and ratio = (pull+verify) ÷ (GET+sha256+fsync).
//
//	go test -run='^$' -bench OCIPullVerify64MiB -benchtime=3x -count 5 ./bench/ | go run ./bench/benchmed
func BenchmarkOCIPullVerify64MiB(b *testing.B) {
	w, cleanup, err := ociSetup()
	b.Cleanup(cleanup)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var pull, verify, get time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir, err := os.MkdirTemp(w.dir, "run-")
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		p, v := w.pullVerify(b, filepath.Join(dir, "store"))
		g := w.getHashSync(b, dir)
		b.StopTimer()
		pull, verify, get = pull+p, verify+v, get+g
		os.RemoveAll(dir)
		b.StartTimer()
	}
	n := float64(b.N)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 / n }
	b.ReportMetric(ms(pull+verify), "pullverify-ms/op")
	b.ReportMetric(ms(pull), "pull-ms/op")
	b.ReportMetric(ms(verify), "verify-ms/op")
	b.ReportMetric(ms(get), "get-ms/op")
	b.ReportMetric(float64(pull+verify)/float64(get), "ratio")
}
