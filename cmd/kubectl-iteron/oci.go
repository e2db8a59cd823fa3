package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// registryFlags are how push and pull reach a registry (the manager's
// --registry-config, --registry-ca and --registry-plain-http).
type registryFlags struct {
	config, ca string
	plainHTTP  bool
	timeout    time.Duration
}

func (f *registryFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.config, "registry-config", "", "docker config.json with registry credentials")
	cmd.Flags().StringVar(&f.ca, "registry-ca", "", "PEM bundle of CAs trusted for the registry besides the system's")
	cmd.Flags().BoolVar(&f.plainHTTP, "plain-http", false, "reach a loopback registry over plain HTTP (refused for any other registry)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", artifacts.DefaultPullTimeout, "bound of the whole push or pull")
}

func (f *registryFlags) options() artifacts.RegistryOptions {
	return artifacts.RegistryOptions{Config: f.config, CAFile: f.ca, PlainHTTP: f.plainHTTP, UserAgent: "kubectl-iteron"}
}

func newPushCmd() *cobra.Command {
	var rf registryFlags
	cmd := &cobra.Command{
		Use:   "push DIR REF",
		Short: "Package a provider directory as an OCI artifact and push it",
		Long: `Package a provider directory — DIR/catalog.json and, for each implementation
it carries, its artifact root DIR/<implementation_id>/ — as an OCI artifact
(artifactType ` + artifacts.ArtifactType + `) and push it to REF
(<registry>/<repository>[:<tag>]). Prints the pinned reference and, per
implementation, the source to paste into an activation.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := artifacts.ParseTarget(args[1])
			if err != nil {
				return usage(fmt.Errorf("REF: %w", err))
			}
			if rf.plainHTTP && !artifacts.IsLoopback(ref.Registry) {
				return usage(fmt.Errorf("--plain-http: %s is not a loopback registry; plain HTTP is refused for it", ref.Registry))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), rf.timeout)
			defer cancel()
			res, err := artifacts.Push(ctx, rf.options(), args[0], args[1])
			if err != nil {
				return invalid(err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "pushed %s\n", res.Ref)
			fmt.Fprintf(out, "sources:\n")
			for _, s := range res.Sources {
				printOCISource(out, res.Ref, s.Module, s.ImplementationID, s.ManifestSHA256, s.ArtifactSHA256)
			}
			return nil
		},
	}
	rf.register(cmd)
	return cmd
}

func printOCISource(out io.Writer, ref, module, id, manifest, artifact string) {
	fmt.Fprintf(out, "- module: %s\n  implementationID: %s\n  oci:\n    ref: %s\n  manifestSHA256: %s\n  artifactSHA256: %s\n", module, id, ref, manifest, artifact)
}

func newPullCmd() *cobra.Command {
	var (
		rf  registryFlags
		vf  verifyFlags
		dir string
	)
	cmd := &cobra.Command{
		Use:   "pull REF@sha256:… --to DIR",
		Short: "Pull a provider artifact by digest and verify it as the manager does",
		Long: `Pull a provider artifact by digest into the content-addressed store DIR
through exactly the manager's pull-and-verify path (digests checked while
streaming, size bounds, temp file + fsync + rename), lay it out as a
source (DIR/sources/sha256/<hex>/catalog.json and impl/<implementation_id>/)
and verify every implementation it carries with the manager's verifier, each
on its own, as the one source of its module that an activation names (an
artifact may carry several implementations of one module). It prints each
implementation verified and, for each, the source to paste into an
activation. Exit 1 names the reason (artifact_refused, artifact_unavailable,
verification_failed), each implementation that does not verify and the
digest that did not match.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usage(errors.New("--to DIR is required"))
			}
			ref, err := artifacts.ParseRef(args[0])
			if err != nil {
				return usage(fmt.Errorf("REF: %w", err))
			}
			if rf.plainHTTP && !artifacts.IsLoopback(ref.Registry) {
				return usage(fmt.Errorf("--plain-http: %s is not a loopback registry; plain HTTP is refused for it", ref.Registry))
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return usage(err)
			}
			store, err := artifacts.OpenStore(abs, 0)
			if err != nil {
				return usage(fmt.Errorf("--to: %w", err))
			}
			p, err := artifacts.NewPuller(artifacts.PullerOptions{RegistryOptions: rf.options(), Store: store, Timeout: rf.timeout})
			if err != nil {
				return usage(err)
			}
			layout, err := p.Pull(cmd.Context(), args[0])
			if err != nil {
				return invalid(fmt.Errorf("pull %s: %w", args[0], err))
			}
			vf.allowedRoots = nil // the store is the allowed root of OCI sources
			v, err := vf.verifierWith(offlineStore{store})
			if err != nil {
				return err
			}
			data, err := os.ReadFile(layout.CatalogPath)
			if err != nil {
				return invalid(err)
			}
			cat, err := catalog.ParseCatalog(data)
			if err != nil {
				return invalid(err)
			}
			// An activation names one source per module, so an artifact that
			// carries several implementations of one module (counter v1 and v2
			// of prompt_system, say) is verified one implementation at a time,
			// each as the only source of its own document: what the manager
			// checks when an activation names that implementation.
			ids := slices.Sorted(mapsKeys(layout.Roots))
			if len(ids) == 0 {
				return invalid(fmt.Errorf("%s carries no implementation", args[0]))
			}
			var verified []*verifier.VerifiedSource
			var failed []error
			for _, id := range ids {
				m, _ := cat.Lookup(id)
				md, err := catalog.ManifestDigest(m)
				if err != nil {
					return invalid(err)
				}
				doc := &verifier.Document{Form: verifier.FormDocument, CandidateSHA256: "sha256:" + fmt.Sprintf("%064x", 0),
					Sources: []verifier.Source{{Module: m.Module, ImplementationID: id, OCIRef: args[0], ManifestSHA256: md, ArtifactSHA256: "sha256:" + m.ArtifactSHA256}}}
				res, err := v.Verify(doc)
				if err != nil {
					return invalid(fmt.Errorf("implementation %s: %w", id, err))
				}
				for _, f := range res.Failed() {
					failed = append(failed, implementationFailure(id, f.Err))
				}
				verified = append(verified, res.Verified()...)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "pulled %s into %s\n", args[0], layout.Dir)
			if len(verified) > 0 {
				fmt.Fprintf(out, "verified (%d implementations):\n", len(verified))
				for _, vs := range verified {
					fmt.Fprintf(out, "  %s %s: catalog %s, root %s\n", vs.Module, vs.ImplementationID, vs.CatalogPath, vs.ArtifactRoot)
				}
			}
			if len(failed) > 0 {
				return invalid(fmt.Errorf("%s does not verify (%d of %d implementations): %w", args[0], len(failed), len(ids), errors.Join(failed...)))
			}
			fmt.Fprintf(out, "sources:\n")
			for _, vs := range verified {
				printOCISource(out, args[0], vs.Module, vs.ImplementationID, vs.ManifestSHA256, vs.ArtifactSHA256)
			}
			return nil
		},
	}
	rf.register(cmd)
	cmd.Flags().StringVar(&dir, "to", "", "the content-addressed store to pull into (created if needed)")
	cmd.Flags().StringVar(&vf.ceiling, "capability-ceiling", catalog.DefaultCeiling, "the node's capability ceiling, comma-separated")
	return cmd
}

