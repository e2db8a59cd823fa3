package protocol

import (
	"github.com/go-json-experiment/json/jsontext"
)

// Every frame, payload, state and contract object is declared once below:
// its members in wire order (docs/reference/protocol.md), each a name and the
// field that holds its value. The encoder writes the members in that order
// and the decoder reads them by these names (any order, each exactly once),
// both from the same declaration: a new field is one line here.

// member is one member of a message of type T.
type member[T any] struct {
	name string
	// field returns a pointer to the member's field: *string, *uint64,
	// *uint32, *bool, *ContractRef, *[]string, *jsontext.Value, *State,
	// *startInput, *RequestPayload or *ResponsePayload.
	field func(*T) any
}

// startInput is the input member of a start request: a raw value that,
// once checked (decoded strictly, or a Payload), is written as it is.
type startInput StartRequest

// codec reads and writes one message type from its declaration.
type codec interface {
	// names is the tag's name (if the message has one) then every
	// member's, in wire order.
	names() []string
	// read decodes the members of a new message from a decoder inside its
	// object; seen has bit 0 set when the tag was read already.
	read(d *decoder, ptr, tag string, seen uint64) (any, error)
	// write encodes the members of v (not its tag) after whatever e holds
	// and returns e; ptr is the message's JSON Pointer, for errors. (The
	// encoder goes by value: through an interface a pointer would move it
	// to the heap, and every append would pay a write barrier.)
	write(e encoder, v any, ptr string) (encoder, error)
}

type messageCodec[T any] struct {
	members  []member[T]
	allNames []string
	// pointers are the members' JSON Pointers relative to the message
	// ("/" + name), made once: the encoder needs them only for errors.
	pointers []string
	tagged   bool
}

// Every member of a message fits in the decoder's set of names seen.
const maxMembers = 64

// declare makes the codec of a message: tagName is its payload tag's
// member name ("operation", "result"), or "" for an untagged object.
func declare[T any](tagName string, members ...member[T]) *messageCodec[T] {
	c := &messageCodec[T]{members: members, tagged: tagName != ""}
	if c.tagged {
		c.allNames = append(c.allNames, tagName)
	}
	for _, m := range members {
		c.allNames = append(c.allNames, m.name)
		c.pointers = append(c.pointers, "/"+escapePointer(m.name))
	}
	if len(c.allNames) > maxMembers {
		panic("protocol: a message declared with more than 64 members")
	}
	return c
}

func (c *messageCodec[T]) names() []string { return c.allNames }

func (c *messageCodec[T]) read(d *decoder, ptr, tag string, seen uint64) (any, error) {
	v := new(T)
	if err := c.readInto(d, ptr, tag, seen, v); err != nil {
		return nil, err
	}
	return v, nil
}

// readInto is read into v.
func (c *messageCodec[T]) readInto(d *decoder, ptr, tag string, seen uint64, v *T) error {
	off := 0
	if c.tagged {
		off = 1
	}
	seen, err := d.members(ptr, c.allNames, seen, func(i int, p string) error {
		if i < off {
			s, err := d.string(p)
			if err == nil && s != tag {
				err = errorf(ErrMalformed, p, "second tag %q", s)
			}
			return err
		}
		return d.field(c.members[i-off].field(v), p)
	})
	if err != nil {
		return err
	}
	return requireAll(ptr, c.allNames, seen, 1<<len(c.allNames)-1)
}

func (c *messageCodec[T]) write(e encoder, v any, ptr string) (encoder, error) {
	m, ok := v.(*T)
	if !ok {
		return e, errorf(ErrMalformed, ptr, "unknown payload type %T", v)
	}
	for i, mb := range c.members {
		e.field(mb.name)
		e.value(mb.field(m), ptr, c.pointers[i])
	}
	return e, nil
}

