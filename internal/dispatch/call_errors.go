package dispatch

import (
	"errors"
	"fmt"

	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/reasons"
)

// Classify is the one place where an error that ended a call becomes the
// call's reason (docs/reference/reasons.md), so that the gateway, the
// fleet probe and the dispatcher itself read a CallError's Code and never
// test an executor's or a runtime's errors. lineage is the generation the
// call ran on, for the message.
//
//   - A run the host ended (an error that says HostEnded: the executor's
//     run cancelled and process closed, also as a survivor reports them) is
//     interrupted: a swap's quiesce timeout, a retirement or a shutdown. A caller that asked for the
//     cancellation reads it as cancelled: only it knows it asked.
//   - A package runtime's failure keeps the runtime's code.
//   - A provider failure whose cause carries a reason code of its own (an
//     executor fault: deadline_exceeded, schema_mismatch, …) takes it.
//   - Any other CallError is kept; anything else is provider_failed.
func Classify(err error, lineage int64) *CallError {
	if err == nil {
		return nil
	}
	var ce *CallError
	if errors.As(err, &ce) && ce.Code == reasons.Cancelled {
		return ce
	}
	var he interface{ HostEnded() bool }
	if errors.As(err, &he) && he.HostEnded() {
		return &CallError{Code: reasons.Interrupted, Err: err,
			Message: fmt.Sprintf("the host ended the run on generation %d (a swap's quiesce timeout, a retirement or a shutdown): %v", lineage, err)}
	}
	if ce == nil {
		var pe *pkgruntime.Error
		if errors.As(err, &pe) {
			return &CallError{Code: pe.Code, Message: pe.Message(), Err: err}
		}
		ce = &CallError{Code: reasons.ProviderFailed, Message: err.Error(), Err: err}
	}
	if ce.Code == reasons.ProviderFailed && ce.Err != nil {
		var rc interface{ ReasonCode() string }
		if errors.As(ce.Err, &rc) && rc.ReasonCode() != "" && rc.ReasonCode() != ce.Code {
			return &CallError{Code: rc.ReasonCode(), Message: ce.Message, Err: ce.Err}
		}
	}
	return ce
}