// implementationFailure names the implementation and the reason in front of
// the verifier's error, with the field relative to the implementation: the
// verifier names it in the one-source document made for it (sources[0].…).
func implementationFailure(id string, err error) error {
	var ae *verifier.Error
	if !errors.As(err, &ae) {
		return fmt.Errorf("implementation %s: %w", id, err)
	}
	detail := ae.Detail
	if field := strings.TrimPrefix(ae.Field, "sources[0]."); field != "" {
		detail = field + ": " + detail
	}
	return fmt.Errorf("implementation %s: %s: %s", id, ae.Code, detail)
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// offlineStore resolves OCI sources from a store already pulled into (by
// `kubectl iteron pull --to DIR`); it never reaches a registry.
type offlineStore struct{ s *artifacts.Store }

func (o offlineStore) Resolve(ref, _ string) (*artifacts.Layout, error) {
	r, err := artifacts.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	l, ok := o.s.Lookup(r.Digest)
	if !ok {
		return nil, &artifacts.Error{Code: reasons.ArtifactUnavailable, Ref: ref,
			Detail: fmt.Sprintf("%s is not in the artifact store %s: pull it first (kubectl iteron pull %s --to %s)", ref, o.s.Root(), ref, o.s.Root())}
	}
	return l, nil
}

func (o offlineStore) Store() *artifacts.Store { return o.s }
