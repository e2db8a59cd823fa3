package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

const testNode = "lifecycle-node"

var (
	env        *kubeapi.Environment
	stateDir   string
	cliBin     string
	kubeconfig string
)

// entry is a module of the suite's seam graph file (schema version 3).
func entry(module string, deps ...any) map[string]any {
	if deps == nil {
		deps = []any{}
	}
	raw, _ := json.Marshal(protocol.BuiltinContracts(module))
	var contracts map[string]any
	_ = json.Unmarshal(raw, &contracts)
	return map[string]any{"module": module, "dependencies": deps, "contracts": contracts,
		"failure_semantics": catalog.FailureSemantics(), "host_invariants": catalog.HostInvariants()}
}

// graphFile is the node's custom seam graph: planner requires store in
// [1.2.0, 2.0.0) and, optionally, memo ≥ 1.0.0; search_fast and
// search_exact both provide acme/search@v1, which ranker requires without
// a selection and picker with search_exact selected; swapper stands alone
// for the hot swap.
func graphFile() []byte {
	fast, exact := entry("search_fast"), entry("search_exact")
	fast["provides"] = []any{map[string]any{"id": "acme/search@v1", "version": 1}}
	exact["provides"] = []any{map[string]any{"id": "acme/search@v1", "version": 1}}
	modules := []any{
		entry("store"), entry("memo"), fast, exact,
		entry("planner",
			map[string]any{"module": "store", "version_range": map[string]any{"minimum": []int{1, 2, 0}, "maximum": []int{2, 0, 0}}},
			map[string]any{"module": "memo", "optional": true, "version_range": map[string]any{"minimum": []int{1, 0, 0}}}),
		entry("ranker", map[string]any{"contract": "acme/search@v1"}),
		entry("picker", map[string]any{"contract": "acme/search@v1", "select": "search_exact"}),
		entry("swapper"),
	}
	b, err := json.MarshalIndent(map[string]any{"schema_version": 3, "modules": modules}, "", " ")
	if err != nil {
		panic(err)
	}
	return b
}

// gates hold a transaction at a phase: "<ns>/<activation>/<module>/<phase>"
// → a function that returns once the test has seen what it waits for.
var gates sync.Map

func holdAt(ns, activation, module, phase string, wait func()) {
	gates.Store(ns+"/"+activation+"/"+module+"/"+phase, wait)
}

func afterPhase(key hotswap.ActivationKey, module, phase string) {
	if w, ok := gates.LoadAndDelete(key.Namespace + "/" + key.Name + "/" + module + "/" + phase); ok {
		w.(func())()
	}
}

// table collects the requirement cases as the real manager showed them;
// TestMain prints it after the tests.
var (
	tableMu sync.Mutex
	table   [][4]string
)

func addRow(c, phase, reason, detail string) {
	tableMu.Lock()
	table = append(table, [4]string{c, phase, reason, detail})
	tableMu.Unlock()
}

func printTable() {
	tableMu.Lock()
	defer tableMu.Unlock()
	if len(table) == 0 {
		return
	}
	fmt.Println("\nTyped requirements against the real API server and manager (custom seam graph, schema version 3):")
	fmt.Println("| case | module phase | reason | message / diagnostic |")
	fmt.Println("|---|---|---|---|")
	for _, r := range table {
		fmt.Printf("| %s | %s | %s | %s |\n", r[0], r[1], orDash(r[2]), strings.ReplaceAll(orDash(r[3]), "|", "\\|"))
	}
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func TestMain(m *testing.M) {
	g, err := catalog.ParseSeamGraph(graphFile())
	if err != nil {
		fmt.Fprintln(os.Stderr, "the suite's seam graph:", err)
		os.Exit(1)
	}
	code := operatortest.RunWith(m, "lifecycle", testNode, func(o *operatortest.Options) {
		o.Graph, o.AfterPhase = g, afterPhase
	}, func(s *operatortest.Suite) {
		env, stateDir, cliBin, kubeconfig = s.Env, s.StateDir, s.CLI, s.Kubeconfig
	})
	printTable()
	os.Exit(code)
}

// gateTimeout bounds how long a gate holds a transaction: past it the
// transaction goes on and the test's assertion says what was not seen.
const gateTimeout = 60 * time.Second
