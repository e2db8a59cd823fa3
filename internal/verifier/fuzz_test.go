package verifier

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzParseDocument checks that document parsing never panics, that every
// rejection is a typed *Error with a reason code, and that an accepted
// document survives both conversions: raw JSON written back, and the
// ImplementationActivation spec form.
func FuzzParseDocument(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"candidate_sha256":"` + candidate + `","sources":[]}`))
	f.Add([]byte(`{"schema_version":1,"candidate_sha256":"` + candidate + `","sources":[{"module":"prompt_system","implementation_id":"a","catalog_path":"/c.json","artifact_root":"/r","manifest_sha256":"` + candidate + `","artifact_sha256":"` + candidate + `"}]}`))
	f.Add([]byte(`{"schema_version":1,"candidate_sha256":"` + candidate + `","sources":[{"module":"a"},{"module":"a"}]}`))
	f.Add([]byte(`{"schema_version":1,"schema_version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := ParseDocument(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.ReasonCode() == "" {
				t.Fatalf("untyped rejection %T: %v", err, err)
			}
			return
		}
		out, err := doc.MarshalDocument()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseDocument(out)
		if err != nil {
			t.Fatalf("written-back document refused: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(doc.Sources, again.Sources) || doc.CandidateSHA256 != again.CandidateSHA256 {
			t.Fatal("raw round trip changed the document")
		}
		spec := doc.Spec("node")
		fromSpec, err := DocumentFromSpec(&spec)
		if err != nil {
			t.Fatalf("spec form of an accepted document refused: %v", err)
		}
		if len(fromSpec.Sources) != len(doc.Sources) || (len(doc.Sources) > 0 && !reflect.DeepEqual(fromSpec.Sources, doc.Sources)) {
			t.Fatal("spec round trip changed the sources")
		}
	})
}
