package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCompareGivesEachMetricsMediansAndTheirRatio(t *testing.T) {
	dir := t.TempDir()
	oldFile, newFile := filepath.Join(dir, "old.txt"), filepath.Join(dir, "new.txt")
	write := func(name, text string) {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(oldFile, "goos: linux\nBenchmarkX-2 10 100 ns/op 5 allocs/op\nBenchmarkX-2 10 120 ns/op 5 allocs/op\nBenchmarkX-2 10 110 ns/op 5 allocs/op\nBenchmarkGone-2 1 3 ms\nPASS\n")
	write(newFile, "BenchmarkX-2 10 99 ns/op 4 allocs/op\nBenchmarkX-2 10 121 ns/op 4 allocs/op\nBenchmarkX-2 10 132 ns/op 4 allocs/op\nBenchmarkNew-2 1 7 ms\n")
	var out strings.Builder
	if err := compare(&out, oldFile, newFile); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ns/op                  old      110.000   new      121.000   new÷old  1.100   p 0.700   (n=3/3)",
		// U = 9 of at most 9, with ties: the normal approximation.
		"allocs/op              old        5.000   new        4.000   new÷old  0.800   p 0.047   (n=3/3)",
		"ms                     old            -   new        7.000   new÷old      -   p     -   (n=0/1)",
		"ms                     old        3.000   new            -   new÷old      -   p     -   (n=1/0)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the comparison lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCompareWithoutResultsSaysSo(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.txt")
	if err := os.WriteFile(empty, []byte("PASS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := compare(&strings.Builder{}, empty, empty)
	if err == nil || !strings.Contains(err.Error(), "no benchmark results in "+empty) {
		t.Errorf("compare of two files without results: %v", err)
	}
	if err := compare(&strings.Builder{}, filepath.Join(t.TempDir(), "absent"), empty); err == nil {
		t.Error("compare of a missing file succeeded")
	}
}

func TestTheRankTestsPValueIsExactWithoutTiesAndApproximatedWithThem(t *testing.T) {
	for _, c := range []struct {
		name string
		x, y []float64
		want float64
	}{
		// Each of the 20 ways to split six ranks into two threes is as
		// likely; the two farthest apart (all low, all high) are 2 of 20.
		{"three all below three", []float64{1, 2, 3}, []float64{4, 5, 6}, 0.1},
		{"three all above three", []float64{14, 15, 16}, []float64{1, 2, 3}, 0.1},
		// 2 of C(10,5) = 252.
		{"five all below five", []float64{1, 2, 3, 4, 5}, []float64{6, 7, 8, 9, 10}, 2.0 / 252},
		{"interleaved", []float64{1, 3, 5, 7}, []float64{2, 4, 6, 8}, 0.686},
		{"the same values", []float64{5, 5, 5}, []float64{5, 5, 5}, 1},
		// Ties: the normal approximation (U = 0, mean 4.5, σ² = 6.5 less
		// the ties' share).
		{"tied groups apart", []float64{1, 1, 2}, []float64{3, 3, 4}, 0.0722},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := mannWhitneyP(c.x, c.y); math.Abs(got-c.want) > 0.001 {
				t.Errorf("p = %.4f, want %.4f", got, c.want)
			}
		})
	}
}
