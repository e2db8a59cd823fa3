package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/go-json-experiment/json/jsontext"
)

var testContracts = BuiltinContracts("prompt_system")

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func env(v Version, id string) Envelope {
	return Envelope{Protocol: v.String(), RequestID: id, ImplementationID: "test.impl", Module: "prompt_system"}
}

func testState(gen uint64, impl string, raw string) State {
	s := State{Module: "prompt_system", ImplementationID: impl, RunID: "lineage-prompt_system", Generation: gen,
		StateSchema: testContracts.Snapshot, State: jsontext.Value(raw)}
	s.StateSHA256, _ = StateDigest(s.State)
	return s
}

// requests returns one valid request of every operation.
func requests() []*Request {
	c := testContracts
	st := testState(1, "test.impl", `{"b":[1,2.5,"<&>\u2028"],"a":{"z":null}}`)
	return []*Request{
		{Envelope: env(V2, "host-1"), Payload: &LoadRequest{LifecycleContract: c.Load, DefinitionContract: c.Definition, ProviderContract: c.Provider,
			ConsumerContract: c.Consumer, ObservationSchema: c.Observation, ArtifactSHA256: testDigest, AdmittedCapabilities: []string{"read_only", "reversible_local"}}},
		{Envelope: env(V2, "host-2"), Payload: &StartRequest{LifecycleContract: c.Start, RunID: "run-1", CandidateSHA256: testDigest,
			InputSchema: c.Consumer, Input: jsontext.Value(`{"key":"a","add":1}`), DeadlineMs: 5000}},
		{Envelope: env(V2, "host-3"), Payload: &CancelRequest{LifecycleContract: c.Cancel, RunID: "run-1", Reason: "quiesce \"now\" ✓"}},
		{Envelope: env(V2, "host-4"), Payload: &SnapshotRequest{LifecycleContract: c.Snapshot, RunID: "lineage-prompt_system", Generation: 1, StateSchema: c.Snapshot, DeadlineMs: 1000}},
		{Envelope: env(V2, "host-5"), Payload: &MigrateRequest{LifecycleContract: c.Migrate, Source: st, TargetGeneration: 2, DeadlineMs: 1000}},
		{Envelope: env(V2, "host-6"), Payload: &RestoreRequest{LifecycleContract: c.Restore, State: st, DeadlineMs: 1000}},
		{Envelope: env(V2, "host-7"), Payload: &ReadinessRequest{LifecycleContract: c.Readiness, RunID: "lineage-prompt_system", Generation: 1, StateSchema: c.Snapshot, StateSHA256: st.StateSHA256, DeadlineMs: 1000}},
		{Envelope: env(V2, "host-8"), Payload: &StopRequest{LifecycleContract: c.Stop, Reason: "shutdown"}},
	}
}

