package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "iteron.dev/operator"

// internalOrder is the order of the internal packages: each may import only
// those before it (and api/..., pkg/strictjson, pkg/protocol). Packages on
// one line are peers: neither imports the other. A package below one of
// these (internal/procexec/conformance) belongs to its row: it takes the same
// place in the order and may import the package above it. Packages that do
// not exist yet keep their place.
var internalOrder = [][]string{
	{"internal/statedir"},
	{"internal/reasons"},
	{"internal/tracing"},
	{"internal/catalog"},
	{"internal/artifacts"},
	{"internal/verifier"},
	{"internal/graph"},
	{"internal/spawn"},
	{"internal/sandbox"},
	{"internal/procexec", "internal/pkgruntime"},
	{"internal/survivor"},
	{"internal/ledger"},
	{"internal/effects"},
	{"internal/dispatch"},
	{"internal/providers"},
	{"internal/hotswap"},
	{"internal/fleet"},
	{"internal/gateway"},
}

// leaves may be imported by every internal package.
var leaves = []string{"api", "pkg/strictjson", "pkg/protocol"}

// testSupport may additionally be imported by any package's _test.go files.
var testSupport = []string{"test", "examples"}

// A rule is one row of the layering table. Every path in it stands for that
// package and every package below it (relative to the module).
type rule struct {
	pkgs     string   // the packages this row is about
	rank     int      // place in internalOrder (1-based); 0 when not in it
	imports  []string // what their non-test files may import of this module
	never    []string // imports forbidden with a reason of their own
	neverWhy string
	// testsMay lifts never for the row's _test.go files: a test may build
	// the real thing around the package (the gateway's tests run a real
	// transaction engine).
	testsMay bool
	onlyBy   []string // when set, only these (and the row's own packages) may import pkgs
	onlyWhy  string
	why      string // the rule an import outside imports breaks
}

// knownViolations are edges that break the layering today and are being
// removed. The test logs them instead of failing, and fails when one of them
// has disappeared, so the list cannot outlive its violations. Add nothing
// here: fix the import instead.
var knownViolations = []struct{ importer, imported string }{}

