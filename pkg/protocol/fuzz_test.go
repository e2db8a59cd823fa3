package protocol

import (
	"bytes"
	"errors"
	"io"
	"testing"
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
