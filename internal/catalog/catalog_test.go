package catalog

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// validManifest is a manifest with every field set and within bounds, as a
// generic JSON object so that rows can delete or retype members.
func validManifest(id string) map[string]any {
	return map[string]any{
		"implementation_id":        id,
		"implementation_version":   []any{1, 2, 3},
		"module":                   "prompt_system",
		"artifact_sha256":          strings.Repeat("ab", 32),
		"executable":               "bin/provider",
		"argv":                     []any{"--mode", "fast"},
		"protocol_version":         2,
		"requested_capabilities":   []any{"read_only", "reversible_local"},
		"dependencies":             []any{},
		"runtime_deadline_ms":      60000,
		"cancellation_deadline_ms": 5000,
		"evidence_limits":          map[string]any{"stdout_bytes": 65536, "stderr_bytes": 4096, "observations": 16},
		"failure_policy":           "fail_closed",
	}
}

func catalogOf(manifests ...map[string]any) map[string]any {
	list := make([]any, len(manifests))
	for i, m := range manifests {
		list[i] = m
	}
	return map[string]any{"schema_version": 1, "implementations": list}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParseCatalogAcceptsAValidCatalog(t *testing.T) {
	dep := validManifest("base")
	m := validManifest("prompt-fast")
	m["dependencies"] = []any{map[string]any{"implementation_id": "base", "minimum_version": []any{1, 0, 0}}}
	c, err := ParseCatalog(mustJSON(t, catalogOf(dep, m)))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := c.Lookup("prompt-fast")
	if !ok || got.ImplementationVersion != (Version{1, 2, 3}) || got.Dependencies[0].MinimumVersion != (Version{1, 0, 0}) {
		t.Fatalf("Lookup = %+v, %v", got, ok)
	}
	if _, ok := c.Lookup("absent"); ok {
		t.Fatal("Lookup of an absent ID reported found")
	}
	if err := ValidateCatalog(c); err != nil {
		t.Fatalf("a parsed catalog does not validate: %v", err)
	}
}

func TestAbsentListsDefaultToEmptyAndDigestAsWrittenOut(t *testing.T) {
	explicit := validManifest("x")
	explicit["argv"], explicit["requested_capabilities"], explicit["dependencies"] = []any{}, []any{}, []any{}
	implicit := validManifest("x")
	delete(implicit, "argv")
	delete(implicit, "requested_capabilities")
	delete(implicit, "dependencies")
	a, err := ParseCatalog(mustJSON(t, catalogOf(explicit)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseCatalog(mustJSON(t, catalogOf(implicit)))
	if err != nil {
		t.Fatal(err)
	}
	m := b.Implementations[0]
	if m.Argv == nil || m.RequestedCapabilities == nil || m.Dependencies == nil {
		t.Fatalf("defaults not written out: %+v", m)
	}
	da, _ := ManifestDigest(a.Implementations[0])
	db, _ := ManifestDigest(m)
	if da != db {
		t.Fatalf("absent lists digest differently from explicit []: %s vs %s", da, db)
	}
}

// TestCatalogRejections has one row per rule of docs/reference/catalog.md (and
// the strict JSON rules as they apply to a catalog); each row asserts the
// field its error names and the reason code.
func TestCatalogRejections(t *testing.T) {
	set := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) { m[key] = v }
	}
	del := func(key string) func(map[string]any) { return func(m map[string]any) { delete(m, key) } }
	limit := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) { m["evidence_limits"].(map[string]any)[key] = v }
	}
	strs := func(n int, s string) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	deps := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = map[string]any{"implementation_id": fmt.Sprintf("d%d", i), "minimum_version": []any{1, 0, 0}}
		}
		return out
	}
	const m0 = "implementations[0]"
	tests := []struct {
		name     string
		manifest func(map[string]any) // edits implementations[0]
		raw      string               // a whole catalog, instead of manifest
		field    string
		code     string
		sentinel error
		detail   string
	}{
		// The catalog file.
		{name: "a catalog over 512 KiB is refused before parsing", raw: `{"schema_version":1,"implementations":[]}` + strings.Repeat(" ", MaxCatalogBytes),
			field: "", code: "verification_failed", sentinel: ErrTooLarge, detail: "524288"},
		{name: "a catalog of schema version 2 is refused", raw: `{"schema_version":2,"implementations":[]}`,
			field: "schema_version", code: "unsupported_version", sentinel: ErrUnsupportedVersion},
		{name: "a catalog without schema_version is refused", raw: `{"implementations":[]}`,
			field: "schema_version", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "a catalog without implementations is refused", raw: `{"schema_version":1}`,
			field: "implementations", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "an unknown top-level member is refused", raw: `{"schema_version":1,"implementations":[],"signed":true}`,
			field: "signed", code: "schema_mismatch", sentinel: ErrMalformed, detail: "unknown field"},
		{name: "a duplicate top-level key is refused", raw: `{"schema_version":1,"schema_version":1,"implementations":[]}`,
			field: "schema_version", code: "schema_mismatch", sentinel: ErrMalformed, detail: "duplicate"},
		{name: "trailing data after the catalog is refused", raw: `{"schema_version":1,"implementations":[]} {}`,
			field: "", code: "schema_mismatch", sentinel: ErrMalformed},
		{name: "invalid UTF-8 is refused", raw: "{\"schema_version\":1,\"implementations\":[],\"\xff\":1}",
			code: "schema_mismatch", sentinel: ErrMalformed, detail: "UTF-8"},
		{name: "a catalog that is not one JSON object is refused", raw: `[]`,
			field: "", code: "schema_mismatch", sentinel: ErrMalformed},

		// Manifest members as present or absent.
		{name: "an unknown manifest member is refused", manifest: set("signature", "x"),
			field: m0 + ".signature", code: "schema_mismatch", sentinel: ErrMalformed, detail: "unknown field"},
		{name: "an unknown evidence_limits member is refused", manifest: limit("stdin_bytes", 1),
			field: m0 + ".evidence_limits.stdin_bytes", code: "schema_mismatch", sentinel: ErrMalformed},
		{name: "a missing implementation_id is refused", manifest: del("implementation_id"),
			field: m0 + ".implementation_id", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "a missing evidence_limits member is refused", manifest: func(m map[string]any) { delete(m["evidence_limits"].(map[string]any), "observations") },
			field: m0 + ".evidence_limits.observations", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "a missing failure_policy is refused", manifest: del("failure_policy"),
			field: m0 + ".failure_policy", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "null for a defaulted list is refused", manifest: set("argv", nil),
			field: m0 + ".argv", code: "schema_mismatch", sentinel: ErrMalformed, detail: "null"},
		{name: "a string where a number belongs is refused", manifest: set("runtime_deadline_ms", "60000"),
			field: m0 + ".runtime_deadline_ms", code: "schema_mismatch", sentinel: ErrMalformed},

		// implementation_id.
		{name: "an empty implementation_id is refused", manifest: set("implementation_id", ""),
			field: m0 + ".implementation_id", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "an implementation_id over 96 bytes is refused", manifest: set("implementation_id", strings.Repeat("a", 97)),
			field: m0 + ".implementation_id", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "an implementation_id with a slash is refused", manifest: set("implementation_id", "vendor/impl"),
			field: m0 + ".implementation_id", code: "verification_failed", sentinel: ErrInvalidValue},
		// implementation_version.
		{name: "version 0.0.0 is refused", manifest: set("implementation_version", []any{0, 0, 0}),
			field: m0 + ".implementation_version", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a version of two components is refused", manifest: set("implementation_version", []any{1, 0}),
			field: m0 + ".implementation_version", code: "schema_mismatch", sentinel: ErrMalformed},
		{name: "a negative version component is refused", manifest: set("implementation_version", []any{1, -1, 0}),
			field: m0 + ".implementation_version[1]", code: "schema_mismatch", sentinel: ErrMalformed},
		// module.
		{name: "a dotted module ID is refused", manifest: set("module", "prompt.system"),
			field: m0 + ".module", code: "verification_failed", sentinel: ErrInvalidValue},
		// artifact_sha256.
		{name: "a prefixed artifact_sha256 is refused inside a manifest", manifest: set("artifact_sha256", "sha256:"+strings.Repeat("ab", 32)),
			field: m0 + ".artifact_sha256", code: "verification_failed", sentinel: ErrInvalidValue, detail: "no sha256: prefix"},
		{name: "an uppercase artifact_sha256 is refused", manifest: set("artifact_sha256", strings.Repeat("AB", 32)),
			field: m0 + ".artifact_sha256", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a short artifact_sha256 is refused", manifest: set("artifact_sha256", "abcd"),
			field: m0 + ".artifact_sha256", code: "verification_failed", sentinel: ErrInvalidValue},
		// executable.
		{name: "an absolute executable is refused", manifest: set("executable", "/bin/sh"),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue, detail: "not a local relative path"},
		{name: "an executable escaping the root is refused", manifest: set("executable", "../other/bin"),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "an unclean executable is refused", manifest: set("executable", "bin/./provider"),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue, detail: "not clean"},
		{name: "an executable with a trailing slash is refused", manifest: set("executable", "bin/"),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "an executable with a backslash is refused", manifest: set("executable", `bin\provider`),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue, detail: "backslash"},
		{name: "an empty executable is refused", manifest: set("executable", ""),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "the root itself as executable is refused", manifest: set("executable", "."),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "an executable over 512 bytes is refused", manifest: set("executable", strings.Repeat("a/", 256)+"b"),
			field: m0 + ".executable", code: "verification_failed", sentinel: ErrInvalidValue},
		// argv.
		{name: "more than 64 argv entries are refused", manifest: set("argv", strs(65, "x")),
			field: m0 + ".argv", code: "verification_failed", sentinel: ErrTooLarge},
		{name: "an argv entry over 1 KiB is refused", manifest: set("argv", []any{"ok", strings.Repeat("x", 1025)}),
			field: m0 + ".argv[1]", code: "verification_failed", sentinel: ErrTooLarge},
		{name: "argv over 16 KiB in all is refused", manifest: set("argv", strs(17, strings.Repeat("x", 1000))),
			field: m0 + ".argv", code: "verification_failed", sentinel: ErrTooLarge, detail: "in all"},
		{name: "an argv entry with NUL is refused", manifest: set("argv", []any{"a\x00b"}),
			field: m0 + ".argv[0]", code: "verification_failed", sentinel: ErrInvalidValue, detail: "NUL"},
		// protocol_version.
		{name: "protocol version 3 is refused", manifest: set("protocol_version", 3),
			field: m0 + ".protocol_version", code: "unsupported_version", sentinel: ErrUnsupportedVersion},
		{name: "protocol version 0 is refused", manifest: set("protocol_version", 0),
			field: m0 + ".protocol_version", code: "unsupported_version", sentinel: ErrUnsupportedVersion},
		// requested_capabilities.
		{name: "an unknown capability is refused", manifest: set("requested_capabilities", []any{"read_only", "root"}),
			field: m0 + ".requested_capabilities[1]", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "unsorted capabilities are refused", manifest: set("requested_capabilities", []any{"reversible_local", "read_only"}),
			field: m0 + ".requested_capabilities[1]", code: "verification_failed", sentinel: ErrInvalidValue, detail: "sorted"},
		{name: "a repeated capability is refused", manifest: set("requested_capabilities", []any{"read_only", "read_only"}),
			field: m0 + ".requested_capabilities[1]", code: "verification_failed", sentinel: ErrDuplicate},
		// dependencies.
		{name: "more than 64 dependencies are refused", manifest: set("dependencies", deps(65)),
			field: m0 + ".dependencies", code: "verification_failed", sentinel: ErrTooLarge},
		{name: "a dependency with a bad implementation_id is refused", manifest: set("dependencies", []any{map[string]any{"implementation_id": "a b", "minimum_version": []any{1, 0, 0}}}),
			field: m0 + ".dependencies[0].implementation_id", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a dependency without minimum_version is refused", manifest: set("dependencies", []any{map[string]any{"implementation_id": "base"}}),
			field: m0 + ".dependencies[0].minimum_version", code: "schema_mismatch", sentinel: ErrMissingField},
		{name: "a manifest depending on itself is refused", manifest: set("dependencies", []any{map[string]any{"implementation_id": "impl-0", "minimum_version": []any{1, 0, 0}}}),
			field: m0 + ".dependencies[0].implementation_id", code: "dependency_cycle", sentinel: ErrCycle},
		{name: "a dependency listed twice is refused", manifest: set("dependencies", []any{
			map[string]any{"implementation_id": "impl-1", "minimum_version": []any{1, 0, 0}},
			map[string]any{"implementation_id": "impl-1", "minimum_version": []any{2, 0, 0}}}),
			field: m0 + ".dependencies[1].implementation_id", code: "verification_failed", sentinel: ErrDuplicate},
		{name: "a catalog that is not dependency-closed is refused whole", manifest: set("dependencies", []any{map[string]any{"implementation_id": "elsewhere", "minimum_version": []any{1, 0, 0}}}),
			field: m0 + ".dependencies[0].implementation_id", code: "verification_failed", sentinel: ErrNotDependencyClosed, detail: "dependency-closed"},
		// Deadlines.
		{name: "a runtime deadline of 0 is refused", manifest: set("runtime_deadline_ms", 0),
			field: m0 + ".runtime_deadline_ms", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a runtime deadline over an hour is refused", manifest: set("runtime_deadline_ms", 3_600_001),
			field: m0 + ".runtime_deadline_ms", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a cancellation deadline of 0 is refused", manifest: set("cancellation_deadline_ms", 0),
			field: m0 + ".cancellation_deadline_ms", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "a cancellation deadline over five minutes is refused", manifest: set("cancellation_deadline_ms", 300_001),
			field: m0 + ".cancellation_deadline_ms", code: "verification_failed", sentinel: ErrInvalidValue},
		// Evidence limits.
		{name: "stdout_bytes over 4 MiB is refused", manifest: limit("stdout_bytes", 4<<20+1),
			field: m0 + ".evidence_limits.stdout_bytes", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "stderr_bytes over 4 MiB is refused", manifest: limit("stderr_bytes", 4<<20+1),
			field: m0 + ".evidence_limits.stderr_bytes", code: "verification_failed", sentinel: ErrInvalidValue},
		{name: "more than 4096 observations are refused", manifest: limit("observations", 4097),
			field: m0 + ".evidence_limits.observations", code: "verification_failed", sentinel: ErrInvalidValue},
		// failure_policy.
		{name: "an unknown failure policy is refused", manifest: set("failure_policy", "fail_open"),
			field: m0 + ".failure_policy", code: "verification_failed", sentinel: ErrInvalidValue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.raw == "" {
				m := validManifest("impl-0")
				tc.manifest(m)
				data = mustJSON(t, catalogOf(m, validManifest("impl-1")))
			}
			c, err := ParseCatalog(data)
			if c != nil {
				t.Errorf("a rejected catalog came back non-nil")
			}
			expectError(t, err, tc.field, tc.code, tc.sentinel, tc.detail)
		})
	}
}

