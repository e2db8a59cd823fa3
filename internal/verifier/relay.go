package verifier

import (
	"fmt"
	"path/filepath"
	"slices"

	"iteron.dev/operator/pkg/protocol"
)

// Fields returns a copy of the plan's fields: what a manager sends to the
// survivor (docs/survivor.md) so that it can run the verified provider.
func (p LaunchPlan) Fields() LaunchPlanFields {
	return LaunchPlanFields{
		Module: p.module, ImplementationID: p.implementationID, Version: p.version,
		ProtocolVersion: p.protocolVersion, ManifestSHA256: p.manifestSHA256,
		ArtifactSHA256: p.artifactSHA256, ArtifactRoot: p.artifactRoot, Executable: p.executable,
		Argv: slices.Clone(p.argv), CandidateSHA256: p.candidateSHA256,
		AdmittedCapabilities: slices.Clone(p.admitted), AuthoritySHA256: p.authoritySHA256,
		RuntimeDeadline: p.runtimeDeadline, CancellationDeadline: p.cancellationDeadline,
		EvidenceLimits: p.limits, Contracts: p.contracts, FailurePolicy: p.failurePolicy,
		Sandbox: p.sandbox,
	}
}

// RelayedPlan re-mints, in the survivor, a plan that the node's manager
// minted with its verifier and relayed over the fenced control socket
// (docs/survivor.md). It is the survivor's door and no other caller's: the
// survivor authenticates the manager first (peer credentials and the
// state-dir lock), and runs the plan only with the sealed executable the
// manager handed it, whose bytes it hashes to ArtifactSHA256 itself. Every
// field is checked here, naming the field that is wrong.
func RelayedPlan(f LaunchPlanFields) (LaunchPlan, error) {
	bad := func(field, format string, args ...any) (LaunchPlan, error) {
		return LaunchPlan{}, fmt.Errorf("relayed plan: %s: %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case protocol.ValidModule(f.Module) != nil:
		return bad("module", "%v", protocol.ValidModule(f.Module))
	case protocol.ValidID(f.ImplementationID) != nil:
		return bad("implementation_id", "%v", protocol.ValidID(f.ImplementationID))
	case f.ProtocolVersion != 1 && f.ProtocolVersion != 2:
		return bad("protocol_version", "%d, want 1 or 2", f.ProtocolVersion)
	case protocol.ValidDigest(f.ManifestSHA256) != nil:
		return bad("manifest_sha256", "%v", protocol.ValidDigest(f.ManifestSHA256))
	case protocol.ValidDigest(f.ArtifactSHA256) != nil:
		return bad("artifact_sha256", "%v", protocol.ValidDigest(f.ArtifactSHA256))
	case protocol.ValidDigest(f.CandidateSHA256) != nil:
		return bad("candidate_sha256", "%v", protocol.ValidDigest(f.CandidateSHA256))
	case protocol.ValidDigest(f.AuthoritySHA256) != nil:
		return bad("authority_sha256", "%v", protocol.ValidDigest(f.AuthoritySHA256))
	case !cleanAbs(f.ArtifactRoot):
		return bad("artifact_root", "%q must be an absolute, clean path", f.ArtifactRoot)
	case !cleanAbs(f.Executable) || !within(f.Executable, f.ArtifactRoot):
		return bad("executable", "%q must be an absolute, clean path under the artifact root %q", f.Executable, f.ArtifactRoot)
	case len(f.Argv) > 64:
		return bad("argv", "%d arguments, at most 64", len(f.Argv))
	case protocol.ValidCapabilities(f.AdmittedCapabilities) != nil:
		return bad("admitted_capabilities", "%v", protocol.ValidCapabilities(f.AdmittedCapabilities))
	case f.RuntimeDeadline <= 0 || f.CancellationDeadline <= 0:
		return bad("deadlines", "runtime %v and cancellation %v must be positive", f.RuntimeDeadline, f.CancellationDeadline)
	case f.EvidenceLimits.StdoutBytes <= 0 || f.EvidenceLimits.StderrBytes < 0 || f.EvidenceLimits.Observations <= 0:
		return bad("evidence_limits", "%+v", f.EvidenceLimits)
	case !slices.Contains([]string{"", "none", "limits", "isolated"}, f.Sandbox.Require):
		return bad("sandbox.require", "%q is not a sandbox level", f.Sandbox.Require)
	case f.Sandbox.MemoryBytes < 0 || f.Sandbox.CPUMillis < 0 || f.Sandbox.Tasks < 0 || f.Sandbox.TmpBytes < 0:
		return bad("sandbox", "negative bound in %+v", f.Sandbox)
	}
	for i, a := range f.Argv {
		if len(a) > 4096 {
			return bad(fmt.Sprintf("argv[%d]", i), "%d bytes, at most 4096", len(a))
		}
	}
	return newLaunchPlan(f), nil
}

func cleanAbs(p string) bool {
	return p != "" && filepath.IsAbs(p) && filepath.Clean(p) == p && p != "/"
}

func within(p, dir string) bool {
	return len(p) > len(dir) && p[:len(dir)] == dir && p[len(dir)] == '/'
}
