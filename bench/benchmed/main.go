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
// each metric's median in both and new ÷ old.
//
//	go run ./bench/benchmed -old old.txt -new new.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
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
		ratio := "-"
		if len(o) > 0 && len(n) > 0 && median(o) != 0 {
			ratio = strconv.FormatFloat(median(n)/median(o), 'f', 3, 64)
		}
		fmt.Fprintf(w, "  %-22s old %12s   new %12s   new÷old %6s   (n=%d/%d)\n", k.unit, medianCell(o), medianCell(n), ratio, len(o), len(n))
	}
	return nil
}
