// Package verifier verifies an activation — a raw JSON document
// (docs/reference/activation.md) or an ImplementationActivation spec, both
// converted to one Document first — against the files on this node, and mints
// a LaunchPlan for every source that passes. It is the only minter of real
// plans: a LaunchPlan's fields are unexported, so a plan in hand is proof that
// its bytes, manifest and capability ceiling were checked.
//
// Per source, in order: the values as written (module pattern and presence in
// the seam graph, implementation ID, absolute canonical paths — the same
// vectors as the CRD's CEL rule —, paths under the allowed roots, digest
// forms); the catalog (no symlink at any component, checked by an lstat walk
// that names the component, by filepath.EvalSymlinks, and by the kernel at
// open with openat2 RESOLVE_NO_SYMLINKS; a regular file of at most 512 KiB;
// parsed by internal/catalog with every bound and dependency closure); the
// selected manifest (the source's ID and module, its canonical digest equal
// to manifest_sha256, its artifact_sha256 equal to the source's); the
// artifact root (a directory reached through no symlink); the executable (a
// regular file of at most 256 MiB, opened beneath the root with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, hashed through one fixed 64 KiB buffer
// and equal to artifact_sha256); then capabilities: admitted = requested ∩
// (node ceiling, narrowed by the activation's), and the authority digest.
//
// Errors are *Error: the field path as the user wrote it
// (sources[2].catalog_path: /var/lib/x is a symlink for a raw document,
// spec.sources[2].catalogPath for a spec), the detail, a sentinel to test with
// errors.Is, and ReasonCode, the reason (docs/reference/reasons.md).
// Document-level failures (size, strict JSON, schema version, candidate
// digest, duplicate modules or implementation IDs, too many sources) fail the
// whole document; a per-source failure fails that source alone and never hides
// the other sources' results. Results and plans come out in ModuleId order.
package verifier