// field decodes one member's value into f (a member's field pointer).
func (d *decoder) field(f any, p string) (err error) {
	switch f := f.(type) {
	case *string:
		*f, err = d.string(p)
	case *uint64:
		*f, err = d.uint(p)
	case *uint32:
		var v uint64
		v, err = d.uint(p)
		if err == nil && v > 1<<32-1 {
			err = errorf(ErrMalformed, p, "%d does not fit in 32 bits", v)
		}
		*f = uint32(v)
	case *bool:
		*f, err = d.bool(p)
	case *ContractRef:
		err = d.contract(p, f)
	case *[]string:
		*f, err = d.strings(p)
	case *jsontext.Value:
		*f, err = d.raw(p)
	case *State:
		*f, err = d.state(p)
	case *startInput:
		f.Input, err = d.raw(p)
		f.checked = f.Input
	case *RequestPayload:
		err = d.payload(p, "operation", func(d *decoder, tag string) (err error) {
			*f, err = readRequestPayload(d, p, tag, 1)
			return err
		}, func(raw jsontext.Value) (err error) {
			*f, err = decodeRequestPayload(raw)
			return err
		})
	case *ResponsePayload:
		err = d.payload(p, "result", func(d *decoder, tag string) (err error) {
			*f, err = readResponsePayload(d, p, tag, 1)
			return err
		}, func(raw jsontext.Value) (err error) {
			*f, err = decodeResponsePayload(raw)
			return err
		})
	default:
		panic("protocol: a member declared with an unknown field type")
	}
	return err
}

// value encodes one member's value from f; base + rel is its JSON Pointer,
// for errors.
func (e *encoder) value(f any, base, rel string) {
	switch f := f.(type) {
	case *string:
		e.str(*f)
	case *uint64:
		e.uint(*f)
	case *uint32:
		e.uint(uint64(*f))
	case *bool:
		e.bool(*f)
	case *ContractRef:
		e.contract(f)
	case *[]string:
		e.strings(*f)
	case *jsontext.Value:
		e.raw(*f, base, rel)
	case *State:
		e.state(f, at(base, rel))
	case *startInput:
		if sameBytes(f.Input, f.checked) {
			e.b = append(e.b, f.Input...) // checked: one strict value on one line
		} else {
			e.raw(f.Input, base, rel)
		}
	case *RequestPayload:
		e.requestPayload(*f, at(base, rel))
	case *ResponsePayload:
		e.responsePayload(*f, at(base, rel))
	default:
		panic("protocol: a member declared with an unknown field type")
	}
}

// requestFrame is a host → provider frame: the envelope, then the payload
// tagged "operation".
var requestFrame = declare("",
	member[Request]{"protocol", func(r *Request) any { return &r.Protocol }},
	member[Request]{"request_id", func(r *Request) any { return &r.RequestID }},
	member[Request]{"implementation_id", func(r *Request) any { return &r.ImplementationID }},
	member[Request]{"module", func(r *Request) any { return &r.Module }},
	member[Request]{"payload", func(r *Request) any { return &r.Payload }})

// responseFrame and observationFrame are the two provider → host frames. A
// frame is read before it is known which of the two it is (frameMembers):
// one with responseMark is a response.
var (
	responseFrame = declare("",
		member[Response]{"protocol", func(r *Response) any { return &r.Protocol }},
		member[Response]{"request_id", func(r *Response) any { return &r.RequestID }},
		member[Response]{"implementation_id", func(r *Response) any { return &r.ImplementationID }},
		member[Response]{"module", func(r *Response) any { return &r.Module }},
		member[Response]{"payload", func(r *Response) any { return &r.Payload }})
	observationFrame = declare("",
		member[Observation]{"protocol", func(o *Observation) any { return &o.Protocol }},
		member[Observation]{"implementation_id", func(o *Observation) any { return &o.ImplementationID }},
		member[Observation]{"module", func(o *Observation) any { return &o.Module }},
		member[Observation]{"run_id", func(o *Observation) any { return &o.RunID }},
		member[Observation]{"sequence", func(o *Observation) any { return &o.Sequence }},
		member[Observation]{"schema", func(o *Observation) any { return &o.Schema }},
		member[Observation]{"terminal", func(o *Observation) any { return &o.Terminal }},
		member[Observation]{"observation", func(o *Observation) any { return &o.Observation }})
)

// responseMark is the member that makes a provider → host frame a response.
const responseMark = "request_id"

// contractCodec is a ContractRef object, untagged.
var contractCodec = declare("",
	member[ContractRef]{"id", func(c *ContractRef) any { return &c.ID }},
	member[ContractRef]{"version", func(c *ContractRef) any { return &c.Version }})

