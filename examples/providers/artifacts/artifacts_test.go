package artifacts

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestTheRecordedSourcesAreTheModuleFilesOfTheBuild: what RecordSources
// stats for a provider is its own files and those of every package of the
// module it imports (so that a change to any of them reruns a test that
// built it), go.mod and go.sum — and nothing of the standard library or of
// another module, whose versions go.mod and go.sum pin.
func TestTheRecordedSourcesAreTheModuleFilesOfTheBuild(t *testing.T) {
	ctx := context.Background()
	root, err := ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ex, _ := ExampleByName(CounterV2)
	files, err := sourceFiles(ctx, root, ex.Package)
	if err != nil {
		t.Fatal(err)
	}
	rel := make([]string, len(files))
	for i, f := range files {
		r, err := filepath.Rel(root, f)
		if err != nil || strings.HasPrefix(r, "..") {
			t.Fatalf("%s is outside the module %s", f, root)
		}
		rel[i] = r
	}
	for _, want := range []string{"go.mod", "go.sum", "examples/providers/counter/v2/main.go", "examples/providers/internal/counter/counter.go", "pkg/provider/provider.go", "pkg/protocol/decode.go", "pkg/strictjson/check.go"} {
		if !slices.Contains(rel, want) {
			t.Errorf("%s is not recorded; recorded: %v", want, rel)
		}
	}
	for _, r := range rel {
		if strings.HasSuffix(r, "_test.go") || strings.HasPrefix(r, "internal/hotswap/") {
			t.Errorf("%s is recorded, but the build of %s does not read it", r, ex.Package)
		}
	}

	if _, err := sourceFiles(ctx, root, "iteron.dev/operator/examples/providers/nosuch"); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("a package that does not exist: %v, want an error naming it", err)
	}
}
