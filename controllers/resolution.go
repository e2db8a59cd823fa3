package controllers

import (
	"time"

	"iteron.dev/operator/internal/verifier"
)

// Resolution is what verification and the dependency graph made of a spec:
// per module either a verified launch plan with its epoch, or the reason it
// cannot run.
type Resolution struct {
	// DocumentError refuses the whole spec (duplicate modules, bad
	// document); nothing is applied and the running generations stay.
	DocumentError error
	// DocumentCode is DocumentError's reason code.
	DocumentCode string
	// Modules are the spec's modules in ModuleId order.
	Modules []ResolvedModule
	// ActivateOrder is the topological order of the admitted modules.
	ActivateOrder []string
	// DrainOrder is its reverse.
	DrainOrder []string
	// RetryAfter, when set, asks for another reconcile then: an OCI source
	// is being pulled or waits for its next attempt (artifact_unavailable).
	RetryAfter time.Duration
	// Reusable says the resolution holds for the same spec for as long as
	// every one of Files is unchanged: every source verified, none waits
	// for a pull. A failure is not kept: what made it (a missing file, a
	// symlink in a directory, a registry) is not only in Files.
	Reusable bool
	// Files are the files the verification read, stamped before reading.
	Files []verifier.FileStamp
}

// ResolvedModule is one module of a resolution.
type ResolvedModule struct {
	// Module is the module.
	Module string
	// Plan is the verified launch plan; nil when the module cannot run.
	Plan *verifier.LaunchPlan
	// CatalogPath is the canonical catalog the plan was verified from.
	CatalogPath string
	// Epoch is the module's epoch (docs/concepts.md, identity, epoch and
	// plan).
	Epoch string
	// Identity is module|implementation_id|version|artifact_sha256.
	Identity string
	// DependsOn are the modules of this activation it needs Active first.
	DependsOn []string
	// Code and Message say why the module cannot run (verification_failed,
	// dependency_unsatisfied, dependency_cycle, …); empty when it can.
	Code, Message string
	// NotAdmitted are requested capabilities the ceiling dropped.
	NotAdmitted []string
	// Diagnostics are the unmet optional requirements of an admitted
	// module (internal/graph).
	Diagnostics []string
}
