package procexec

import (
	"errors"
	"fmt"
	"iteron.dev/operator/internal/reasons"
	"time"
	"unicode/utf8"
)

// FaultKind classifies what went wrong with a provider process.
type FaultKind int

// Fault kinds. Refused and InvalidRequest are raised before anything is
// written to the provider and leave a live process as it was; every other
// kind kills the provider's process group, and the Process is dead when the
// fault is returned.
const (
	// KindTimeout: no answer, terminal observation or exit within the
	// deadline (or the caller's context ended while a request was
	// outstanding).
	KindTimeout FaultKind = iota + 1
	// KindMalformedFrame: a stdout line is not a strict frame.
	KindMalformedFrame
	// KindMiscorrelated: a response does not answer the outstanding request
	// (request ID, identity, result, run, generation, schema or digest), or
	// arrived when none was outstanding.
	KindMiscorrelated
	// KindOversized: a frame, payload or state is over its protocol bound.
	KindOversized
	// KindOutputOverflow: a run produced more stdout bytes or observations
	// than the manifest's evidence_limits.
	KindOutputOverflow
	// KindBadObservation: an observation for no or another run, with a
	// schema other than the module's, or whose sequence did not increase.
	KindBadObservation
	// KindProviderFailed: the provider answered with a failed result.
	KindProviderFailed
	// KindExited: the provider exited (or closed stdout) when it should not
	// have, or exited non-zero after stop.
	KindExited
	// KindBudgetExhausted: a per-process bound (lifetime, stdin bytes, state
	// operations) was reached: the coordinator should have renewed the
	// process first.
	KindBudgetExhausted
	// KindRefused: the executor refused to do it: the artifact's digest does
	// not match the plan, an interpreter is not allowlisted, a state
	// operation was asked of a protocol-1 provider, an operation came in the
	// wrong state (start during a run, anything before load).
	KindRefused
	// KindInvalidRequest: the caller's request breaks the protocol (an
	// input that is not strict JSON or is too large, a state whose digest
	// does not match); nothing was written.
	KindInvalidRequest
	// KindSpawn: the process could not be started (copy, exec, chdir,
	// credentials).
	KindSpawn
	// KindTampered: the executable on disk changed after it was verified.
	KindTampered
)

var kindNames = map[FaultKind]string{
	KindTimeout: "timeout", KindMalformedFrame: "malformed frame", KindMiscorrelated: "mis-correlated response",
	KindOversized: "oversized", KindOutputOverflow: "output overflow", KindBadObservation: "bad observation",
	KindProviderFailed: "provider failed", KindExited: "process exited", KindBudgetExhausted: "budget exhausted",
	KindRefused: "refused", KindInvalidRequest: "invalid request", KindSpawn: "spawn failed",
	KindTampered: "artifact tampered",
}

// String names the kind.
func (k FaultKind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Kills reports whether a fault of this kind kills the process group.
func (k FaultKind) Kills() bool { return k != KindRefused && k != KindInvalidRequest }

// Operation names used in faults besides the protocol operations.
const (
	OpSpawn    = "spawn"    // verifying, copying and starting the process
	OpRun      = "run"      // a run, between started and its terminal observation
	OpLifetime = "lifetime" // the process's runtime_deadline_ms
	OpIdle     = "idle"     // no request outstanding and no run active
	OpVerify   = "verify"   // the re-hash of the executable after start
)

// MaxFrameEvidence bounds the offending frame a fault carries.
const MaxFrameEvidence = 1024

// Fault is every error a Process or the Executor returns about a provider.
type Fault struct {
	// Kind classifies the fault.
	Kind FaultKind
	// Op is the operation in progress: a protocol operation ("load",
	// "start", …) or OpSpawn, OpRun, OpLifetime, OpIdle, OpVerify.
	Op string
	// Detail says what happened, in words, with the field path where there
	// is one.
	Detail string
	// Frame is the offending frame, at most MaxFrameEvidence bytes (longer
	// frames are cut and end with "…").
	Frame []byte
	// Code and Message are a failed result's (KindProviderFailed).
	Code, Message string
	// Reason overrides the reason code (e.g. unsupported_version for a state
	// operation refused to a protocol-1 provider).
	Reason string
	// At is when the fault was detected.
	At time.Time
	// Err is the underlying error, if any.
	Err error
}

// Error says what happened during which operation, with the offending frame.
func (f *Fault) Error() string {
	msg := fmt.Sprintf("provider %s during %s: %s", f.Kind, f.Op, f.Detail)
	if f.Kind == KindProviderFailed {
		msg = fmt.Sprintf("provider failed %s: %s: %s", f.Op, f.Code, f.Message)
	}
	if len(f.Frame) > 0 {
		msg += fmt.Sprintf(" (frame: %q)", f.Frame)
	}
	return msg
}

// Unwrap returns the underlying error.
func (f *Fault) Unwrap() error { return f.Err }

// ReasonCode maps the fault to the reasons of docs/reference/reasons.md: a
// deadline is deadline_exceeded; a digest, tampering or interpreter refusal is
// verification_failed; a state operation of a protocol-1 provider is
// unsupported_version; a caller's bad request is schema_mismatch; anything
// else the provider did is activation_failed while loading (spawn or load) and
// provider_failed afterwards.
func (f *Fault) ReasonCode() string {
	if f.Reason != "" {
		return f.Reason
	}
	switch f.Kind {
	case KindTimeout:
		return reasons.DeadlineExceeded
	case KindTampered:
		return reasons.VerificationFailed
	case KindInvalidRequest:
		return reasons.SchemaMismatch
	case KindSpawn:
		return reasons.ActivationFailed
	}
	if f.Op == OpSpawn || f.Op == "load" || f.Op == OpVerify {
		return reasons.ActivationFailed
	}
	return reasons.ProviderFailed
}

// AsFault returns err's *Fault if it is or wraps one.
func AsFault(err error) (*Fault, bool) {
	var f *Fault
	ok := errors.As(err, &f)
	return f, ok
}

func evidence(frame []byte) []byte {
	if len(frame) <= MaxFrameEvidence {
		return append([]byte(nil), frame...)
	}
	cut := MaxFrameEvidence - len("…")
	for cut > 0 && !utf8.RuneStart(frame[cut]) {
		cut--
	}
	return append(append([]byte(nil), frame[:cut]...), "…"...)
}

// ErrRunCancelled is a run's outcome when the host cancelled it.
var ErrRunCancelled error = &hostEnded{"procexec: run cancelled"}

// ErrClosed is returned by requests to a Process that was closed or stopped
// without a fault.
var ErrClosed error = &hostEnded{"procexec: process closed"}

// hostEnded is a run the host ended, not its provider: it says so
// (HostEnded), so that whoever classifies a call's error (internal/dispatch)
// need not know the executor's sentinels.
type hostEnded struct{ msg string }

func (e *hostEnded) Error() string { return e.msg }

// HostEnded reports that the host, not the provider, ended the run.
func (e *hostEnded) HostEnded() bool { return true }
