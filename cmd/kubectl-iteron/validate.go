package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/graph"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/strictjson"
)

// maxInputBytes bounds any file the CLI reads as an activation: a raw
// document is held to its own 128 KiB after this; YAML is wordier.
const maxInputBytes = 1 << 20

// verifyFlags are the node settings validate and plan verify under; their
// defaults are the manager's, allowed roots included: an offline check that
// passed what the manager refuses would only move the failure to the node.
type verifyFlags struct {
	allowedRoots  []string
	ceiling       string
	graphFile     string
	artifactStore string
}

func (f *verifyFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.allowedRoots, "allowed-roots", []string{verifier.DefaultAllowedRoot},
		"comma-separated directories every catalog and artifact root must lie under; pass the manager's --allowed-roots (the default is the manager's default)")
	cmd.Flags().StringVar(&f.ceiling, "capability-ceiling", catalog.DefaultCeiling, "the node's capability ceiling, comma-separated")
	cmd.Flags().StringVar(&f.graphFile, "graph", "", "a custom seam graph file (default: the built-in graph)")
	cmd.Flags().StringVar(&f.artifactStore, "artifact-store", "", "verify OCI sources (oci.ref) from this store, filled by `kubectl iteron pull REF --to DIR`; nothing is pulled")
}

func (f *verifyFlags) verifier() (*verifier.Verifier, error) {
	if f.artifactStore == "" {
		return f.verifierWith(nil)
	}
	abs, err := filepath.Abs(f.artifactStore)
	if err != nil {
		return nil, usage(err)
	}
	store, err := artifacts.OpenStore(abs, 0)
	if err != nil {
		return nil, usage(fmt.Errorf("--artifact-store: %w", err))
	}
	return f.verifierWith(offlineStore{store})
}

// verifierWith builds the verifier, resolving OCI sources with arts (nil
// refuses them).
func (f *verifyFlags) verifierWith(arts verifier.ArtifactResolver) (*verifier.Verifier, error) {
	ceiling, err := catalog.ParseCeiling(f.ceiling)
	if err != nil {
		return nil, usage(fmt.Errorf("--capability-ceiling: %w", err))
	}
	cfg := verifier.Config{AllowedRoots: f.allowedRoots, Ceiling: ceiling, Artifacts: arts}
	if f.graphFile != "" {
		if cfg.Graph, err = catalog.LoadSeamGraph(f.graphFile); err != nil {
			return nil, invalid(fmt.Errorf("--graph: %w", err))
		}
	}
	v, err := verifier.NewVerifier(cfg)
	if err != nil {
		return nil, usage(fmt.Errorf("--allowed-roots: %w", err))
	}
	return v, nil
}

// readInput reads a named file ("-" is stdin), bounded.
func readInput(cmd *cobra.Command, path string) ([]byte, error) {
	var r io.Reader
	if path == "-" {
		r = cmd.InOrStdin()
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, usage(err)
		}
		defer f.Close()
		r = f
	}
	data, err := strictjson.ReadBounded(r, maxInputBytes)
	if errors.Is(err, strictjson.ErrTooLarge) {
		return nil, invalid(fmt.Errorf("%s: %w", path, err))
	}
	if err != nil {
		return nil, usage(fmt.Errorf("%s: %w", path, err))
	}
	return data, nil
}

// loadedActivation is an activation as read: the internal document and, for
// the Kubernetes form, the object it came from.
type loadedActivation struct {
	doc    *verifier.Document
	object *v1alpha1.ImplementationActivation // nil for a raw document
}

// loadActivation reads either form: a raw JSON document
// (docs/reference/activation.md, strict) or an ImplementationActivation in YAML or JSON (recognised by its
// apiVersion/kind). Errors name the field in the form read.
func loadActivation(cmd *cobra.Command, path string) (*loadedActivation, error) {
	data, err := readInput(cmd, path)
	if err != nil {
		return nil, err
	}
	if isRawDocument(data) {
		doc, err := verifier.ParseDocument(data)
		if err != nil {
			return nil, invalid(err)
		}
		return &loadedActivation{doc: doc}, nil
	}
	obj, err := parseActivationObject(data)
	if err != nil {
		return nil, invalid(err)
	}
	doc, err := verifier.DocumentFromSpec(&obj.Spec)
	if err != nil {
		return nil, invalid(err)
	}
	return &loadedActivation{doc: doc, object: obj}, nil
}

