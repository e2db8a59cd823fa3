package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/test/pkgruntimetest"
)

// runtimeManifest lays binary out in a directory the provider uid can
// traverse, with a package-runtime manifest beside it pinning its digest,
// and returns the manifest's path.
func runtimeManifest(t *testing.T, binary, revision string) string {
	t.Helper()
	dir := providertest.Dir(t)
	digest := pkgruntimetest.Install(t, dir, binary)
	m := fmt.Sprintf(`{"schema_id":"iteron-package-runtime/1","package_revision_id":%q,"runtime_protocol_version":"quixos.runtime/1",`+
		`"module":"prompt_system","export_ids":["get","put","watch"],"executable":"runtime","artifact_sha256":%q,`+
		`"deadlines":{"handshake_ms":10000,"invoke_ms":10000,"cancel_ms":1000},`+
		`"limits":{"max_message_bytes":1048576,"max_concurrent_invocations":8,"max_watches":4}}`, revision, digest)
	return writeFile(t, filepath.Join(dir, "runtime.json"), m)
}

func TestConformanceDrivesAPackageRuntimeWhicheverWayItWasWritten(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runtimes are launched as uid 65534: run as root")
	}
	dir := t.TempDir()
	bins, err := pkgruntimetest.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	notInitial, err := pkgruntimetest.BuildSeedWithFault(dir, "not-initial")
	if err != nil {
		t.Fatal(err)
	}
	wrongProof, err := pkgruntimetest.BuildSeedWithFault(dir, "wrong-proof")
	if err != nil {
		t.Fatal(err)
	}
	kvFlags := []string{"--invoke", `get={"key":"k"}`, "--invoke", `put={"key":"k","value":{"n":[1,2.5,null]}}`, "--watch", `watch={"key":"k"}`}
	cases := []struct {
		name     string
		manifest string
		extra    []string
		code     int
		out      []string
	}{
		{"the SDK's kv conforms", runtimeManifest(t, bins[pkgruntimetest.KV], "kv-1.0.0"), kvFlags, 0,
			[]string{"ok    handshake", "ok    invoke put", "ok    watch watch: first event", "ok    watch watch: stream ends after cancel",
				"runtime exit status 0 after SIGTERM", "conformant: 11 checks passed"}},
		{"a runtime written from the proto alone conforms", runtimeManifest(t, bins[pkgruntimetest.Seed], "seed-kv-1"), kvFlags, 0,
			[]string{"ok    status of invoke get", "ok    watch watch: cancel", "conformant: 11 checks passed", "sandbox applied: mode=enforce level=isolated"}},
		{"a first watch event without initial is a violation, shown", runtimeManifest(t, notInitial, "seed-kv-1"), kvFlags, 1,
			[]string{"FAIL  watch watch: first event", "the first event of a watch must have initial set", `message: { "watchId": "inv-4"`, "not conformant: 1 violation(s)"}},
		{"a wrong proof fails the launch", runtimeManifest(t, wrongProof, "seed-kv-1"), kvFlags, 1,
			[]string{"FAIL  launch and handshake: activation_failed: handshake.authentication_proof: does not prove the launch key", "not conformant: the runtime did not start"}},
		{"an export the manifest lacks is a usage error", runtimeManifest(t, bins[pkgruntimetest.KV], "kv-1.0.0"), []string{"--watch", "nope"}, 2, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"conformance", "--kind", "package-runtime", "--sandbox-launcher=" + providertest.SandboxLauncher(t), c.manifest}, c.extra...)
			code, out, errOut := runCLI(t, "", args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, out, errOut)
			}
			for _, want := range c.out {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