// The request payloads, tagged "operation".
var requestCodecs = map[Operation]codec{
	OpLoad: declare("operation",
		member[LoadRequest]{"lifecycle_contract", func(r *LoadRequest) any { return &r.LifecycleContract }},
		member[LoadRequest]{"definition_contract", func(r *LoadRequest) any { return &r.DefinitionContract }},
		member[LoadRequest]{"provider_contract", func(r *LoadRequest) any { return &r.ProviderContract }},
		member[LoadRequest]{"consumer_contract", func(r *LoadRequest) any { return &r.ConsumerContract }},
		member[LoadRequest]{"observation_schema", func(r *LoadRequest) any { return &r.ObservationSchema }},
		member[LoadRequest]{"artifact_sha256", func(r *LoadRequest) any { return &r.ArtifactSHA256 }},
		member[LoadRequest]{"admitted_capabilities", func(r *LoadRequest) any { return &r.AdmittedCapabilities }}),
	OpStart: declare("operation",
		member[StartRequest]{"lifecycle_contract", func(r *StartRequest) any { return &r.LifecycleContract }},
		member[StartRequest]{"run_id", func(r *StartRequest) any { return &r.RunID }},
		member[StartRequest]{"candidate_sha256", func(r *StartRequest) any { return &r.CandidateSHA256 }},
		member[StartRequest]{"input_schema", func(r *StartRequest) any { return &r.InputSchema }},
		member[StartRequest]{"input", func(r *StartRequest) any { return (*startInput)(r) }},
		member[StartRequest]{"deadline_ms", func(r *StartRequest) any { return &r.DeadlineMs }}),
	OpCancel: declare("operation",
		member[CancelRequest]{"lifecycle_contract", func(r *CancelRequest) any { return &r.LifecycleContract }},
		member[CancelRequest]{"run_id", func(r *CancelRequest) any { return &r.RunID }},
		member[CancelRequest]{"reason", func(r *CancelRequest) any { return &r.Reason }}),
	OpStop: declare("operation",
		member[StopRequest]{"lifecycle_contract", func(r *StopRequest) any { return &r.LifecycleContract }},
		member[StopRequest]{"reason", func(r *StopRequest) any { return &r.Reason }}),
	OpSnapshot: declare("operation",
		member[SnapshotRequest]{"lifecycle_contract", func(r *SnapshotRequest) any { return &r.LifecycleContract }},
		member[SnapshotRequest]{"run_id", func(r *SnapshotRequest) any { return &r.RunID }},
		member[SnapshotRequest]{"generation", func(r *SnapshotRequest) any { return &r.Generation }},
		member[SnapshotRequest]{"state_schema", func(r *SnapshotRequest) any { return &r.StateSchema }},
		member[SnapshotRequest]{"deadline_ms", func(r *SnapshotRequest) any { return &r.DeadlineMs }}),
	OpMigrate: declare("operation",
		member[MigrateRequest]{"lifecycle_contract", func(r *MigrateRequest) any { return &r.LifecycleContract }},
		member[MigrateRequest]{"source", func(r *MigrateRequest) any { return &r.Source }},
		member[MigrateRequest]{"target_generation", func(r *MigrateRequest) any { return &r.TargetGeneration }},
		member[MigrateRequest]{"deadline_ms", func(r *MigrateRequest) any { return &r.DeadlineMs }}),
	OpRestore: declare("operation",
		member[RestoreRequest]{"lifecycle_contract", func(r *RestoreRequest) any { return &r.LifecycleContract }},
		member[RestoreRequest]{"state", func(r *RestoreRequest) any { return &r.State }},
		member[RestoreRequest]{"deadline_ms", func(r *RestoreRequest) any { return &r.DeadlineMs }}),
	OpReadiness: declare("operation",
		member[ReadinessRequest]{"lifecycle_contract", func(r *ReadinessRequest) any { return &r.LifecycleContract }},
		member[ReadinessRequest]{"run_id", func(r *ReadinessRequest) any { return &r.RunID }},
		member[ReadinessRequest]{"generation", func(r *ReadinessRequest) any { return &r.Generation }},
		member[ReadinessRequest]{"state_schema", func(r *ReadinessRequest) any { return &r.StateSchema }},
		member[ReadinessRequest]{"state_sha256", func(r *ReadinessRequest) any { return &r.StateSHA256 }},
		member[ReadinessRequest]{"deadline_ms", func(r *ReadinessRequest) any { return &r.DeadlineMs }}),
}

