package survivor

import (
	"testing"
	"time"
)

func TestTheOutcomeTableKeepsOneRecordPerInvocation(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tab := newOutcomeTable(func() time.Time { return now })
	inv := func(ns, id string) *Invocation {
		return &Invocation{Namespace: ns, InvocationID: id, Activation: "a", Module: "m"}
	}

	tab.begin("gw-1-1", inv("team-a", "call-1"))
	tab.begin("gw-1-2", inv("team-b", "call-1")) // the same ID in another namespace is another invocation
	if unacked, acked, active := tab.counts(); unacked != 0 || acked != 0 || active != 2 {
		t.Fatalf("counts %d/%d/%d; want 2 active", unacked, acked, active)
	}
	o, dropped := tab.end("gw-1-1", inv("team-a", "call-1"), 3, []byte(`{"n":1}`), nil)
	if !o.Done || o.RunID != "gw-1-1" || o.Call.Namespace != "team-a" || len(dropped) != 0 {
		t.Fatalf("ended outcome %+v, dropped %v", o, dropped)
	}
	// Acknowledged by its run ID, as the manager names it.
	tab.ack([]string{"gw-1-1", "unknown-run"})
	if unacked, acked, active := tab.counts(); unacked != 0 || acked != 1 || active != 1 {
		t.Fatalf("after the ack: counts %d/%d/%d; want 1 acknowledged, 1 active", unacked, acked, active)
	}
	// The gateway forgot call-1 of team-a and ran it again: the new run
	// replaces the invocation's record, it is not a second one.
	tab.begin("gw-2-1", inv("team-a", "call-1"))
	list := tab.list()
	if len(list) != 2 {
		t.Fatalf("%d records for 2 invocations: %+v", len(list), list)
	}
	for _, o := range list {
		if o.Call.Namespace == "team-a" && (o.RunID != "gw-2-1" || o.Done) {
			t.Fatalf("team-a's record %+v; want its new run, in progress", o)
		}
	}
	// The old run's acknowledgement arriving late changes nothing.
	tab.ack([]string{"gw-1-1"})
	if unacked, acked, active := tab.counts(); unacked != 0 || acked != 0 || active != 2 {
		t.Fatalf("after a stale ack: counts %d/%d/%d; want 2 active", unacked, acked, active)
	}
	// Acknowledged outcomes age out after OutcomeTTL; unacknowledged ones stay.
	tab.end("gw-2-1", inv("team-a", "call-1"), 1, nil, nil)
	tab.end("gw-1-2", inv("team-b", "call-1"), 1, nil, nil)
	tab.ack([]string{"gw-2-1"})
	now = now.Add(OutcomeTTL + time.Second)
	list = tab.list()
	if len(list) != 1 || list[0].Call.Namespace != "team-b" || list[0].Acked {
		t.Fatalf("after the TTL: %+v; want only team-b's unacknowledged outcome", list)
	}
}
