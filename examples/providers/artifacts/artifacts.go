// Package artifacts builds the example providers and lays them out as the
// operator expects to find them: an artifact root per implementation,
// traversable by the provider's uid, and catalog.json files whose manifest
// and artifact digests are computed from the bytes just written, so that no
// test or demo carries a stale digest. providertest wraps it for tests and
// `go run ./hack/catalog` for the demo.
package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/strictjson"
)

// The example providers, by the names Build gives their executables.
const (
	CounterV1 = "counter-v1"
	// CounterV1Down is counter v1.1.0: v1's layout, and a down-migration
	// from v2's.
	CounterV1Down = "counter-v1-down"
	CounterV2     = "counter-v2"
	Faulty        = "faulty"
	Stateless     = "stateless"
)

// Example describes one example provider.
type Example struct {
	// Name is the executable's file name.
	Name string
	// Package is the Go import path of its main package.
	Package string
	// Version is its implementation_version.
	Version catalog.Version
	// Protocol is its protocol_version.
	Protocol uint32
}

// Examples are the example providers, in a fixed order.
var Examples = []Example{
	{Name: CounterV1, Package: "iteron.dev/operator/examples/providers/counter/v1", Version: catalog.Version{1, 0, 0}, Protocol: 2},
	{Name: CounterV1Down, Package: "iteron.dev/operator/examples/providers/counter/v1down", Version: catalog.Version{1, 1, 0}, Protocol: 2},
	{Name: CounterV2, Package: "iteron.dev/operator/examples/providers/counter/v2", Version: catalog.Version{2, 0, 0}, Protocol: 2},
	{Name: Faulty, Package: "iteron.dev/operator/examples/providers/faulty", Version: catalog.Version{2, 0, 0}, Protocol: 2},
	{Name: Stateless, Package: "iteron.dev/operator/examples/providers/stateless", Version: catalog.Version{1, 0, 0}, Protocol: 1},
}

// ExampleByName returns the example called name.
func ExampleByName(name string) (Example, bool) {
	for _, e := range Examples {
		if e.Name == name {
			return e, true
		}
	}
	return Example{}, false
}

// ModuleRoot returns the directory of the go.mod of the module containing
// the current directory.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}

// Build compiles pkg into out as a static executable (CGO_ENABLED=0,
// -trimpath), with extra -ldflags (e.g. "-X main.build=B").
func Build(ctx context.Context, moduleRoot, pkg, out, ldflags string) error {
	args := []string{"build", "-trimpath", "-o", out}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.String())
	}
	return RecordSources(ctx, moduleRoot, pkg)
}

// RecordSources, in a test binary, stats every file of this module that a
// build of pkgs reads: the Go and embedded files of each of the module's
// packages they depend on, and go.mod and go.sum, which pin the rest. A test
// that builds a binary of this repository at run time calls it (Build does)
// because the build is a child process whose reads go test's cache does not
// see, while the files a test itself opens or stats are part of the key of a
// cached result: so a test whose provider's source changed runs again instead
// of answering "(cached)". Outside a test binary it does nothing.
func RecordSources(ctx context.Context, moduleRoot string, pkgs ...string) error {
	if !testing.Testing() {
		return nil
	}
	files, err := sourceFiles(ctx, moduleRoot, pkgs...)
	if err != nil {
		return err
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("record the sources of %s: %w", strings.Join(pkgs, " "), err)
		}
	}
	return nil
}

// sourceFiles lists what RecordSources stats: go.mod, go.sum, then the Go,
// cgo and embedded files of every package of the module that pkgs are or
// depend on, as absolute paths.
func sourceFiles(ctx context.Context, moduleRoot string, pkgs ...string) ([]string, error) {
	const format = `{{if .Module}}{{if .Module.Main}}{{.Dir}}` +
		`{{range .GoFiles}}{{"\t"}}{{.}}{{end}}{{range .CgoFiles}}{{"\t"}}{{.}}{{end}}` +
		`{{range .EmbedFiles}}{{"\t"}}{{.}}{{end}}{{"\n"}}{{end}}{{end}}`
	cmd := exec.CommandContext(ctx, "go", append([]string{"list", "-deps", "-f", format}, pkgs...)...)
	cmd.Dir = moduleRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s: %w\n%s", strings.Join(pkgs, " "), err, stderr.String())
	}
	files := []string{filepath.Join(moduleRoot, "go.mod"), filepath.Join(moduleRoot, "go.sum")}
	for line := range strings.Lines(string(out)) {
		fields := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		for _, name := range fields[1:] {
			files = append(files, filepath.Join(fields[0], name))
		}
	}
	if len(files) == 2 {
		return nil, fmt.Errorf("go list -deps %s: no package of the module in %s", strings.Join(pkgs, " "), moduleRoot)
	}
	return files, nil
}

// BuildExamples compiles every example provider into dir and returns the
// executables' paths by name.
func BuildExamples(ctx context.Context, moduleRoot, dir string) (map[string]string, error) {
	paths := map[string]string{}
	for _, e := range Examples {
		out := filepath.Join(dir, e.Name)
		if err := Build(ctx, moduleRoot, e.Package, out, ""); err != nil {
			return nil, err
		}
		paths[e.Name] = out
	}
	return paths, nil
}

// Spec is one implementation to lay out.
type Spec struct {
	// Binary is the executable to copy into the artifact root.
	Binary string
	// Executable is its path relative to the root; default the binary's base name.
	Executable string
	// ImplementationID, Version, Module and Protocol go into the manifest.
	ImplementationID string
	Version          catalog.Version
	Module           string
	Protocol         uint32
	// Argv are the arguments after argv[0].
	Argv []string
	// Capabilities is requested_capabilities (sorted by Layout).
	Capabilities []string
	// RuntimeDeadlineMs default 600000; CancellationDeadlineMs default 5000.
	RuntimeDeadlineMs, CancellationDeadlineMs uint64
	// Limits default to 4 MiB stdout, 64 KiB stderr, 4096 observations.
	Limits catalog.EvidenceLimits
	// FailurePolicy default fail_closed.
	FailurePolicy string
}

