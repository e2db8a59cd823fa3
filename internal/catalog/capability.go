package catalog

import (
	"slices"
	"strings"

	"iteron.dev/operator/pkg/strictjson"
)

// The five capabilities (docs/reference/catalog.md). A capability set on the
// wire is a JSON array of these strings, sorted byte-wise, without duplicates.
const (
	CapabilityCodeExecuting        = "code_executing"
	CapabilityIrreversibleExternal = "irreversible_external"
	CapabilityReadOnly             = "read_only"
	CapabilityReversibleLocal      = "reversible_local"
	CapabilityTrustMutating        = "trust_mutating"
)

// DefaultCeiling is the node capability ceiling when the manager is given
// none (--capability-ceiling): nothing that executes code, mutates trust or
// reaches outside the node.
const DefaultCeiling = CapabilityReadOnly + "," + CapabilityReversibleLocal

// Capabilities returns the five capabilities in their sorted (wire) order.
func Capabilities() []string {
	return []string{
		CapabilityCodeExecuting,
		CapabilityIrreversibleExternal,
		CapabilityReadOnly,
		CapabilityReversibleLocal,
		CapabilityTrustMutating,
	}
}

// IsCapability reports whether s is one of the five capabilities.
func IsCapability(s string) bool {
	return slices.Contains(Capabilities(), s)
}

// CheckCapabilitySet checks a capability array as the wire carries it: known
// names, sorted byte-wise, no duplicates. Sorted-and-unique is required, not
// repaired: the manifest digest is taken over the array as written, so two
// spellings of one set would be two digests. field names the array.
func CheckCapabilitySet(field string, caps []string) error {
	for i, c := range caps {
		if !IsCapability(c) {
			return invalidf(Index(field, i), ErrInvalidValue, "%q is not a capability (one of %s)", c, strings.Join(Capabilities(), ", "))
		}
		if i > 0 && caps[i-1] >= c {
			if caps[i-1] == c {
				return invalidf(Index(field, i), ErrDuplicate, "capability %q is listed twice", c)
			}
			return invalidf(Index(field, i), ErrInvalidValue, "capabilities must be sorted: %q comes after %q", c, caps[i-1])
		}
	}
	return nil
}

// ParseCeiling parses a comma-separated capability list (the manager's
// --capability-ceiling flag) into a sorted set. Order and repetition do not
// matter here, unknown names do; "" is the empty ceiling.
func ParseCeiling(list string) ([]string, error) {
	set := []string{}
	if strings.TrimSpace(list) == "" {
		return set, nil
	}
	for i, c := range strings.Split(list, ",") {
		c = strings.TrimSpace(c)
		if !IsCapability(c) {
			return nil, invalidf(Index("capability ceiling", i), ErrInvalidValue, "%q is not a capability (one of %s)", c, strings.Join(Capabilities(), ", "))
		}
		if !slices.Contains(set, c) {
			set = append(set, c)
		}
	}
	slices.Sort(set)
	return set, nil
}

// Admit returns requested ∩ ceiling, sorted and never nil: what a provider
// is actually granted.
func Admit(requested, ceiling []string) []string {
	admitted := []string{}
	for _, c := range requested {
		if slices.Contains(ceiling, c) && !slices.Contains(admitted, c) {
			admitted = append(admitted, c)
		}
	}
	slices.Sort(admitted)
	return admitted
}

// NotAdmitted returns requested − admitted, sorted: the capabilities a
// ceiling dropped (shown by `kubectl iteron plan`).
func NotAdmitted(requested, admitted []string) []string {
	dropped := []string{}
	for _, c := range requested {
		if !slices.Contains(admitted, c) && !slices.Contains(dropped, c) {
			dropped = append(dropped, c)
		}
	}
	slices.Sort(dropped)
	return dropped
}

// NarrowCeiling is the ceiling an activation runs under: the node's ceiling,
// narrowed by the activation's own when it gives one. An activation can never
// widen the node's ceiling: a capability it names that the node lacks is
// simply not granted.
func NarrowCeiling(node, activation []string) []string {
	if len(activation) == 0 {
		return Admit(node, node)
	}
	return Admit(activation, node)
}

// AuthorityDigest is authority_sha256: "sha256:" over the compact JSON array
// of the admitted capabilities (sorted, as Admit returns them). Two
// generations may hand state to each other only under equal digests.
func AuthorityDigest(admitted []string) string {
	sorted := make([]string, 0, len(admitted))
	for _, c := range admitted {
		// Capability names are ASCII; the repair only keeps the encoding
		// total for a caller that passes something else.
		sorted = append(sorted, strings.ToValidUTF8(c, "\uFFFD"))
	}
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	b, err := strictjson.Canonical(sorted)
	if err != nil {
		panic("catalog: encoding a capability array of valid UTF-8: " + err.Error())
	}
	return strictjson.Digest(b)
}
