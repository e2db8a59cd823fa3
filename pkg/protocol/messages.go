package protocol

import (
	"fmt"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// Version is a protocol version: 1 (stateless load/start/cancel/stop) or 2
// (adds the state operations).
type Version int

// The two protocol versions.
const (
	V1 Version = 1
	V2 Version = 2
)

// Protocol strings as they appear in every frame's "protocol" member.
const (
	ProtocolV1 = "iteron-implementation/1"
	ProtocolV2 = "iteron-implementation/2"
)

// String is the wire form, e.g. "iteron-implementation/2".
func (v Version) String() string {
	switch v {
	case V1:
		return ProtocolV1
	case V2:
		return ProtocolV2
	default:
		return "iteron-implementation/" + strconv.Itoa(int(v))
	}
}

// Valid reports whether v is 1 or 2.
func (v Version) Valid() bool { return v == V1 || v == V2 }

// ParseVersion parses a frame's "protocol" member.
func ParseVersion(s string) (Version, error) {
	switch s {
	case ProtocolV1:
		return V1, nil
	case ProtocolV2:
		return V2, nil
	default:
		return 0, fmt.Errorf("unknown protocol %q", s)
	}
}

// Operation is a request's payload tag ("operation").
type Operation string

// The closed set of operations.
const (
	OpLoad      Operation = "load"
	OpStart     Operation = "start"
	OpCancel    Operation = "cancel"
	OpStop      Operation = "stop"
	OpSnapshot  Operation = "snapshot"
	OpMigrate   Operation = "migrate"
	OpRestore   Operation = "restore"
	OpReadiness Operation = "readiness"
)

// IsStateOperation reports whether o is one of the protocol-2-only state
// operations (snapshot, migrate, restore, readiness).
func (o Operation) IsStateOperation() bool {
	switch o {
	case OpSnapshot, OpMigrate, OpRestore, OpReadiness:
		return true
	}
	return false
}

// SupportedBy reports whether a provider speaking v may receive o.
func (o Operation) SupportedBy(v Version) bool {
	return v == V2 || !o.IsStateOperation()
}

// Success is the result a provider answers o with when it succeeds.
func (o Operation) Success() Result {
	switch o {
	case OpLoad:
		return ResultLoaded
	case OpStart:
		return ResultStarted
	case OpCancel:
		return ResultCancelled
	case OpStop:
		return ResultStopped
	case OpSnapshot:
		return ResultSnapshotted
	case OpMigrate:
		return ResultMigrated
	case OpRestore:
		return ResultRestored
	case OpReadiness:
		return ResultReady
	}
	return ""
}

// Result is a response's payload tag ("result").
type Result string

// The closed set of results.
const (
	ResultLoaded      Result = "loaded"
	ResultStarted     Result = "started"
	ResultCancelled   Result = "cancelled"
	ResultStopped     Result = "stopped"
	ResultSnapshotted Result = "snapshotted"
	ResultMigrated    Result = "migrated"
	ResultRestored    Result = "restored"
	ResultReady       Result = "ready"
	ResultFailed      Result = "failed"
)

// Envelope is the identity every request and response repeats.
type Envelope struct {
	// Protocol is ProtocolV1 or ProtocolV2.
	Protocol string
	// RequestID is "host-1", "host-2", … per process, chosen by the host.
	RequestID string
	// ImplementationID is the manifest's implementation_id.
	ImplementationID string
	// Module is the snake_case module the provider fills.
	Module string
}

// Request is one host → provider frame.
type Request struct {
	Envelope
	// Payload is one of *LoadRequest, *StartRequest, *CancelRequest,
	// *StopRequest, *SnapshotRequest, *MigrateRequest, *RestoreRequest,
	// *ReadinessRequest.
	Payload RequestPayload
}

// RequestPayload is a request's payload; Operation is its tag.
type RequestPayload interface {
	Operation() Operation
}

// LoadRequest binds the verified artifact digest, every module contract and
// the admitted capabilities.
type LoadRequest struct {
	LifecycleContract    ContractRef
	DefinitionContract   ContractRef
	ProviderContract     ContractRef
	ConsumerContract     ContractRef
	ObservationSchema    ContractRef
	ArtifactSHA256       string
	AdmittedCapabilities []string
}

// StartRequest binds a run and the candidate digest to a bounded input.
type StartRequest struct {
	LifecycleContract ContractRef
	RunID             string
	CandidateSHA256   string
	// InputSchema is the module's consumer contract.
	InputSchema ContractRef
	// Input is the run's input, raw JSON (at most MaxPayloadBytes).
	Input jsontext.Value
	// DeadlineMs is > 0 and at most the manifest's runtime_deadline_ms.
	DeadlineMs uint64

	// checked is Input as the strict decoder returned it or as SetInput
	// took it from a Payload: one strict value on one line. Validate and
	// the writer take Input as it is while it is still that very slice.
	checked jsontext.Value
}

// SetInput makes p the request's input. p was checked when it was made, so
// neither Validate nor the writer looks at its bytes again.
func (r *StartRequest) SetInput(p Payload) { r.Input, r.checked = p.raw, p.raw }

// CancelRequest addresses one run.
type CancelRequest struct {
	LifecycleContract ContractRef
	RunID             string
	Reason            string
}

// StopRequest asks the provider process to stop.
type StopRequest struct {
	LifecycleContract ContractRef
	Reason            string
}

// SnapshotRequest asks a quiesced v2 provider for its state.
type SnapshotRequest struct {
	LifecycleContract ContractRef
	// RunID is the lineage run ID, "lineage-<module>".
	RunID string
	// Generation is the lineage number.
	Generation  uint64
	StateSchema ContractRef
	DeadlineMs  uint64
}

// MigrateRequest converts a State to the consecutive lineage.
type MigrateRequest struct {
	LifecycleContract ContractRef
	Source            State
	// TargetGeneration is exactly Source.Generation + 1.
	TargetGeneration uint64
	DeadlineMs       uint64
}

// RestoreRequest imports a State into a loaded provider.
type RestoreRequest struct {
	LifecycleContract ContractRef
	State             State
	DeadlineMs        uint64
}

// ReadinessRequest asks a provider to prove it holds exactly a state.
type ReadinessRequest struct {
	LifecycleContract ContractRef
	RunID             string
	Generation        uint64
	StateSchema       ContractRef
	StateSHA256       string
	DeadlineMs        uint64
}

// Operation implements RequestPayload.
func (*LoadRequest) Operation() Operation { return OpLoad }

// Operation implements RequestPayload.
func (*StartRequest) Operation() Operation { return OpStart }

// Operation implements RequestPayload.
func (*CancelRequest) Operation() Operation { return OpCancel }

// Operation implements RequestPayload.
func (*StopRequest) Operation() Operation { return OpStop }

// Operation implements RequestPayload.
func (*SnapshotRequest) Operation() Operation { return OpSnapshot }

// Operation implements RequestPayload.
func (*MigrateRequest) Operation() Operation { return OpMigrate }

// Operation implements RequestPayload.
func (*RestoreRequest) Operation() Operation { return OpRestore }

// Operation implements RequestPayload.
func (*ReadinessRequest) Operation() Operation { return OpReadiness }

// State is content-addressed provider state, bound to its module, lineage and
// schema (docs/reference/protocol.md).
type State struct {
	Module           string
	ImplementationID string
	// RunID is the lineage run ID, "lineage-<module>".
	RunID string
	// Generation is the lineage number.
	Generation uint64
	// StateSchema is the module's lifecycle/snapshot contract.
	StateSchema ContractRef
	// StateSHA256 is "sha256:" over the canonical encoding of State.
	StateSHA256 string
	// State is the provider's state, raw JSON (at most MaxStateBytes).
	State jsontext.Value
}

// Response is one provider → host frame answering a request.
type Response struct {
	Envelope
	// Payload is one of *Loaded, *Started, *Cancelled, *Stopped,
	// *Snapshotted, *Migrated, *Restored, *Ready, *Failed.
	Payload ResponsePayload
}

// ResponsePayload is a response's payload; Result is its tag.
type ResponsePayload interface {
	Result() Result
}

// Loaded answers load, repeating the contracts the provider serves.
type Loaded struct {
	ProviderContract  ContractRef
	ObservationSchema ContractRef
}

// Started answers start.
type Started struct{ RunID string }

// Cancelled answers cancel.
type Cancelled struct{ RunID string }

// Stopped answers stop.
type Stopped struct{}

// Snapshotted answers snapshot with the provider's state.
type Snapshotted struct{ State State }

// Migrated answers migrate with the converted state.
type Migrated struct{ State State }

// Restored answers restore, repeating the restored state's identity.
type Restored struct {
	RunID       string
	Generation  uint64
	StateSchema ContractRef
	StateSHA256 string
}

// Ready answers readiness, repeating the state's identity.
type Ready struct {
	RunID       string
	Generation  uint64
	StateSchema ContractRef
	StateSHA256 string
}

// Failed is a bounded failure; it carries no fallback, quarantine,
// activation or promotion authority.
type Failed struct {
	Code    string
	Message string
}

// Result implements ResponsePayload.
func (*Loaded) Result() Result { return ResultLoaded }

// Result implements ResponsePayload.
func (*Started) Result() Result { return ResultStarted }

// Result implements ResponsePayload.
func (*Cancelled) Result() Result { return ResultCancelled }

// Result implements ResponsePayload.
func (*Stopped) Result() Result { return ResultStopped }

// Result implements ResponsePayload.
func (*Snapshotted) Result() Result { return ResultSnapshotted }

// Result implements ResponsePayload.
func (*Migrated) Result() Result { return ResultMigrated }

// Result implements ResponsePayload.
func (*Restored) Result() Result { return ResultRestored }

// Result implements ResponsePayload.
func (*Ready) Result() Result { return ResultReady }

// Result implements ResponsePayload.
func (*Failed) Result() Result { return ResultFailed }

// Observation is a provider → host frame carrying one observation of the
// active run. It has no request_id.
type Observation struct {
	Protocol         string
	ImplementationID string
	Module           string
	RunID            string
	// Sequence is strictly increasing within a run (it may start anywhere
	// and skip).
	Sequence uint64
	// Schema is the module's observation contract.
	Schema ContractRef
	// Terminal ends the run.
	Terminal bool
	// Observation is the observation, raw JSON (at most MaxPayloadBytes).
	Observation jsontext.Value
}

// Frame is one decoded provider → host line: exactly one of Response and
// Observation is set.
type Frame struct {
	Response    *Response
	Observation *Observation
}

// LineageRunID is the run ID of every state operation of module's lineage:
// "lineage-<module>".
func LineageRunID(module string) string { return "lineage-" + module }