// The response payloads, tagged "result".
var responseCodecs = map[Result]codec{
	ResultLoaded: declare("result",
		member[Loaded]{"provider_contract", func(r *Loaded) any { return &r.ProviderContract }},
		member[Loaded]{"observation_schema", func(r *Loaded) any { return &r.ObservationSchema }}),
	ResultStarted: declare("result",
		member[Started]{"run_id", func(r *Started) any { return &r.RunID }}),
	ResultCancelled: declare("result",
		member[Cancelled]{"run_id", func(r *Cancelled) any { return &r.RunID }}),
	ResultStopped: declare[Stopped]("result"),
	ResultSnapshotted: declare("result",
		member[Snapshotted]{"state", func(r *Snapshotted) any { return &r.State }}),
	ResultMigrated: declare("result",
		member[Migrated]{"state", func(r *Migrated) any { return &r.State }}),
	ResultRestored: declare("result",
		member[Restored]{"run_id", func(r *Restored) any { return &r.RunID }},
		member[Restored]{"generation", func(r *Restored) any { return &r.Generation }},
		member[Restored]{"state_schema", func(r *Restored) any { return &r.StateSchema }},
		member[Restored]{"state_sha256", func(r *Restored) any { return &r.StateSHA256 }}),
	ResultReady: declare("result",
		member[Ready]{"run_id", func(r *Ready) any { return &r.RunID }},
		member[Ready]{"generation", func(r *Ready) any { return &r.Generation }},
		member[Ready]{"state_schema", func(r *Ready) any { return &r.StateSchema }},
		member[Ready]{"state_sha256", func(r *Ready) any { return &r.StateSHA256 }}),
	ResultFailed: declare("result",
		member[Failed]{"code", func(r *Failed) any { return &r.Code }},
		member[Failed]{"message", func(r *Failed) any { return &r.Message }}),
}

// stateCodec is a State object (docs/reference/protocol.md), untagged.
var stateCodec = declare("",
	member[State]{"module", func(s *State) any { return &s.Module }},
	member[State]{"implementation_id", func(s *State) any { return &s.ImplementationID }},
	member[State]{"run_id", func(s *State) any { return &s.RunID }},
	member[State]{"generation", func(s *State) any { return &s.Generation }},
	member[State]{"state_schema", func(s *State) any { return &s.StateSchema }},
	member[State]{"state_sha256", func(s *State) any { return &s.StateSHA256 }},
	member[State]{"state", func(s *State) any { return &s.State }})

// frameMembers reads a provider → host frame in one pass: the members of
// responseFrame and of observationFrame, each name once, in the order first
// declared, with the declaration (or both) that holds it.
var frameMembers = unionOf(responseFrame, observationFrame)

type frameUnion struct {
	names []string
	// response and observation give, per name, the index of its member in
	// that declaration, or -1.
	response, observation []int
	// responseSet and observationSet are the names of each; mark is
	// responseMark's.
	responseSet, observationSet, mark uint64
}

func unionOf(r *messageCodec[Response], o *messageCodec[Observation]) frameUnion {
	var u frameUnion
	index := func(name string) int {
		if i := indexOf(u.names, name); i >= 0 {
			return i
		}
		u.names = append(u.names, name)
		u.response = append(u.response, -1)
		u.observation = append(u.observation, -1)
		return len(u.names) - 1
	}
	for j, m := range r.members {
		i := index(m.name)
		u.response[i], u.responseSet = j, u.responseSet|1<<i
	}
	for j, m := range o.members {
		i := index(m.name)
		u.observation[i], u.observationSet = j, u.observationSet|1<<i
	}
	if len(u.names) > maxMembers {
		panic("protocol: the frames declare more than 64 members")
	}
	i := indexOf(u.names, responseMark)
	if i < 0 || u.response[i] < 0 || u.observation[i] >= 0 {
		panic("protocol: responseMark is not a member of responses alone")
	}
	u.mark = 1 << i
	return u
}
