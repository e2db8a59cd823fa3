package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/reasons"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		code     string
		contains string
	}{
		{"a run the host cancelled is interrupted, naming its generation",
			procexec.ErrRunCancelled, reasons.Interrupted, "the host ended the run on generation 7"},
		{"a process the host closed under the run is interrupted",
			fmt.Errorf("run r1: %w", procexec.ErrClosed), reasons.Interrupted, "process closed"},
		{"a host-ended run already wrapped as a provider failure is interrupted",
			&CallError{Code: reasons.ProviderFailed, Message: "x", Err: procexec.ErrRunCancelled}, reasons.Interrupted, "generation 7"},
		{"a call cancelled in the queue stays cancelled, even over a host-ended run",
			&CallError{Code: reasons.Cancelled, Message: "withdrawn", Err: procexec.ErrRunCancelled}, reasons.Cancelled, "withdrawn"},
		{"an executor's timeout is deadline_exceeded",
			&procexec.Fault{Kind: procexec.KindTimeout, Op: procexec.OpRun, Detail: "no terminal in 2s"}, reasons.DeadlineExceeded, "no terminal in 2s"},
		{"an executor's refusal of a bad request is schema_mismatch",
			&procexec.Fault{Kind: procexec.KindInvalidRequest, Op: procexec.OpRun, Detail: "input: not an object"}, reasons.SchemaMismatch, "not an object"},
		{"a package runtime's failure keeps the runtime's code",
			&pkgruntime.Error{Code: reasons.QueueFull, Detail: "16 calls wait"}, reasons.QueueFull, "16 calls wait"},
		{"a call error of the dispatcher's own is kept",
			&CallError{Code: reasons.StaleGeneration, Message: "pinned 3"}, reasons.StaleGeneration, "pinned 3"},
		{"a caller's deadline in the queue stays deadline_exceeded",
			&CallError{Code: reasons.DeadlineExceeded, Message: "gave up", Err: context.DeadlineExceeded}, reasons.DeadlineExceeded, "gave up"},
		{"any other error is provider_failed with its text",
			errors.New("the provider wrote garbage"), reasons.ProviderFailed, "the provider wrote garbage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ce := Classify(tc.err, 7)
			if ce == nil || ce.Code != tc.code || !strings.Contains(ce.Message, tc.contains) {
				t.Fatalf("Classify(%v) = %+v; want code %s and a message with %q", tc.err, ce, tc.code, tc.contains)
			}
			if !errors.Is(ce, tc.err) && !errors.Is(tc.err, ce) {
				t.Fatalf("Classify(%v) = %+v lost the error it classified", tc.err, ce)
			}
		})
	}
	if Classify(nil, 1) != nil {
		t.Fatal("Classify(nil) is not nil")
	}
}
