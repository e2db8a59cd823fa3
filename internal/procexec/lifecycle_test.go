package procexec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

type counted struct {
	Version string `json:"implementation_version"`
	Key     string `json:"key"`
	Count   int64  `json:"count"`
	Total   int64  `json:"total"`
}

// runCounter starts one counter run and returns its observations.
func runCounter(t *testing.T, p *Process, runID, input string) ([]protocol.Observation, counted) {
	t.Helper()
	run, err := p.Start(ctx(t), runID, []byte(input), 5*time.Second)
	if err != nil {
		t.Fatalf("Start(%s): %v", input, err)
	}
	var obs []protocol.Observation
	for o := range run.Observations() {
		obs = append(obs, o)
	}
	last, err := run.Result()
	if err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
	var c counted
	if err := json.Unmarshal(last.Observation, &c); err != nil {
		t.Fatalf("terminal observation %s: %v", last.Observation, err)
	}
	return obs, c
}

func TestAFullProtocol2LifecycleMovesCounterStateFromV1ToV2(t *testing.T) {
	ex := newExecutor(t)
	contracts := protocol.BuiltinContracts("prompt_system")

	// The old generation: counter v1 serves three runs.
	v1 := loaded(t, ex, providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	if _, c := runCounter(t, v1, "run-1", `{"key":"a","add":1}`); c != (counted{"1.0.0", "a", 1, 1}) {
		t.Fatalf("first run observed %+v", c)
	}
	obs, c := runCounter(t, v1, "run-2", `{"key":"a","add":2,"progress":2}`)
	if c != (counted{"1.0.0", "a", 3, 3}) {
		t.Fatalf("second run observed %+v", c)
	}
	if len(obs) != 3 || obs[0].Terminal || obs[1].Terminal || !obs[2].Terminal || obs[0].Sequence >= obs[1].Sequence || obs[1].Sequence >= obs[2].Sequence {
		t.Fatalf("observations of a run with progress: %+v", obs)
	}
	for _, o := range obs {
		if o.RunID != "run-2" || o.Schema != contracts.Observation || o.ImplementationID != "counter-v1" {
			t.Fatalf("observation %+v does not carry the run, schema and implementation", o)
		}
	}
	if _, c := runCounter(t, v1, "run-3", `{"key":"b","add":5}`); c.Total != 8 {
		t.Fatalf("third run observed %+v", c)
	}

	// Snapshot the old generation at lineage 1.
	snap, err := v1.Snapshot(ctx(t), 1, time.Second)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if snap.ImplementationID != "counter-v1" || snap.Generation != 1 || snap.RunID != "lineage-prompt_system" || snap.StateSchema != contracts.Snapshot {
		t.Fatalf("snapshot identity: %+v", snap)
	}
	if want, _ := strictjson.DigestOfValue(snap.State); snap.StateSHA256 != want {
		t.Fatalf("snapshot digest %s, the state's canonical digest is %s", snap.StateSHA256, want)
	}
	if !strings.Contains(string(snap.State), `"counts":{"a":3,"b":5}`) {
		t.Fatalf("v1 state layout: %s", snap.State)
	}

	// The new generation: counter v2 migrates the v1 state to lineage 2.
	v2 := loaded(t, ex, providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	migrated, err := v2.Migrate(ctx(t), snap, time.Second)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if migrated.ImplementationID != "counter-v2" || migrated.Generation != 2 || migrated.StateSchema != contracts.Snapshot {
		t.Fatalf("migrated identity: %+v", migrated)
	}
	if !strings.Contains(string(migrated.State), `"keys":[{"count":3,"key":"a"},{"count":5,"key":"b"}],"layout":2`) {
		t.Fatalf("v2 state layout: %s", migrated.State)
	}
	restored, err := v2.Restore(ctx(t), migrated, time.Second)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if restored.Generation != 2 || restored.StateSHA256 != migrated.StateSHA256 {
		t.Fatalf("restored %+v, want lineage 2 and %s", restored, migrated.StateSHA256)
	}
	ready, err := v2.Readiness(ctx(t), 2, migrated.StateSHA256, time.Second)
	if err != nil {
		t.Fatalf("Readiness: %v", err)
	}
	if ready.StateSHA256 != migrated.StateSHA256 {
		t.Fatalf("ready %+v", ready)
	}

	// The new generation serves from the migrated state.
	if _, c := runCounter(t, v2, "run-4", `{"key":"a","add":1}`); c != (counted{"2.0.0", "a", 4, 9}) {
		t.Fatalf("run on the new generation observed %+v", c)
	}

	// Drain: both stop cleanly and leave nothing behind.
	for _, p := range []*Process{v1, v2} {
		if err := p.Stop(ctx(t), "drain"); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		td := p.Teardown()
		if !td.Exit.Success() || len(td.LeftBehind) > 0 || len(td.Unreaped) > 0 {
			t.Fatalf("teardown after stop: %+v", td)
		}
		if left := alive(p.Pgid(), p.Pid()); len(left) > 0 {
			t.Fatalf("provider %d still exists after Stop", p.Pid())
		}
		if err := p.Err(); err != nil {
			t.Fatalf("Err after a clean stop: %v", err)
		}
		if _, err := p.Start(ctx(t), "late", []byte(`{}`), time.Second); !errors.Is(err, ErrClosed) {
			t.Fatalf("Start after Stop: %v, want ErrClosed", err)
		}
	}
}

func TestACancelledRunEndsWithErrRunCancelledAndTheProcessServesOn(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	run, err := p.Start(ctx(t), "slow", []byte(`{"key":"a","add":1,"sleep_ms":10000}`), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Cancel(ctx(t), "slow", "test"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if _, err := run.Result(); !errors.Is(err, ErrRunCancelled) {
		t.Fatalf("cancelled run ended with %v", err)
	}
	// The cancelled run counted nothing; the next one sees a fresh counter.
	if _, c := runCounter(t, p, "next", `{"key":"a","add":1}`); c.Count != 1 {
		t.Fatalf("run after a cancel observed %+v", c)
	}
	// Cancelling a run that has already ended is answered, not a fault.
	if err := p.Cancel(ctx(t), "next", "late"); err != nil {
		t.Fatalf("Cancel of a finished run: %v", err)
	}
}

func TestOneRunAtATimeAndNoStateOperationDuringARun(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	if _, err := p.Start(ctx(t), "slow", []byte(`{"key":"a","add":1,"sleep_ms":10000}`), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start(ctx(t), "second", []byte(`{"key":"a","add":1}`), time.Second); faultKind(err) != KindRefused {
		t.Fatalf("a second Start during a run: %v, want a refusal", err)
	}
	if _, err := p.Snapshot(ctx(t), 1, time.Second); faultKind(err) != KindRefused {
		t.Fatalf("Snapshot during a run: %v, want a refusal", err)
	}
	if err := p.Cancel(ctx(t), "slow", "test"); err != nil {
		t.Fatalf("Cancel: %v (the refusals must leave the process usable)", err)
	}
}

func faultKind(err error) FaultKind {
	if f, ok := AsFault(err); ok {
		return f.Kind
	}
	return 0
}

func TestAProtocol1ProviderIsRefusedEveryStateOperation(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.Stateless))
	snap := protocol.State{Module: "prompt_system", ImplementationID: "stateless", RunID: "lineage-prompt_system",
		Generation: 1, StateSchema: protocol.BuiltinContracts("prompt_system").Snapshot, State: []byte(`{}`)}
	snap.StateSHA256, _ = strictjson.DigestOfValue(snap.State)
	ops := []struct {
		name string
		call func() error
	}{
		{"snapshot", func() error { _, err := p.Snapshot(ctx(t), 1, time.Second); return err }},
		{"migrate", func() error { _, err := p.Migrate(ctx(t), snap, time.Second); return err }},
		{"restore", func() error { _, err := p.Restore(ctx(t), snap, time.Second); return err }},
		{"readiness", func() error { _, err := p.Readiness(ctx(t), 1, snap.StateSHA256, time.Second); return err }},
	}
	for _, op := range ops {
		t.Run(op.name+" is refused as unsupported_version", func(t *testing.T) {
			err := op.call()
			f, ok := AsFault(err)
			if !ok || f.Kind != KindRefused || f.ReasonCode() != reasons.UnsupportedVersion || f.Op != op.name {
				t.Fatalf("%s on a protocol-1 provider: %v", op.name, err)
			}
		})
	}
	// Nothing was written: the provider still serves.
	run, err := p.Start(ctx(t), "after", []byte(`{"text":"ok"}`), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := run.Result(); err != nil || string(o.Observation) != `{"length":2,"upper":"OK"}` {
		t.Fatalf("run after the refusals: %s, %v", o.Observation, err)
	}
}
