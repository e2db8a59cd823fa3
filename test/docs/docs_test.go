package docs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/test/kubeapi"
)

// commandTimeout bounds one command of a guide. The first commands build
// things (the manager, the plugin, the example providers): minutes on a
// cold cache, seconds warm.
const commandTimeout = 10 * time.Minute

var repoRoot string

func TestMain(m *testing.M) {
	root, err := kubeapi.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	repoRoot = root
	if err := linkControlPlane(root); err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// linkControlPlane makes bin/k8s hold the control-plane binaries the guides
// name ($PWD/bin/k8s/kubectl; bin/localcluster starts etcd and
// kube-apiserver from there) when they were built elsewhere and
// KUBEBUILDER_ASSETS points there: bin/ is the build output directory
// (ignored by git), and the link changes nothing a guide runs.
func linkControlPlane(root string) error {
	k8s := filepath.Join(root, "bin", "k8s")
	if _, err := os.Stat(filepath.Join(k8s, "kube-apiserver")); err == nil {
		return nil
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" || filepath.Clean(assets) == k8s {
		return nil // the guide's own `make controlplane` builds them
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return fmt.Errorf("KUBEBUILDER_ASSETS=%s lacks %s: %w", assets, bin, err)
		}
	}
	if _, err := os.Lstat(k8s); err == nil {
		return fmt.Errorf("%s exists but holds no kube-apiserver; remove it or run `make controlplane`", k8s)
	}
	if err := os.MkdirAll(filepath.Dir(k8s), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "docs: linking %s -> %s (KUBEBUILDER_ASSETS)\n", k8s, assets)
	return os.Symlink(assets, k8s)
}

// guide is one document run as a test, with the values the test gives the
// reader's choices.
type guide struct {
	// Path is relative to the repository root.
	Path string
	// Workdir is where its session starts: "" for the repository root (the
	// guide says "from the root of your checkout"), "tmp" for the test's
	// temporary directory.
	Workdir string
	// Root says the guide must run as root.
	Root bool
}

// guides run in this order, each in a session of its own.
var guides = []guide{
	{Path: "docs/getting-started.md", Root: true},
	{Path: "docs/providers.md", Workdir: "tmp", Root: true},
	{Path: "docs/fleet.md", Root: true},
	{Path: "docs/reference/encoding.md"},
	{Path: "docs/reference/catalog.md"},
	{Path: "docs/reference/ledger.md"},
	{Path: "docs/reference/package-runtimes.md"},
}

// TestGuidesRunAsWritten runs every shell block of each guide in order and
// fails at the first command that fails or prints other than what the
// guide shows.
func TestGuidesRunAsWritten(t *testing.T) {
	for _, g := range guides {
		t.Run(g.Path, func(t *testing.T) {
			if g.Root && os.Geteuid() != 0 {
				t.Skipf("%s is written for root (its providers run as uid 65534); run the test as root", g.Path)
			}
			runGuide(t, g)
		})
	}
}

