package providers

import "iteron.dev/operator/internal/sandbox"

// Sandboxed is a provider started in a sandbox.
type Sandboxed interface {
	// Sandbox is what its sandbox applied; false without one.
	Sandbox() (sandbox.Evidence, bool)
	// SandboxViolations are what it did under --sandbox=audit that the
	// enforced sandbox refuses, by syscall.
	SandboxViolations() map[string]int64
}

func (pp *processProvider) Sandbox() (sandbox.Evidence, bool)   { return pp.p.Sandbox() }
func (pp *processProvider) SandboxViolations() map[string]int64 { return pp.p.SandboxViolations() }
func (p *packageProvider) Sandbox() (sandbox.Evidence, bool)    { return p.r.Sandbox() }
func (p *packageProvider) SandboxViolations() map[string]int64  { return p.r.SandboxViolations() }

// Sandbox is what the survivor's sandbox applied, as it reported it at the
// launch.
func (r *remoteProvider) Sandbox() (sandbox.Evidence, bool) {
	s := r.rp.Info().Sandbox
	if s == "" {
		return sandbox.Evidence{}, false
	}
	ev, err := sandbox.ParseEvidence(s)
	return ev, err == nil
}

// SandboxViolations are counted and logged by the survivor, which runs the
// launcher, and reported to this manager on its status operation.
func (r *remoteProvider) SandboxViolations() map[string]int64 { return r.rp.SandboxViolations() }
