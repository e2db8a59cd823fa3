package protocol

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// benchPayload is a JSON document of about n bytes shaped like a real input.
func benchPayload(n int) jsontext.Value {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < n-200; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"id":%d,"role":"user","text":"lorem ipsum dolor sit amet, consectetur adipiscing elit","score":%d.25}`, i, i%97)
	}
	b.WriteString(`]}`)
	return jsontext.Value(b.String())
}

func BenchmarkCodec(b *testing.B) {
	for _, n := range []int{200, 64 << 10, 500 << 10} {
		in := benchPayload(n)
		req := &Request{Envelope: env(V1, "host-2"), Payload: &StartRequest{LifecycleContract: testContracts.Start, RunID: "run-1",
			CandidateSHA256: testDigest, InputSchema: testContracts.Consumer, Input: in, DeadlineMs: 5000}}
		reqFrame, _ := MarshalRequest(req, V1, &testContracts)
		obsFrame, _ := AppendObservation(nil, &Observation{Protocol: ProtocolV1, ImplementationID: "test.impl", Module: "prompt_system", RunID: "run-1", Schema: testContracts.Observation, Terminal: true, Observation: in})
		b.Run(fmt.Sprintf("ValidPayload/%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for i := 0; i < b.N; i++ {
				if err := ValidPayload(in, MaxPayloadBytes); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("MarshalRequest/%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for i := 0; i < b.N; i++ {
				if _, err := MarshalRequest(req, V1, &testContracts); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("DecodeRequest+Validate/%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for i := 0; i < b.N; i++ {
				r, err := DecodeRequest(reqFrame)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Validate(V1, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("DecodeFrame/%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for i := 0; i < b.N; i++ {
				if _, err := DecodeFrame(obsFrame); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("LineReader/%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			data := append(bytes.Clone(obsFrame), '\n')
			for i := 0; i < b.N; i++ {
				if _, err := NewLineReader(bytes.NewReader(data), MaxFrameBytes).Next(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
