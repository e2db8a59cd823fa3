// Command catalog builds the example providers and lays them out for the
// demo: one artifact root per implementation and one catalog.json per
// module, with digests computed from the bytes it just wrote, so that the
// demo never carries a stale digest. It prints what an activation source
// needs (paths and digests) as JSON on stdout.
//
//	go run ./hack/catalog -out /var/lib/iteron/providers [-modules prompt_system,tool_exposure] [-faulty]
//
// Layout under -out:
//
//	bin/<example>                       the built executables
//	artifacts/<module>/<impl>/<example> one artifact root per implementation
//	catalogs/<module>.json              counter-v1.<module>, counter-v2.<module>, stateless.<module> (and faulty):
//	                                    implementation IDs carry the module, since an activation needs them unique
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/pkg/protocol"
)

// Source is one implementation as an activation source names it.
type Source struct {
	Module           string `json:"module"`
	ImplementationID string `json:"implementation_id"`
	Version          string `json:"implementation_version"`
	ProtocolVersion  uint32 `json:"protocol_version"`
	CatalogPath      string `json:"catalog_path"`
	ArtifactRoot     string `json:"artifact_root"`
	Executable       string `json:"executable"`
	ManifestSHA256   string `json:"manifest_sha256"`
	ArtifactSHA256   string `json:"artifact_sha256"`
}

func main() {
	out := flag.String("out", "", "directory to lay the providers out in (required)")
	modules := flag.String("modules", "prompt_system", "comma-separated modules to write a catalog for")
	faulty := flag.Bool("faulty", false, "also list the faulty provider (no fault armed) in each catalog")
	flag.Parse()
	if err := run(*out, strings.Split(*modules, ","), *faulty); err != nil {
		fmt.Fprintln(os.Stderr, "catalog:", err)
		os.Exit(1)
	}
}

func run(out string, modules []string, withFaulty bool) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	out, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	for _, m := range modules {
		if err := protocol.ValidModule(m); err != nil {
			return fmt.Errorf("module %q: %v", m, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := artifacts.ModuleRoot(ctx)
	if err != nil {
		return err
	}
	bin := filepath.Join(out, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	paths, err := artifacts.BuildExamples(ctx, root, bin)
	if err != nil {
		return err
	}
	names := []string{artifacts.CounterV1, artifacts.CounterV2, artifacts.Stateless}
	if withFaulty {
		names = append(names, artifacts.Faulty)
	}
	var sources []Source
	for _, module := range modules {
		var impls []artifacts.Implementation
		for _, name := range names {
			ex, _ := artifacts.ExampleByName(name)
			impl, err := artifacts.Layout(filepath.Join(out, "artifacts", module, name), artifacts.Spec{
				Binary: paths[name], ImplementationID: name + "." + module, Version: ex.Version, Module: module, Protocol: ex.Protocol,
				Capabilities: []string{"read_only"},
			})
			if err != nil {
				return err
			}
			impls = append(impls, impl)
		}
		srcs, err := artifacts.WriteCatalog(filepath.Join(out, "catalogs", module+".json"), impls...)
		if err != nil {
			return err
		}
		for _, s := range srcs {
			v := s.Manifest.ImplementationVersion
			sources = append(sources, Source{
				Module: module, ImplementationID: s.Manifest.ImplementationID, Version: fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]),
				ProtocolVersion: s.Manifest.ProtocolVersion, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
				Executable: s.Executable, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
			})
		}
	}
	if err := artifacts.MakeTraversable(out); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"sources": sources})
}