// isRawDocument reports a JSON object without apiVersion or kind at the top:
// the raw document. Anything else is read as a Kubernetes object.
func isRawDocument(data []byte) bool {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return false
	}
	dec := jsontext.NewDecoder(bytes.NewReader(trimmed))
	if _, err := dec.ReadToken(); err != nil {
		return true // let the strict parser report it
	}
	for dec.PeekKind() == '"' {
		name, err := dec.ReadToken()
		if err != nil {
			return true
		}
		if n := name.String(); n == "apiVersion" || n == "kind" {
			return false
		}
		if err := dec.SkipValue(); err != nil {
			return true
		}
	}
	return true
}

// parseActivationObject reads one ImplementationActivation strictly: one YAML
// document, no duplicate keys, no unknown fields (case-sensitively, unlike
// encoding/json), the right apiVersion and kind.
func parseActivationObject(data []byte) (*v1alpha1.ImplementationActivation, error) {
	if n := yamlDocuments(data); n != 1 {
		return nil, fmt.Errorf("want exactly one YAML document, found %d", n)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	var obj v1alpha1.ImplementationActivation
	if cerr := catalog.DecodeStrict(j, &obj, maxInputBytes, ""); cerr != nil {
		return nil, cerr
	}
	if obj.APIVersion != v1alpha1.GroupVersion.String() || obj.Kind != "ImplementationActivation" {
		return nil, fmt.Errorf("apiVersion/kind: want %s ImplementationActivation, found %q %q", v1alpha1.GroupVersion, obj.APIVersion, obj.Kind)
	}
	return &obj, nil
}

// yamlDocuments counts the YAML documents with content ("---" separates).
func yamlDocuments(data []byte) int {
	count, content := 0, false
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if line == "---" || strings.HasPrefix(line, "--- ") {
			if content {
				count++
			}
			content = false
			continue
		}
		if trimmed != "" && !strings.HasPrefix(trimmed, "#") {
			content = true
		}
	}
	if content {
		count++
	}
	return count
}

// evaluated is one activation verified and placed in its graph.
type evaluated struct {
	result *verifier.Result
	eval   *graph.Evaluation
}

func evaluate(v *verifier.Verifier, doc *verifier.Document) (*evaluated, error) {
	res, err := v.Verify(doc)
	if err != nil {
		return nil, invalid(err)
	}
	ev, err := graph.Evaluate(graph.FromVerification(v.Graph(), res))
	if err != nil {
		return nil, invalid(err)
	}
	return &evaluated{result: res, eval: ev}, nil
}

// moduleReport is one module in validate's output.
type moduleReport struct {
	Module           string `json:"module"`
	ImplementationID string `json:"implementationID"`
	Admitted         bool   `json:"admitted"`
	// Kind is the verified source's kind: "catalog" (a line-protocol
	// provider) or "package-runtime" (docs/reference/package-runtimes.md).
	Kind string `json:"kind,omitempty"`
	// Version is a catalog manifest's implementation_version; a package
	// runtime has none (its revision ID is its implementationID).
	Version string `json:"version,omitempty"`
	// Exports are a package runtime's export_ids.
	Exports              []string `json:"exports,omitempty"`
	ManifestSHA256       string   `json:"manifestSHA256,omitempty"`
	ArtifactSHA256       string   `json:"artifactSHA256,omitempty"`
	AdmittedCapabilities []string `json:"admittedCapabilities,omitempty"`
	NotAdmitted          []string `json:"capabilitiesNotAdmitted,omitempty"`
	AuthoritySHA256      string   `json:"authoritySHA256,omitempty"`
	Epoch                string   `json:"epoch,omitempty"`
	Reason               string   `json:"reason,omitempty"`
	Message              string   `json:"message,omitempty"`
	// Diagnostics are the unmet optional requirements of an admitted
	// module (a custom seam graph of schema version 3).
	Diagnostics []string `json:"diagnostics,omitempty"`
}

