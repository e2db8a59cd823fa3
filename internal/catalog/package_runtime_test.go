package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// validPackageRuntime is a package-runtime manifest with every member set
// and within bounds, as a generic object that rows can edit.
func validPackageRuntime() map[string]any {
	return map[string]any{
		"schema_id":                PackageRuntimeSchemaID,
		"package_revision_id":      "kv-1.0.0",
		"runtime_protocol_version": PackageRuntimeProtocol,
		"module":                   "prompt_system",
		"export_ids":               []any{"get", "put", "watch"},
		"requested_capabilities":   []any{"read_only"},
		"executable":               "bin/kv",
		"artifact_sha256":          strings.Repeat("ab", 32),
		"deadlines":                map[string]any{"handshake_ms": 5000, "invoke_ms": 10000, "cancel_ms": 2000},
		"limits":                   map[string]any{"max_message_bytes": 1 << 20, "max_concurrent_invocations": 64, "max_watches": 16},
	}
}

// goldenPackageRuntimeCanonical is validPackageRuntime's canonical bytes, in
// the documented member order (docs/reference/package-runtimes.md).
const goldenPackageRuntimeCanonical = `{"schema_id":"iteron-package-runtime/1","package_revision_id":"kv-1.0.0",` +
	`"runtime_protocol_version":"quixos.runtime/1","module":"prompt_system","export_ids":["get","put","watch"],` +
	`"requested_capabilities":["read_only"],"executable":"bin/kv",` +
	`"artifact_sha256":"abababababababababababababababababababababababababababababababab",` +
	`"deadlines":{"handshake_ms":5000,"invoke_ms":10000,"cancel_ms":2000},` +
	`"limits":{"max_message_bytes":1048576,"max_concurrent_invocations":64,"max_watches":16}}`

func TestAPackageRuntimeManifestParsesAndDigestsItsCanonicalBytes(t *testing.T) {
	m, err := ParsePackageRuntimeManifest(mustJSON(t, validPackageRuntime()))
	if err != nil {
		t.Fatal(err)
	}
	want := PackageRuntimeManifest{
		SchemaID: PackageRuntimeSchemaID, PackageRevisionID: "kv-1.0.0", RuntimeProtocolVersion: PackageRuntimeProtocol,
		Module: "prompt_system", ExportIDs: []string{"get", "put", "watch"}, RequestedCapabilities: []string{"read_only"},
		Executable: "bin/kv", ArtifactSHA256: strings.Repeat("ab", 32),
		Deadlines: PackageRuntimeDeadlines{HandshakeMs: 5000, InvokeMs: 10000, CancelMs: 2000},
		Limits:    PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 64, MaxWatches: 16},
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("parsed %+v\nwant   %+v", m, want)
	}
	digest, err := PackageRuntimeManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(goldenPackageRuntimeCanonical))
	if wantDigest := "sha256:" + hex.EncodeToString(sum[:]); digest != wantDigest {
		t.Fatalf("digest %s, want %s (sha256 of the documented canonical bytes)", digest, wantDigest)
	}
	// The canonical bytes parse back to the same manifest, whatever order the
	// members were written in.
	again, err := ParsePackageRuntimeManifest([]byte(goldenPackageRuntimeCanonical))
	if err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("canonical bytes parse to %+v, %v", again, err)
	}
	if !m.HasExport("put") || m.HasExport("delete") {
		t.Fatal("HasExport disagrees with export_ids")
	}
}

func TestAnAbsentCapabilityListIsEmptyAndDigestsAsWrittenOut(t *testing.T) {
	absent := validPackageRuntime()
	delete(absent, "requested_capabilities")
	empty := validPackageRuntime()
	empty["requested_capabilities"] = []any{}
	a, err := ParsePackageRuntimeManifest(mustJSON(t, absent))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParsePackageRuntimeManifest(mustJSON(t, empty))
	if err != nil {
		t.Fatal(err)
	}
	if a.RequestedCapabilities == nil || len(a.RequestedCapabilities) != 0 {
		t.Fatalf("absent requested_capabilities = %#v, want []", a.RequestedCapabilities)
	}
	da, _ := PackageRuntimeManifestDigest(a)
	db, _ := PackageRuntimeManifestDigest(b)
	if da != db {
		t.Fatalf("absent and empty capability lists digest differently: %s, %s", da, db)
	}
}

