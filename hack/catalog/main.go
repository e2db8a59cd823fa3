// Command catalog builds the example providers and lays them out: one
// artifact root per implementation and one catalog per module, with digests
// computed from the bytes it just wrote, so that nothing downstream carries a
// stale digest. It prints what activation sources need (paths and digests)
// as JSON on stdout or, with -activation, a ready-to-apply
// ImplementationActivation for the modules it laid out (with -set, an
// ActivationSet over the nodes -selector matches).
//
//	go run ./hack/catalog -out /var/lib/iteron/providers [-modules prompt_system,tool_exposure] [-faulty]
//	go run ./hack/catalog -out DIR -modules prompt_system,context_assembly -activation stack [-node NODE] [-use counter-v2]
//	go run ./hack/catalog -out DIR -activation counters -set [-selector iteron.dev/pool=demo] [-use counter-v2]
//
// Layout under -out:
//
//	bin/<example>                       the built executables
//	artifacts/<module>/<example>/<example> one artifact root per implementation
//	catalogs/<module>.json              counter-v1.<module>, counter-v2.<module>, stateless.<module> (and faulty.<module>):
//	                                    implementation IDs carry the module, since an activation needs them unique
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// activationOptions ask for an ImplementationActivation instead of the JSON
// list of sources.
type activationOptions struct {
	// Name is metadata.name; empty prints the JSON list instead.
	Name string
	// Namespace is metadata.namespace.
	Namespace string
	// Node is spec.nodeName.
	Node string
	// Set prints an ActivationSet named Name instead, over the Nodes
	// Selector (key=value) matches.
	Set      bool
	Selector string
	// Use is which example fills each module: "counter-v1" for every module,
	// or "prompt_system=counter-v2,context_assembly=stateless".
	Use string
}

func main() {
	out := flag.String("out", "", "directory to lay the providers out in (required)")
	modules := flag.String("modules", "prompt_system", "comma-separated modules to write a catalog for")
	faulty := flag.Bool("faulty", false, "also list the faulty provider (no fault armed) in each catalog")
	var act activationOptions
	flag.StringVar(&act.Name, "activation", "", "print an ImplementationActivation with this name (ready to apply) instead of the JSON list of sources")
	flag.StringVar(&act.Namespace, "namespace", "default", "with -activation: its namespace")
	flag.StringVar(&act.Node, "node", "", "with -activation: spec.nodeName (default: this machine's hostname, lowercased)")
	flag.StringVar(&act.Use, "use", artifacts.CounterV1, "with -activation: the example filling every module, or module=example pairs, comma-separated")
	flag.BoolVar(&act.Set, "set", false, "with -activation: print an ActivationSet (one activation per selected node, rolled out in waves) instead")
	flag.StringVar(&act.Selector, "selector", "iteron.dev/pool=demo", "with -set: the node label (key=value) that selects the set's nodes")
	flag.Parse()
	if err := run(os.Stdout, *out, strings.Split(*modules, ","), *faulty, act); err != nil {
		fmt.Fprintln(os.Stderr, "catalog:", err)
		os.Exit(1)
	}
}

func run(stdout io.Writer, out string, modules []string, withFaulty bool, act activationOptions) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	var use map[string]string
	if act.Name != "" {
		var err error
		if use, err = parseUse(act.Use, modules, withFaulty); err != nil {
			return err
		}
		if act.Set {
			if k, v, ok := strings.Cut(act.Selector, "="); !ok || k == "" || v == "" || strings.ContainsAny(k+v, " \t\n\"'#:") {
				return fmt.Errorf("-selector: %q is not key=value", act.Selector)
			}
		}
		if act.Node == "" && !act.Set {
			host, err := os.Hostname()
			if err != nil {
				return fmt.Errorf("-node: no hostname to default to: %w", err)
			}
			act.Node = strings.ToLower(host)
		}
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
	if act.Name != "" && act.Set {
		return writeSet(stdout, act, modules, use, sources)
	}
	if act.Name != "" {
		return writeActivation(stdout, act, modules, use, sources)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"sources": sources})
}

// parseUse reads -use: one example for every module, or module=example
// pairs naming exactly the modules laid out.
func parseUse(value string, modules []string, withFaulty bool) (map[string]string, error) {
	known := func(name string) error {
		if _, ok := artifacts.ExampleByName(name); !ok || name == artifacts.Faulty && !withFaulty {
			return fmt.Errorf("-use: %q is not an example laid out here (counter-v1, counter-v2, stateless, and faulty with -faulty)", name)
		}
		return nil
	}
	use := map[string]string{}
	if !strings.Contains(value, "=") {
		if err := known(value); err != nil {
			return nil, err
		}
		for _, m := range modules {
			use[m] = value
		}
		return use, nil
	}
	for _, pair := range strings.Split(value, ",") {
		module, name, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("-use: %q is not module=example", pair)
		}
		if !slices.Contains(modules, module) {
			return nil, fmt.Errorf("-use: module %q is not one of -modules (%s)", module, strings.Join(modules, ","))
		}
		if err := known(name); err != nil {
			return nil, err
		}
		use[module] = name
	}
	for _, m := range modules {
		if use[m] == "" {
			return nil, fmt.Errorf("-use: no example for module %q", m)
		}
	}
	return use, nil
}

