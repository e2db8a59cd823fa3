package procexec

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// Every limit at its boundary: exactly the limit passes, one byte or one
// item more fails.

func TestAFrameOfExactly1MiBPassesAndOneByteMoreIsOversized(t *testing.T) {
	ex := newExecutor(t)
	for _, tc := range []struct {
		size int
		kind FaultKind
	}{
		{protocol.MaxFrameBytes, 0},
		{protocol.MaxFrameBytes + 1, KindOversized},
	} {
		t.Run(fmt.Sprintf("a %d-byte loaded frame", tc.size), func(t *testing.T) {
			p := launch(t, ex, implement(t, artifacts.Faulty, "--fault", "oversized", "--at", "load", "--size", strconv.Itoa(tc.size)))
			_, err := p.Load(ctx(t))
			if faultKind(err) != tc.kind {
				t.Fatalf("Load: %v, want kind %v", err, tc.kind)
			}
		})
	}
}

func TestAnInputOfExactly512KiBPassesAndOneByteMoreIsRefusedWithoutHarm(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	input := func(n int) []byte { return []byte(`"` + strings.Repeat("x", n-2) + `"`) }
	run, err := p.Start(ctx(t), "exact", input(protocol.MaxPayloadBytes), 5*time.Second)
	if err != nil {
		t.Fatalf("a %d-byte input: %v", protocol.MaxPayloadBytes, err)
	}
	if _, err := run.Result(); err != nil {
		t.Fatal(err)
	}
	_, err = p.Start(ctx(t), "over", input(protocol.MaxPayloadBytes+1), 5*time.Second)
	if f, ok := AsFault(err); !ok || f.Kind != KindInvalidRequest || f.ReasonCode() != reasons.SchemaMismatch {
		t.Fatalf("a %d-byte input: %v, want an invalid request", protocol.MaxPayloadBytes+1, err)
	}
	if _, c := runCounter(t, p, "after", counterInput); c.Count != 1 {
		t.Fatalf("the refused input harmed the process: %+v", c)
	}
}

