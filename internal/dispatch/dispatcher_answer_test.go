package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/internal/reasons"
)

// TestWhatACallGetsWhileNothingServesItsModule is the dispatcher's rule,
// one row per case the coordinator can declare: what a call that is already
// queued gets when the case is declared, and what a call made afterwards
// gets — at once, or at its deadline.
func TestWhatACallGetsWhileNothingServesItsModule(t *testing.T) {
	const deadline = 150 * time.Millisecond
	tests := []struct {
		name    string
		declare func(d *Dispatcher)
		// queued is what a call queued before the declaration gets ("":
		// it keeps waiting and then gets later).
		queued string
		// later is what a call made after it gets; atOnce says it is
		// answered without waiting for its deadline.
		later  string
		atOnce bool
		// fragment is in the message of the later call's answer.
		fragment string
	}{
		{name: "a generation being activated or swapped makes calls wait, and a call that waits out its deadline is told so",
			declare: func(d *Dispatcher) { d.SetAvailable() },
			later:   reasons.DeadlineExceeded, fragment: "the deadline passed after"},
		{name: "a committed generation being recovered makes calls wait, and one that waits out its deadline is told to retry",
			declare: func(d *Dispatcher) { d.SetRecovering("module m's last committed generation g1 is being re-attached") },
			later:   reasons.Recovering, fragment: "g1 is being re-attached; the call waited"},
		{name: "a recovery stays one when a relaunch says calls may wait",
			declare: func(d *Dispatcher) { d.SetRecovering("g1 is being relaunched"); d.SetAvailable() },
			later:   reasons.Recovering, fragment: "g1 is being relaunched"},
		{name: "a recovery that concludes the module cannot serve fails the waiting calls at once with its reason",
			declare: func(d *Dispatcher) {
				d.SetRecovering("g1 is being relaunched")
				d.SetUnavailable(reasons.VerificationFailed, "relaunch of g1 refused at verify: the artifact's bytes changed")
			},
			queued: reasons.VerificationFailed, later: reasons.VerificationFailed, atOnce: true, fragment: "the artifact's bytes changed"},
		{name: "a ledger that cannot be written fails the waiting calls at once",
			declare: func(d *Dispatcher) {
				d.SetUnavailable(reasons.LedgerUnwritable, "a ledger append failed: no space left on device")
			},
			queued: reasons.LedgerUnwritable, later: reasons.LedgerUnwritable, atOnce: true, fragment: "no space left"},
		{name: "a retired module is not found, for the waiting calls and the later ones",
			declare: func(d *Dispatcher) { d.SetRecovering("g1 is being relaunched"); d.Close() },
			queued:  reasons.NotFound, later: reasons.NotFound, atOnce: true, fragment: "retired"},
		{name: "a recovery that ends with the generation switched in makes a later wait a plain deadline again",
			declare: func(d *Dispatcher) {
				d.SetRecovering("g1 is being relaunched")
				if _, err := d.Switch(Route{Lineage: 1, Name: "g1", Backend: newScripted("g1")}); err != nil {
					panic(err)
				}
			},
			later: reasons.DeadlineExceeded, fragment: "the deadline passed after"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDispatcher("prompt_system", 8)
			defer d.Close()
			queued := make(chan error, 1)
			go func() { _, err := d.Invoke(context.Background(), call("queued", 5*time.Second)); queued <- err }()
			for d.QueueLength() < 1 {
				time.Sleep(time.Millisecond)
			}
			tc.declare(d)
			if tc.queued != "" {
				select {
				case err := <-queued:
					wantCode(t, "the queued call", err, tc.queued)
				case <-time.After(2 * time.Second):
					t.Fatalf("the queued call was not answered at once; want %s", tc.queued)
				}
			}
			start := time.Now()
			_, err := d.Invoke(context.Background(), call("later", deadline))
			took := time.Since(start)
			wantCode(t, "the later call", err, tc.later)
			if !strings.Contains(err.Error(), tc.fragment) {
				t.Errorf("the later call got %q; want it to contain %q", err, tc.fragment)
			}
			if tc.atOnce && took >= deadline {
				t.Errorf("the later call was answered after %v: it waited out its deadline (%v) instead of failing at once", took, deadline)
			}
			if !tc.atOnce && took < deadline {
				t.Errorf("the later call was answered after %v, before its deadline (%v): it did not wait", took, deadline)
			}
		})
	}
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var ce *CallError
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("%s got %v; want %s", what, err, code)
	}
}