func TestCatalogCountAndUniquenessRules(t *testing.T) {
	t.Run("more than 256 manifests are refused", func(t *testing.T) {
		ms := make([]map[string]any, 257)
		for i := range ms {
			ms[i] = validManifest(fmt.Sprintf("impl-%d", i))
			delete(ms[i], "argv")
		}
		_, err := ParseCatalog(mustJSON(t, catalogOf(ms...)))
		expectError(t, err, "implementations", "verification_failed", ErrTooLarge, "257")
	})
	t.Run("256 manifests are accepted", func(t *testing.T) {
		ms := make([]map[string]any, 256)
		for i := range ms {
			ms[i] = validManifest(fmt.Sprintf("impl-%d", i))
		}
		if _, err := ParseCatalog(mustJSON(t, catalogOf(ms...))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a repeated implementation_id is refused", func(t *testing.T) {
		_, err := ParseCatalog(mustJSON(t, catalogOf(validManifest("a"), validManifest("b"), validManifest("a"))))
		expectError(t, err, "implementations[2].implementation_id", "verification_failed", ErrDuplicate, "implementations[0]")
	})
	t.Run("a duplicate key deep inside a manifest is refused", func(t *testing.T) {
		raw := `{"schema_version":1,"implementations":[{"evidence_limits":{"stdout_bytes":1,"stdout_bytes":2}}]}`
		_, err := ParseCatalog([]byte(raw))
		expectError(t, err, "implementations[0].evidence_limits.stdout_bytes", "schema_mismatch", ErrMalformed, "duplicate")
	})
}

func TestValidateCatalogAppliesTheFileRules(t *testing.T) {
	c, err := ParseCatalog(mustJSON(t, catalogOf(validManifest("a"))))
	if err != nil {
		t.Fatal(err)
	}
	c.Implementations[0].Dependencies = []Dependency{{ImplementationID: "missing", MinimumVersion: Version{1, 0, 0}}}
	expectError(t, ValidateCatalog(c), "implementations[0].dependencies[0].implementation_id", "verification_failed", ErrNotDependencyClosed, "")
	c.SchemaVersion = 3
	expectError(t, ValidateCatalog(c), "schema_version", "unsupported_version", ErrUnsupportedVersion, "")
	m := c.Implementations[0]
	m.Executable = "/abs"
	expectError(t, ValidateManifest(m), "executable", "verification_failed", ErrInvalidValue, "")
}

func TestParseManifestReadsALoneManifest(t *testing.T) {
	m, err := ParseManifest(mustJSON(t, validManifest("lone")))
	if err != nil {
		t.Fatal(err)
	}
	if m.ImplementationID != "lone" || !slices.Equal(m.Argv, []string{"--mode", "fast"}) {
		t.Fatalf("ParseManifest = %+v", m)
	}
	bad := validManifest("lone")
	bad["protocol_version"] = 9
	_, err = ParseManifest(mustJSON(t, bad))
	expectError(t, err, "protocol_version", "unsupported_version", ErrUnsupportedVersion, "")
}

// goldenManifest holds every string hazard of the canonical encoding:
// non-ASCII, <&>, U+2028/U+2029, a control character and a quote.
func goldenManifest() Manifest {
	return Manifest{
		ImplementationID:       "golden.impl-1",
		ImplementationVersion:  Version{1, 2, 3},
		Module:                 "prompt_system",
		ArtifactSHA256:         strings.Repeat("0f", 32),
		Executable:             "bin/provider",
		Argv:                   []string{"<&>", "héllo ✓", "line\u2028sep\u2029", "tab\there", `quote"back\slash`, "\x01"},
		ProtocolVersion:        2,
		RequestedCapabilities:  []string{"read_only"},
		Dependencies:           []Dependency{{ImplementationID: "base", MinimumVersion: Version{0, 1, 0}}},
		RuntimeDeadlineMs:      60000,
		CancellationDeadlineMs: 5000,
		EvidenceLimits:         EvidenceLimits{StdoutBytes: 65536, StderrBytes: 4096, Observations: 16},
		FailurePolicy:          "fail_closed",
	}
}

// goldenCanonical is what serde_json::to_vec prints for goldenManifest: field
// order as declared, no escaping of <&> or U+2028/U+2029, \t and \u0001.
const goldenCanonical = `{"implementation_id":"golden.impl-1","implementation_version":[1,2,3],"module":"prompt_system",` +
	`"artifact_sha256":"0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f","executable":"bin/provider",` +
	`"argv":["<&>","héllo ✓","line` + "\u2028" + `sep` + "\u2029" + `","tab\there","quote\"back\\slash","\u0001"],"protocol_version":2,` +
	`"requested_capabilities":["read_only"],"dependencies":[{"implementation_id":"base","minimum_version":[0,1,0]}],` +
	`"runtime_deadline_ms":60000,"cancellation_deadline_ms":5000,` +
	`"evidence_limits":{"stdout_bytes":65536,"stderr_bytes":4096,"observations":16},"failure_policy":"fail_closed"}`

func TestManifestDigestEqualsSha256sumOfTheCanonicalBytes(t *testing.T) {
	sha256sum, err := exec.LookPath("sha256sum")
	if err != nil {
		t.Skip("sha256sum not installed")
	}
	path := filepath.Join(t.TempDir(), "manifest.canonical.json")
	if err := os.WriteFile(path, []byte(goldenCanonical), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sha256sum, path).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "sha256:" + strings.Fields(string(out))[0]
	got, err := ManifestDigest(goldenManifest())
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("ManifestDigest = %s, sha256sum of the canonical bytes = %s", got, want)
	}
	// The same bytes parsed back (through a catalog, strictly) digest the same.
	base := validManifest("base")
	cat := `{"schema_version":1,"implementations":[` + string(mustJSON(t, base)) + `,` + goldenCanonical + `]}`
	c, err := ParseCatalog([]byte(cat))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := c.Lookup("golden.impl-1")
	if again, _ := ManifestDigest(m); again != want {
		t.Fatalf("digest after a parse round trip = %s, want %s", again, want)
	}
	// The committed golden vector pins the value across changes to the encoder.
	const pinned = "testdata/manifest-golden.sha256"
	if data, err := os.ReadFile(pinned); err == nil {
		if strings.TrimSpace(string(data)) != want {
			t.Fatalf("%s = %s, computed %s", pinned, strings.TrimSpace(string(data)), want)
		}
	} else {
		t.Fatalf("golden digest file missing: %v", err)
	}
}

