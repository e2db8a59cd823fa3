// Package artifacts moves providers through OCI registries: it packs a
// provider directory (a catalog and one artifact root per implementation)
// into an OCI artifact, pushes it, and pulls an artifact by digest into the
// manager's content-addressed store, where it lays out a source that the
// unchanged verifier (internal/verifier) then checks. The transport
// changes; the verification chain does not: the activation still pins the
// manifest and artifact digests, and only bytes that hash to them run.
//
// The format (docs/reference/oci-artifact.md): an OCI image manifest with
// artifactType application/vnd.iteron.provider.v1, the empty config, one
// catalog layer (application/vnd.iteron.provider.catalog.v1+json) and one
// executable layer per implementation it carries
// (application/vnd.iteron.provider.executable.v1), annotated with its
// module, implementation ID, file name and mode. An image index is accepted
// only when exactly one of its manifests is for this node's platform.
//
// What holds after any failure, including a manager killed mid-pull:
//   - A reference without a digest is refused; the manifest's bytes must
//     hash to it, and every blob's bytes to its descriptor's digest and size.
//     Both are checked while the bytes stream (one pass, no second read of
//     the download) and before anything is renamed into the store.
//   - Sizes are bounded before a byte is fetched: the artifact manifest by
//     MaxManifestBytes, the catalog by 512 KiB, an executable by 256 MiB, the
//     whole store by its configured maximum; a body longer than its
//     descriptor is cut at size+1 and refused.
//   - A blob is written to a temporary file under tmp/ and fsynced; the
//     blobs of one pull are renamed into blobs/sha256/<hex> together, only
//     once every one of them matched its descriptor, and the directory is
//     fsynced after: a failed pull leaves blobs/ as it found it. tmp/ is
//     emptied when a store opens, so a partial download is never visible
//     under blobs/ and never used.
//   - A source is laid out in a temporary directory (hard links to the
//     blobs, read-only, file names only from annotations that are plain
//     names) and renamed into sources/sha256/<hex> complete; nothing is
//     written outside the store.
//   - Concurrent pulls of one digest share one download.
//   - Registry errors are classified once: unreachable, 5xx, timeouts and
//     truncated bodies are artifact_unavailable (retried with backoff);
//     401, 403 and 404 are artifact_refused (not retried until the spec or
//     the credentials change); a digest, size or format mismatch is
//     verification_failed.
//   - GC removes only what no keep set names: sources first, then the
//     blobs no remaining source uses, in a bounded number of steps.
package artifacts
