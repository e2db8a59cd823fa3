// Command benchmed reads `go test -bench` output on stdin and prints, for
// each benchmark, the median of each reported metric over its runs
// (-count=N), so that results are medians over several runs. It copies its
// input to stderr as it reads it, so the runs themselves are seen as they
// come: through the file descriptor it inherits, unlike a `tee /dev/stderr`
// in front of it, which opens the file again and, when stderr is a file
// (`make bench-activation > log 2>&1`), truncates what came before.
//
//	go test -run='^$' -bench . -count 5 ./bench/ | go run ./bench/benchmed
package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	type key struct{ bench, unit string }
	values := map[key][]float64{}
	var order []key
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		fmt.Fprintln(os.Stderr, sc.Text())
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
			k := key{f[0], f[i+1]}
			if _, ok := values[k]; !ok {
				order = append(order, k)
			}
			values[k] = append(values[k], v)
		}
	}
	last := ""
	for _, k := range order {
		if k.bench != last {
			fmt.Println(k.bench)
			last = k.bench
		}
		v := slices.Clone(values[k])
		slices.Sort(v)
		fmt.Printf("  %-18s median %10.3f   (n=%d, min %.3f, max %.3f)\n", k.unit, v[len(v)/2], len(v), v[0], v[len(v)-1])
	}
}
