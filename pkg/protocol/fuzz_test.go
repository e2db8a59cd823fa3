package protocol

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/strictjson"
)

// Fuzz targets for every parser of untrusted bytes in this package: the
// host's frame decoder, the provider's request decoder, response correlation
// and the capped line reader. Seed corpora are in testdata/fuzz/<FuzzName>/.

// reencodeFrame encodes a decoded frame again.
func reencodeFrame(f Frame) ([]byte, error) {
	if f.Response != nil {
		return AppendResponse(nil, f.Response)
	}
	return AppendObservation(nil, f.Observation)
}

func FuzzDecodeFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeFrame(data)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("DecodeFrame returned %T, not a *protocol.Error: %v", err, err)
			}
			return
		}
		if (fr.Response == nil) == (fr.Observation == nil) {
			t.Fatalf("a frame must be exactly one of response and observation: %+v", fr)
		}
		// Encoding what was decoded is stable: decode(encode(x)) encodes to
		// the same bytes again.
		e1, err := reencodeFrame(fr)
		if err != nil {
			return // e.g. a raw value with a carriage return that is not JSON whitespace-compactable
		}
		fr2, err := DecodeFrame(e1)
		if err != nil {
			t.Fatalf("re-encoded frame %q does not decode: %v", e1, err)
		}
		e2, err := reencodeFrame(fr2)
		if err != nil || !bytes.Equal(e1, e2) {
			t.Fatalf("re-encoding is not stable:\n%q\n%q (%v)", e1, e2, err)
		}
		if fr.Response != nil {
			for _, req := range requests() {
				_ = Correlate(req, fr.Response, &testContracts)
			}
		} else {
			_ = CheckObservation(fr.Observation, ObservationExpectation{Protocol: ProtocolV2, ImplementationID: "i", Module: "m", RunID: "r", Schema: testContracts.Observation})
		}
	})
}

func FuzzDecodeRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("DecodeRequest returned %T, not a *protocol.Error: %v", err, err)
			}
			return
		}
		for _, v := range []Version{V1, V2} {
			_ = req.Validate(v, nil)
			_ = req.Validate(v, &testContracts)
		}
		e1, err := AppendRequest(nil, req)
		if err != nil {
			return
		}
		req2, err := DecodeRequest(e1)
		if err != nil {
			t.Fatalf("re-encoded request %q does not decode: %v", e1, err)
		}
		e2, err := AppendRequest(nil, req2)
		if err != nil || !bytes.Equal(e1, e2) {
			t.Fatalf("re-encoding is not stable:\n%q\n%q (%v)", e1, e2, err)
		}
	})
}

func FuzzCorrelate(f *testing.F) {
	f.Fuzz(func(t *testing.T, reqFrame, respFrame []byte) {
		req, err := DecodeRequest(reqFrame)
		if err != nil {
			return
		}
		resp, err := DecodeResponse(respFrame)
		if err != nil {
			return
		}
		if err := Correlate(req, resp, &testContracts); err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Correlate returned %T, not a *protocol.Error: %v", err, err)
			}
			return
		}
		// What correlates answers this request and nothing else.
		if resp.Protocol != req.Protocol || resp.RequestID != req.RequestID || resp.ImplementationID != req.ImplementationID || resp.Module != req.Module {
			t.Fatalf("correlated envelopes differ: %+v vs %+v", resp.Envelope, req.Envelope)
		}
		if r := resp.Payload.Result(); r != ResultFailed && r != req.Payload.Operation().Success() {
			t.Fatalf("result %s correlated with operation %s", r, req.Payload.Operation())
		}
		if s, ok := resp.Payload.(*Snapshotted); ok {
			if d, err := StateDigest(s.State.State); err != nil || d != s.State.StateSHA256 {
				t.Fatalf("a snapshot correlated with a digest that is not its state's")
			}
		}
	})
}

func FuzzLineReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, max uint16) {
		lr := NewLineReader(bytes.NewReader(data), int(max))
		var lines [][]byte
		var err error
		for {
			var line []byte
			line, err = lr.Next()
			if err != nil {
				break
			}
			if len(line) > int(max) || bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("a %d-byte frame (cap %d) or one with a newline", len(line), max)
			}
			lines = append(lines, line)
		}
		if errors.Is(err, io.EOF) {
			var joined []byte
			for _, l := range lines {
				joined = append(append(joined, l...), '\n')
			}
			if !bytes.Equal(joined, data) {
				t.Fatalf("the frames do not add up to the input")
			}
		} else if KindOf(err) != ErrTooLarge && KindOf(err) != ErrMalformed {
			t.Fatalf("unexpected error %v", err)
		}
	})
}

// FuzzPayload is the differential target for the hot path: a Payload is
// checked by the hand-written validator once and then spliced into start
// frames without another look, while the full strict decoder (jsontext,
// strictjson.Valid) is the reference. For every input both must agree on
// accept or reject, and an accepted payload must come out of a start frame
// written by the fast path as the very bytes the full path writes and
// decodes.
func FuzzPayload(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := NewPayload(data)
		reference := strictjson.Valid(data, MaxPayloadBytes)
		if (err == nil) != (reference == nil) {
			t.Fatalf("NewPayload(%q) = %v; the strict decoder says %v", data, err, reference)
		}
		if err != nil {
			if KindOf(err) != ErrMalformed && KindOf(err) != ErrTooLarge {
				t.Fatalf("NewPayload(%q) refused with %v, not a malformed or too-large *Error", data, err)
			}
			return
		}
		// The full path: Input set as raw bytes, validated and compacted by
		// the writer.
		slow := &Request{Envelope: Envelope{Protocol: ProtocolV2, RequestID: "host-1", ImplementationID: "impl", Module: "m"},
			Payload: &StartRequest{LifecycleContract: testContracts.Start, RunID: "run-1", CandidateSHA256: testDigest,
				InputSchema: testContracts.Consumer, Input: jsontext.Value(data), DeadlineMs: 1000}}
		slowFrame, slowErr := MarshalRequest(slow, V2, &testContracts)
		// The fast path: the checked payload spliced as it is.
		fastReq := &StartRequest{LifecycleContract: testContracts.Start, RunID: "run-1", CandidateSHA256: testDigest,
			InputSchema: testContracts.Consumer, DeadlineMs: 1000}
		fastReq.SetInput(p)
		fast := &Request{Envelope: slow.Envelope, Payload: fastReq}
		fastFrame, fastErr := MarshalRequest(fast, V2, &testContracts)
		if (slowErr == nil) != (fastErr == nil) {
			t.Fatalf("input %q: the full path says %v, the fast path %v", data, slowErr, fastErr)
		}
		if slowErr != nil {
			if KindOf(slowErr) != ErrTooLarge {
				t.Fatalf("input %q accepted as a payload but refused in a frame: %v", data, slowErr)
			}
			return
		}
		slowGot, err := DecodeRequest(slowFrame)
		if err != nil {
			t.Fatalf("the full path's frame %q does not decode: %v", slowFrame, err)
		}
		fastGot, err := DecodeRequest(fastFrame)
		if err != nil {
			t.Fatalf("the fast path's frame %q does not decode: %v", fastFrame, err)
		}
		// The provider reads the very same bytes either way, and they are the
		// payload's.
		slowIn, fastIn := slowGot.Payload.(*StartRequest).Input, fastGot.Payload.(*StartRequest).Input
		if !bytes.Equal(fastIn, slowIn) || !bytes.Equal(fastIn, p.Raw()) {
			t.Fatalf("input %q: the provider reads %q by the fast path, %q by the full path; the payload is %q", data, fastIn, slowIn, p.Raw())
		}
		if bytes.IndexAny(data, "\r\n") < 0 && !bytes.Equal(p.Raw(), bytes.Trim(data, " \t")) {
			t.Fatalf("a one-line input %q became %q", data, p.Raw())
		}
	})
}

