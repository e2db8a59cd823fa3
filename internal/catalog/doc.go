// Package catalog holds the family's static data and its parsers: the
// capability seam graph, catalogs and manifests (docs/reference/catalog.md),
// the canonical manifest digest and capability sets with their authority
// digest.
//
// Everything here is untrusted input parsed fail-closed: the size bound is
// checked before a byte is parsed, decoding goes through pkg/strictjson
// (duplicate names at any depth, unknown members, trailing data and invalid
// UTF-8 are errors) and null is refused everywhere, since no member of these
// documents is nullable. Every rejection is an *Error naming the member in the
// document's own spelling (implementations[3].argv[2]) and the reason code
// (docs/reference/reasons.md) it is reported under: schema_mismatch when the
// JSON does not have the document's shape (malformed, unknown or missing
// members), unsupported_version for a schema or protocol version the host does
// not speak, dependency_cycle for a cycle, verification_failed for everything
// else (bounds, patterns, uniqueness, dependency closure).
//
// Two rules go beyond the letter of the wire format, both fail-closed: a
// capability array must already be in its canonical form (known names, sorted,
// no repeats), because the manifest digest is taken over the array as written;
// and an argv entry may not contain NUL, which exec cannot pass.
//
// The built-in seam graph is embedded (seamgraph.json) and is checked by the
// tests against the seam graph table of docs/reference/catalog.md and
// protocol.BuiltinContracts; a custom graph (our extension, at most 64
// modules) is loaded from a file under the same rules. The order of a graph
// file is its ModuleId order.
package catalog