func TestEveryMemberTakesPartInTheDigest(t *testing.T) {
	base, err := ParsePackageRuntimeManifest(mustJSON(t, validPackageRuntime()))
	if err != nil {
		t.Fatal(err)
	}
	d0, _ := PackageRuntimeManifestDigest(base)
	edits := map[string]func(m *PackageRuntimeManifest){
		"package_revision_id":               func(m *PackageRuntimeManifest) { m.PackageRevisionID = "kv-1.0.1" },
		"module":                            func(m *PackageRuntimeManifest) { m.Module = "other" },
		"export_ids":                        func(m *PackageRuntimeManifest) { m.ExportIDs = []string{"get"} },
		"requested_capabilities":            func(m *PackageRuntimeManifest) { m.RequestedCapabilities = nil },
		"executable":                        func(m *PackageRuntimeManifest) { m.Executable = "bin/kv2" },
		"artifact_sha256":                   func(m *PackageRuntimeManifest) { m.ArtifactSHA256 = strings.Repeat("cd", 32) },
		"deadlines.handshake_ms":            func(m *PackageRuntimeManifest) { m.Deadlines.HandshakeMs++ },
		"deadlines.invoke_ms":               func(m *PackageRuntimeManifest) { m.Deadlines.InvokeMs++ },
		"deadlines.cancel_ms":               func(m *PackageRuntimeManifest) { m.Deadlines.CancelMs++ },
		"limits.max_message_bytes":          func(m *PackageRuntimeManifest) { m.Limits.MaxMessageBytes++ },
		"limits.max_concurrent_invocations": func(m *PackageRuntimeManifest) { m.Limits.MaxConcurrentInvocations++ },
		"limits.max_watches":                func(m *PackageRuntimeManifest) { m.Limits.MaxWatches++ },
	}
	for field, edit := range edits {
		m := base
		m.ExportIDs = append([]string(nil), base.ExportIDs...)
		edit(&m)
		if d, _ := PackageRuntimeManifestDigest(m); d == d0 {
			t.Errorf("changing %s leaves the digest unchanged", field)
		}
	}
}

