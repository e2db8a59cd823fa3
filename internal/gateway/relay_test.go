package gateway

import (
	"fmt"
	"slices"
	"testing"

	"iteron.dev/operator/internal/survivor"
)

// recordingSink is the gateway's invocation table as the relay sees it:
// it records what it was given, in order.
type recordingSink struct{ got []string }

func (s *recordingSink) Remember(listed []survivor.Outcome) (ended, running int) {
	for _, o := range listed {
		s.got = append(s.got, "listed "+describeOutcome(o))
		if o.Done {
			ended++
		} else {
			running++
		}
	}
	return ended, running
}

func (s *recordingSink) Outcome(o survivor.Outcome) {
	s.got = append(s.got, "outcome "+describeOutcome(o))
}

func describeOutcome(o survivor.Outcome) string { return fmt.Sprintf("%s done=%v", o.RunID, o.Done) }

func TestOutcomeRelay(t *testing.T) {
	running := survivor.Outcome{RunID: "r1"}
	ended := survivor.Outcome{RunID: "r1", Done: true}
	other := survivor.Outcome{RunID: "r2", Done: true}
	for _, tc := range []struct {
		name string
		hold bool
		// before arrive after the listing and before the gateway starts;
		// after arrive once it serves.
		before, after []survivor.Outcome
		want          []string
	}{
		{
			name: "a run listed as running that ends before the gateway starts reaches the gateway after the listing",
			hold: true, before: []survivor.Outcome{ended},
			want: []string{"listed r1 done=false", "outcome r1 done=true"},
		},
		{
			name: "outcomes held before the gateway starts keep their order, and later ones follow",
			hold: true, before: []survivor.Outcome{ended, other}, after: []survivor.Outcome{{RunID: "r3", Done: true}},
			want: []string{"listed r1 done=false", "outcome r1 done=true", "outcome r2 done=true", "outcome r3 done=true"},
		},
		{
			name: "with nothing held the gateway gets the listing, then each outcome as it arrives",
			hold: true, after: []survivor.Outcome{ended},
			want: []string{"listed r1 done=false", "outcome r1 done=true"},
		},
		{
			name: "a manager without a gateway holds nothing",
			hold: false, before: []survivor.Outcome{ended, other},
			want: []string{"listed r1 done=false"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewOutcomeRelay(tc.hold)
			for _, o := range tc.before {
				r.Deliver(o)
			}
			if !tc.hold && len(r.held) != 0 {
				t.Fatalf("held %d outcomes with no gateway to give them to", len(r.held))
			}
			sink := &recordingSink{}
			e, n := r.start(sink, []survivor.Outcome{running})
			if e != 0 || n != 1 {
				t.Errorf("start reported %d ended, %d running; want 0, 1", e, n)
			}
			for _, o := range tc.after {
				r.Deliver(o)
			}
			if !slices.Equal(sink.got, tc.want) {
				t.Errorf("the gateway got %q, want %q", sink.got, tc.want)
			}
			if len(r.held) != 0 {
				t.Errorf("%d outcomes still held after the gateway started", len(r.held))
			}
		})
	}
}
