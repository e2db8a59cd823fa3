// Package strictjson is the one place untrusted JSON is decoded and the one
// place canonical JSON is encoded.
//
// Decoding is strict in every way the protocol family requires and
// encoding/json is not: duplicate object names at any depth, unknown members,
// trailing data and invalid UTF-8 are rejected, and the size bound is checked
// before a byte is parsed.
//
// Canonical encoding produces exactly the bytes serde_json::to_vec prints, the
// bytes the protocol family hashes (docs/reference/encoding.md): compact,
// struct fields in declaration order, object keys sorted byte-wise where the
// value is free-form JSON, no escaping of '<', '>', '&', U+2028 or U+2029,
// control characters as \n, \t, ... or \u00xx, and numbers as serde_json
// prints them (integers as integers, other numbers in ryu's shortest form:
// 100.0, 1e21, 1.5e-7).
package strictjson
