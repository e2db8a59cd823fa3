package main

import (
	"slices"
	"strings"
	"testing"
)

func TestFaultyArgumentsAreParsedStrictly(t *testing.T) {
	f, err := parse(strings.Fields("--fault fork-grandchild --at load --children 3 --fault crash --at start --skip 2 --always --fault escape --at load --hold-pipes"))
	if err != nil || len(f) != 3 || f[0].children != 3 || f[1].skip != 2 || !f[1].always || f[1].at != "start" || !f[2].holdPipes || f[0].holdPipes {
		t.Fatalf("parse: %+v, %v", f, err)
	}
	for _, bad := range []string{
		"--at load",                 // an option before --fault
		"--fault explode --at load", // an unknown fault
		"--fault crash --at launch", // an unknown operation
		"--fault crash",             // no operation
		"--fault crash --at load --skip -1",
		"--fault crash --at load --size",
		"--fault crash --at load --color red",
		"--fault hang --at load --hold-pipes", // only an escapee holds the pipes this way
	} {
		if _, err := parse(strings.Fields(bad)); err == nil {
			t.Errorf("parse(%q) succeeded", bad)
		}
	}
}

func TestAFaultFiresOnceAfterItsSkipsUnlessAlways(t *testing.T) {
	s := &state{faults: []*fault{{kind: "wrong-schema", at: "start", skip: 1}, {kind: "stderr-flood", at: "start", always: true}}}
	var fired []int
	for range 4 {
		fired = append(fired, len(s.arm("start", nil)))
	}
	if !slices.Equal(fired, []int{1, 2, 1, 1}) {
		t.Fatalf("faults firing per start: %v, want [1 2 1 1]", fired)
	}
}

func TestAFaultWithIfRequestContainsFiresOnlyForMatchingRequests(t *testing.T) {
	f, err := parse(strings.Fields("--fault crash --at migrate --if-request-contains poison"))
	if err != nil || len(f) != 1 || f[0].ifContains != "poison" {
		t.Fatalf("parse: %+v, %v", f, err)
	}
	if _, err := parse([]string{"--fault", "crash", "--at", "migrate", "--if-request-contains", ""}); err == nil {
		t.Fatal("an empty --if-request-contains was accepted")
	}
	s := &state{faults: f}
	if n := len(s.arm("migrate", []byte(`{"state":{"keys":[{"count":1,"key":"a"}]}}`))); n != 0 {
		t.Fatalf("fired %d faults for a state without the text", n)
	}
	if n := len(s.arm("migrate", []byte(`{"state":{"keys":[{"count":1,"key":"poison"}]}}`))); n != 1 {
		t.Fatalf("fired %d faults for a state with the text; want 1", n)
	}
}