// table is the layering, written once: docs/reference/layering.md carries
// its rendering (TestLayeringDoc keeps the two equal).
var table = func() []rule {
	var all []string
	for _, line := range internalOrder {
		all = append(all, line...)
	}
	var rows []rule
	rows = append(rows,
		rule{pkgs: "api", imports: []string{"api"},
			why: "api/... imports nothing of this module outside api/ (a generated proto package may import the packages of the protos it imports)"},
		rule{pkgs: "pkg/strictjson",
			why: "pkg/strictjson imports nothing of this module"},
		rule{pkgs: "pkg/protocol", imports: []string{"pkg/strictjson"},
			why: "pkg/protocol imports only pkg/strictjson"},
		rule{pkgs: "pkg/provider", imports: []string{"pkg/protocol", "pkg/strictjson"},
			why: "pkg/provider (the provider SDK) imports only pkg/protocol and pkg/strictjson: the message types live in one place, shared by host and SDK"},
		rule{pkgs: "pkg/packageruntime", imports: []string{"api/quixos"},
			why: "pkg/packageruntime (the package-runtime SDK) imports only the generated quixos code under api/quixos/"},
	)
	for i, line := range internalOrder {
		var before []string
		for _, l := range internalOrder[:i] {
			before = append(before, l...)
		}
		for _, p := range line {
			r := rule{pkgs: p, rank: i + 1, imports: append(slices.Clone(leaves), before...),
				why: p + " may import only api/..., pkg/strictjson, pkg/protocol and the internal packages before it in the order " + orderText()}
			if p == "internal/dispatch" {
				r.never, r.testsMay = []string{"internal/procexec"}, true
				r.neverWhy = "internal/dispatch never imports internal/procexec: an error says itself that the host ended a run (HostEnded) or what its reason is (ReasonCode), so classifying it needs no executor"
			}
			if p == "internal/gateway" {
				r.never, r.testsMay = []string{"internal/hotswap", "internal/providers", "internal/procexec"}, true
				r.neverWhy = "internal/gateway never imports internal/hotswap (the transaction engine), internal/providers or internal/procexec: " +
					"all it needs of the node runtime is internal/dispatch (queue, routes, the call's error classification)"
			}
			rows = append(rows, r)
		}
	}
	rows = append(rows,
		rule{pkgs: "internal/doctor", imports: append(slices.Clone(leaves), all...),
			never:    []string{"internal/hotswap"},
			neverWhy: "internal/doctor never imports internal/hotswap, the transaction engine: the files it reads are named by internal/statedir",
			onlyBy:   []string{"cmd", "test"},
			onlyWhy:  "internal/doctor is imported only by cmd/... (and the suites under test/)",
			why:      "internal/doctor may read any internal package of the order, api/..., pkg/strictjson and pkg/protocol, nothing else"},
		rule{pkgs: "controllers",
			imports: append(slices.Clone(leaves), "internal/reasons", "internal/tracing", "internal/catalog", "internal/verifier", "internal/graph", "internal/dispatch", "internal/hotswap", "internal/fleet"),
			never:   []string{"internal/ledger", "internal/procexec", "internal/pkgruntime"},
			neverWhy: "controllers never imports internal/ledger, internal/procexec or internal/pkgruntime: " +
				"reconcilers reach processes and the ledger only through internal/hotswap",
			onlyBy:  []string{"cmd/manager", "test"},
			onlyWhy: "nothing imports controllers but cmd/manager (and the test support and suites under test/)",
			why: "controllers imports only api/..., pkg/strictjson, pkg/protocol, internal/reasons, internal/tracing, " +
				"the verification packages (internal/catalog, internal/verifier, internal/graph), internal/dispatch, internal/hotswap and internal/fleet"},
		rule{pkgs: "cmd/manager", imports: []string{"api", "pkg", "internal", "controllers"},
			why: "cmd/manager imports only api/..., pkg/..., internal/... and controllers; never hack/, test/, examples/ or bench/"},
		rule{pkgs: "cmd/kubectl-iteron", imports: []string{"api", "pkg", "internal"},
			never: []string{"internal/hotswap", "internal/providers"}, testsMay: true,
			neverWhy: "cmd/kubectl-iteron never imports internal/hotswap (the transaction engine) or internal/providers: the files it reads are named by internal/statedir, the calls it makes go through the gateway",
			why:      "a command under cmd/ imports only api/..., pkg/... and internal/... (controllers only in cmd/manager); never hack/, test/, examples/ or bench/"},
		rule{pkgs: "cmd", imports: []string{"api", "pkg", "internal"},
			why: "a command under cmd/ imports only api/..., pkg/... and internal/... (controllers only in cmd/manager); never hack/, test/, examples/ or bench/"},
		rule{pkgs: "examples/providers/artifacts", imports: []string{"api", "pkg", "internal", "examples"},
			why: "examples/providers/artifacts (test support) imports only api/..., pkg/..., internal/... and examples/..."},
		rule{pkgs: "examples/providers/providertest", imports: []string{"api", "pkg", "internal", "examples"},
			why: "examples/providers/providertest (test support) imports only api/..., pkg/..., internal/... and examples/..."},
		rule{pkgs: "examples", imports: []string{"api", "pkg", "examples"},
			why: "an example provider imports only api/..., pkg/... and examples/...: what a module outside this repository could import"},
		rule{pkgs: "bench", imports: []string{"api", "pkg", "internal", "examples", "bench"},
			why: "bench/... imports only api/..., pkg/..., internal/..., examples/... and bench/..."},
		rule{pkgs: "hack", imports: []string{"api", "pkg", "internal", "examples", "test", "hack"},
			why: "hack/... imports only api/..., pkg/..., internal/..., examples/..., test/... and hack/...; never controllers, cmd/ or bench/"},
		rule{pkgs: "test", imports: []string{"api", "pkg", "internal", "controllers", "cmd/manager/app", "examples", "test"},
			why: "test/... imports only api/..., pkg/..., internal/..., controllers, cmd/manager/app (the manager's one constructor, so suites run what users run), examples/... and test/...; never the other cmd/ packages, hack/ or bench/"},
	)
	return rows
}()

