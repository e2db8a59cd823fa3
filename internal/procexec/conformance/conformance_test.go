package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/verifier"
)

func TestMain(m *testing.M) { providertest.Main(m) }

func plan(t *testing.T, name string, argv ...string) verifier.LaunchPlan {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: name, Argv: argv})
	return providertest.Plan(t, impl, func(f *verifier.LaunchPlanFields) {
		f.CancellationDeadline = time.Second
		f.RuntimeDeadline = time.Minute
	})
}

func TestTheExampleProvidersAreConformant(t *testing.T) {
	ex, err := procexec.NewExecutor(procexec.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		steps int
	}{
		{artifacts.CounterV1, 8},
		{artifacts.CounterV2, 8},
		{artifacts.Faulty, 8}, // no fault armed: counter v2
		{artifacts.Stateless, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Run(context.Background(), ex, plan(t, tc.name), Options{Timeout: time.Second, Input: []byte(`{"key":"a","add":1,"text":"x"}`)})
			if !rep.Conformant() || len(rep.Steps) != tc.steps || !rep.Exit.Success() {
				t.Fatalf("steps %+v\nviolations %+v\nexit %v", rep.Steps, rep.Violations, rep.Exit)
			}
		})
	}
}

func TestEveryFaultyModeIsFlagged(t *testing.T) {
	ex, err := procexec.NewExecutor(procexec.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		argv []string
		op   string
		kind string
	}{
		{[]string{"--fault", "crash", "--at", "load"}, "load", "exited"},
		{[]string{"--fault", "hang", "--at", "start"}, "start", "timeout"},
		{[]string{"--fault", "hang", "--at", "cancel"}, "cancel", "timeout"},
		{[]string{"--fault", "malformed", "--at", "snapshot"}, "snapshot", "malformed frame"},
		{[]string{"--fault", "oversized", "--at", "migrate"}, "migrate", "oversized"},
		{[]string{"--fault", "miscorrelate", "--at", "restore"}, "restore", "mis-correlation"},
		{[]string{"--fault", "wrong-schema", "--at", "start"}, "start", "wrong schema"},
		{[]string{"--fault", "wrong-schema", "--at", "readiness"}, "readiness", "wrong schema"},
		{[]string{"--fault", "wrong-run", "--at", "start"}, "start", "wrong run"},
		{[]string{"--fault", "sequence-regression", "--at", "start"}, "start", "sequence regression"},
		{[]string{"--fault", "exit", "--at", "stop"}, "stop", "non-zero exit"},
		{[]string{"--fault", "stderr-flood", "--at", "load"}, "stderr", "stderr overflow"},
		{[]string{"--fault", "fork-grandchild", "--at", "load"}, "stop", "process left behind"},
		{[]string{"--fault", "escape", "--at", "load"}, "stop", "process left behind"},
	} {
		t.Run(strings.Join(tc.argv[1:], " "), func(t *testing.T) {
			rep := Run(context.Background(), ex, plan(t, artifacts.Faulty, tc.argv...), Options{Timeout: 500 * time.Millisecond, Input: []byte(`{"key":"a","add":1}`)})
			if rep.Conformant() {
				t.Fatalf("not flagged: steps %+v", rep.Steps)
			}
			v := rep.Violations[0]
			if v.Op != tc.op || v.Kind != tc.kind {
				t.Fatalf("violation %+v, want %s during %s (all: %+v)", v, tc.kind, tc.op, rep.Violations)
			}
		})
	}
}