// FuzzFastDecoder is the differential target of the frame decoders: the
// fast mode (strictjson's scanning steps) against the full mode (jsontext's
// strict decoder), on every input read both as a provider → host frame and
// as a request. Whatever the fast mode accepts, the full mode accepts too,
// with the same values (raw values the same bytes); what the fast mode
// gives up on, the full mode decides.
func FuzzFastDecoder(f *testing.F) {
	for _, req := range requests() {
		b, err := AppendRequest(nil, req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > MaxFrameBytes {
			return
		}
		if fast, err := decodeFrame(&decoder{fast: true, src: data}); err == nil {
			full, ferr := decodeFrame(newDecoder(data))
			if ferr != nil {
				t.Fatalf("the fast mode accepts the frame %q, the full mode refuses it: %v", data, ferr)
			}
			if !reflect.DeepEqual(fast, full) {
				t.Fatalf("frame %q: the fast mode decodes\n%#v\nthe full mode\n%#v", data, fast, full)
			}
		}
		if fast, err := decodeRequest(&decoder{fast: true, src: data}); err == nil {
			full, ferr := decodeRequest(newDecoder(data))
			if ferr != nil {
				t.Fatalf("the fast mode accepts the request %q, the full mode refuses it: %v", data, ferr)
			}
			if !reflect.DeepEqual(fast, full) {
				t.Fatalf("request %q: the fast mode decodes\n%#v\nthe full mode\n%#v", data, fast, full)
			}
		}
	})
}

func TestTheFastDecoderTakesEveryFrameTheEncodersWrite(t *testing.T) {
	for _, req := range requests() {
		b, err := AppendRequest(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeRequest(&decoder{fast: true, src: b}); err != nil {
			t.Errorf("the fast mode gives %s up: %s", req.Payload.Operation(), b)
		}
	}
	for _, line := range encodedResponsesAndObservations(t) {
		if _, err := decodeFrame(&decoder{fast: true, src: line}); err != nil {
			t.Errorf("the fast mode gives up: %s", line)
		}
	}
}

// encodedResponsesAndObservations is one frame of every response result
// and an observation, as the encoders write them.
func encodedResponsesAndObservations(t *testing.T) [][]byte {
	c := testContracts
	st := State{Module: "prompt_system", ImplementationID: "impl", RunID: "lineage-prompt_system", Generation: 2,
		StateSchema: c.Snapshot, StateSHA256: testDigest, State: jsontext.Value(`{"count":{"a":3},"note":"é\n"}`)}
	env := Envelope{Protocol: ProtocolV2, RequestID: "host-7", ImplementationID: "impl", Module: "prompt_system"}
	var out [][]byte
	for _, p := range []ResponsePayload{
		&Loaded{ProviderContract: c.Provider, ObservationSchema: c.Observation}, &Started{RunID: "run-1"},
		&Cancelled{RunID: "run-1"}, &Stopped{}, &Snapshotted{State: st}, &Migrated{State: st},
		&Restored{RunID: st.RunID, Generation: 2, StateSchema: c.Snapshot, StateSHA256: testDigest},
		&Ready{RunID: st.RunID, Generation: 2, StateSchema: c.Snapshot, StateSHA256: testDigest},
		&Failed{Code: "invalid_request", Message: "a \"quoted\" message"},
	} {
		b, err := AppendResponse(nil, &Response{Envelope: env, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	b, err := AppendObservation(nil, &Observation{Protocol: ProtocolV2, ImplementationID: "impl", Module: "prompt_system", RunID: "run-1",
		Sequence: 3, Schema: c.Observation, Terminal: true, Observation: jsontext.Value(`{"items":[1,2.5,"x"],"ok":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	return append(out, b)
}
