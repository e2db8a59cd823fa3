package verifier

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
)

func validSourceJSON(module, id string) map[string]any {
	return map[string]any{
		"module": module, "implementation_id": id,
		"catalog_path": "/var/lib/iteron/providers/c.json", "artifact_root": "/var/lib/iteron/providers/" + id,
		"manifest_sha256": "sha256:" + strings.Repeat("1", 64), "artifact_sha256": "sha256:" + strings.Repeat("2", 64),
	}
}

func documentJSON(sources ...map[string]any) map[string]any {
	list := make([]any, len(sources))
	for i, s := range sources {
		list[i] = s
	}
	return map[string]any{"schema_version": 1, "candidate_sha256": candidate, "sources": list}
}

func marshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDocumentRejections has one row per document-level rule of
// docs/reference/activation.md and of the strict JSON rules; each fails the
// whole document and names the field.
func TestDocumentRejections(t *testing.T) {
	many := func(n int) []map[string]any {
		out := make([]map[string]any, n)
		for i := range out {
			out[i] = validSourceJSON(fmt.Sprintf("m%d", i), fmt.Sprintf("impl-%d", i))
		}
		return out
	}
	tests := []struct {
		name     string
		doc      map[string]any
		raw      string
		field    string
		code     string
		sentinel error
		detail   string
	}{
		{name: "a document over 128 KiB is refused before parsing",
			raw: `{"schema_version":1}` + strings.Repeat(" ", MaxDocumentBytes), field: "", code: "verification_failed", sentinel: catalog.ErrTooLarge, detail: "131072"},
		{name: "a duplicate top-level key is refused",
			raw: `{"schema_version":1,"schema_version":1}`, field: "schema_version", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "duplicate"},
		{name: "a duplicate key inside a source is refused",
			raw:   `{"schema_version":1,"candidate_sha256":"` + candidate + `","sources":[{"module":"a","module":"b"}]}`,
			field: "sources[0].module", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "duplicate"},
		{name: "an unknown top-level member is refused",
			doc:   func() map[string]any { d := documentJSON(); d["capability_ceiling"] = []any{}; return d }(),
			field: "capability_ceiling", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "unknown field"},
		{name: "an unknown source member is refused",
			doc: func() map[string]any {
				s := validSourceJSON("prompt_system", "a")
				s["catalogPath"] = "/x"
				return documentJSON(s)
			}(),
			field: "sources[0].catalogPath", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "unknown field"},
		{name: "trailing data is refused",
			raw: string(marshal(t, documentJSON())) + "{}", field: "", code: "schema_mismatch", sentinel: catalog.ErrMalformed},
		{name: "invalid UTF-8 is refused",
			raw: "{\"schema_version\":1,\"candidate_sha256\":\"\xc3\x28\"}", field: "candidate_sha256", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "UTF-8"},
		{name: "null is refused",
			raw: `{"schema_version":1,"candidate_sha256":null,"sources":[]}`, field: "candidate_sha256", code: "schema_mismatch", sentinel: catalog.ErrMalformed, detail: "null"},
		{name: "a string schema version is refused",
			raw: `{"schema_version":"1","candidate_sha256":"` + candidate + `","sources":[]}`, field: "schema_version", code: "schema_mismatch", sentinel: catalog.ErrMalformed},
		{name: "schema version 2 is refused",
			doc:   func() map[string]any { d := documentJSON(); d["schema_version"] = 2; return d }(),
			field: "schema_version", code: "unsupported_version", sentinel: ErrUnsupportedVersion},
		{name: "a missing schema version is refused",
			doc:   func() map[string]any { d := documentJSON(); delete(d, "schema_version"); return d }(),
			field: "schema_version", code: "schema_mismatch", sentinel: catalog.ErrMissingField},
		{name: "a missing candidate digest is refused",
			doc:   func() map[string]any { d := documentJSON(); delete(d, "candidate_sha256"); return d }(),
			field: "candidate_sha256", code: "schema_mismatch", sentinel: catalog.ErrMissingField},
		{name: "a missing source list is refused",
			doc:   func() map[string]any { d := documentJSON(); delete(d, "sources"); return d }(),
			field: "sources", code: "schema_mismatch", sentinel: catalog.ErrMissingField},
		{name: "a bare-hex candidate digest is refused",
			doc:   func() map[string]any { d := documentJSON(); d["candidate_sha256"] = strings.Repeat("a", 64); return d }(),
			field: "candidate_sha256", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "two sources for one module are refused",
			doc:   documentJSON(validSourceJSON("prompt_system", "a"), validSourceJSON("context_assembly", "b"), validSourceJSON("prompt_system", "c")),
			field: "sources[2].module", code: "verification_failed", sentinel: ErrDuplicate, detail: "sources[0]"},
		{name: "a repeated implementation ID is refused",
			doc:   documentJSON(validSourceJSON("prompt_system", "a"), validSourceJSON("context_assembly", "a")),
			field: "sources[1].implementation_id", code: "verification_failed", sentinel: ErrDuplicate, detail: "sources[0]"},
		{name: "more than 64 sources are refused",
			doc: documentJSON(many(65)...), field: "sources", code: "verification_failed", sentinel: ErrTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.raw == "" {
				data = marshal(t, tc.doc)
			}
			doc, err := ParseDocument(data)
			if doc != nil {
				t.Error("a rejected document came back non-nil")
			}
			expectVerifyError(t, err, tc.field, tc.code, tc.sentinel, tc.detail)
			// The verifier fails the whole document the same way.
			res, verr := newVerifier(t).VerifyDocument(data)
			if res != nil || verr == nil || verr.Error() != err.Error() {
				t.Errorf("VerifyDocument = %v, %v; want the document-level error", res, verr)
			}
		})
	}
}

