package gateway

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// AllNamespaces in a rule allows every namespace.
const AllNamespaces = "*"

// Allow maps peer credentials to the namespaces they may call through the
// gateway (the manager's repeatable --gateway-allow flag). A caller may call
// a namespace when a rule for its uid or for its gid names it (or "*").
// The gid is the one SO_PEERCRED reports: the caller's effective gid when it
// connected, not its supplementary groups. The zero value allows nothing,
// root included.
type Allow struct {
	// UIDs and GIDs map an id to its namespaces.
	UIDs, GIDs map[uint32][]string
}

// AllowRuleError is a --gateway-allow rule that does not parse.
type AllowRuleError struct {
	// Rule is the rule as given.
	Rule string
	// Why says what is wrong with it.
	Why string
}

func (e *AllowRuleError) Error() string {
	return fmt.Sprintf("gateway allow rule %q: %s", e.Rule, e.Why)
}

// ParseAllow parses rules of the form uid:<n>=<ns>[,<ns>...] or
// gid:<n>=<ns>[,<ns>...]; a namespace is an RFC 1123 label or "*". Rules for
// the same id add up.
func ParseAllow(rules []string) (Allow, error) {
	allow := Allow{UIDs: map[uint32][]string{}, GIDs: map[uint32][]string{}}
	for _, rule := range rules {
		kind, rest, ok := strings.Cut(rule, ":")
		id, namespaces, ok2 := strings.Cut(rest, "=")
		if !ok || !ok2 || (kind != "uid" && kind != "gid") {
			return Allow{}, &AllowRuleError{rule, "must look like uid:<n>=<ns>[,<ns>...] or gid:<n>=<ns>[,<ns>...]"}
		}
		n, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return Allow{}, &AllowRuleError{rule, fmt.Sprintf("%q is not a numeric %s", id, kind)}
		}
		m := allow.UIDs
		if kind == "gid" {
			m = allow.GIDs
		}
		for _, ns := range strings.Split(namespaces, ",") {
			if ns != AllNamespaces && !IsNamespaceName(ns) {
				return Allow{}, &AllowRuleError{rule, fmt.Sprintf("%q is not a namespace name or *", ns)}
			}
			if !slices.Contains(m[uint32(n)], ns) {
				m[uint32(n)] = append(m[uint32(n)], ns)
			}
		}
	}
	return allow, nil
}

// Namespaces returns what a caller with uid and gid may call, sorted and
// without duplicates ("*" for every namespace).
func (a Allow) Namespaces(uid, gid uint32) []string {
	var out []string
	for _, ns := range append(slices.Clone(a.UIDs[uid]), a.GIDs[gid]...) {
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	if slices.Contains(out, AllNamespaces) {
		return []string{AllNamespaces}
	}
	slices.Sort(out)
	return out
}

// Permits reports whether a caller with uid and gid may call namespace.
func (a Allow) Permits(uid, gid uint32, namespace string) bool {
	for _, list := range [][]string{a.UIDs[uid], a.GIDs[gid]} {
		for _, ns := range list {
			if ns == AllNamespaces || ns == namespace {
				return true
			}
		}
	}
	return false
}

// IsNamespaceName reports whether s is a valid namespace name (an RFC 1123
// label: at most 63 lowercase alphanumerics or '-', not starting or ending
// with '-').
func IsNamespaceName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}
