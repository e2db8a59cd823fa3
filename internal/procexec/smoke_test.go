package procexec

import (
	"context"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
)

func TestMain(m *testing.M) { providertest.Main(m) }

func TestSmoke(t *testing.T) {
	ex, err := NewExecutor(DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2})
	p, err := ex.Launch(providertest.Plan(t, impl))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Now()
	if _, err := p.Load(ctx); err != nil {
		t.Fatal(err)
	}
	t.Log("load", time.Since(t0))
	run, err := p.Start(ctx, "run-1", []byte(`{"key":"a","add":2}`), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	o, err := run.Wait(ctx)
	t.Logf("%s %v", o.Observation, err)
	st, err := p.Snapshot(ctx, 1, time.Second)
	t.Logf("%s %s %v", st.State, st.StateSHA256, err)
	if err := p.Stop(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v stderr=%q", p.Teardown(), p.StderrTail())
}
