// Command benchmed reads `go test -bench` output on stdin and prints, for
// each benchmark, the median of each reported metric over its runs
// (-count=N), so that results are medians over several runs. It copies its
// input to stderr as it reads it, so the runs themselves are seen as they
// come: through the file descriptor it inherits, unlike a `tee /dev/stderr`
// in front of it, which opens the file again and, when stderr is a file
// (`make bench-activation > log 2>&1`), truncates what came before.
//
//	go test -run='^$' -bench . -count 5 ./bench/ | go run ./bench/benchmed
//
// With -old and -new it compares two files of such output instead (the
// runs of one commit and of another, as bench/sidebyside.sh writes them):
// each metric's median in both, new ÷ old, and the two-sided p-value of a
// Mann–Whitney U test over the runs (the chance that runs of one and the
// same code differ at least this much by their order alone: a ratio whose p
// is above 0.05 is not told apart from the runs' noise).
//
//	go run ./bench/benchmed -old old.txt -new new.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// metric is one figure a benchmark reports: its name and its unit.
type metric struct{ bench, unit string }

// runs are the values of each metric, in the order first seen.
type runs struct {
	values map[metric][]float64
	order  []metric
}

// read collects the metrics of `go test -bench` output, copying each line
// to echo when it is not nil.
func read(r io.Reader, echo io.Writer) (*runs, error) {
	rs := &runs{values: map[metric][]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if echo != nil {
			fmt.Fprintln(echo, sc.Text())
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		// name, iterations, then value-unit pairs.
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			k := metric{f[0], f[i+1]}
			if _, ok := rs.values[k]; !ok {
				rs.order = append(rs.order, k)
			}
			rs.values[k] = append(rs.values[k], v)
		}
	}
	return rs, sc.Err()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// medianCell is v's median as a table cell, "-" for no values.
func medianCell(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return strconv.FormatFloat(median(v), 'f', 3, 64)
}

func readFile(name string) (*runs, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rs, err := read(f, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return rs, nil
}

func main() {
	oldFile := flag.String("old", "", "compare: the old commit's `go test -bench` output")
	newFile := flag.String("new", "", "compare: the new commit's `go test -bench` output")
	flag.Parse()
	if (*oldFile == "") != (*newFile == "") {
		fmt.Fprintln(os.Stderr, "benchmed: -old and -new go together")
		os.Exit(2)
	}
	if *oldFile != "" {
		if err := compare(os.Stdout, *oldFile, *newFile); err != nil {
			fmt.Fprintln(os.Stderr, "benchmed:", err)
			os.Exit(1)
		}
		return
	}
	rs, err := read(os.Stdin, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmed:", err)
		os.Exit(1)
	}
	last := ""
	for _, k := range rs.order {
		if k.bench != last {
			fmt.Println(k.bench)
			last = k.bench
		}
		v := slices.Clone(rs.values[k])
		slices.Sort(v)
		fmt.Printf("  %-18s median %10.3f   (n=%d, min %.3f, max %.3f)\n", k.unit, v[len(v)/2], len(v), v[0], v[len(v)-1])
	}
}

// compare prints, for each metric of the new runs, the median of the old
// runs and of the new ones and new ÷ old; a metric only one side reports
// is listed with "-" for the other.
func compare(w io.Writer, oldFile, newFile string) error {
	old, err := readFile(oldFile)
	if err != nil {
		return err
	}
	cur, err := readFile(newFile)
	if err != nil {
		return err
	}
	order := slices.Clone(cur.order)
	for _, k := range old.order {
		if _, ok := cur.values[k]; !ok {
			order = append(order, k)
		}
	}
	if len(order) == 0 {
		return fmt.Errorf("no benchmark results in %s or %s", oldFile, newFile)
	}
	last := ""
	for _, k := range order {
		if k.bench != last {
			fmt.Fprintln(w, k.bench)
			last = k.bench
		}
		o, n := old.values[k], cur.values[k]
		ratio, p := "-", "-"
		if len(o) > 0 && len(n) > 0 && median(o) != 0 {
			ratio = strconv.FormatFloat(median(n)/median(o), 'f', 3, 64)
		}
		if len(o) > 0 && len(n) > 0 {
			p = strconv.FormatFloat(mannWhitneyP(o, n), 'f', 3, 64)
		}
		fmt.Fprintf(w, "  %-22s old %12s   new %12s   new÷old %6s   p %5s   (n=%d/%d)\n", k.unit, medianCell(o), medianCell(n), ratio, p, len(o), len(n))
	}
	return nil
}

// mannWhitneyP is the two-sided p-value of the Mann–Whitney U test of x
// against y: exact (every way of splitting the ranks into groups of len(x)
// and len(y) counted) when no two values tie, else the normal
// approximation with its correction for ties and for continuity. Runs of
// a benchmark are not normally distributed (a run on a busy machine is far
// slower, never far faster), which a rank test does not assume.
func mannWhitneyP(x, y []float64) float64 {
	n1, n2 := len(x), len(y)
	all := make([]float64, 0, n1+n2)
	all = append(append(all, x...), y...)
	slices.Sort(all)
	// One pass over the sorted values: each value's rank (1-based, tied
	// values given their mean rank) and the ties' share of the variance.
	rank := map[float64]float64{}
	tieTerm := 0.0
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j] == all[i] {
			j++
		}
		rank[all[i]] = float64(i+1+j) / 2
		t := float64(j - i)
		tieTerm += t*t*t - t
		i = j
	}
	var r1 float64
	for _, v := range x {
		r1 += rank[v]
	}
	u := r1 - float64(n1*(n1+1))/2
	if tieTerm == 0 && n1+n2 <= 100 {
		return exactUP(n1, n2, int(math.Round(u)))
	}
	nn := float64(n1 + n2)
	mu := float64(n1*n2) / 2
	sigma := math.Sqrt(float64(n1*n2) / 12 * ((nn + 1) - tieTerm/(nn*(nn-1))))
	if sigma == 0 {
		return 1
	}
	z := (math.Abs(u-mu) - 0.5) / sigma
	return min(1, math.Erfc(max(z, 0)/math.Sqrt2))
}

// exactUP is the two-sided p-value of U = u for groups of n1 and n2 values
// without ties: the share of the C(n1+n2, n1) splittings whose U is at
// least as far from its mean, counted by the number of ways to pick k of
// the first m ranks with a given sum.
func exactUP(n1, n2, u int) float64 {
	n := n1 + n2
	maxSum := n * (n + 1) / 2
	// ways[k][s]: the ways to pick k of the ranks seen so far summing to s.
	ways := make([][]float64, n1+1)
	for k := range ways {
		ways[k] = make([]float64, maxSum+1)
	}
	ways[0][0] = 1
	for r := 1; r <= n; r++ {
		for k := min(r, n1); k >= 1; k-- {
			for s := maxSum; s >= r; s-- {
				ways[k][s] += ways[k-1][s-r]
			}
		}
	}
	base := n1 * (n1 + 1) / 2 // U = rank sum − base
	var total, low, high float64
	for s, w := range ways[n1] {
		if w == 0 {
			continue
		}
		total += w
		if s-base <= u {
			low += w
		}
		if s-base >= u {
			high += w
		}
	}
	return min(1, 2*min(low, high)/total)
}
