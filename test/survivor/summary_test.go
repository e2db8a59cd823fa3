package survivor

import (
	"fmt"
	"strings"
	"sync"
)

// summaryRow is one case of the table docs/survivor.md shows.
type summaryRow struct {
	kind        string
	made        int
	failed      int
	retriedOnce string
	lost        string
	pids        string
}

var summary struct {
	sync.Mutex
	rows []summaryRow
}

func recordResult(r summaryRow) {
	summary.Lock()
	summary.rows = append(summary.rows, r)
	summary.Unlock()
}

// printSummary prints the table of the cases that ran, after every test (a
// table is evidence, not a test: it asserts nothing).
func printSummary() {
	summary.Lock()
	defer summary.Unlock()
	if len(summary.rows) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nsurvivor summary:\n| case | calls made | calls failed | retried calls answered once? | state lost | provider pids |\n|---|---|---|---|---|---|\n")
	for _, r := range summary.rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s |\n", r.kind, r.made, r.failed, r.retriedOnce, r.lost, r.pids)
	}
	fmt.Print(b.String())
}