func TestATerminalObservationOfExactly512KiBPasses(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	base := len(`{"implementation_version":"2.0.0","key":"a","count":1,"total":1,"pad":""}`)
	run, err := p.Start(ctx(t), "big", []byte(fmt.Sprintf(`{"key":"a","add":1,"pad":%d}`, protocol.MaxPayloadBytes-base)), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	o, err := run.Result()
	if err != nil || len(o.Observation) != protocol.MaxPayloadBytes {
		t.Fatalf("observation of %d bytes, %v; want exactly %d", len(o.Observation), err, protocol.MaxPayloadBytes)
	}
}

// startLine is the size of the start request the process would write next.
func startLine(t *testing.T, p *Process, runID string, input []byte, deadline time.Duration) int {
	t.Helper()
	p.mu.Lock()
	id := "host-" + strconv.FormatUint(p.nextID+1, 10)
	p.mu.Unlock()
	req := &protocol.Request{
		Envelope: protocol.Envelope{Protocol: p.version.String(), RequestID: id, ImplementationID: p.plan.ImplementationID(), Module: p.plan.Module()},
		Payload: &protocol.StartRequest{LifecycleContract: p.contracts.Start, RunID: runID, CandidateSHA256: p.plan.CandidateSHA256(),
			InputSchema: p.contracts.Consumer, Input: input, DeadlineMs: uint64(deadline.Milliseconds())},
	}
	b, err := protocol.MarshalRequest(req, p.version, &p.contracts)
	if err != nil {
		t.Fatal(err)
	}
	return len(b) + 1
}

// fillStdin writes starts until exactly over bytes past the 8 MiB are left
// for the last one (over 0: the last request uses the budget exactly).
func fillStdin(t *testing.T, p *Process, over int) error {
	t.Helper()
	const deadline = 5 * time.Second
	str := func(n int) []byte { return []byte(`"` + strings.Repeat("y", n-2) + `"`) }
	for i := 0; ; i++ {
		runID := fmt.Sprintf("fill-%03d", i)
		left := p.Budget().StdinBytes
		base := startLine(t, p, runID, str(2), deadline) - 2 // the line without the input's bytes
		n := 500 << 10
		if int64(base+n) > left-int64(base+1000) {
			// The last request: size it to end exactly at (or over) the
			// budget.
			n = int(left) - base + over
		}
		run, err := p.Start(ctx(t), runID, str(n), deadline)
		if err != nil {
			return err
		}
		if _, err := run.Result(); err != nil {
			t.Fatalf("run %s: %v", runID, err)
		}
		if p.Budget().StdinBytes == 0 {
			return nil
		}
	}
}

func TestExactly8MiBOfStdinPassesAndOneByteMoreExhaustsTheBudget(t *testing.T) {
	ex := newExecutor(t)
	t.Run("exactly 8 MiB", func(t *testing.T) {
		p := loaded(t, ex, implement(t, artifacts.CounterV2))
		if err := fillStdin(t, p, 0); err != nil {
			t.Fatalf("filling stdin to exactly 8 MiB: %v", err)
		}
		if b := p.Budget(); b.StdinBytes != 0 {
			t.Fatalf("budget %+v, want no stdin left", b)
		}
		select {
		case <-p.Done():
			t.Fatalf("the process died at exactly the bound: %v", p.Err())
		default:
		}
	})
	t.Run("one byte more", func(t *testing.T) {
		p := loaded(t, ex, implement(t, artifacts.CounterV2))
		err := fillStdin(t, p, 1)
		if f, ok := AsFault(err); !ok || f.Kind != KindBudgetExhausted || f.Op != "start" {
			t.Fatalf("a request one byte past 8 MiB: %v, want budget exhausted", err)
		}
		<-p.Done()
	})
}

func TestExactly64StateOperationsPassAndTheNextExhaustsTheBudget(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	snap, err := p.Snapshot(ctx(t), 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= protocol.MaxStateOperations; i++ {
		if _, err := p.Readiness(ctx(t), 1, snap.StateSHA256, time.Second); err != nil {
			t.Fatalf("state operation %d: %v", i, err)
		}
	}
	if b := p.Budget(); b.StateOperations != 0 {
		t.Fatalf("budget %+v after 64 state operations", b)
	}
	_, err = p.Readiness(ctx(t), 1, snap.StateSHA256, time.Second)
	if f, ok := AsFault(err); !ok || f.Kind != KindBudgetExhausted {
		t.Fatalf("state operation 65: %v, want budget exhausted", err)
	}
}

func TestExactlyTheObservationLimitPassesAndOneMoreOverflows(t *testing.T) {
	ex := newExecutor(t)
	const limit = 5
	limited := func(f *verifier.LaunchPlanFields) { f.EvidenceLimits.Observations = limit }
	for _, tc := range []struct {
		progress int
		kind     FaultKind
	}{
		{limit - 1, 0},              // limit-1 progress + the terminal one = limit
		{limit, KindOutputOverflow}, // one more
	} {
		t.Run(fmt.Sprintf("%d observations", tc.progress+1), func(t *testing.T) {
			p := loaded(t, ex, implement(t, artifacts.CounterV2), limited)
			err := startAndWait(fmt.Sprintf(`{"key":"a","add":1,"progress":%d}`, tc.progress), 5*time.Second)(t, p)
			if faultKind(err) != tc.kind {
				t.Fatalf("run: %v, want kind %v", err, tc.kind)
			}
		})
	}
}

func TestExactlyTheStdoutLimitPassesAndOneByteMoreOverflows(t *testing.T) {
	ex := newExecutor(t)
	const input = `{"key":"a","add":1,"progress":3,"pad":1000}`
	// Measure what the run writes on a fresh process; a fresh process
	// writes the same bytes again.
	p := loaded(t, ex, implement(t, artifacts.CounterV2))
	run, err := p.Start(ctx(t), "measure", []byte(input), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Result(); err != nil {
		t.Fatal(err)
	}
	used := run.StdoutBytes()
	for _, tc := range []struct {
		limit int64
		kind  FaultKind
	}{
		{used, 0},
		{used - 1, KindOutputOverflow},
	} {
		t.Run(fmt.Sprintf("a run of %d bytes under a limit of %d", used, tc.limit), func(t *testing.T) {
			p := loaded(t, ex, implement(t, artifacts.CounterV2), func(f *verifier.LaunchPlanFields) { f.EvidenceLimits.StdoutBytes = tc.limit })
			run, err := p.Start(ctx(t), "measure", []byte(input), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_, err = run.Result()
			if faultKind(err) != tc.kind {
				t.Fatalf("run: %v, want kind %v", err, tc.kind)
			}
		})
	}
}

func TestExactlyTheStderrRingIsKeptAndOneByteMoreIsDroppedNotAFault(t *testing.T) {
	ex := newExecutor(t)
	const ring = 64 << 10
	for _, tc := range []struct {
		written int
		dropped int64
	}{
		{ring, 0},
		{ring + 1, 1},
	} {
		t.Run(fmt.Sprintf("%d bytes into a %d-byte ring", tc.written, ring), func(t *testing.T) {
			p := launch(t, ex, implement(t, artifacts.Faulty, "--fault", "stderr-flood", "--at", "load", "--size", strconv.Itoa(tc.written)))
			if _, err := p.Load(ctx(t)); err != nil {
				t.Fatalf("Load: %v", err)
			}
			if err := p.Stop(ctx(t), "done"); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			flood := bytes.Repeat([]byte("faulty: stderr flood\n"), tc.written/21+1)[:tc.written]
			if tail := p.StderrTail(); !bytes.Equal(tail, flood[tc.written-ring:]) || p.StderrDropped() != tc.dropped {
				t.Fatalf("kept %d bytes, dropped %d; want the newest %d kept and %d dropped", len(tail), p.StderrDropped(), ring, tc.dropped)
			}
		})
	}
}

func TestARunDeadlineIsBoundedByTheManifestAndTheLifetimeLeft(t *testing.T) {
	ex := newExecutor(t)
	p := loaded(t, ex, implement(t, artifacts.CounterV2), func(f *verifier.LaunchPlanFields) { f.RuntimeDeadline = 20 * time.Second })
	if _, err := p.Start(ctx(t), "too-long", []byte(counterInput), 20*time.Second+time.Millisecond); faultKind(err) != KindInvalidRequest {
		t.Fatalf("a run deadline past runtime_deadline_ms: %v, want an invalid request", err)
	}
	if b := p.Budget(); b.Fits(20*time.Second, 0) || !b.Fits(10*time.Second, time.Second) {
		t.Fatalf("budget %+v: a 20s run cannot fit any more, a 10s run with a 1s margin does", b)
	}
	// The whole manifest deadline no longer fits what is left of the
	// lifetime: dispatching it anyway is a budget fault.
	if _, err := p.Start(ctx(t), "no-fit", []byte(counterInput), 20*time.Second); faultKind(err) != KindBudgetExhausted {
		t.Fatalf("a run that does not fit the lifetime left: %v, want budget exhausted", err)
	}
}