func orderText() string {
	var parts []string
	for _, line := range internalOrder {
		var names []string
		for _, p := range line {
			names = append(names, strings.TrimPrefix(p, "internal/"))
		}
		parts = append(parts, strings.Join(names, " | "))
	}
	return strings.Join(parts, " → ")
}

// within reports whether path is pattern or below it.
func within(path, pattern string) bool {
	return path == pattern || strings.HasPrefix(path, pattern+"/")
}

func withinAny(path string, patterns []string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return within(path, p) })
}

// rowOf returns the most specific row for a package (relative path), or nil.
func rowOf(rel string) *rule {
	var best *rule
	for i := range table {
		r := &table[i]
		if within(rel, r.pkgs) && (best == nil || len(r.pkgs) > len(best.pkgs)) {
			best = r
		}
	}
	return best
}

// check returns "" when importer may import imported (from a _test.go file
// when test is set), else the rule it breaks.
func check(importer, imported string, test bool) string {
	r, t := rowOf(importer), rowOf(imported)
	if r == nil || t == nil || r == t {
		return "" // an unplaced package is reported on its own
	}
	if len(t.onlyBy) > 0 && !withinAny(importer, t.onlyBy) {
		return t.onlyWhy
	}
	if withinAny(imported, r.never) && !(test && r.testsMay) {
		return r.neverWhy
	}
	if withinAny(imported, r.imports) || test && withinAny(imported, testSupport) {
		return ""
	}
	if r.rank > 0 && t.rank > 0 {
		if r.rank == t.rank {
			return fmt.Sprintf("%s and %s are peers in the internal order: neither imports the other", r.pkgs, t.pkgs)
		}
		return fmt.Sprintf("internal packages import only those before them in the order %s; %s comes after %s", orderText(), t.pkgs, r.pkgs)
	}
	if test {
		return r.why + " (its _test.go files may also import test/... and examples/...)"
	}
	return r.why
}

type listed struct {
	ImportPath, Dir                                              string
	Imports, TestImports, XTestImports                           []string
	GoFiles, CgoFiles, TestGoFiles, XTestGoFiles, IgnoredGoFiles []string
}

// edge is one package importing another, with the files that do it.
type edge struct {
	importer, imported string
	files, testFiles   []string
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if bytes.HasPrefix(b, []byte("module "+module+"\n")) {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the working directory", module)
		}
		dir = parent
	}
}

// ownImports returns the module's packages a file imports, relative to the
// module (the module's root package as ".").
func ownImports(fset *token.FileSet, path string) ([]string, error) {
	f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, spec := range f.Imports {
		p, err := strconv.Unquote(spec.Path.Value)
		if err != nil {
			return nil, err
		}
		if rel, ok := relative(p); ok {
			out = append(out, rel)
		}
	}
	return out, nil
}

func relative(importPath string) (string, bool) {
	if importPath == module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(importPath, module+"/")
	return rel, ok
}