func runGuide(t *testing.T, g guide) {
	text, err := os.ReadFile(filepath.Join(repoRoot, g.Path))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseBlocks(string(text))
	if err != nil {
		t.Fatalf("%s: %v", g.Path, err)
	}
	// A short base directory: the guides put a unix socket under it (at
	// most 107 bytes), and providers (uid 65534) must traverse it.
	tmp, err := os.MkdirTemp("", "docs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := false
	defer func() {
		if keep {
			t.Logf("kept %s for inspection", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	// The reader's choices, and the test's values for them.
	values := map[string]string{
		"ITERON_DIR":       filepath.Join(tmp, "iteron"),
		"ITERON_PROVIDERS": filepath.Join(tmp, "providers"),
		"ITERON_SRC":       repoRoot,
	}
	shown := map[string]string{} // test value -> the guide's value, for output
	sessionDir := filepath.Join(tmp, "session")
	workdir := filepath.Join(tmp, "work")
	for _, d := range []string{sessionDir, workdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if g.Workdir == "" {
		workdir = repoRoot
	}
	var env []string
	for _, kv := range os.Environ() {
		// A reader's KUBECONFIG is theirs; the guide sets its own.
		if !strings.HasPrefix(kv, "KUBECONFIG=") {
			env = append(env, kv)
		}
	}
	s, err := startSession(sessionDir, workdir, env)
	if err != nil {
		t.Fatal(err)
	}
	failed := true
	defer func() {
		if left := s.close(time.Minute); len(left) > 0 {
			t.Errorf("%s left processes running (now stopped): %s", g.Path, strings.Join(left, ", "))
		}
		if failed || t.Failed() {
			keep = true
			dumpLogs(t, tmp)
		}
	}()
	dm := newDigestMap()
	ran := 0
	for bi, b := range blocks {
		where := fmt.Sprintf("%s:%d (block %d)", g.Path, b.Line, bi+1)
		directive, arg, _ := strings.Cut(b.Directive, " ")
		directive = strings.TrimSuffix(directive, ":")
		switch directive {
		case "", "your-values", "digests":
		case "skip":
			if b.Lang == "sh" {
				t.Logf("%s: skipped: %s", where, arg)
			}
			continue
		case "file":
			pwd, err := s.pwd()
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			path := filepath.Join(pwd, arg)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(strings.Join(b.Body, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: wrote %s (%d lines)", where, arg, len(b.Body))
			continue
		default:
			t.Fatalf("%s: unknown directive %q", where, b.Directive)
		}
		if b.Lang != "sh" {
			continue
		}
		cmds, err := commands(b)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if directive == "your-values" {
			if cmds, err = substitute(cmds, values, shown); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		}
		for _, c := range cmds {
			t0 := time.Now()
			out, code, err := s.run(c.Text, commandTimeout)
			first, _, _ := strings.Cut(c.Text, "\n")
			if err != nil {
				t.Fatalf("%s:%d: $ %s\n  %v; output so far:\n%s", g.Path, c.Line, first, err, indent(out))
			}
			if code != 0 {
				t.Fatalf("%s:%d: $ %s\n  exit status %d; output:\n%s", g.Path, c.Line, first, code, indent(out))
			}
			compared := ""
			if c.Output != nil {
				if diff := matchOutput(c.Output, unsubstitute(out, shown), directive == "digests", dm); diff != "" {
					t.Fatalf("%s:%d: $ %s\n  the output differs from the guide's: %s\n  whole output:\n%s", g.Path, c.Line, first, diff, indent(out))
				}
				compared = fmt.Sprintf(", output as shown (%d lines)", len(c.Output))
			}
			ran++
			t.Logf("%s:%d: $ %s — pass (%v%s)", g.Path, c.Line, first, time.Since(t0).Round(10*time.Millisecond), compared)
		}
	}
	if ran == 0 {
		t.Fatalf("%s has no command to run", g.Path)
	}
	failed = false
}

var exportRE = regexp.MustCompile(`^export ([A-Z_][A-Z0-9_]*)=(\S+)(\s+#.*)?$`)

// substitute gives the reader's choices in a your-values block the test's
// values; nothing else in the block changes. shown records the guide's
// value for each test value, to put back into output.
func substitute(cmds []command, values, shown map[string]string) ([]command, error) {
	out := slices.Clone(cmds)
	for i, c := range out {
		m := exportRE.FindStringSubmatch(c.Text)
		if m == nil {
			return nil, fmt.Errorf("line %d: a your-values block holds only `export NAME=value` lines, not %q", c.Line, c.Text)
		}
		v, ok := values[m[1]]
		if !ok {
			return nil, fmt.Errorf("line %d: the test has no value for %s (add one to runGuide)", c.Line, m[1])
		}
		out[i].Text = "export " + m[1] + "=" + shellQuote(v) + m[3]
		shown[v] = m[2]
	}
	return out, nil
}

// unsubstitute puts the guide's values back into output, longest test value
// first (one may contain another).
func unsubstitute(out string, shown map[string]string) string {
	keys := make([]string, 0, len(shown))
	for k := range shown {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return len(b) - len(a) })
	for _, k := range keys {
		out = strings.ReplaceAll(out, k, shown[k])
	}
	return out
}

// dumpLogs prints the tail of every log file a failed guide left, so that
// the cause of a failure is in the test's output.
func dumpLogs(t *testing.T, dir string) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil || len(data) == 0 {
			return nil
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("last lines of %s:\n%s", path, indent(strings.Join(lines, "\n")))
		return nil
	})
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (none)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// markdownFiles are the repository's documents: README.md and docs/.
func markdownFiles(t *testing.T) []string {
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(repoRoot, path)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestGoBlocksCompile builds every Go block of the documents as a program
// of its own, in a module that requires this repository as the providers
// guide says to.
func TestGoBlocksCompile(t *testing.T) {
	n := 0
	for _, f := range markdownFiles(t) {
		text, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parseBlocks(string(text))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, b := range blocks {
			if b.Lang != "go" {
				continue
			}
			n++
			where := fmt.Sprintf("%s:%d", f, b.Line)
			dir := t.TempDir()
			src := strings.Join(b.Body, "\n") + "\n"
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			gomod := fmt.Sprintf("module example.com/docblock\n\ngo 1.26\n\nrequire iteron.dev/operator v0.0.0\n\nreplace iteron.dev/operator => %s\n", repoRoot)
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
				t.Fatal(err)
			}
			sum, err := os.ReadFile(filepath.Join(repoRoot, "go.sum"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"mod", "tidy"}, {"vet", "."}, {"build", "-o", filepath.Join(dir, "program"), "."}} {
				cmd := exec.Command("go", args...)
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s: go %s: %v\n%s", where, strings.Join(args, " "), err, out)
				}
			}
			t.Logf("%s: the Go block compiles (go vet, go build)", where)
		}
	}
	if n == 0 {
		t.Fatal("no Go block found in the documents")
	}
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksResolve: every relative link of the documents names a file of
// the repository, and an anchor a heading of it.
func TestLinksResolve(t *testing.T) {
	slugCache := map[string]map[string]bool{}
	slugsOf := func(path string) map[string]bool {
		if s, ok := slugCache[path]; ok {
			return s
		}
		data, _ := os.ReadFile(path)
		slugCache[path] = headingSlugs(string(data))
		return slugCache[path]
	}
	for _, f := range markdownFiles(t) {
		text, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(stripCode(string(text)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join(repoRoot, f)
			if file != "" {
				path = filepath.Join(filepath.Dir(path), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !slugsOf(path)[anchor] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", f, target, filepath.Base(path), anchor)
			}
		}
	}
}

// stripCode blanks fenced blocks and inline code, which hold no links.
func stripCode(text string) string {
	var b strings.Builder
	inFence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			b.WriteString("\n")
			continue
		}
		if inFence {
			b.WriteString("\n")
			continue
		}
		b.WriteString(regexp.MustCompile("`[^`]*`").ReplaceAllString(l, ""))
		b.WriteString("\n")
	}
	return b.String()
}

var moduleRowRE = regexp.MustCompile("^\\| (\\d+) \\| `([a-z0-9_]+)` \\| `iteron/([a-z0-9_.]+)/<role>@v1` \\| (.*) \\|$")

// TestTheModuleTableIsTheBuiltinGraph: the 28 modules of docs/providers.md,
// their order, contracts and dependencies are the built-in seam graph's.
func TestTheModuleTableIsTheBuiltinGraph(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(repoRoot, "docs", "providers.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for _, l := range strings.Split(string(text), "\n") {
		if m := moduleRowRE.FindStringSubmatch(l); m != nil {
			rows = append(rows, m)
		}
	}
	g := catalog.BuiltinSeamGraph()
	modules := g.Modules()
	if len(rows) != len(modules) {
		t.Fatalf("docs/providers.md lists %d modules, the built-in graph has %d", len(rows), len(modules))
	}
	for i, row := range rows {
		module := modules[i]
		if row[1] != fmt.Sprint(i+1) || row[2] != module {
			t.Errorf("row %d: %s %s, the graph's module %d is %s", i+1, row[1], row[2], i+1, module)
			continue
		}
		dotted := protocol.DottedModule(module)
		if row[3] != dotted {
			t.Errorf("%s: contracts iteron/%s/…, want iteron/%s/…", module, row[3], dotted)
		}
		c, _ := g.Contracts(module)
		for role, ref := range map[string]protocol.ContractRef{
			"definition": c.Definition, "provider": c.Provider, "consumer": c.Consumer, "observation": c.Observation,
			"lifecycle/load": c.Load, "lifecycle/start": c.Start, "lifecycle/cancel": c.Cancel, "lifecycle/stop": c.Stop,
			"lifecycle/snapshot": c.Snapshot, "lifecycle/restore": c.Restore, "lifecycle/migrate": c.Migrate, "lifecycle/readiness": c.Readiness,
		} {
			if want := "iteron/" + dotted + "/" + role + "@v1"; ref.ID != want || ref.Version != 1 {
				t.Errorf("%s: the %s contract is %s v%d, the table implies %s v1", module, role, ref.ID, ref.Version, want)
			}
		}
		var deps []string
		for _, d := range strings.Split(row[4], ", ") {
			if d != "–" {
				deps = append(deps, strings.Trim(d, "`"))
			}
		}
		if got := g.Dependencies(module); !slices.Equal(deps, got) {
			t.Errorf("%s: the table says it depends on %v, the graph on %v", module, deps, got)
		}
	}
}
