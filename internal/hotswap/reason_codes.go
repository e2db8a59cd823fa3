package hotswap

import (
	"context"
	"errors"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
)

// reasonCoder is implemented by errors that carry a reason code of
// docs/reference/reasons.md: the executor's faults, verification errors,
// dispatcher call errors.
type reasonCoder interface{ ReasonCode() string }

// codeOf returns the reason code of err: its own when it carries one,
// deadline_exceeded for a context deadline, otherwise fallback.
func codeOf(err error, fallback ledger.ReasonCode) ledger.ReasonCode {
	var rc reasonCoder
	if errors.As(err, &rc) && rc.ReasonCode() != "" {
		return ledger.ReasonCode(rc.ReasonCode())
	}
	var ce *dispatch.CallError
	if errors.As(err, &ce) {
		return ledger.ReasonCode(ce.Code)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return reasons.DeadlineExceeded
	}
	return fallback
}
