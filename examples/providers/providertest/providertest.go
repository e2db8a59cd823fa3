// Package providertest is the test helper every package that runs real
// providers uses (procexec, hotswap, controllers, e2e): it builds the
// example providers once per test binary, lays out artifact roots that the
// provider uid (65534) can traverse (t.TempDir is 0700), writes catalog.json
// files with digests computed from the bytes just written, and mints the
// launch plans the verifier would mint for them.
//
// A package using it should run its tests through Main, so that the binaries
// built for the test binary are removed afterwards:
//
//	func TestMain(m *testing.M) { providertest.Main(m) }
package providertest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

var build struct {
	mu       sync.Mutex
	atExit   []func() // what Main runs after the tests, newest first
	dir      string
	root     string
	paths    map[string]string // example name or variant key → executable
	examples bool
}

// Main runs the tests of m and then removes the providers built for them.
func Main(m *testing.M) {
	code := m.Run()
	build.mu.Lock()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	atExit := build.atExit
	build.mu.Unlock()
	for i := len(atExit) - 1; i >= 0; i-- {
		atExit[i]()
	}
	os.Exit(code)
}

// AtExit has Main run fn once every test has run, before it exits (which
// runs no deferred function of TestMain): for what lives as long as the test
// binary — a shared executor's process records, a shared registry — and no
// single test's cleanup may end.
func AtExit(fn func()) {
	build.mu.Lock()
	defer build.mu.Unlock()
	build.atExit = append(build.atExit, fn)
}

// RemoveAtExit has Main remove dir once every test has run (see AtExit).
func RemoveAtExit(dir string) { AtExit(func() { os.RemoveAll(dir) }) }

func buildDir(tb testing.TB) string {
	if build.dir == "" {
		dir, err := os.MkdirTemp("", "iteron-providers-")
		if err != nil {
			tb.Fatalf("providertest: %v", err)
		}
		root, err := artifacts.ModuleRoot(context.Background())
		if err != nil {
			tb.Fatalf("providertest: %v", err)
		}
		build.dir, build.root, build.paths = dir, root, map[string]string{}
	}
	return build.dir
}

// Binary returns the path of the example provider called name (one of
// artifacts.CounterV1, CounterV2, Faulty, Stateless), building every example
// on first use in this test binary.
func Binary(tb testing.TB, name string) string {
	tb.Helper()
	build.mu.Lock()
	defer build.mu.Unlock()
	dir := buildDir(tb)
	if !build.examples {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		paths, err := artifacts.BuildExamples(ctx, build.root, dir)
		if err != nil {
			tb.Fatalf("providertest: building the example providers: %v", err)
		}
		for k, v := range paths {
			build.paths[k] = v
		}
		build.examples = true
	}
	p, ok := build.paths[name]
	if !ok {
		tb.Fatalf("providertest: no example provider %q", name)
	}
	return p
}

