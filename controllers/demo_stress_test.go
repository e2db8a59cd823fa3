//go:build stress

package controllers_test

// The demo's sequence (hack/demo), repeated under load: not part of make
// test. Run it with
//
//	go test -tags stress -count=1 -timeout 1200s -run TestTheDemoSequenceUnderTwoCPUHogs -v ./controllers/
//
// ITERON_STRESS_RUNS changes the number of runs (default 10).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

// startHogs starts n busy-loop processes this test owns and, at the end of
// the test, kills each by its pid and waits for it.
func startHogs(t *testing.T, n int) []int {
	t.Helper()
	var pids []int
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start a CPU hog: %v", err)
		}
		pids = append(pids, cmd.Process.Pid)
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	return pids
}

func TestTheDemoSequenceUnderTwoCPUHogs(t *testing.T) {
	runs := 10
	if v := os.Getenv("ITERON_STRESS_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("ITERON_STRESS_RUNS=%q", v)
		}
		runs = n
	}
	hogs := startHogs(t, 2)
	t.Logf("two CPU hogs running: pids %v", hogs)
	var report []string
	passed := 0
	for i := 1; i <= runs; i++ {
		start := time.Now()
		var detail string
		ok := t.Run(fmt.Sprintf("run %d", i), func(t *testing.T) { detail = demoOnce(t, i == 1) })
		line := fmt.Sprintf("run %2d/%d: %s in %5.1fs", i, runs, map[bool]string{true: "ok  ", false: "FAIL"}[ok], time.Since(start).Seconds())
		if ok {
			passed++
			line += "  " + detail
		}
		report = append(report, line)
		t.Log(line)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("the demo's sequence under two CPU hogs: %d/%d runs passed (load average now %s)\n%s", passed, runs, strings.TrimSpace(string(load)), strings.Join(report, "\n"))
}

// demoOnce is hack/demo's sequence through the API: apply an activation of
// prompt_system and context_assembly (counter v1), wait Ready, call
// prompt_system three times, apply counter v2 to prompt_system (a hot swap
// that reloads context_assembly too), wait Ready, call it (the state
// migrated), list the Generations, delete the activation. Every Ready
// status is checked against the Generations at its resourceVersion.
func demoOnce(t *testing.T, show bool) string {
	act := newActivation(t, "stack", nil,
		source(t, artifacts.CounterV1, "prompt_system", "counter-v1"),
		source(t, artifacts.CounterV1, "context_assembly", "counter-v1-ctx"),
	)
	rw := watchReady(t, act)
	t0 := time.Now()
	first := rw.waitFirstReady(t, 1)
	readyIn := time.Since(t0)
	got := waitFor(t, act, "Ready", ready)
	for _, in := range []struct {
		key string
		add int
	}{{"alpha", 2}, {"beta", 5}, {"alpha", 1}} {
		count(t, got, "prompt_system", in.key, in.add)
	}

	v2 := source(t, artifacts.CounterV2, "prompt_system", "counter-v2")
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = v2 })
	t1 := time.Now()
	swapped := rw.waitFirstReady(t, 2)
	swapIn := time.Since(t1)
	for _, ms := range swapped.modules {
		if ms.Generation != 2 || ms.Phase != iteronv1.PhaseActive {
			t.Fatalf("first Ready after the swap shows module %+v; want every module Active at lineage 2", ms)
		}
	}
	got = waitFor(t, act, "Ready after the swap", ready)
	out, by := count(t, got, "prompt_system", "alpha", 1)
	if out["count"] != float64(4) || out["implementation_version"] != "2.0.0" {
		t.Fatalf("after the swap %s answered %v; want alpha=4 from 2.0.0 (the migrated state)", by, out)
	}

	// kubectl get generations, as the demo shows them.
	table, err := exec.Command(env.KubectlPath(), "--kubeconfig", kubeconfig, "get", "generations", "-n", act.Namespace,
		"-l", iteronv1.LabelActivation+"="+act.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get generations: %v\n%s", err, table)
	}
	if show {
		t.Logf("kubectl get generations -l %s=%s:\n%s", iteronv1.LabelActivation, act.Name, table)
	}
	var list iteronv1.GenerationList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(act.Namespace), client.MatchingLabels{iteronv1.LabelActivation: act.Name}); err != nil {
		t.Fatal(err)
	}
	var gens []string
	for _, g := range list.Items {
		gens = append(gens, fmt.Sprintf("%s %s/%s", g.Name, g.Status.Phase, g.Status.Step))
	}
	slices.Sort(gens)
	want := []string{
		act.Name + "-context-assembly-g1-1 Inactive/drain", act.Name + "-context-assembly-g2-1 Active/committed",
		act.Name + "-prompt-system-g1-1 Inactive/drain", act.Name + "-prompt-system-g2-1 Active/committed",
	}
	if !slices.Equal(gens, want) {
		t.Fatalf("Generations after the demo's sequence:\n  %s\nwant exactly\n  %s\n(kubectl:\n%s)", strings.Join(gens, "\n  "), strings.Join(want, "\n  "), table)
	}
	checked := rw.agreed(t)
	deleteAndWait(t, act)
	return fmt.Sprintf("Ready in %4.1fs (rv %s), swap Ready in %4.1fs (rv %s), 4 Generations as expected, %d Ready statuses agreed",
		readyIn.Seconds(), first.resourceVersion, swapIn.Seconds(), swapped.resourceVersion, checked)
}