func (e *evaluated) reports() []moduleReport {
	verified := map[string]*verifier.VerifiedSource{}
	for _, vs := range e.result.Verified() {
		verified[vs.Module] = vs
	}
	var out []moduleReport
	for _, s := range e.eval.Modules {
		r := moduleReport{Module: s.Module, ImplementationID: s.ImplementationID, Admitted: s.Admitted,
			Epoch: s.Epoch, Reason: s.Reason, Message: s.Message, Diagnostics: s.Diagnostics}
		if vs := verified[s.Module]; vs != nil {
			r.Kind, r.ManifestSHA256, r.ArtifactSHA256 = vs.Kind(), vs.ManifestSHA256, vs.ArtifactSHA256
			if vs.PackageRuntime != nil {
				r.Exports = vs.PackageRuntime.ExportIDs
			} else {
				r.Version = vs.Version.String()
			}
			r.AdmittedCapabilities, r.NotAdmitted, r.AuthoritySHA256 = vs.AdmittedCapabilities, vs.NotAdmittedCapabilities, vs.AuthoritySHA256
		}
		out = append(out, r)
	}
	return out
}

func newValidateCmd() *cobra.Command {
	var flags verifyFlags
	var output string
	cmd := &cobra.Command{
		Use:   "validate [flags] <document.json|activation.yaml|->",
		Short: "Verify an activation offline: strict parsing, paths, symlinks, digests, capabilities, graph",
		Long: `Verify an activation exactly as the manager would, against the files on this
machine: a raw activation document (docs/reference/activation.md, strict
JSON) or an ImplementationActivation (YAML or JSON). Paths must lie under
--allowed-roots, whose default is the manager's (/var/lib/iteron/providers):
pass the manager's value when it runs with another. Every source is checked; each failure
is printed on stderr naming its field (sources[2].catalog_path: … for a raw
document, spec.sources[2].catalogPath: … for an ImplementationActivation).

A source's catalog path names a catalog or a package-runtime manifest
(docs/reference/package-runtimes.md). Each admitted module is printed as
"ok  MODULE ID VERSION manifest=… artifact=… admitted=[…]"; a package
runtime, which has no version, shows "package-runtime exports=[…]" there.

Exit status: 0 every module is admitted, 1 something is invalid, 2 usage.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return usage(fmt.Errorf("--output must be text or json, not %q", output))
			}
			v, err := flags.verifier()
			if err != nil {
				return err
			}
			in, err := loadActivation(cmd, args[0])
			if err != nil {
				return err
			}
			ev, err := evaluate(v, in.doc)
			if err != nil {
				return err
			}
			reports := ev.reports()
			if output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), map[string]any{"modules": reports, "activateOrder": ev.eval.ActivateOrder}); err != nil {
					return err
				}
			} else {
				for _, r := range reports {
					if r.Admitted {
						// A catalog's line shows the version; a package
						// runtime's, which has none, its kind and exports.
						what := r.Version
						if r.Kind == verifier.SourceKindPackageRuntime {
							what = r.Kind + " exports=[" + strings.Join(r.Exports, ",") + "]"
						}
						fmt.Fprintf(cmd.OutOrStdout(), "ok  %s %s %s manifest=%s artifact=%s admitted=[%s]\n", r.Module, r.ImplementationID, what,
							r.ManifestSHA256, r.ArtifactSHA256, strings.Join(r.AdmittedCapabilities, ","))
					}
				}
			}
			failed := 0
			for _, r := range reports {
				for _, d := range r.Diagnostics {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: %s: %s\n", r.Module, d)
				}
				if !r.Admitted {
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s: %s\n", r.Module, r.Reason, r.Message)
				}
			}
			if failed > 0 {
				return invalid(fmt.Errorf("%d of %d modules not admitted", failed, len(reports)))
			}
			return nil
		},
	}
	flags.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
