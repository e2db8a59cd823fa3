package counter

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/provider"
)

func state(t *testing.T, gen uint64, raw string) *protocol.State {
	t.Helper()
	s := &protocol.State{Module: "m", ImplementationID: "x", RunID: "lineage-m", Generation: gen, StateSchema: protocol.BuiltinContracts("m").Snapshot, State: jsontext.Value(raw)}
	d, err := protocol.StateDigest(s.State)
	if err != nil {
		t.Fatal(err)
	}
	s.StateSHA256 = d
	return s
}

func TestV2MigratesV1StateRebuildingTheCountsOfItsHistory(t *testing.T) {
	v1 := `{"counts":{"a":3,"b":5},"history":[{"add":1,"key":"a"},{"add":2,"key":"a"},{"add":5,"key":"b"}],"total":8}`
	got, err := New(2, "2.0.0").Migrate(context.Background(), state(t, 1, v1), provider.Lineage{Generation: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"keys":[{"count":3,"key":"a"},{"count":5,"key":"b"}],"layout":2,"recent":[{"add":1,"count":1,"key":"a"},{"add":2,"count":3,"key":"a"},{"add":5,"count":5,"key":"b"}],"runs":3,"total":8}`
	if string(got) != want {
		t.Fatalf("migrated\n got %s\nwant %s", got, want)
	}
}

func TestEachVersionMigratesItsOwnLayoutAndV1RefusesV2(t *testing.T) {
	v2 := `{"keys":[{"count":1,"key":"a"}],"layout":2,"recent":[],"runs":1,"total":1}`
	if got, err := New(2, "2.0.0").Migrate(context.Background(), state(t, 4, v2), provider.Lineage{Generation: 5}); err != nil || string(got) != v2 {
		t.Fatalf("v2 migrating its own state: %s, %v", got, err)
	}
	v1 := `{"counts":{"a":1},"history":[],"total":1}`
	if got, err := New(1, "1.0.0").Migrate(context.Background(), state(t, 4, v1), provider.Lineage{Generation: 5}); err != nil || string(got) != v1 {
		t.Fatalf("v1 migrating its own state: %s, %v", got, err)
	}
	_, err := New(1, "1.0.0").Migrate(context.Background(), state(t, 4, v2), provider.Lineage{Generation: 5})
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Code != "unsupported_layout" {
		t.Fatalf("v1 migrating v2 state: %v", err)
	}
	if err := New(2, "2.0.0").Restore(context.Background(), state(t, 4, v1)); !errors.As(err, &pe) || pe.Code != "unsupported_layout" {
		t.Fatalf("v2 restoring v1 state without migrating: %v", err)
	}
}

func TestReadinessProvesTheRestoredStateAndNothingElse(t *testing.T) {
	c := New(2, "2.0.0")
	s := state(t, 3, `{"keys":[{"count":2,"key":"k"}],"layout":2,"recent":[],"runs":2,"total":2}`)
	if err := c.Restore(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if err := c.Readiness(context.Background(), provider.Lineage{Generation: 3}, s.StateSHA256); err != nil {
		t.Fatalf("readiness for the restored state: %v", err)
	}
	other := state(t, 3, `{}`)
	if err := c.Readiness(context.Background(), provider.Lineage{Generation: 3}, other.StateSHA256); err == nil {
		t.Fatal("readiness for another digest succeeded")
	}
	if err := c.Readiness(context.Background(), provider.Lineage{Generation: 4}, s.StateSHA256); err == nil {
		t.Fatal("readiness for another lineage succeeded")
	}
}

func TestObservationSizeIsTheSizeOfTheObservation(t *testing.T) {
	for _, pad := range []int{0, 1, 1000} {
		o := observation("2.0.0", "key", 12, 345, pad)
		if ObservationSize("2.0.0", "key", 12, 345, pad) != len(o) || !jsontext.Value(o).IsValid() {
			t.Fatalf("pad %d: %s", pad, o)
		}
		if pad > 0 && !strings.Contains(string(o), `"pad":"x`) {
			t.Fatalf("pad %d: %s", pad, o)
		}
	}
}

func TestV1Point1MigratesV2StateDownKeepingTheCounts(t *testing.T) {
	v2 := `{"keys":[{"count":3,"key":"a"},{"count":5,"key":"b"}],"layout":2,"recent":[{"add":1,"count":1,"key":"a"},{"add":2,"count":3,"key":"a"},{"add":5,"count":5,"key":"b"}],"runs":3,"total":8}`
	down := NewWithDownMigration("1.1.0")
	got, err := down.Migrate(context.Background(), state(t, 4, v2), provider.Lineage{Generation: 5})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"counts":{"a":3,"b":5},"history":[{"add":1,"key":"a"},{"add":2,"key":"a"},{"add":5,"key":"b"}],"total":8}`
	if string(got) != want {
		t.Fatalf("migrated down\n got %s\nwant %s", got, want)
	}
	// Its own layout too, and it restores only its own layout.
	if again, err := down.Migrate(context.Background(), state(t, 5, want), provider.Lineage{Generation: 6}); err != nil || string(again) != want {
		t.Fatalf("v1.1 migrating its own state: %s, %v", again, err)
	}
	var pe *provider.Error
	if err := down.Restore(context.Background(), state(t, 5, v2)); !errors.As(err, &pe) || pe.Code != "unsupported_layout" {
		t.Fatalf("v1.1 restoring v2 state without migrating: %v", err)
	}
	if err := down.Restore(context.Background(), state(t, 5, want)); err != nil {
		t.Fatal(err)
	}
	// And up again: v2 reads what v1.1 wrote, counts intact.
	up, err := New(2, "2.0.0").Migrate(context.Background(), state(t, 5, want), provider.Lineage{Generation: 6})
	if err != nil || !strings.Contains(string(up), `{"count":3,"key":"a"},{"count":5,"key":"b"}`) {
		t.Fatalf("v2 migrating v1.1's state: %s, %v", up, err)
	}
}