func TestPackageRuntimeManifestRejections(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(m map[string]any)
		raw    string
		field  string
		detail string
	}{
		{name: "a missing schema_id is refused", edit: func(m map[string]any) { delete(m, "schema_id") }, field: "schema_id", detail: "required field missing"},
		{name: "another schema_id is refused", edit: func(m map[string]any) { m["schema_id"] = "iteron-package-runtime/2" }, field: "schema_id", detail: `is not "iteron-package-runtime/1"`},
		{name: "another protocol is refused", edit: func(m map[string]any) { m["runtime_protocol_version"] = "quixos.runtime/2" }, field: "runtime_protocol_version", detail: "not supported"},
		{name: "a revision with a slash is refused", edit: func(m map[string]any) { m["package_revision_id"] = "kv/1" }, field: "package_revision_id", detail: "[A-Za-z0-9._-]"},
		{name: "a module that is not snake_case is refused", edit: func(m map[string]any) { m["module"] = "Prompt" }, field: "module", detail: "not a module ID"},
		{name: "no exports are refused", edit: func(m map[string]any) { m["export_ids"] = []any{} }, field: "export_ids", detail: "at least one"},
		{name: "unsorted exports are refused", edit: func(m map[string]any) { m["export_ids"] = []any{"put", "get"} }, field: "export_ids[1]", detail: "sorted"},
		{name: "a repeated export is refused", edit: func(m map[string]any) { m["export_ids"] = []any{"get", "get"} }, field: "export_ids[1]", detail: "listed twice"},
		{name: "65 exports are refused", edit: func(m map[string]any) {
			ids := make([]any, 65)
			for i := range ids {
				ids[i] = fmt.Sprintf("e%03d", i)
			}
			m["export_ids"] = ids
		}, field: "export_ids", detail: "65 IDs exceed 64"},
		{name: "an unknown capability is refused", edit: func(m map[string]any) { m["requested_capabilities"] = []any{"root"} }, field: "requested_capabilities[0]", detail: "root"},
		{name: "an executable outside the root is refused", edit: func(m map[string]any) { m["executable"] = "../kv" }, field: "executable", detail: "not a local relative path"},
		{name: "a prefixed artifact digest is refused", edit: func(m map[string]any) { m["artifact_sha256"] = "sha256:" + strings.Repeat("ab", 32) }, field: "artifact_sha256", detail: "64 lowercase hex"},
		{name: "missing deadlines are refused", edit: func(m map[string]any) { delete(m, "deadlines") }, field: "deadlines", detail: "required field missing"},
		{name: "a missing cancel deadline is refused", edit: func(m map[string]any) { delete(m["deadlines"].(map[string]any), "cancel_ms") }, field: "deadlines.cancel_ms", detail: "required field missing"},
		{name: "a zero handshake deadline is refused", edit: func(m map[string]any) { m["deadlines"].(map[string]any)["handshake_ms"] = 0 }, field: "deadlines.handshake_ms", detail: "0 is outside 1..300000"},
		{name: "an invoke deadline over an hour is refused", edit: func(m map[string]any) { m["deadlines"].(map[string]any)["invoke_ms"] = 3_600_001 }, field: "deadlines.invoke_ms", detail: "outside 1..3600000"},
		{name: "a message bound under 1 KiB is refused", edit: func(m map[string]any) { m["limits"].(map[string]any)["max_message_bytes"] = 1023 }, field: "limits.max_message_bytes", detail: "1023 is outside 1024..16777216"},
		{name: "zero watches are refused", edit: func(m map[string]any) { m["limits"].(map[string]any)["max_watches"] = 0 }, field: "limits.max_watches", detail: "outside 1..1024"},
		{name: "missing limits are refused", edit: func(m map[string]any) { delete(m, "limits") }, field: "limits", detail: "required field missing"},
		{name: "an unknown member is refused", edit: func(m map[string]any) { m["argv"] = []any{} }, field: "argv", detail: "unknown"},
		{name: "a null member is refused", edit: func(m map[string]any) { m["requested_capabilities"] = nil }, field: "requested_capabilities", detail: "null is not a valid value"},
		{name: "a duplicate member is refused", raw: `{"schema_id":"iteron-package-runtime/1","schema_id":"iteron-package-runtime/1"}`, field: "schema_id", detail: "duplicate"},
		{name: "a file over 64 KiB is refused before parsing", raw: `{"schema_id":"` + strings.Repeat("x", 64<<10) + `"}`, field: "", detail: "exceed the bound of 65536 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := []byte(c.raw)
			if c.edit != nil {
				m := validPackageRuntime()
				c.edit(m)
				data = mustJSON(t, m)
			}
			_, err := ParsePackageRuntimeManifest(data)
			if err == nil {
				t.Fatalf("accepted %s", data)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			if e.Field != c.field {
				t.Errorf("field = %q, want %q (error: %v)", e.Field, c.field, err)
			}
			if !strings.Contains(err.Error(), c.detail) {
				t.Errorf("error %q does not say %q", err, c.detail)
			}
		})
	}
}

func TestAManifestIsToldFromACatalogBySchemaID(t *testing.T) {
	cases := []struct {
		name string
		data string
		want bool
	}{
		{"a package-runtime manifest is one", goldenPackageRuntimeCanonical, true},
		{"schema_id after other members still counts", `{"module":"m","schema_id":"x"}`, true},
		{"a catalog is not one", `{"schema_version":1,"implementations":[]}`, false},
		{"a schema_id nested below the top level does not count", `{"implementations":[{"schema_id":"x"}]}`, false},
		{"an array is not one", `[{"schema_id":"x"}]`, false},
		{"malformed bytes are not one", `{"module":`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := IsPackageRuntimeManifest([]byte(c.data)); got != c.want {
				t.Fatalf("IsPackageRuntimeManifest(%s) = %v, want %v", c.data, got, c.want)
			}
		})
	}
}
