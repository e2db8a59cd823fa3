// Command reasonsdoc renders the reason table of internal/reasons into the
// reference docs (make generate).
package main

import (
	"flag"
	"fmt"
	"os"

	"iteron.dev/operator/internal/reasons"
)

func main() {
	out := flag.String("out", "docs/reference/reasons.md", "file to write")
	flag.Parse()
	if err := os.WriteFile(*out, reasons.Markdown(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "reasonsdoc:", err)
		os.Exit(1)
	}
}