func TestAMissingSourceMemberFailsOnlyThatSource(t *testing.T) {
	s := validSourceJSON("context_assembly", "b")
	delete(s, "artifact_root")
	data := marshal(t, documentJSON(validSourceJSON("prompt_system", "a"), s))
	res, err := newVerifier(t).VerifyDocument(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range res.Sources {
		if sr.Index == 1 {
			expectVerifyError(t, sr.Err, "sources[1].artifact_root", "schema_mismatch", catalog.ErrMissingField, "required")
		} else if errors.Is(sr.Err, catalog.ErrMissingField) {
			t.Errorf("source 0 reported a missing field: %v", sr.Err)
		}
	}
}

type pathVector struct {
	Path  string `json:"path"`
	Valid bool   `json:"valid"`
	Why   string `json:"why"`
}

// TestPathCheckRunsTheSharedVectors runs testdata/path-vectors.json, the table
// the CRD's CEL rule also runs, through the Go check and through a source's
// catalog_path and artifact_root.
func TestPathCheckRunsTheSharedVectors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "path-vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Vectors []pathVector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Vectors) < 10 {
		t.Fatalf("only %d vectors", len(table.Vectors))
	}
	extra := []pathVector{
		{Path: "/" + strings.Repeat("a", 511), Valid: true, Why: "512 bytes exactly"},
		{Path: "/" + strings.Repeat("a", 512), Valid: false, Why: "513 bytes"},
	}
	for _, v := range append(table.Vectors, extra...) {
		t.Run(fmt.Sprintf("%q (%s)", v.Path, v.Why), func(t *testing.T) {
			reason, ok := checkCanonicalPath(v.Path)
			if ok != v.Valid {
				t.Fatalf("checkCanonicalPath(%q) = %v (%s), want %v", v.Path, ok, reason, v.Valid)
			}
			for _, key := range []string{"catalog_path", "artifact_root"} {
				s := validSourceJSON("prompt_system", "a")
				s[key] = v.Path
				res, err := newVerifier(t).VerifyDocument(marshal(t, documentJSON(s)))
				if err != nil {
					t.Fatal(err)
				}
				got := res.Sources[0].Err
				if v.Valid {
					if errors.Is(got, ErrNotCanonical) {
						t.Errorf("%s: valid path refused as non-canonical: %v", key, got)
					}
					continue
				}
				expectVerifyError(t, got, "sources[0]."+key, "verification_failed", ErrNotCanonical, "")
			}
		})
	}
}

