package catalog

import "strings"

// Bounds of the identifiers of docs/reference/encoding.md and
// docs/reference/catalog.md.
const (
	// MaxModuleIDBytes bounds a module ID (^[a-z][a-z0-9_]{0,47}$).
	MaxModuleIDBytes = 48
	// MaxImplementationIDBytes bounds a manifest's implementation_id.
	MaxImplementationIDBytes = 96
	// MaxContractIDBytes bounds a contract ID (an ID of the family).
	MaxContractIDBytes = 128
)

// IsModuleID reports whether s matches ^[a-z][a-z0-9_]{0,47}$, the module
// pattern of the CRD and of a custom seam graph.
func IsModuleID(s string) bool {
	if len(s) == 0 || len(s) > MaxModuleIDBytes || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// IsImplementationID reports whether s is 1–96 bytes of [A-Za-z0-9._-], the
// manifest's implementation_id rule (also the CRD's).
func IsImplementationID(s string) bool {
	if len(s) == 0 || len(s) > MaxImplementationIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// IsContractID reports whether s is an ID of the family: 1–128 bytes of
// [A-Za-z0-9._\-/:@+].
func IsContractID(s string) bool {
	if len(s) == 0 || len(s) > MaxContractIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-/:@+", c) >= 0) {
			return false
		}
	}
	return true
}

// IsDigest reports whether s is "sha256:" and 64 lowercase hex digits, the
// digest form everywhere but inside a manifest.
func IsDigest(s string) bool {
	rest, ok := strings.CutPrefix(s, "sha256:")
	return ok && IsBareDigest(rest)
}

// IsBareDigest reports whether s is 64 lowercase hex digits, the form of a
// manifest's artifact_sha256 (the family's own inconsistency, kept).
func IsBareDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