func TestManifestDigestDependsOnEveryField(t *testing.T) {
	base, _ := ManifestDigest(goldenManifest())
	edits := map[string]func(*Manifest){
		"implementation_id":        func(m *Manifest) { m.ImplementationID = "other" },
		"implementation_version":   func(m *Manifest) { m.ImplementationVersion[2]++ },
		"module":                   func(m *Manifest) { m.Module = "context_assembly" },
		"artifact_sha256":          func(m *Manifest) { m.ArtifactSHA256 = strings.Repeat("0e", 32) },
		"executable":               func(m *Manifest) { m.Executable = "bin/other" },
		"argv":                     func(m *Manifest) { m.Argv = m.Argv[1:] },
		"protocol_version":         func(m *Manifest) { m.ProtocolVersion = 1 },
		"requested_capabilities":   func(m *Manifest) { m.RequestedCapabilities = nil },
		"dependencies":             func(m *Manifest) { m.Dependencies = nil },
		"runtime_deadline_ms":      func(m *Manifest) { m.RuntimeDeadlineMs++ },
		"cancellation_deadline_ms": func(m *Manifest) { m.CancellationDeadlineMs++ },
		"evidence_limits":          func(m *Manifest) { m.EvidenceLimits.Observations++ },
		"failure_policy":           func(m *Manifest) { m.FailurePolicy = "request_host_fallback" },
	}
	for field, edit := range edits {
		m := goldenManifest()
		edit(&m)
		if d, _ := ManifestDigest(m); d == base {
			t.Errorf("changing %s does not change the digest", field)
		}
	}
}

