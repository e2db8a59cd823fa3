package artifacts

import (
	"strings"
	"testing"
)

// FuzzParseManifest: the artifact-manifest parser never panics, and what it
// accepts keeps every rule of the format (seed corpus in
// testdata/fuzz/FuzzParseManifest).
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(validManifest))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			if m != nil {
				t.Fatal("a manifest and an error")
			}
			return
		}
		if m.Catalog.Size > MaxCatalogBytes || len(m.Executables) == 0 || len(m.Executables) > MaxExecutables {
			t.Fatalf("accepted out of bounds: %+v", m)
		}
		ids := map[string]bool{}
		for _, e := range m.Executables {
			if e.Layer.Size > MaxExecutableBytes || PlainName(e.Name) != nil || strings.ContainsAny(e.Name, "/\x00") || ids[e.ImplementationID] || e.Mode > 0o777 {
				t.Fatalf("accepted a bad executable layer: %+v", e)
			}
			ids[e.ImplementationID] = true
		}
		_, _ = ParseIndex(data, NodePlatform())
	})
}

const validManifest = `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.iteron.provider.v1","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[{"mediaType":"application/vnd.iteron.provider.catalog.v1+json","digest":"sha256:dab11146e443a1b3fcc2cba684e7c1a2b5dff968e8738b91b52455df693f96e3","size":683,"annotations":{"org.opencontainers.image.title":"catalog.json"}},{"mediaType":"application/vnd.iteron.provider.executable.v1","digest":"sha256:7a68741fc66869aa6588dbf4d5590842aa8cadfd6086ad02ae4ab86be08b1fdd","size":4567095,"annotations":{"dev.iteron.provider.file-mode":"0755","dev.iteron.provider.implementation-id":"counter.gc-b","dev.iteron.provider.module":"prompt_system","org.opencontainers.image.title":"provider"}}]}`

func TestTheFormatRefusesWhatBreaksItsRules(t *testing.T) {
	if _, err := ParseManifest([]byte(validManifest)); err != nil {
		t.Fatalf("the valid seed: %v", err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"a file name with a slash", `"org.opencontainers.image.title":"provider"`, `"org.opencontainers.image.title":"../provider"`, "plain file name"},
		{"a file name that is ..", `"org.opencontainers.image.title":"provider"`, `"org.opencontainers.image.title":".."`, "plain file name"},
		{"another artifact type", `application/vnd.iteron.provider.v1"`, `application/vnd.example.v1"`, "not a provider artifact"},
		{"a duplicate member", `"schemaVersion":2,`, `"schemaVersion":2,"schemaVersion":2,`, "duplicate"},
		{"an unknown member", `"schemaVersion":2,`, `"schemaVersion":2,"extra":1,`, "unknown"},
		{"a foreign URL", `"size":683,`, `"size":683,"urls":["https://example.com/x"],`, "foreign URLs"},
		{"a sha512 digest", `sha256:dab11146`, `sha512:dab11146`, "not sha256"},
		{"an over-bound catalog", `"size":683`, `"size":600000`, "catalog bound"},
		{"a mode that is not octal", `"0755"`, `"0999"`, "octal"},
		{"an unknown layer type", `application/vnd.iteron.provider.executable.v1`, `application/vnd.oci.image.layer.v1.tar`, "neither"},
		{"no implementation ID", `"dev.iteron.provider.implementation-id":"counter.gc-b",`, ``, "implementation-id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(validManifest, tc.from, tc.to, 1)
			_, err := ParseManifest([]byte(data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want an error containing %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}
