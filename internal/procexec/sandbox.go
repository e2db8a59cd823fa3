package procexec

import (
	"errors"
	"os"
	"syscall"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/internal/verifier"
)

// spawnSandboxed starts the provider through the node's sandbox
// (Config.Sandbox): the same descriptors, credentials and group as
// without one, its capabilities turned into kernel rules.
func (e *Executor) spawnSandboxed(plan verifier.LaunchPlan, exe *os.File, interpreter, scratch string, argv []string, attr *syscall.ProcAttr) (spawn.Group, int, *sandbox.Launch, error) {
	req, err := sandbox.RequestOf(plan.Sandbox())
	if err != nil {
		return spawn.Group{}, -1, nil, err
	}
	return e.cfg.Sandbox.Spawn(sandbox.Start{
		Name: plan.Module(), Capabilities: plan.AdmittedCapabilities(), Request: req,
		ArtifactRoot: plan.ArtifactRoot(), Exe: exe, Interpreter: interpreter, Scratch: scratch, Argv: argv,
	}, attr, int(e.cfg.ProviderUID))
}

// sandboxFault is the fault of a launch the sandbox refused: the node
// cannot give what the source requires (nothing was started).
func sandboxFault(err error) (*Fault, bool) {
	var se *sandbox.Error
	if !errors.As(err, &se) {
		return nil, false
	}
	return &Fault{Kind: KindRefused, Op: OpSpawn, Reason: reasons.SandboxUnavailable, Detail: se.Error(), Err: err}, true
}

// Sandbox is what the process's sandbox applied, false when the executor
// has none.
func (p *Process) Sandbox() (sandbox.Evidence, bool) {
	if p.sandbox == nil {
		return sandbox.Evidence{}, false
	}
	return p.sandbox.Evidence(), true
}

// SandboxViolations are the syscalls the provider made, under
// --sandbox=audit, that the enforced sandbox refuses, by name.
func (p *Process) SandboxViolations() map[string]int64 {
	if p.sandbox == nil {
		return nil
	}
	return p.sandbox.Violations()
}
