package protocol

import (
	"github.com/go-json-experiment/json/jsontext"
)

// Every payload and the state object are declared once below: their members in
// wire order (docs/reference/protocol.md), each a name and the field that
// holds its value. The encoder writes the members in that order and the
// decoder reads them by these names (any order, each exactly once), both from
// the same declaration: a new field is one line here.

// member is one member of a message of type T.
type member[T any] struct {
	name string
	// field returns a pointer to the member's field: *string, *uint64,
	// *ContractRef, *[]string, *jsontext.Value, *State, or *startInput.
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
	tagged   bool
}

// declare makes the codec of a message: tagName is its payload tag's
// member name ("operation", "result"), or "" for an untagged object.
func declare[T any](tagName string, members ...member[T]) *messageCodec[T] {
	c := &messageCodec[T]{members: members, tagged: tagName != ""}
	if c.tagged {
		c.allNames = append(c.allNames, tagName)
	}
	for _, m := range members {
		c.allNames = append(c.allNames, m.name)
	}
	return c
}

func (c *messageCodec[T]) names() []string { return c.allNames }

func (c *messageCodec[T]) read(d *decoder, ptr, tag string, seen uint64) (any, error) {
	v := new(T)
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
		return nil, err
	}
	if err := requireAll(ptr, c.allNames, seen, 1<<len(c.allNames)-1); err != nil {
		return nil, err
	}
	return v, nil
}

func (c *messageCodec[T]) write(e encoder, v any, ptr string) (encoder, error) {
	m, ok := v.(*T)
	if !ok {
		return e, errorf(ErrMalformed, ptr, "unknown payload type %T", v)
	}
	for _, mb := range c.members {
		e.field(mb.name)
		e.value(mb.field(m), ptr, mb.name)
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
	case *ContractRef:
		*f, err = d.contract(p)
	case *[]string:
		*f, err = d.strings(p)
	case *jsontext.Value:
		*f, err = d.raw(p)
	case *State:
		*f, err = d.state(p)
	case *startInput:
		f.Input, err = d.raw(p)
		f.checked = f.Input
	default:
		panic("protocol: a member declared with an unknown field type")
	}
	return err
}

// value encodes one member's value from f; base and name make its JSON
// Pointer, for errors.
func (e *encoder) value(f any, base, name string) {
	switch f := f.(type) {
	case *string:
		e.str(*f)
	case *uint64:
		e.uint(*f)
	case *ContractRef:
		e.contract(*f)
	case *[]string:
		e.strings(*f)
	case *jsontext.Value:
		e.raw(*f, base, name)
	case *State:
		e.state(f, base+"/"+name)
	case *startInput:
		if sameBytes(f.Input, f.checked) {
			e.b = append(e.b, f.Input...) // checked: one strict value on one line
		} else {
			e.raw(f.Input, base, name)
		}
	default:
		panic("protocol: a member declared with an unknown field type")
	}
}

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
