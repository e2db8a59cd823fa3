package protocol

// Limits of the iteron-implementation protocols (docs/reference/protocol.md).
// The host enforces every one of them; the SDK enforces the ones a provider
// can break.
const (
	// MaxFrameBytes bounds one NDJSON frame, the newline not counted.
	MaxFrameBytes = 1 << 20
	// MaxPayloadBytes bounds a free-form payload value: a start request's
	// input and an observation's observation, as the bytes on the wire.
	MaxPayloadBytes = 512 << 10
	// MaxStateBytes bounds a State's state value, as the bytes on the wire.
	MaxStateBytes = 512 << 10
	// MaxStdinBytes bounds the cumulative bytes written to one provider
	// process's stdin, newlines included.
	MaxStdinBytes = 8 << 20
	// MaxStateOperations bounds the snapshot, migrate, restore and readiness
	// requests sent to one provider process.
	MaxStateOperations = 64
	// MaxIDBytes bounds every identifier (request, run, implementation and
	// contract IDs).
	MaxIDBytes = 128
	// MaxFailedCodeBytes bounds a failed result's code.
	MaxFailedCodeBytes = 128
	// MaxFailedMessageBytes bounds a failed result's message.
	MaxFailedMessageBytes = 4096
	// MaxReasonBytes bounds the reason of a cancel or stop request (our
	// bound: the family leaves it free-form).
	MaxReasonBytes = 1024
	// MaxDeadlineMs bounds every deadline_ms (one hour), the manifest's
	// runtime_deadline_ms bound.
	MaxDeadlineMs = 3_600_000
	// MaxAdmittedCapabilities is the number of known capabilities.
	MaxAdmittedCapabilities = 5
)
