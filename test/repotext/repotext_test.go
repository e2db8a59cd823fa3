package repotext

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "iteron.dev/operator"

// A pointer is text that sends the reader somewhere this repository does not
// take them. Each pattern is written so that it does not match itself.
type pointer struct {
	re  *regexp.Regexp
	why string
}

var pointers = []pointer{
	{regexp.MustCompile(`spec/wire\.md`), "the wire spec is not in this repository: cite the page of docs/reference/ that holds the rule"},
	{regexp.MustCompile(`\bDESIGN(\.md|\s*§)`), "the design notes are not in this repository: cite the page of docs/ that holds the rule"},
	{regexp.MustCompile(`/work/shar[e]d\b|\bNOTES\.md\b`), "a path outside the repository"},
	{regexp.MustCompile(`\b[Ii]ssues? #?[0-9]+`), "an issue number: name the feature (a Go bug is golang/go#NNNNN)"},
	{regexp.MustCompile(`\bseeds? [0-9]{3}\b`), "a seed number: name the feature or the Quixos seed"},
}

// A finding is one offending line.
type finding struct {
	file string
	line int
	text string
	why  string
}

func (f finding) String() string {
	return fmt.Sprintf("%s:%d: %s\n\t%s", f.file, f.line, strings.TrimSpace(f.text), f.why)
}

// scan returns the findings in one file's content. Binary content (a NUL in
// its first 8 KiB) has none.
func scan(name string, content []byte) []finding {
	if bytes.IndexByte(content[:min(len(content), 8<<10)], 0) >= 0 {
		return nil
	}
	var out []finding
	s := bufio.NewScanner(bytes.NewReader(content))
	s.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; s.Scan(); n++ {
		for _, p := range pointers {
			if p.re.Match(s.Bytes()) {
				out = append(out, finding{name, n, s.Text(), p.why})
				break
			}
		}
	}
	return out
}

// skipped are files whose text is not ours to word.
func skipped(name string) bool {
	return filepath.Base(name) == "go.sum"
}

func TestNoTextPointsOutsideTheRepository(t *testing.T) {
	root := repoRoot(t)
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	var found []finding
	files := 0
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if name == "" || skipped(name) {
			continue
		}
		content, err := os.ReadFile(filepath.Join(root, name))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		files++
		found = append(found, scan(name, content)...)
	}
	if files < 100 {
		t.Fatalf("read %d files from git ls-files in %s: not the repository?", files, root)
	}
	for _, f := range found {
		t.Error(f)
	}
	if len(found) > 0 {
		t.Logf("%d line(s) point outside the repository; docs/README.md and docs/reference/README.md list the pages to cite", len(found))
	}
}

// TestTheScanFindsEachPointer shows the scan itself at work: each kind of
// pointer is found with its file and line, and what resembles one but is
// not stays quiet.
func TestTheScanFindsEachPointer(t *testing.T) {
	hash := "§"
	for _, c := range []struct {
		name, text string
		want       int // the line found, 0 for none
	}{
		{"the wire spec in a Go comment", "package x\n\n// Bounds (spec/" + "wire.md §3).\n", 3},
		{"a section of the design notes", "// Crash policy (DESIGN " + hash + "8).\n", 1},
		{"the design notes by file name", "see DESIGN" + ".md\n", 1},
		{"an issue number in make's help", "a: ## Package runtimes (iss" + "ue 16): …\n", 1},
		{"issue numbers in a heading", "x\ny\n## Re-measured with iss" + "ues 17 and 18 merged\n", 3},
		{"a capitalised issue number", "# Iss" + "ue #4 asked for it\n", 1},
		{"a seed number", "# The service of se" + "ed 004\n", 1},
		{"a path of the build machines", "cat /work/" + "shared/x\n", 1},
		{"a Go bug written as golang/go#N", "// (golang/go#27505)\n", 0},
		{"an issue without a number", "// a known issue of the kernel\n", 0},
		{"the docs page instead", "// Bounds (docs/reference/activation.md).\n", 0},
		{"the Quixos seed by name", "// the Quixos seed's service\n", 0},
		{"a seeded corpus", "// seed 12 values\n", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := scan("f.go", []byte(c.text))
			switch {
			case c.want == 0 && len(got) != 0:
				t.Fatalf("found %v in %q", got, c.text)
			case c.want != 0 && len(got) != 1:
				t.Fatalf("found %d pointers in %q, want 1", len(got), c.text)
			case c.want != 0 && (got[0].file != "f.go" || got[0].line != c.want || !strings.HasPrefix(got[0].String(), fmt.Sprintf("f.go:%d: ", c.want))):
				t.Fatalf("found %q, want f.go:%d", got[0], c.want)
			}
		})
	}
	if got := scan("bin", []byte("\x00DESIGN"+".md")); len(got) != 0 {
		t.Errorf("a binary file was scanned: %v", got)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module "+module+"\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the working directory", module)
		}
		dir = parent
	}
}
