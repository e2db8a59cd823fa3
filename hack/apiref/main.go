// Command apiref writes the API reference (docs/reference/api.md) from the
// CRDs in config/crd/bases: every field with its type, default, validation and
// description, plus each kind's names, scope, subresources, printer columns,
// selectable fields and object-level rules.
//
// It reads the CRDs, not the Go types, because the CRDs are what the API
// server enforces: the reference then shows exactly the defaults, bounds and
// CEL rules a user meets (controller-gen turns the markers into the CRDs with
// `make manifests`). A schema keyword it does not know how to show stops it
// with an error naming the field, so nothing the server enforces is left out
// of the reference silently.
//
//	go run ./hack/apiref                 # write docs/reference/api.md
//	go run ./hack/apiref -check          # exit 1 if the committed file is stale
//
// Exit codes: 0 written (or up to date), 1 stale (-check) or a CRD that cannot
// be documented, 2 usage.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("apiref", flag.ContinueOnError)
	fs.SetOutput(stderr)
	crdDir := fs.String("crds", "config/crd/bases", "directory of CRD YAML files (every *.yaml is read)")
	out := fs.String("out", "docs/reference/api.md", "the Markdown file to write")
	check := fs.Bool("check", false, "do not write: exit 1 if -out differs from what would be written")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "apiref: unexpected arguments %q\n", fs.Args())
		return 2
	}
	crds, err := loadCRDs(*crdDir)
	if err != nil {
		fmt.Fprintln(stderr, "apiref:", err)
		return 1
	}
	doc, err := render(crds)
	if err != nil {
		fmt.Fprintln(stderr, "apiref:", err)
		return 1
	}
	if *check {
		current, err := os.ReadFile(*out)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(stderr, "apiref:", err)
			return 1
		}
		if !bytes.Equal(current, doc) {
			fmt.Fprintf(stderr, "apiref: %s is stale: it differs from what %s generates (first difference at line %d); run `make api-docs`\n",
				*out, *crdDir, firstDifferentLine(current, doc))
			return 1
		}
		fmt.Fprintf(stdout, "%s is up to date\n", *out)
		return 0
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(stderr, "apiref:", err)
		return 1
	}
	if err := os.WriteFile(*out, doc, 0o644); err != nil {
		fmt.Fprintln(stderr, "apiref:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%d kinds, %d bytes)\n", *out, len(crds), len(doc))
	return 0
}

// firstDifferentLine is the 1-based line at which a and b first differ.
func firstDifferentLine(a, b []byte) int {
	al, bl := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := 0; i < len(al) && i < len(bl); i++ {
		if !bytes.Equal(al[i], bl[i]) {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