// Implementation is a laid-out implementation: its manifest and where its
// bytes are.
type Implementation struct {
	Manifest catalog.Manifest
	// ArtifactRoot and Executable are absolute paths.
	ArtifactRoot, Executable string
	// ManifestSHA256 and ArtifactSHA256 are prefixed ("sha256:…").
	ManifestSHA256, ArtifactSHA256 string
}

// Source is an implementation listed in a catalog: what an activation
// source names.
type Source struct {
	Implementation
	// CatalogPath is the absolute path of the catalog listing it.
	CatalogPath string
}

// Layout copies spec.Binary into root (created if needed) and makes root and
// every parent directory traversable by other users (it adds g+rx and o+rx
// where they are missing: a provider runs as another uid and must be able to
// reach its cwd and executable).
func Layout(root string, spec Spec) (Implementation, error) {
	if !filepath.IsAbs(root) {
		return Implementation{}, fmt.Errorf("artifact root %q is not absolute", root)
	}
	root = filepath.Clean(root)
	if spec.Executable == "" {
		spec.Executable = filepath.Base(spec.Binary)
	}
	exe := filepath.Join(root, spec.Executable)
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		return Implementation{}, err
	}
	if err := MakeTraversable(filepath.Dir(exe)); err != nil {
		return Implementation{}, err
	}
	digest, err := copyFile(spec.Binary, exe)
	if err != nil {
		return Implementation{}, err
	}
	m := ManifestFor(spec, digest)
	md, err := catalog.ManifestDigest(m)
	if err != nil {
		return Implementation{}, err
	}
	return Implementation{Manifest: m, ArtifactRoot: root, Executable: exe, ManifestSHA256: md, ArtifactSHA256: strictjson.DigestPrefix + digest}, nil
}

// ManifestFor is spec's manifest for an executable whose bare hex digest is
// artifactHex, defaults filled in.
func ManifestFor(spec Spec, artifactHex string) catalog.Manifest {
	if spec.Executable == "" {
		spec.Executable = filepath.Base(spec.Binary)
	}
	if spec.RuntimeDeadlineMs == 0 {
		spec.RuntimeDeadlineMs = 600_000
	}
	if spec.CancellationDeadlineMs == 0 {
		spec.CancellationDeadlineMs = 5_000
	}
	if spec.Limits == (catalog.EvidenceLimits{}) {
		spec.Limits = catalog.EvidenceLimits{StdoutBytes: 4 << 20, StderrBytes: 64 << 10, Observations: 4096}
	}
	if spec.FailurePolicy == "" {
		spec.FailurePolicy = "fail_closed"
	}
	caps := slices.Sorted(slices.Values(spec.Capabilities))
	if caps == nil {
		caps = []string{}
	}
	return catalog.Manifest{
		ImplementationID: spec.ImplementationID, ImplementationVersion: spec.Version, Module: spec.Module,
		ArtifactSHA256: artifactHex, Executable: filepath.ToSlash(spec.Executable),
		Argv: append([]string{}, spec.Argv...), ProtocolVersion: spec.Protocol,
		RequestedCapabilities: caps, Dependencies: []catalog.Dependency{},
		RuntimeDeadlineMs: spec.RuntimeDeadlineMs, CancellationDeadlineMs: spec.CancellationDeadlineMs,
		EvidenceLimits: spec.Limits, FailurePolicy: spec.FailurePolicy,
	}
}

// WriteCatalog writes a catalog file listing impls at path (its directory
// created if needed) with fsync, and returns them as sources.
func WriteCatalog(path string, impls ...Implementation) ([]Source, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("catalog path %q is not absolute", path)
	}
	c := catalog.Catalog{SchemaVersion: 1, Implementations: []catalog.Manifest{}}
	for _, im := range impls {
		c.Implementations = append(c.Implementations, im.Manifest)
	}
	b, err := strictjson.Canonical(c)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := writeFileSync(path, append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	out := make([]Source, 0, len(impls))
	for _, im := range impls {
		out = append(out, Source{Implementation: im, CatalogPath: filepath.Clean(path)})
	}
	return out, nil
}

// MakeTraversable adds g+rx and o+rx to dir and each of its parents that
// lacks them.
func MakeTraversable(dir string) error {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if mode := fi.Mode().Perm(); mode&0o055 != 0o055 {
			keep := fi.Mode() & (os.ModePerm | os.ModeSticky | os.ModeSetgid | os.ModeSetuid)
			if err := os.Chmod(d, keep|0o055); err != nil {
				return err
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// FileSHA256 is the bare hex SHA-256 of a file's bytes.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 64<<10)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(io.MultiWriter(out, h), in, make([]byte, 64<<10)); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Chmod(0o755); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func writeFileSync(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Package lays specs out as a provider directory, the input of `kubectl
// iteron push`: dir/<implementation_id>/ is each implementation's artifact
// root and dir/catalog.json lists them all.
func Package(dir string, specs ...Spec) ([]Source, error) {
	var impls []Implementation
	for _, spec := range specs {
		impl, err := Layout(filepath.Join(dir, spec.ImplementationID), spec)
		if err != nil {
			return nil, err
		}
		impls = append(impls, impl)
	}
	return WriteCatalog(filepath.Join(dir, "catalog.json"), impls...)
}