func TestDocumentRoundTripsThroughBothForms(t *testing.T) {
	in := marshal(t, documentJSON(validSourceJSON("prompt_system", "a"), validSourceJSON("context_assembly", "b")))
	doc, err := ParseDocument(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := doc.MarshalDocument()
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseDocument(out)
	if err != nil {
		t.Fatalf("MarshalDocument output does not parse: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(doc.Sources, again.Sources) || doc.CandidateSHA256 != again.CandidateSHA256 {
		t.Fatalf("round trip changed the document:\n%+v\n%+v", doc, again)
	}
	if !strings.HasPrefix(string(out), "{\n  \"schema_version\": 1,\n  \"candidate_sha256\"") {
		t.Fatalf("members out of the wire order:\n%s", out)
	}
	spec := doc.Spec("worker-1")
	if spec.NodeName != "worker-1" || spec.Sources[1].ArtifactRoot != "/var/lib/iteron/providers/b" {
		t.Fatalf("Spec = %+v", spec)
	}
	fromSpec, err := DocumentFromSpec(&spec)
	if err != nil {
		t.Fatal(err)
	}
	if fromSpec.Form != FormSpec || !reflect.DeepEqual(fromSpec.Sources, doc.Sources) {
		t.Fatalf("spec round trip changed the sources: %+v", fromSpec)
	}
}

func TestASpecCeilingIsSortedAndAnEmptySpecIsValid(t *testing.T) {
	spec := &v1alpha1.ImplementationActivationSpec{NodeName: "n", CandidateSHA256: candidate,
		CapabilityCeiling: []v1alpha1.Capability{"reversible_local", "read_only"}}
	doc, err := DocumentFromSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(doc.CapabilityCeiling, ",") != "read_only,reversible_local" {
		t.Fatalf("ceiling = %v", doc.CapabilityCeiling)
	}
	res, err := newVerifier(t).Verify(doc)
	if err != nil || len(res.Sources) != 0 || res.Err() != nil {
		t.Fatalf("empty activation: %+v, %v", res, err)
	}
	spec.CandidateSHA256 = "sha256:XYZ"
	_, err = DocumentFromSpec(spec)
	expectVerifyError(t, err, "spec.candidateSHA256", "verification_failed", ErrInvalidValue, "")
}

func TestNewVerifierRefusesABadConfiguration(t *testing.T) {
	if _, err := NewVerifier(Config{AllowedRoots: []string{"/var/lib/iteron/"}}); !errors.Is(err, ErrNotCanonical) {
		t.Fatalf("a non-canonical root: %v", err)
	}
	if _, err := NewVerifier(Config{AllowedRoots: []string{"relative"}}); !errors.Is(err, ErrNotCanonical) {
		t.Fatalf("a relative root: %v", err)
	}
	if _, err := NewVerifier(Config{Ceiling: []string{"sudo"}}); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("an unknown capability in the ceiling: %v", err)
	}
	v, err := NewVerifier(Config{})
	if err != nil || !v.Graph().IsBuiltin() {
		t.Fatalf("defaults: %v", err)
	}
}

func TestArtifactDigestStreamsTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "art")
	// Three and a half buffers: the loop must carry across reads.
	data := []byte(strings.Repeat("0123456789abcdef", HashBufferBytes*7/2/16))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ArtifactDigest(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "sha256:" + sha256Hex(data); got != want {
		t.Fatalf("ArtifactDigest = %s, want %s", got, want)
	}
	if err := os.Symlink(path, path+".link"); err != nil {
		t.Fatal(err)
	}
	if _, err := ArtifactDigest(path + ".link"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("a symlink: %v", err)
	}
	if _, err := ArtifactDigest(dir); !errors.Is(err, ErrNotRegularFile) {
		t.Fatalf("a directory: %v", err)
	}
	if _, err := ArtifactDigest(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
}

func TestHashingStopsAtTheBoundWhenAFileGrows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "art")
	if err := os.WriteFile(path, make([]byte, 3*HashBufferBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The size check passed earlier; the file is now larger than the limit.
	if _, n, err := hashOpenFile(f, 2*HashBufferBytes); !errors.Is(err, ErrTooLarge) || n > 3*HashBufferBytes {
		t.Fatalf("hashOpenFile past its limit: n=%d err=%v", n, err)
	}
}

func TestLaunchPlanAccessorsReturnCopies(t *testing.T) {
	p := NewLaunchPlanForTest(t, LaunchPlanFields{Argv: []string{"a"}, AdmittedCapabilities: []string{"read_only"}})
	p.Argv()[0] = "mutated"
	p.AdmittedCapabilities()[0] = "mutated"
	if p.Argv()[0] != "a" || p.AdmittedCapabilities()[0] != "read_only" {
		t.Fatal("a plan was mutated through an accessor")
	}
}