// graph lists the module's packages (go list) and every import of the
// module's packages by their files, test files included.
func graph(t *testing.T) (pkgs []string, edges []*edge) {
	t.Helper()
	root := repoRoot(t)
	cmd := exec.Command("go", "list",
		"-json=ImportPath,Dir,Imports,TestImports,XTestImports,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles,IgnoredGoFiles",
		"./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	fset := token.NewFileSet()
	byKey := map[[2]string]*edge{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		rel, ok := relative(p.ImportPath)
		if !ok {
			t.Fatalf("go list ./... returned %s, outside %s", p.ImportPath, module)
		}
		pkgs = append(pkgs, rel)
		parsed := map[bool]map[string]bool{false: {}, true: {}}
		groups := []struct {
			files  []string
			test   bool
			listed bool // go list's Imports/TestImports cover these files
		}{
			{p.GoFiles, false, true}, {p.CgoFiles, false, true},
			{p.TestGoFiles, true, true}, {p.XTestGoFiles, true, true},
		}
		// Files left out by build constraints obey the same rules.
		for _, f := range p.IgnoredGoFiles {
			groups = append(groups, struct {
				files  []string
				test   bool
				listed bool
			}{[]string{f}, strings.HasSuffix(f, "_test.go"), false})
		}
		for _, g := range groups {
			for _, f := range g.files {
				imps, err := ownImports(fset, filepath.Join(p.Dir, f))
				if err != nil {
					t.Fatalf("%s: %v", filepath.Join(p.Dir, f), err)
				}
				for _, imp := range imps {
					if g.listed {
						parsed[g.test][imp] = true
					}
					if imp == rel {
						continue // an external test package importing its package
					}
					e := byKey[[2]string{rel, imp}]
					if e == nil {
						e = &edge{importer: rel, imported: imp}
						byKey[[2]string{rel, imp}] = e
						edges = append(edges, e)
					}
					if g.test {
						e.testFiles = append(e.testFiles, f)
					} else {
						e.files = append(e.files, f)
					}
				}
			}
		}
		// The files' import clauses must say what go list says.
		own := func(lists ...[]string) map[string]bool {
			m := map[string]bool{}
			for _, l := range lists {
				for _, imp := range l {
					if r, ok := relative(imp); ok {
						m[r] = true
					}
				}
			}
			return m
		}
		for test, want := range map[bool]map[string]bool{false: own(p.Imports), true: own(p.TestImports, p.XTestImports)} {
			got := parsed[test]
			for k := range got {
				if !want[k] {
					t.Errorf("%s: the files import %s but go list does not say so (test files: %v)", rel, k, test)
				}
			}
			for k := range want {
				if !got[k] {
					t.Errorf("%s: go list says it imports %s but no file does (test files: %v)", rel, k, test)
				}
			}
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed no package")
	}
	openDirs(t, root)
	return pkgs, edges
}

// openDirs opens every directory go list ./... looks into. go test caches a
// passing result keyed on the files and directories the test binary opened,
// and knows nothing of what the go list subprocess read: opening the
// directories here makes a new package or file anywhere in the module a
// reason to run the test again (the parsed files are opened already).
func openDirs(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == root {
			return err
		}
		name := d.Name()
		if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
			path == filepath.Join(root, "bin") {
			return filepath.SkipDir // go list ./... does not look there
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
			return filepath.SkipDir // another module (hack/k8s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func where(e *edge) string {
	var parts []string
	if len(e.files) > 0 {
		parts = append(parts, strings.Join(e.files, ", "))
	}
	if len(e.testFiles) > 0 {
		parts = append(parts, "tests: "+strings.Join(e.testFiles, ", "))
	}
	return strings.Join(parts, "; ")
}

// TestLayering fails on every import of this module's packages that the
// layering forbids (docs/reference/layering.md), naming the importer, the
// imported package, the rule it breaks and the files.
func TestLayering(t *testing.T) {
	pkgs, edges := graph(t)
	for _, p := range pkgs {
		if rowOf(p) == nil {
			t.Errorf("%s has no row in the layering table: give it one in test/layering (an internal package takes a place in the order) and in docs/reference/layering.md", p)
		}
	}
	known := map[[2]string]bool{}
	for _, k := range knownViolations {
		known[[2]string{k.importer, k.imported}] = false
	}
	checked := 0
	for _, e := range edges {
		why := ""
		if len(e.files) > 0 {
			why = check(e.importer, e.imported, false)
		} else {
			why = check(e.importer, e.imported, true)
		}
		checked++
		if why == "" {
			continue
		}
		msg := fmt.Sprintf("%s imports %s: %s [%s]", e.importer, e.imported, why, where(e))
		key := [2]string{e.importer, e.imported}
		if _, ok := known[key]; ok {
			known[key] = true
			t.Logf("known violation, being removed: %s", msg)
			continue
		}
		t.Error(msg)
	}
	for _, k := range knownViolations {
		if !known[[2]string{k.importer, k.imported}] {
			t.Errorf("known violation %s imports %s is gone: remove it from knownViolations in test/layering", k.importer, k.imported)
		}
	}
	t.Logf("%d packages, %d imports between them checked", len(pkgs), checked)
}

// TestCheck pins the rules on edges that do not exist (or not yet), so a
// change to the table that loosens one of them shows here.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		importer, imported string
		test, ok           bool
	}{
		{"api/v1alpha1", "pkg/strictjson", false, false},
		{"api/v1alpha1", "test/kubeapi", true, true},
		{"api/quixos/runtime", "api/quixos/wire", false, true},
		{"pkg/strictjson", "pkg/protocol", false, false},
		{"pkg/protocol", "pkg/strictjson", false, true},
		{"pkg/provider", "internal/catalog", false, false},
		{"pkg/provider", "api/v1alpha1", false, false},
		{"pkg/packageruntime", "api/quixos/runtime", false, true},
		{"pkg/packageruntime", "pkg/protocol", false, false},
		{"internal/reasons", "internal/catalog", false, false},
		{"internal/catalog", "internal/reasons", false, true},
		{"internal/procexec", "internal/pkgruntime", false, false},
		{"internal/pkgruntime", "internal/procexec", false, false},
		{"internal/pkgruntime", "internal/spawn", false, true},
		{"internal/sandbox", "internal/spawn", false, true},
		{"internal/sandbox", "internal/procexec", false, false},
		{"internal/procexec", "internal/sandbox", false, true},
		{"internal/pkgruntime", "internal/sandbox", false, true},
		{"internal/spawn", "internal/sandbox", false, false},
		{"internal/sandbox/launcher", "internal/sandbox", false, true},
		{"internal/procexec/conformance", "internal/procexec", false, true},
		{"internal/procexec/conformance", "internal/ledger", false, false},
		{"internal/hotswap", "internal/procexec/conformance", false, true},
		{"internal/ledger", "internal/hotswap", false, false},
		{"internal/gateway", "internal/fleet", false, true},
		{"internal/gateway", "internal/hotswap", false, false},
		{"internal/gateway", "internal/hotswap", true, true},
		{"internal/gateway", "internal/procexec", false, false},
		{"internal/gateway", "internal/dispatch", false, true},
		{"internal/dispatch", "internal/hotswap", false, false},
		{"internal/dispatch", "internal/hotswap", true, false},
		{"internal/dispatch", "internal/procexec", false, false},
		{"internal/dispatch", "internal/procexec", true, true},
		{"internal/hotswap", "internal/dispatch", false, true},
		{"internal/hotswap", "internal/providers", false, true},
		{"internal/providers", "internal/hotswap", false, false},
		{"internal/providers", "internal/dispatch", false, true},
		{"internal/gateway", "internal/providers", false, false},
		{"internal/gateway", "internal/providers", true, true},
		{"internal/gateway", "api/gateway/v1", false, true},
		{"internal/gateway", "pkg/protocol", false, true},
		{"internal/gateway", "pkg/provider", false, false},
		{"internal/hotswap", "controllers", false, false},
		{"internal/hotswap", "examples/providers/providertest", false, false},
		{"internal/hotswap", "examples/providers/providertest", true, true},
		{"internal/hotswap", "test/operatortest", true, true},
		{"internal/hotswap", "cmd/manager", false, false},
		{"internal/hotswap", "hack/localcluster", true, false},
		{"internal/gateway", "internal/doctor", false, false},
		{"internal/doctor", "internal/gateway", false, true},
		{"cmd/kubectl-iteron", "internal/doctor", false, true},
		{"cmd/kubectl-iteron", "internal/hotswap", false, false},
		{"cmd/kubectl-iteron", "internal/providers", false, false},
		{"cmd/kubectl-iteron", "internal/hotswap", true, true},
		{"cmd/kubectl-iteron", "internal/gateway", false, true},
		{"hack/demo", "internal/doctor", false, false},
		{"test/doctor", "internal/doctor", true, true},
		{"controllers", "internal/procexec", false, false},
		{"controllers", "internal/procexec", true, false},
		{"controllers", "internal/pkgruntime", false, false},
		{"controllers", "internal/ledger", false, false},
		{"controllers", "internal/fleet", false, true},
		{"controllers", "internal/hotswap", false, true},
		{"controllers", "internal/gateway", false, false},
		{"controllers", "test/operatortest", true, true},
		{"cmd/manager", "controllers", false, true},
		{"cmd/kubectl-iteron", "controllers", false, false},
		{"hack/demo", "controllers", false, false},
		{"test/operatortest", "controllers", false, true},
		{"examples/providers/providertest", "controllers", false, false},
		{"cmd/manager", "test/kubeapi", false, false},
		{"cmd/manager", "test/kubeapi", true, true},
		{"examples/providers/stateless", "internal/catalog", false, false},
		{"examples/providers/stateless", "pkg/provider", false, true},
		{"examples/providers/artifacts", "internal/catalog", false, true},
		{"bench/echo", "pkg/provider", false, true},
		{"test/e2e", "hack/localcluster", false, false},
		{"hack/demo", "test/kubeapi", false, true},
	} {
		why := check(c.importer, c.imported, c.test)
		if (why == "") != c.ok {
			t.Errorf("check(%s, %s, test=%v) = %q, want allowed=%v", c.importer, c.imported, c.test, why, c.ok)
		}
	}
}

var update = flag.Bool("update", false, "rewrite the table in docs/reference/layering.md")

const (
	docPath  = "docs/reference/layering.md"
	docBegin = "<!-- BEGIN layering table: rendered by test/layering (go test ./test/layering -run TestLayeringDoc -update) -->\n"
	docEnd   = "<!-- END layering table -->\n"
)

func show(p string) string {
	switch p {
	case "api", "api/quixos", "pkg", "internal", "cmd", "examples", "bench", "hack", "test":
		return "`" + p + "/...`"
	}
	return "`" + p + "`"
}

func showAll(ps []string) string {
	var out []string
	for _, p := range ps {
		out = append(out, show(p))
	}
	return strings.Join(out, ", ")
}

// renderTable renders the table as the Markdown docs/reference/layering.md
// carries.
func renderTable() string {
	var order []string
	for _, line := range internalOrder {
		order = append(order, line...)
	}
	var b strings.Builder
	b.WriteString("| packages | order | may import (non-test files) | imported by |\n|---|---|---|---|\n")
	for _, r := range table {
		rank, imports := "", ""
		switch {
		case r.rank > 0:
			rank = strconv.Itoa(r.rank)
			for _, line := range internalOrder {
				if len(line) > 1 && slices.Contains(line, r.pkgs) {
					rank += ", peer of " + showAll(slices.DeleteFunc(slices.Clone(line), func(p string) bool { return p == r.pkgs }))
				}
			}
			imports = showAll(leaves)
			if r.rank > 1 {
				imports += fmt.Sprintf(", the internal packages of order < %d", r.rank)
			}
		case len(r.imports) == 0:
			imports = "nothing of this module"
		default:
			own := slices.DeleteFunc(slices.Clone(r.imports), func(p string) bool { return p == r.pkgs })
			every := !slices.ContainsFunc(order, func(p string) bool { return !slices.Contains(own, p) })
			if every {
				own = slices.DeleteFunc(own, func(p string) bool { return slices.Contains(order, p) })
			}
			imports = showAll(own)
			if every {
				imports += ", every internal package of the order"
			}
			if len(own) < len(r.imports) && slices.Contains(r.imports, r.pkgs) {
				imports += " (and " + show(r.pkgs) + " itself)"
			}
			if len(own) == 0 {
				imports = show(r.pkgs) + " only"
			}
		}
		if len(r.never) > 0 {
			imports += "; never " + showAll(r.never)
			if r.testsMay {
				imports += " (its tests may)"
			}
		}
		by := "any package whose row allows it"
		if len(r.onlyBy) > 0 {
			by = "only " + showAll(r.onlyBy)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", show(r.pkgs), rank, imports, by)
	}
	return b.String()
}

// TestLayeringDoc keeps docs/reference/layering.md's table equal to table.
func TestLayeringDoc(t *testing.T) {
	path := filepath.Join(repoRoot(t), docPath)
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, docBegin), strings.Index(s, docEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the table markers %q … %q", docPath, docBegin, docEnd)
	}
	want := renderTable()
	if got := s[i+len(docBegin) : j]; got != want {
		if *update {
			if err := os.WriteFile(path, []byte(s[:i+len(docBegin)]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s's table differs from test/layering's: run go test ./test/layering -run TestLayeringDoc -update\nwant:\n%s", docPath, want)
	}
	if !strings.Contains(s, orderText()) {
		t.Errorf("%s does not state the internal order as %q", docPath, orderText())
	}
}