// Variant builds the example called name with extra -ldflags (e.g.
// "-X main.build=B"), once per test binary, and returns its path: a binary
// whose bytes differ from the example's.
func Variant(tb testing.TB, name, ldflags string) string {
	tb.Helper()
	build.mu.Lock()
	defer build.mu.Unlock()
	dir := buildDir(tb)
	key := name + "|" + ldflags
	if p, ok := build.paths[key]; ok {
		return p
	}
	ex, ok := artifacts.ExampleByName(name)
	if !ok {
		tb.Fatalf("providertest: no example provider %q", name)
	}
	out := filepath.Join(dir, name+"-variant-"+strconv.Itoa(len(build.paths)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := artifacts.Build(ctx, build.root, ex.Package, out, ldflags); err != nil {
		tb.Fatalf("providertest: %v", err)
	}
	build.paths[key] = out
	return out
}

// Dir returns a fresh directory under tb.TempDir() that the provider uid can
// traverse (it and every parent).
func Dir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := artifacts.MakeTraversable(dir); err != nil {
		tb.Fatalf("providertest: %v", err)
	}
	return dir
}

// Implement lays spec out in a fresh artifact root. spec.Binary may name an
// example provider (artifacts.CounterV2, …) instead of a path.
func Implement(tb testing.TB, spec artifacts.Spec) artifacts.Implementation {
	tb.Helper()
	if !strings.ContainsRune(spec.Binary, '/') {
		ex, ok := artifacts.ExampleByName(spec.Binary)
		if !ok {
			tb.Fatalf("providertest: no example provider %q", spec.Binary)
		}
		spec.Binary = Binary(tb, spec.Binary)
		if spec.Version == (catalog.Version{}) {
			spec.Version = ex.Version
		}
		if spec.Protocol == 0 {
			spec.Protocol = ex.Protocol
		}
		if spec.ImplementationID == "" {
			spec.ImplementationID = ex.Name
		}
	}
	if spec.Module == "" {
		spec.Module = "prompt_system"
	}
	impl, err := artifacts.Layout(filepath.Join(Dir(tb), "root"), spec)
	if err != nil {
		tb.Fatalf("providertest: %v", err)
	}
	return impl
}

// Catalog writes a catalog.json listing impls in a fresh directory and
// returns them as activation sources.
func Catalog(tb testing.TB, impls ...artifacts.Implementation) []artifacts.Source {
	tb.Helper()
	srcs, err := artifacts.WriteCatalog(filepath.Join(Dir(tb), "catalog.json"), impls...)
	if err != nil {
		tb.Fatalf("providertest: %v", err)
	}
	return srcs
}

// Example lays out the example provider name as implementation id of module
// (argv after argv[0]) in its own root and catalog.
func Example(tb testing.TB, name, module, id string, argv ...string) artifacts.Source {
	tb.Helper()
	impl := Implement(tb, artifacts.Spec{Binary: name, Module: module, ImplementationID: id, Argv: argv})
	return Catalog(tb, impl)[0]
}

// CandidateSHA256 is the candidate digest test plans carry.
var CandidateSHA256 = strictjson.Digest([]byte("providertest candidate"))

// Fields returns the launch-plan fields the verifier would derive from impl,
// with every requested capability admitted, so that a test can adjust them
// (shorter deadlines, smaller limits, a wrong digest) before minting.
func Fields(tb testing.TB, impl artifacts.Implementation) verifier.LaunchPlanFields {
	tb.Helper()
	m := impl.Manifest
	admitted := append([]string{}, m.RequestedCapabilities...)
	authority, err := strictjson.DigestOf(admitted)
	if err != nil {
		tb.Fatalf("providertest: %v", err)
	}
	return verifier.LaunchPlanFields{
		Module: m.Module, ImplementationID: m.ImplementationID, Version: m.ImplementationVersion,
		ProtocolVersion: int(m.ProtocolVersion), ManifestSHA256: impl.ManifestSHA256, ArtifactSHA256: impl.ArtifactSHA256,
		ArtifactRoot: impl.ArtifactRoot, Executable: impl.Executable, Argv: m.Argv,
		CandidateSHA256: CandidateSHA256, AdmittedCapabilities: admitted, AuthoritySHA256: authority,
		RuntimeDeadline:      time.Duration(m.RuntimeDeadlineMs) * time.Millisecond,
		CancellationDeadline: time.Duration(m.CancellationDeadlineMs) * time.Millisecond,
		EvidenceLimits: verifier.EvidenceLimits{
			StdoutBytes: int64(m.EvidenceLimits.StdoutBytes), StderrBytes: int64(m.EvidenceLimits.StderrBytes),
			Observations: int(m.EvidenceLimits.Observations),
		},
		Contracts: protocol.BuiltinContracts(m.Module), FailurePolicy: m.FailurePolicy,
	}
}

// Plan mints the launch plan for impl, optionally adjusted by edit.
func Plan(tb testing.TB, impl artifacts.Implementation, edit ...func(*verifier.LaunchPlanFields)) verifier.LaunchPlan {
	tb.Helper()
	f := Fields(tb, impl)
	for _, e := range edit {
		e(&f)
	}
	return verifier.NewLaunchPlanForTest(tb, f)
}

// SandboxLauncher returns the path of the sandbox launcher
// (cmd/iteron-sandbox), built once per test binary without cgo.
func SandboxLauncher(tb testing.TB) string {
	tb.Helper()
	return Program(tb, "iteron.dev/operator/cmd/iteron-sandbox")
}

// Program builds the main package pkg of this module (without cgo) once
// per test binary and returns its path: the launcher, the hostile
// providers of test/sandbox.
func Program(tb testing.TB, pkg string) string {
	tb.Helper()
	build.mu.Lock()
	defer build.mu.Unlock()
	dir := buildDir(tb)
	key := "program|" + pkg
	if p, ok := build.paths[key]; ok {
		return p
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := artifacts.Build(ctx, build.root, pkg, out, ""); err != nil {
		tb.Fatalf("providertest: %v", err)
	}
	build.paths[key] = out
	return out
}
