package verifier

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"iteron.dev/operator/api/v1alpha1"
)

func TestASourcesSandboxFieldsReachItsDocumentInBytesAndMillis(t *testing.T) {
	mem, cpu, tmp := resource.MustParse("768Mi"), resource.MustParse("250m"), resource.MustParse("8Mi")
	spec := &v1alpha1.ImplementationActivationSpec{NodeName: "n", CandidateSHA256: candidate, Sources: []v1alpha1.ActivationSource{{
		Module: "prompt_system", ImplementationID: "a", CatalogPath: "/var/lib/iteron/providers/a/catalog.json", ArtifactRoot: "/var/lib/iteron/providers/a",
		ManifestSHA256: candidate, ArtifactSHA256: candidate,
		Sandbox: &v1alpha1.SourceSandbox{Require: v1alpha1.SandboxLevelIsolated, Memory: &mem, CPU: &cpu, Tasks: ptr.To[int32](64), Tmp: &tmp},
	}}}
	doc, err := DocumentFromSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := SandboxRequest{Require: "isolated", MemoryBytes: 768 << 20, CPUMillis: 250, Tasks: 64, TmpBytes: 8 << 20}
	if got := doc.Sources[0].Sandbox; got != want {
		t.Errorf("sandbox request %+v, want %+v", got, want)
	}
	for _, c := range []struct {
		name  string
		edit  func(*v1alpha1.SourceSandbox)
		field string
	}{
		{"an unknown level", func(s *v1alpha1.SourceSandbox) { s.Require = "Strict" }, "spec.sources[0].sandbox.require"},
		{"a negative memory bound", func(s *v1alpha1.SourceSandbox) { q := resource.MustParse("-1Mi"); s.Memory = &q }, "spec.sources[0].sandbox.memory"},
		{"no tasks", func(s *v1alpha1.SourceSandbox) { s.Tasks = ptr.To[int32](0) }, "spec.sources[0].sandbox.tasks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := spec.DeepCopy()
			c.edit(bad.Sources[0].Sandbox)
			_, err := DocumentFromSpec(bad)
			expectVerifyError(t, err, c.field, "verification_failed", ErrInvalidValue, "")
		})
	}
}

func TestARelayedPlanKeepsItsSandboxRequestAndRefusesAnUnknownLevel(t *testing.T) {
	f := LaunchPlanFields{
		Module: "prompt_system", ImplementationID: "a", ProtocolVersion: 2, ManifestSHA256: candidate, ArtifactSHA256: candidate,
		ArtifactRoot: "/var/lib/iteron/providers/a", Executable: "/var/lib/iteron/providers/a/p", CandidateSHA256: candidate,
		AdmittedCapabilities: []string{}, AuthoritySHA256: candidate, RuntimeDeadline: time.Minute, CancellationDeadline: time.Second,
		EvidenceLimits: EvidenceLimits{StdoutBytes: 1, StderrBytes: 1, Observations: 1},
	}
	f.Sandbox = SandboxRequest{Require: "limits", MemoryBytes: 1 << 30}
	p, err := RelayedPlan(f)
	if err != nil {
		t.Fatal(err)
	}
	if p.Sandbox() != f.Sandbox || p.Fields().Sandbox != f.Sandbox {
		t.Errorf("relayed sandbox %+v, want %+v", p.Sandbox(), f.Sandbox)
	}
	f.Sandbox.Require = "strict"
	if _, err := RelayedPlan(f); err == nil {
		t.Errorf("a relayed plan with level strict was accepted")
	}
}