func TestVersionOrdering(t *testing.T) {
	cases := []struct {
		a, b Version
		want int
	}{
		{Version{1, 2, 3}, Version{1, 2, 3}, 0},
		{Version{1, 2, 3}, Version{1, 10, 0}, -1},
		{Version{2, 0, 0}, Version{1, 99, 99}, 1},
		{Version{1, 2, 4}, Version{1, 2, 3}, 1},
	}
	for _, c := range cases {
		if got := c.a.Compare(c.b); got != c.want {
			t.Errorf("%s.Compare(%s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	if s := (Version{1, 20, 3}).String(); s != "1.20.3" {
		t.Errorf("String = %q", s)
	}
}

func TestFieldPathSpellsPointersAsFields(t *testing.T) {
	cases := map[string]string{
		"":                        "",
		"/sources/2/catalog_path": "sources[2].catalog_path",
		"/a~1b/0":                 "a/b[0]",
		"/implementations/10":     "implementations[10]",
	}
	for ptr, want := range cases {
		if got := FieldPath("", ptr); got != want {
			t.Errorf("FieldPath(%q) = %q, want %q", ptr, got, want)
		}
	}
	if got := FieldPath("spec", "/sources/0/module"); got != "spec.sources[0].module" {
		t.Errorf("with prefix: %q", got)
	}
}

func TestErrorsWithoutAFieldReadAsTheirDetail(t *testing.T) {
	e := &Error{Detail: "too big", Code: "verification_failed", Err: ErrTooLarge}
	if e.Error() != "too big" || !errors.Is(e, ErrTooLarge) {
		t.Fatalf("Error() = %q", e.Error())
	}
}
