package main

import (
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
		"ns/op                  old      110.000   new      121.000   new÷old  1.100   (n=3/3)",
		"allocs/op              old        5.000   new        4.000   new÷old  0.800   (n=3/3)",
		"ms                     old            -   new        7.000   new÷old      -   (n=0/1)",
		"ms                     old        3.000   new            -   new÷old      -   (n=1/0)",
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
