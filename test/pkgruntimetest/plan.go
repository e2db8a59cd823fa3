package pkgruntimetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/strictjson"
)

// Install copies binary into root as "runtime" (mode 0755) and returns its
// digest as 64 lowercase hex digits, as a manifest's artifact_sha256 pins it.
func Install(tb testing.TB, root, binary string) string {
	tb.Helper()
	b, err := os.ReadFile(binary)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "runtime"), b, 0o755); err != nil {
		tb.Fatal(err)
	}
	digest, err := artifacts.FileSHA256(filepath.Join(root, "runtime"))
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimPrefix(digest, "sha256:")
}

// Plan lays binary out in a fresh artifact root (named "runtime") and mints,
// without verification, the launch plan of a package runtime filling
// module and answering the handshake as revision: exports get, put and
// watch, no capabilities, generous deadlines; edit adjusts the manifest
// before its digest is taken. The plan's deadlines are the manifest's, as
// the verifier mints them.
func Plan(tb testing.TB, module, binary, revision string, edit ...func(*catalog.PackageRuntimeManifest)) verifier.LaunchPlan {
	tb.Helper()
	root := providertest.Dir(tb)
	digest := Install(tb, root, binary)
	m := catalog.PackageRuntimeManifest{
		SchemaID: catalog.PackageRuntimeSchemaID, PackageRevisionID: revision, RuntimeProtocolVersion: catalog.PackageRuntimeProtocol,
		Module: module, ExportIDs: []string{"get", "put", "watch"}, RequestedCapabilities: []string{},
		Executable: "runtime", ArtifactSHA256: digest,
		Deadlines: catalog.PackageRuntimeDeadlines{HandshakeMs: 10_000, InvokeMs: 10_000, CancelMs: 500},
		Limits:    catalog.PackageRuntimeLimits{MaxMessageBytes: 1 << 20, MaxConcurrentInvocations: 8, MaxWatches: 8},
	}
	for _, e := range edit {
		e(&m)
	}
	manifestDigest, err := catalog.PackageRuntimeManifestDigest(m)
	if err != nil {
		tb.Fatal(err)
	}
	authority, err := strictjson.DigestOf([]string{})
	if err != nil {
		tb.Fatal(err)
	}
	return verifier.NewLaunchPlanForTest(tb, verifier.LaunchPlanFields{
		Module: module, ImplementationID: revision, ProtocolVersion: 1,
		ManifestSHA256: manifestDigest, ArtifactSHA256: "sha256:" + digest, ArtifactRoot: root, Executable: filepath.Join(root, "runtime"),
		CandidateSHA256: providertest.CandidateSHA256, AdmittedCapabilities: []string{}, AuthoritySHA256: authority,
		RuntimeDeadline:      time.Duration(m.Deadlines.InvokeMs) * time.Millisecond,
		CancellationDeadline: time.Duration(m.Deadlines.CancelMs) * time.Millisecond,
		EvidenceLimits:       verifier.EvidenceLimits{StderrBytes: 64 << 10},
		Contracts:            protocol.BuiltinContracts(module), FailurePolicy: "fail_closed", PackageRuntime: &m,
	})
}
