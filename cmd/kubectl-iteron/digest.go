package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
)

func newDigestCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "digest",
		Short: "Print the digests an activation pins: manifest_sha256 and artifact_sha256",
	}
	cmd.AddCommand(newDigestManifestCmd(), newDigestArtifactCmd())
	return cmd
}

func newDigestManifestCmd() *cobra.Command {
	var lone bool
	cmd := &cobra.Command{
		Use:   "manifest [--manifest] <catalog.json|manifest.json|package-runtime.json|-> [implementation_id]",
		Short: "Print the canonical manifest digest of each implementation in a catalog (or of one)",
		Long: `Parse a catalog strictly (every rule of docs/reference/catalog.md, the whole
catalog rejected if one manifest is invalid or it is not dependency-closed)
and print "sha256:<hex>  <implementation_id>" for each manifest, or only the
digest of the one named. With --manifest the file is a single manifest object.

A package-runtime manifest (a file whose top level has a schema_id member,
docs/reference/package-runtimes.md) is parsed by its own rules and printed as
"sha256:<hex>  <package_revision_id>": the manifest_sha256 of a source that
names it.

A catalog reached through a symlink (at any component of its path) is
refused, naming the link and its target, as the manager refuses it: digest
the target and name that path in the activation.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "-" {
				if err := refuseSymlinks(args[0]); err != nil {
					return err
				}
			}
			data, err := readInput(cmd, args[0])
			if err != nil {
				return err
			}
			if catalog.IsPackageRuntimeManifest(data) {
				return digestPackageRuntime(cmd, args, data)
			}
			var manifests []catalog.Manifest
			if lone {
				if len(args) == 2 {
					return usage(errors.New("--manifest takes no implementation_id"))
				}
				m, err := catalog.ParseManifest(data)
				if err != nil {
					return invalid(fmt.Errorf("%s: %w", args[0], err))
				}
				manifests = []catalog.Manifest{m}
			} else {
				c, err := catalog.ParseCatalog(data)
				if err != nil {
					return invalid(fmt.Errorf("%s: %w", args[0], err))
				}
				manifests = c.Implementations
				if len(args) == 2 {
					m, ok := c.Lookup(args[1])
					if !ok {
						return invalid(fmt.Errorf("%s has no implementation %q", args[0], args[1]))
					}
					d, err := catalog.ManifestDigest(m)
					if err != nil {
						return invalid(err)
					}
					fmt.Fprintln(cmd.OutOrStdout(), d)
					return nil
				}
			}
			for _, m := range manifests {
				d, err := catalog.ManifestDigest(m)
				if err != nil {
					return invalid(err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s  %s\n", d, m.ImplementationID)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&lone, "manifest", false, "the file is one manifest, not a catalog")
	return cmd
}

// digestPackageRuntime prints a package-runtime manifest's digest; an
// implementation_id argument must be its package_revision_id.
func digestPackageRuntime(cmd *cobra.Command, args []string, data []byte) error {
	m, err := catalog.ParsePackageRuntimeManifest(data)
	if err != nil {
		return invalid(fmt.Errorf("%s (a package-runtime manifest): %w", args[0], err))
	}
	d, err := catalog.PackageRuntimeManifestDigest(m)
	if err != nil {
		return invalid(err)
	}
	if len(args) == 2 {
		if args[1] != m.PackageRevisionID {
			return invalid(fmt.Errorf("%s is the package runtime %q, not %q", args[0], m.PackageRevisionID, args[1]))
		}
		fmt.Fprintln(cmd.OutOrStdout(), d)
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s  %s\n", d, m.PackageRevisionID)
	return nil
}

func newDigestArtifactCmd() *cobra.Command {
	var bare bool
	cmd := &cobra.Command{
		Use:   "artifact [--bare] <file>",
		Short: "Print an executable's digest as the verifier computes it",
		Long: `Hash a regular file of at most 256 MiB through a fixed 64 KiB buffer, as the
verifier does, and print "sha256:<hex>" (the form of an activation's
artifact_sha256) or, with --bare, the 64 hex digits alone (the form of a
manifest's artifact_sha256). A path through a symlink (at any component) is
refused, naming the link and its target, as the manager refuses it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseSymlinks(args[0]); err != nil {
				return err
			}
			d, err := verifier.ArtifactDigest(args[0])
			switch {
			case errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission):
				return usage(err)
			case err != nil:
				return invalid(err)
			}
			if bare {
				d = strings.TrimPrefix(d, "sha256:")
			}
			fmt.Fprintln(cmd.OutOrStdout(), d)
			return nil
		},
	}
	cmd.Flags().BoolVar(&bare, "bare", false, "print the bare hex digest (a manifest's artifact_sha256)")
	return cmd
}

// refuseSymlinks refuses a path the manager's verifier would refuse for a
// symlink, so that digest never prints a digest the activation cannot use.
// A missing file is a usage error, as when it is opened.
func refuseSymlinks(path string) error {
	err := verifier.CheckNoSymlinks(path)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, verifier.ErrSymlink):
		return invalid(fmt.Errorf("%w: the manager reads no file through a symlink; digest the target and name it in the activation", err))
	case errors.Is(err, verifier.ErrNotFound):
		return usage(err)
	}
	return invalid(err)
}