func TestEveryRequestRoundTripsThroughItsFrame(t *testing.T) {
	for _, req := range requests() {
		t.Run(string(req.Payload.Operation()), func(t *testing.T) {
			b, err := MarshalRequest(req, V2, &testContracts)
			if err != nil {
				t.Fatalf("MarshalRequest: %v", err)
			}
			if bytes.ContainsAny(b, "\n\r") {
				t.Fatalf("a frame spans lines: %s", b)
			}
			got, err := DecodeRequest(b)
			if err != nil {
				t.Fatalf("DecodeRequest(%s): %v", b, err)
			}
			if s, ok := got.Payload.(*StartRequest); ok {
				s.checked = nil // the decoder's note that Input is checked
			}
			if !reflect.DeepEqual(got, req) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got.Payload, req.Payload)
			}
			if err := got.Validate(V2, &testContracts); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// The protocol-1 exchange of docs/reference/protocol.md, byte for byte.
func TestTheWireSpecExampleExchangeIsByteCompatible(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	c := testContracts
	load := &Request{Envelope: env(V1, "host-1"), Payload: &LoadRequest{LifecycleContract: c.Load, DefinitionContract: c.Definition,
		ProviderContract: c.Provider, ConsumerContract: c.Consumer, ObservationSchema: c.Observation, ArtifactSHA256: digest, AdmittedCapabilities: []string{}}}
	b, err := MarshalRequest(load, V1, &c)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"protocol":"iteron-implementation/1","request_id":"host-1","implementation_id":"test.impl","module":"prompt_system","payload":{"operation":"load","lifecycle_contract":{"id":"iteron/prompt.system/lifecycle/load@v1","version":1},"definition_contract":{"id":"iteron/prompt.system/definition@v1","version":1},"provider_contract":{"id":"iteron/prompt.system/provider@v1","version":1},"consumer_contract":{"id":"iteron/prompt.system/consumer@v1","version":1},"observation_schema":{"id":"iteron/prompt.system/observation@v1","version":1},"artifact_sha256":"` + digest + `","admitted_capabilities":[]}}`
	if string(b) != want {
		t.Fatalf("load frame\n got %s\nwant %s", b, want)
	}
	start := &Request{Envelope: env(V1, "host-2"), Payload: &StartRequest{LifecycleContract: c.Start, RunID: "run-1", CandidateSHA256: digest,
		InputSchema: c.Consumer, Input: jsontext.Value(`{}`), DeadlineMs: 5000}}
	stop := &Request{Envelope: env(V1, "host-3"), Payload: &StopRequest{LifecycleContract: c.Stop, Reason: "shutdown"}}
	// The provider lines of the example, verbatim.
	provider := []struct {
		line string
		req  *Request
	}{
		{`{"protocol":"iteron-implementation/1","request_id":"host-1","implementation_id":"test.impl","module":"prompt_system","payload":{"result":"loaded","provider_contract":{"id":"iteron/prompt.system/provider@v1","version":1},"observation_schema":{"id":"iteron/prompt.system/observation@v1","version":1}}}`, load},
		{`{"protocol":"iteron-implementation/1","request_id":"host-2","implementation_id":"test.impl","module":"prompt_system","payload":{"result":"started","run_id":"run-1"}}`, start},
		{`{"protocol":"iteron-implementation/1","implementation_id":"test.impl","module":"prompt_system","run_id":"run-1","sequence":0,"schema":{"id":"iteron/prompt.system/observation@v1","version":1},"terminal":true,"observation":{"score":7}}`, nil},
		{`{"protocol":"iteron-implementation/1","request_id":"host-3","implementation_id":"test.impl","module":"prompt_system","payload":{"result":"stopped"}}`, stop},
	}
	for _, pl := range provider {
		f, err := DecodeFrame([]byte(pl.line))
		if err != nil {
			t.Fatalf("DecodeFrame(%s): %v", pl.line, err)
		}
		if pl.req == nil {
			if f.Observation == nil {
				t.Fatalf("%s decoded as a response", pl.line)
			}
			err := CheckObservation(f.Observation, ObservationExpectation{Protocol: ProtocolV1, ImplementationID: "test.impl", Module: "prompt_system", RunID: "run-1", Schema: c.Observation})
			if err != nil {
				t.Fatalf("CheckObservation: %v", err)
			}
			re, _ := AppendObservation(nil, f.Observation)
			if string(re) != pl.line {
				t.Fatalf("observation re-encoded\n got %s\nwant %s", re, pl.line)
			}
			continue
		}
		if err := Correlate(pl.req, f.Response, &c); err != nil {
			t.Fatalf("Correlate(%s): %v", pl.line, err)
		}
		re, _ := AppendResponse(nil, f.Response)
		if string(re) != pl.line {
			t.Fatalf("response re-encoded\n got %s\nwant %s", re, pl.line)
		}
	}
}

func TestFramesKeepHTMLCharactersAndLineSeparatorsLiteral(t *testing.T) {
	req := &Request{Envelope: env(V2, "host-1"), Payload: &CancelRequest{LifecycleContract: testContracts.Cancel, RunID: "r", Reason: "<a&b>\u2028\u2029\n\x01é"}}
	b, err := AppendRequest(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"reason":"<a&b>` + "\u2028\u2029" + `\n\u0001é"`; !strings.Contains(string(b), want) {
		t.Fatalf("frame %s does not contain %s", b, want)
	}
}

func TestAMultiLineInputIsCompactedIntoOneFrame(t *testing.T) {
	req := &Request{Envelope: env(V2, "host-1"), Payload: &StartRequest{LifecycleContract: testContracts.Start, RunID: "r", CandidateSHA256: testDigest,
		InputSchema: testContracts.Consumer, Input: jsontext.Value("{\n  \"a\": [1,\r\n 2]\n}"), DeadlineMs: 1}}
	b, err := MarshalRequest(req, V2, &testContracts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"input":{"a":[1,2]}`) {
		t.Fatalf("frame %s", b)
	}
}

func TestDecodingIsStrict(t *testing.T) {
	okObs := `{"protocol":"iteron-implementation/2","implementation_id":"i","module":"m","run_id":"r","sequence":1,"schema":{"id":"c","version":1},"terminal":false,"observation":{}}`
	okResp := `{"protocol":"iteron-implementation/2","request_id":"host-1","implementation_id":"i","module":"m","payload":{"result":"started","run_id":"r"}}`
	escapedName := strings.Replace(okResp, `"run_id"`, `"run\u005fid"`, 1)
	for _, frame := range []string{okObs, okResp, escapedName} {
		if _, err := DecodeFrame([]byte(frame)); err != nil {
			t.Fatalf("the valid frame %s: %v", frame, err)
		}
	}
	cases := []struct {
		name, frame string
		kind        ErrorKind
		pointer     string
	}{
		{"a duplicate member at the top", strings.Replace(okResp, `"module":"m"`, `"module":"m","module":"m"`, 1), ErrMalformed, "/module"},
		{"a duplicate member deep in an observation", strings.Replace(okObs, `"observation":{}`, `"observation":{"a":[{"b":1,"b":2}]}`, 1), ErrMalformed, "/observation/a/0/b"},
		{"a duplicate member in a payload", strings.Replace(okResp, `"run_id":"r"`, `"run_id":"r","run_id":"r"`, 1), ErrMalformed, "/payload/run_id"},
		{"an unknown member at the top", strings.Replace(okResp, `"module":"m"`, `"module":"m","extra":1`, 1), ErrMalformed, "/extra"},
		{"an unknown member spelled with an escape", strings.Replace(okResp, `"module":"m"`, `"module":"m","e\u0078tra":1`, 1), ErrMalformed, "/extra"},
		{"a duplicate member spelled with an escape", strings.Replace(okResp, `"module":"m"`, `"module":"m","modul\u0065":"m"`, 1), ErrMalformed, "/module"},
		{"an unknown member in a payload", strings.Replace(okResp, `"run_id":"r"`, `"run_id":"r","why":"x"`, 1), ErrMalformed, "/payload/why"},
		{"an unknown member in a contract", strings.Replace(okObs, `"version":1}`, `"version":1,"x":0}`, 1), ErrMalformed, "/schema/x"},
		{"a missing member", strings.Replace(okObs, `"terminal":false,`, ``, 1), ErrMalformed, ""},
		{"a missing payload member", strings.Replace(okResp, `,"run_id":"r"`, ``, 1), ErrMalformed, "/payload"},
		{"trailing data", okResp + `{}`, ErrMalformed, ""},
		{"a frame that is not an object", `["protocol"]`, ErrMalformed, ""},
		{"an empty frame", ``, ErrMalformed, ""},
		{"a sequence written as a string", strings.Replace(okObs, `"sequence":1`, `"sequence":"1"`, 1), ErrMalformed, "/sequence"},
		{"a negative sequence", strings.Replace(okObs, `"sequence":1`, `"sequence":-1`, 1), ErrMalformed, "/sequence"},
		{"a fractional sequence", strings.Replace(okObs, `"sequence":1`, `"sequence":1.0`, 1), ErrMalformed, "/sequence"},
		{"a sequence with an exponent", strings.Replace(okObs, `"sequence":1`, `"sequence":1e2`, 1), ErrMalformed, "/sequence"},
		{"a sequence past 64 bits", strings.Replace(okObs, `"sequence":1`, `"sequence":18446744073709551616`, 1), ErrMalformed, "/sequence"},
		{"a null where a string belongs", strings.Replace(okResp, `"module":"m"`, `"module":null`, 1), ErrMalformed, "/module"},
		{"invalid UTF-8", strings.Replace(okResp, `"m"`, "\"\xff\"", 1), ErrMalformed, "/module"},
		{"a response carrying an observation member", strings.Replace(okResp, `"module":"m"`, `"module":"m","sequence":1`, 1), ErrMalformed, "/sequence"},
		{"an observation carrying a payload", strings.Replace(okObs, `"terminal":false`, `"terminal":false,"payload":{}`, 1), ErrMalformed, "/payload"},
		{"an unknown result", strings.Replace(okResp, `"started"`, `"begun"`, 1), ErrMalformed, "/payload/result"},
		{"a second result tag", strings.Replace(okResp, `"run_id":"r"`, `"run_id":"r","result":"started"`, 1), ErrMalformed, "/payload/result"},
		{"a frame over 1 MiB", `{"x":"` + strings.Repeat("a", MaxFrameBytes) + `"}`, ErrTooLarge, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeFrame([]byte(tc.frame))
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("DecodeFrame: %v, want a *protocol.Error", err)
			}
			if pe.Kind != tc.kind || (tc.pointer != "" && pe.Pointer != tc.pointer) {
				t.Fatalf("error %v (kind %v, pointer %q), want kind %v at %q", err, pe.Kind, pe.Pointer, tc.kind, tc.pointer)
			}
		})
	}
}

func TestADecodedInputReplacedAfterDecodingIsValidatedAgain(t *testing.T) {
	frame, err := MarshalRequest(requests()[1], V2, &testContracts)
	if err != nil {
		t.Fatal(err)
	}
	req, err := DecodeRequest(frame)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Validate(V2, &testContracts); err != nil {
		t.Fatalf("the decoded request: %v", err)
	}
	req.Payload.(*StartRequest).Input = jsontext.Value(`{"a":1,"a":2}`)
	if err := req.Validate(V2, &testContracts); KindOf(err) != ErrMalformed {
		t.Fatalf("an input replaced after decoding: %v, want it validated (and refused)", err)
	}
}

func TestAPayloadWhoseTagIsNotFirstStillDecodes(t *testing.T) {
	frame := `{"protocol":"iteron-implementation/2","request_id":"host-1","implementation_id":"i","module":"m","payload":{"run_id":"r","result":"started"}}`
	f, err := DecodeFrame([]byte(frame))
	if err != nil || f.Response.Payload.(*Started).RunID != "r" {
		t.Fatalf("DecodeFrame: %+v, %v", f, err)
	}
}

func TestARawValueIsTheProvidersBytesNotAReencoding(t *testing.T) {
	obs := `{"protocol":"iteron-implementation/2","implementation_id":"i","module":"m","run_id":"r","sequence":1,"schema":{"id":"c","version":1},"terminal":true,"observation":{ "z" : 1.50, "a":"\u00e9" }}`
	f, err := DecodeFrame([]byte(obs))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(f.Observation.Observation); got != `{ "z" : 1.50, "a":"\u00e9" }` {
		t.Fatalf("observation bytes %s", got)
	}
}

func TestValidateNamesTheOffendingField(t *testing.T) {
	valid := func() []*Request { return requests() }
	byOp := func(op Operation) *Request {
		for _, r := range valid() {
			if r.Payload.Operation() == op {
				return r
			}
		}
		panic(op)
	}
	big := func(n int) jsontext.Value { return jsontext.Value(`"` + strings.Repeat("x", n-2) + `"`) }
	cases := []struct {
		name    string
		req     func() *Request
		v       Version
		kind    ErrorKind
		pointer string
	}{
		{"a request ID of 128 bytes", func() *Request { r := byOp(OpStop); r.RequestID = strings.Repeat("h", 128); return r }, V2, 0, ""},
		{"a request ID of 129 bytes", func() *Request { r := byOp(OpStop); r.RequestID = strings.Repeat("h", 129); return r }, V2, ErrInvalid, "/request_id"},
		{"a request ID with a space", func() *Request { r := byOp(OpStop); r.RequestID = "host 1"; return r }, V2, ErrInvalid, "/request_id"},
		{"a module that is not snake_case", func() *Request { r := byOp(OpStop); r.Module = "Prompt"; return r }, V2, ErrInvalid, "/module"},
		{"the wrong protocol string", func() *Request { r := byOp(OpStop); r.Protocol = ProtocolV1; return r }, V2, ErrMismatch, "/protocol"},
		{"a state operation for protocol 1", func() *Request {
			r := byOp(OpSnapshot)
			r.Protocol = ProtocolV1
			return r
		}, V1, ErrInvalid, "/payload/operation"},
		{"a lifecycle contract of another module", func() *Request {
			r := byOp(OpStop)
			r.Payload.(*StopRequest).LifecycleContract = BuiltinContracts("tool_exposure").Stop
			return r
		}, V2, ErrMismatch, "/payload/lifecycle_contract"},
		{"a zero deadline", func() *Request { r := byOp(OpStart); r.Payload.(*StartRequest).DeadlineMs = 0; return r }, V2, ErrInvalid, "/payload/deadline_ms"},
		{"a deadline of one hour", func() *Request { r := byOp(OpStart); r.Payload.(*StartRequest).DeadlineMs = MaxDeadlineMs; return r }, V2, 0, ""},
		{"a deadline past one hour", func() *Request {
			r := byOp(OpStart)
			r.Payload.(*StartRequest).DeadlineMs = MaxDeadlineMs + 1
			return r
		}, V2, ErrInvalid, "/payload/deadline_ms"},
		{"an input of exactly 512 KiB", func() *Request { r := byOp(OpStart); r.Payload.(*StartRequest).Input = big(MaxPayloadBytes); return r }, V2, 0, ""},
		{"an input one byte over 512 KiB", func() *Request {
			r := byOp(OpStart)
			r.Payload.(*StartRequest).Input = big(MaxPayloadBytes + 1)
			return r
		}, V2, ErrTooLarge, "/payload/input"},
		{"an input with a duplicate member", func() *Request {
			r := byOp(OpStart)
			r.Payload.(*StartRequest).Input = jsontext.Value(`{"a":1,"a":2}`)
			return r
		}, V2, ErrMalformed, "/payload/input"},
		{"a candidate that is not a digest", func() *Request {
			r := byOp(OpStart)
			r.Payload.(*StartRequest).CandidateSHA256 = "sha256:ABC"
			return r
		}, V2, ErrInvalid, "/payload/candidate_sha256"},
		{"a reason of 1024 bytes", func() *Request {
			r := byOp(OpStop)
			r.Payload.(*StopRequest).Reason = strings.Repeat("r", 1024)
			return r
		}, V2, 0, ""},
		{"a reason of 1025 bytes", func() *Request {
			r := byOp(OpStop)
			r.Payload.(*StopRequest).Reason = strings.Repeat("r", 1025)
			return r
		}, V2, ErrInvalid, "/payload/reason"},
		{"unsorted capabilities", func() *Request {
			r := byOp(OpLoad)
			r.Payload.(*LoadRequest).AdmittedCapabilities = []string{"reversible_local", "read_only"}
			return r
		}, V2, ErrInvalid, "/payload/admitted_capabilities"},
		{"an unknown capability", func() *Request {
			r := byOp(OpLoad)
			r.Payload.(*LoadRequest).AdmittedCapabilities = []string{"root"}
			return r
		}, V2, ErrInvalid, "/payload/admitted_capabilities"},
		{"a snapshot of another lineage run", func() *Request { r := byOp(OpSnapshot); r.Payload.(*SnapshotRequest).RunID = "run-1"; return r }, V2, ErrInvalid, "/payload/run_id"},
		{"a snapshot of lineage 0", func() *Request { r := byOp(OpSnapshot); r.Payload.(*SnapshotRequest).Generation = 0; return r }, V2, ErrInvalid, "/payload/generation"},
		{"a migration that skips a lineage", func() *Request { r := byOp(OpMigrate); r.Payload.(*MigrateRequest).TargetGeneration = 3; return r }, V2, ErrInvalid, "/payload/target_generation"},
		{"a source whose digest is not its state's", func() *Request {
			r := byOp(OpMigrate)
			r.Payload.(*MigrateRequest).Source.StateSHA256 = testDigest
			return r
		}, V2, ErrMismatch, "/payload/source/state_sha256"},
		{"a restore of another implementation's state", func() *Request {
			r := byOp(OpRestore)
			r.Payload.(*RestoreRequest).State = testState(1, "other", `{}`)
			return r
		}, V2, ErrMismatch, "/payload/state/implementation_id"},
		{"a state of exactly 512 KiB", func() *Request {
			r := byOp(OpRestore)
			r.Payload.(*RestoreRequest).State = testState(1, "test.impl", string(big(MaxStateBytes)))
			return r
		}, V2, 0, ""},
		{"a state one byte over 512 KiB", func() *Request {
			r := byOp(OpRestore)
			r.Payload.(*RestoreRequest).State = testState(1, "test.impl", string(big(MaxStateBytes+1)))
			return r
		}, V2, ErrTooLarge, "/payload/state/state"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.req().Validate(tc.v, &testContracts)
			if tc.kind == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Kind != tc.kind || pe.Pointer != tc.pointer {
				t.Fatalf("Validate: %v, want kind %v at %q", err, tc.kind, tc.pointer)
			}
		})
	}
}

func TestCorrelateRejectsEveryMismatch(t *testing.T) {
	reqs := map[Operation]*Request{}
	for _, r := range requests() {
		reqs[r.Payload.Operation()] = r
	}
	respond := func(op Operation, p ResponsePayload) (*Request, *Response) {
		r := reqs[op]
		return r, &Response{Envelope: r.Envelope, Payload: p}
	}
	migrated := testState(2, "test.impl", `{"b":[1,2.5,"<&>\u2028"],"a":{"z":null}}`)
	snapState := reqs[OpMigrate].Payload.(*MigrateRequest).Source
	ack := func(s State) *Restored {
		return &Restored{RunID: s.RunID, Generation: s.Generation, StateSchema: s.StateSchema, StateSHA256: s.StateSHA256}
	}
	cases := []struct {
		name    string
		pair    func() (*Request, *Response)
		kind    ErrorKind
		pointer string
	}{
		{"a matching started", func() (*Request, *Response) { return respond(OpStart, &Started{RunID: "run-1"}) }, 0, ""},
		{"another request ID", func() (*Request, *Response) {
			r, p := respond(OpStart, &Started{RunID: "run-1"})
			p.RequestID = "host-99"
			return r, p
		}, ErrMismatch, "/request_id"},
		{"another protocol", func() (*Request, *Response) {
			r, p := respond(OpStart, &Started{RunID: "run-1"})
			p.Protocol = ProtocolV1
			return r, p
		}, ErrMismatch, "/protocol"},
		{"another implementation", func() (*Request, *Response) {
			r, p := respond(OpStart, &Started{RunID: "run-1"})
			p.ImplementationID = "x"
			return r, p
		}, ErrMismatch, "/implementation_id"},
		{"another module", func() (*Request, *Response) {
			r, p := respond(OpStart, &Started{RunID: "run-1"})
			p.Module = "tool_exposure"
			return r, p
		}, ErrMismatch, "/module"},
		{"the result of another operation", func() (*Request, *Response) { return respond(OpStart, &Stopped{}) }, ErrMismatch, "/payload/result"},
		{"another run started", func() (*Request, *Response) { return respond(OpStart, &Started{RunID: "run-2"}) }, ErrMismatch, "/payload/run_id"},
		{"another run cancelled", func() (*Request, *Response) { return respond(OpCancel, &Cancelled{RunID: "run-2"}) }, ErrMismatch, "/payload/run_id"},
		{"loaded with another observation schema", func() (*Request, *Response) {
			return respond(OpLoad, &Loaded{ProviderContract: testContracts.Provider, ObservationSchema: testContracts.Consumer})
		}, ErrMismatch, "/payload/observation_schema"},
		{"a snapshot claiming a digest that is not its state's", func() (*Request, *Response) {
			s := testState(1, "test.impl", `{"a":1}`)
			s.StateSHA256 = testDigest
			return respond(OpSnapshot, &Snapshotted{State: s})
		}, ErrMismatch, "/payload/state/state_sha256"},
		{"a snapshot of another lineage", func() (*Request, *Response) {
			return respond(OpSnapshot, &Snapshotted{State: testState(2, "test.impl", `{}`)})
		}, ErrMismatch, "/payload/state/generation"},
		{"a matching migration", func() (*Request, *Response) { return respond(OpMigrate, &Migrated{State: migrated}) }, 0, ""},
		{"a migration to the wrong lineage", func() (*Request, *Response) {
			return respond(OpMigrate, &Migrated{State: testState(3, "test.impl", `{}`)})
		}, ErrMismatch, "/payload/state/generation"},
		{"a migration keeping the old implementation", func() (*Request, *Response) {
			return respond(OpMigrate, &Migrated{State: testState(2, "old.impl", `{}`)})
		}, ErrMismatch, "/payload/state/implementation_id"},
		{"a matching restore", func() (*Request, *Response) { return respond(OpRestore, ack(snapState)) }, 0, ""},
		{"a restore repeating another digest", func() (*Request, *Response) {
			a := ack(snapState)
			a.StateSHA256 = testDigest
			return respond(OpRestore, a)
		}, ErrMismatch, "/payload/state_sha256"},
		{"readiness for another lineage", func() (*Request, *Response) {
			p := reqs[OpReadiness].Payload.(*ReadinessRequest)
			return respond(OpReadiness, &Ready{RunID: p.RunID, Generation: 2, StateSchema: p.StateSchema, StateSHA256: p.StateSHA256})
		}, ErrMismatch, "/payload/generation"},
		{"a failure with a 128-byte code and a 4096-byte message", func() (*Request, *Response) {
			return respond(OpStart, &Failed{Code: strings.Repeat("c", 128), Message: strings.Repeat("m", 4096)})
		}, 0, ""},
		{"a failure with a 129-byte code", func() (*Request, *Response) {
			return respond(OpStart, &Failed{Code: strings.Repeat("c", 129)})
		}, ErrTooLarge, "/payload/code"},
		{"a failure with a 4097-byte message", func() (*Request, *Response) {
			return respond(OpStart, &Failed{Code: "c", Message: strings.Repeat("m", 4097)})
		}, ErrTooLarge, "/payload/message"},
		{"a failure without a code", func() (*Request, *Response) { return respond(OpStart, &Failed{}) }, ErrInvalid, "/payload/code"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, resp := tc.pair()
			// Through the wire, as the host sees it.
			b, err := AppendResponse(nil, resp)
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := DecodeResponse(b)
			if err != nil {
				t.Fatalf("DecodeResponse(%s): %v", b, err)
			}
			err = Correlate(req, decoded, &testContracts)
			if tc.kind == 0 {
				if err != nil {
					t.Fatalf("Correlate: %v", err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Kind != tc.kind || pe.Pointer != tc.pointer {
				t.Fatalf("Correlate: %v, want kind %v at %q", err, tc.kind, tc.pointer)
			}
		})
	}
}

func TestCheckObservationEnforcesRunSchemaSequenceAndSize(t *testing.T) {
	want := ObservationExpectation{Protocol: ProtocolV2, ImplementationID: "i", Module: "m", RunID: "r", Schema: testContracts.Observation, LastSequence: 5, HaveLast: true}
	obs := func(edit func(*Observation)) *Observation {
		o := &Observation{Protocol: ProtocolV2, ImplementationID: "i", Module: "m", RunID: "r", Sequence: 6, Schema: testContracts.Observation, Observation: jsontext.Value(`{}`)}
		edit(o)
		return o
	}
	cases := []struct {
		name    string
		o       *Observation
		want    ObservationExpectation
		kind    ErrorKind
		pointer string
	}{
		{"the next sequence", obs(func(*Observation) {}), want, 0, ""},
		{"a skipped sequence", obs(func(o *Observation) { o.Sequence = 100 }), want, 0, ""},
		{"a first observation starting anywhere", obs(func(o *Observation) { o.Sequence = 42 }), ObservationExpectation{Protocol: ProtocolV2, ImplementationID: "i", Module: "m", RunID: "r", Schema: testContracts.Observation}, 0, ""},
		{"a repeated sequence", obs(func(o *Observation) { o.Sequence = 5 }), want, ErrMismatch, "/sequence"},
		{"a regressing sequence", obs(func(o *Observation) { o.Sequence = 1 }), want, ErrMismatch, "/sequence"},
		{"another run", obs(func(o *Observation) { o.RunID = "other" }), want, ErrMismatch, "/run_id"},
		{"no active run", obs(func(*Observation) {}), ObservationExpectation{Protocol: ProtocolV2, ImplementationID: "i", Module: "m", Schema: testContracts.Observation}, ErrMismatch, "/run_id"},
		{"another schema", obs(func(o *Observation) { o.Schema = testContracts.Consumer }), want, ErrMismatch, "/schema"},
		{"an observation of exactly 512 KiB", obs(func(o *Observation) {
			o.Observation = jsontext.Value(`"` + strings.Repeat("x", MaxPayloadBytes-2) + `"`)
		}), want, 0, ""},
		{"an observation one byte over 512 KiB", obs(func(o *Observation) {
			o.Observation = jsontext.Value(`"` + strings.Repeat("x", MaxPayloadBytes-1) + `"`)
		}), want, ErrTooLarge, "/observation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckObservation(tc.o, tc.want)
			if tc.kind == 0 {
				if err != nil {
					t.Fatalf("CheckObservation: %v", err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Kind != tc.kind || pe.Pointer != tc.pointer {
				t.Fatalf("CheckObservation: %v, want kind %v at %q", err, tc.kind, tc.pointer)
			}
		})
	}
}

func TestTheStateDigestIsOverSerdeJSONsCanonicalBytes(t *testing.T) {
	// The canonical form serde_json prints: keys sorted, compact, <&> and
	// U+2028 literal, floats with .0 or an exponent without +.
	raw := jsontext.Value("{ \"b\": [1e21, 100.0, 0.00000015], \"a\": \"<&>\u2028é\", \"\": {\"y\":1,\"x\":2} }")
	canonical := "{\"\":{\"x\":2,\"y\":1},\"a\":\"<&>\u2028é\",\"b\":[1e21,100.0,1.5e-7]}"
	sum := sha256.Sum256([]byte(canonical))
	got, err := StateDigest(raw)
	if err != nil || got != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("StateDigest = %s, %v; want the digest of %s", got, err, canonical)
	}
}

func TestTheLineReaderStopsAtItsCap(t *testing.T) {
	const max = 100
	line := func(n int) string { return strings.Repeat("a", n) + "\n" }
	cases := []struct {
		name  string
		input string
		want  []string
		err   ErrorKind
		eof   bool
	}{
		{"a frame of exactly the cap", line(max), []string{strings.Repeat("a", max)}, 0, true},
		{"a frame one byte over the cap", line(max + 1), nil, ErrTooLarge, false},
		{"an unterminated frame over the cap", strings.Repeat("a", max+1), nil, ErrTooLarge, false},
		{"an unterminated last frame", "ab\ncd", []string{"ab"}, ErrMalformed, false},
		{"empty frames are frames", "\n\n", []string{"", ""}, 0, true},
		{"a clean end", "", nil, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read: frames cross every buffer boundary.
			lr := NewLineReader(iotest.OneByteReader(strings.NewReader(tc.input)), max)
			var got []string
			var err error
			for {
				var b []byte
				b, err = lr.Next()
				if err != nil {
					break
				}
				got = append(got, string(b))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("frames %q, want %q", got, tc.want)
			}
			if tc.eof != errors.Is(err, io.EOF) || (tc.err != 0 && KindOf(err) != tc.err) {
				t.Fatalf("ended with %v", err)
			}
		})
	}
	// Past the 64 KiB buffer: a 1 MiB frame, exactly the protocol's cap.
	big := strings.Repeat("b", MaxFrameBytes)
	lr := NewLineReader(strings.NewReader(big+"\n"+big+"b\n"), MaxFrameBytes)
	if b, err := lr.Next(); err != nil || len(b) != MaxFrameBytes {
		t.Fatalf("a 1 MiB frame: %d bytes, %v", len(b), err)
	}
	if _, err := lr.Next(); KindOf(err) != ErrTooLarge {
		t.Fatalf("a 1 MiB + 1 frame: %v", err)
	}
}