// writeActivation prints an ImplementationActivation selecting use[module]
// for each module, in -modules order, with the paths and digests just
// written. It is YAML written by hand so that it can carry the comments a
// reader needs; every value in it is a plain scalar or quoted as JSON.
func writeActivation(w io.Writer, act activationOptions, modules []string, use map[string]string, sources []Source) error {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: iteron.dev/v1alpha1\nkind: ImplementationActivation\nmetadata:\n")
	fmt.Fprintf(&b, "  name: %s                      # at most 40 characters\n  namespace: %s\n", yamlScalar(act.Name), yamlScalar(act.Namespace))
	fmt.Fprintf(&b, "spec:\n  # the node whose manager runs it; immutable\n  nodeName: %s\n", yamlScalar(act.Node))
	if err := writeSpec(&b, "  ", modules, use, sources); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSet prints an ActivationSet whose template selects use[module] for
// each module, over the nodes act.Selector matches, rolled out one canary
// first and then one node at a time.
func writeSet(w io.Writer, act activationOptions, modules []string, use map[string]string, sources []Source) error {
	key, value, _ := strings.Cut(act.Selector, "=")
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: iteron.dev/v1alpha1\nkind: ActivationSet\nmetadata:\n")
	fmt.Fprintf(&b, "  name: %s\n  namespace: %s\n", yamlScalar(act.Name), yamlScalar(act.Namespace))
	fmt.Fprintf(&b, "spec:\n  # the nodes that get an activation each\n  nodeSelector:\n    matchLabels:\n      %s: %s\n", yamlScalar(key), yamlScalar(value))
	fmt.Fprintf(&b, "  # every selected node's activation spec (the node's name is added)\n  template:\n")
	if err := writeSpec(&b, "    ", modules, use, sources); err != nil {
		return err
	}
	b.WriteString(`  strategy:
    canary:
      nodes: 1                     # the first wave, by node name
      soakSeconds: 5               # every canary stays Ready this long before the next wave
    maxUnavailable: 1              # nodes not Ready at once in the later waves (or a percentage)
    onFailure: Halt                # or Revert: moved nodes go back to the previous template
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSpec writes an activation spec but for nodeName, each line indented.
func writeSpec(b *strings.Builder, indent string, modules []string, use map[string]string, sources []Source) error {
	var s strings.Builder
	fmt.Fprintf(&s, "# an identity of this selection that you choose; bound into every run and ledger record\n")
	fmt.Fprintf(&s, "candidateSHA256: sha256:%064x\nsources:\n", 1)
	for _, module := range modules {
		id := use[module] + "." + module
		i := slices.IndexFunc(sources, func(s Source) bool { return s.Module == module && s.ImplementationID == id })
		if i < 0 {
			return fmt.Errorf("-use: %s was not laid out for %s", use[module], module)
		}
		src := sources[i]
		fmt.Fprintf(&s, "- module: %s\n  implementationID: %s\n  catalogPath: %s\n  artifactRoot: %s\n  manifestSHA256: %s\n  artifactSHA256: %s\n",
			src.Module, src.ImplementationID, yamlScalar(src.CatalogPath), yamlScalar(src.ArtifactRoot), src.ManifestSHA256, src.ArtifactSHA256)
	}
	s.WriteString(`swap:
  deadlineSeconds: 30            # one whole transaction
  quiesceTimeoutSeconds: 10      # wait this long for a run in flight before cancelling it
  strategy: Hot                  # Hot (migrate state) or Cold
  stateDisposition: Migrate      # or Discard
checkpoint:
  intervalSeconds: 60            # durable snapshot of Active state; bounds what a crash loses
generationHistoryLimit: 10
`)
	for _, line := range strings.SplitAfter(strings.TrimSuffix(s.String(), "\n"), "\n") {
		b.WriteString(indent + line)
	}
	b.WriteString("\n")
	return nil
}

// yamlScalar writes s plain when YAML reads it back unchanged, else as a
// JSON string (which YAML reads as a double-quoted scalar).
func yamlScalar(s string) string {
	plain := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-", r)) {
			plain = false
			break
		}
	}
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~":
		plain = false // YAML 1.1 readers take these for booleans or null
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		plain = false // a number, not a string
	}
	if plain {
		return s
	}
	q, _ := json.Marshal(s)
	return string(q)
}
