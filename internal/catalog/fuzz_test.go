package catalog

import (
	stdjson "encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/strictjson"
)

// FuzzStrictJSON checks the strict decoder against the standard library and
// the canonical encoder against itself: what strictjson accepts is valid JSON
// to encoding/json too; DecodeStrict accepts exactly that minus any input
// holding a null; the canonical form is strict JSON again, and
// canonicalizing is idempotent.
func FuzzStrictJSON(f *testing.F) {
	for _, seed := range []string{
		`{}`, `[]`, `{"a":1,"b":[true,false,null],"c":{"d":"é<&>\u2028"}}`, `{"a":1,"a":2}`,
		`{"a":{"b":1,"b":1}}`, `1e400`, `-0`, `0.1`, `"\ud800"`, "\"\xff\"", `{"a":1} {}`, `123456789012345678901234567890`,
		`[1.5e-7,1e21,100.0]`, `{"k":"\u0000\u001f"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v jsontext.Value
		err := strictjson.Decode(data, &v, 1<<20)
		var withNullRule jsontext.Value
		derr := DecodeStrict(data, &withNullRule, 1<<20, "")
		if err != nil {
			if derr == nil {
				t.Fatalf("DecodeStrict accepted what strictjson refused (%v): %q", err, data)
			}
			return
		}
		var tree any
		dec := stdjson.NewDecoder(strings.NewReader(string(data)))
		dec.UseNumber()
		if uerr := dec.Decode(&tree); uerr != nil {
			t.Fatalf("strictjson accepted %q, encoding/json refuses it: %v", data, uerr)
		}
		if hasNull(tree) != (derr != nil) {
			t.Fatalf("null rule disagrees with the tree: hasNull=%v, DecodeStrict=%v, input %q", hasNull(tree), derr, data)
		}
		if !stdjson.Valid(data) {
			t.Fatalf("strictjson accepted invalid JSON %q", data)
		}
		canon, err := strictjson.CanonicalValue(data)
		if err != nil {
			if strings.Contains(err.Error(), "out of range") {
				return // a number beyond float64, refused as serde_json does
			}
			t.Fatalf("CanonicalValue of accepted input %q: %v", data, err)
		}
		if err := strictjson.Valid(canon, 1<<21); err != nil {
			t.Fatalf("canonical form %q is not strict JSON: %v", canon, err)
		}
		again, err := strictjson.CanonicalValue(canon)
		if err != nil || string(again) != string(canon) {
			t.Fatalf("canonicalization is not idempotent:\n%q\n%q (%v)", canon, again, err)
		}
	})
}

func hasNull(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		for _, e := range x {
			if hasNull(e) {
				return true
			}
		}
	case map[string]any:
		for _, e := range x {
			if hasNull(e) {
				return true
			}
		}
	}
	return false
}

// FuzzParseCatalog checks that catalog parsing never panics, that whatever
// it accepts passes ValidateCatalog, and that an accepted catalog written back
// canonically parses to an equal catalog with equal manifest digests.
func FuzzParseCatalog(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"implementations":[]}`))
	f.Add([]byte(`{"schema_version":1,"implementations":[` + goldenCanonical + `,{"implementation_id":"base","implementation_version":[0,1,0],"module":"prompt_system","artifact_sha256":"` + strings.Repeat("ab", 32) + `","executable":"p","protocol_version":1,"runtime_deadline_ms":1,"cancellation_deadline_ms":1,"evidence_limits":{"stdout_bytes":0,"stderr_bytes":0,"observations":0},"failure_policy":"request_host_quarantine"}]}`))
	f.Add([]byte(`{"schema_version":1,"implementations":[{"implementation_id":"a","implementation_id":"b"}]}`))
	f.Add([]byte(`{"schema_version":1,"implementations":[{"argv":null}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCatalog(data)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || ce.ReasonCode() == "" {
				t.Fatalf("untyped rejection %T: %v", err, err)
			}
			return
		}
		if err := ValidateCatalog(c); err != nil {
			t.Fatalf("accepted catalog does not validate: %v", err)
		}
		canon, err := strictjson.Canonical(c)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseCatalog(canon)
		if err != nil {
			t.Fatalf("canonical form of an accepted catalog is refused: %v\n%s", err, canon)
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("round trip changed the catalog")
		}
		for i := range c.Implementations {
			a, _ := ManifestDigest(c.Implementations[i])
			b, _ := ManifestDigest(again.Implementations[i])
			if a != b {
				t.Fatalf("digest changed over a round trip: %s vs %s", a, b)
			}
		}
	})
}

// FuzzParseSeamGraph checks that graph parsing never panics and that an
// accepted graph is acyclic, bounded and consistent with its accessors.
func FuzzParseSeamGraph(f *testing.F) {
	f.Add([]byte(`{"schema_version":2,"modules":[]}`))
	f.Add(BuiltinSeamGraphJSON())
	f.Add(v3Graph(f, 3, requirementsGraph()...))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := ParseSeamGraph(data)
		if err != nil {
			return
		}
		if g.Len() < 1 || g.Len() > MaxCustomModules || g.findCycle() != nil {
			t.Fatalf("accepted a graph of %d modules or with a cycle", g.Len())
		}
		for i, m := range g.Modules() {
			if o, ok := g.Order(m); !ok || o != i || !IsModuleID(m) || len(g.Dependencies(m))+len(g.Requirements(m)) > MaxGraphDependencies {
				t.Fatalf("module %q inconsistent", m)
			}
			if g.SchemaVersion() == SeamGraphSchemaVersion && (g.Requirements(m) != nil || g.SchemaHashes(m) != nil) {
				t.Fatalf("a version 2 graph carries version 3 members at %q", m)
			}
			for _, r := range g.Requirements(m) {
				switch {
				case (r.Module == "") == (r.Contract == ""):
					t.Fatalf("requirement of %q names %q and %q", m, r.Module, r.Contract)
				case r.Module != "" && (!g.Has(r.Module) || r.Module == m):
					t.Fatalf("requirement of %q on %q accepted", m, r.Module)
				case r.Contract != "" && len(g.Providers(r.Contract)) == 0:
					t.Fatalf("requirement of %q on unprovided %q accepted", m, r.Contract)
				case r.Select != "" && !slices.Contains(g.Providers(r.Contract), r.Select):
					t.Fatalf("selection %q does not provide %q", r.Select, r.Contract)
				case r.Range.Minimum != nil && r.Range.Maximum != nil && r.Range.Minimum.Compare(*r.Range.Maximum) >= 0:
					t.Fatalf("empty range %s accepted", r.Range)
				}
			}
			for k, h := range g.SchemaHashes(m) {
				if !IsDigest(h) {
					t.Fatalf("schema hash %s=%q of %q accepted", k, h, m)
				}
			}
		}
	})
}

// FuzzParsePackageRuntimeManifest checks that package-runtime manifest
// parsing never panics, rejects with a typed error, and that whatever it
// accepts validates, is recognised by its schema_id, and parses back from its
// canonical bytes to an equal manifest with an equal digest.
func FuzzParsePackageRuntimeManifest(f *testing.F) {
	f.Add([]byte(goldenPackageRuntimeCanonical))
	f.Add([]byte(`{"schema_id":"iteron-package-runtime/1","schema_id":"x"}`))
	f.Add([]byte(`{"schema_id":"iteron-package-runtime/1","export_ids":["b","a"]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParsePackageRuntimeManifest(data)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || ce.ReasonCode() == "" {
				t.Fatalf("untyped rejection %T: %v", err, err)
			}
			return
		}
		if err := ValidatePackageRuntimeManifest(m); err != nil {
			t.Fatalf("accepted manifest does not validate: %v", err)
		}
		if !IsPackageRuntimeManifest(data) {
			t.Fatalf("accepted manifest is not recognised by its schema_id: %s", data)
		}
		canon, err := strictjson.Canonical(m)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParsePackageRuntimeManifest(canon)
		if err != nil {
			t.Fatalf("canonical form of an accepted manifest is refused: %v\n%s", err, canon)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("round trip changed the manifest")
		}
		a, _ := PackageRuntimeManifestDigest(m)
		b, _ := PackageRuntimeManifestDigest(again)
		if a != b {
			t.Fatalf("digest changed over a round trip: %s vs %s", a, b)
		}
	})
}
