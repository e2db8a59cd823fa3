package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strings"
)

// MaxActivationName is the longest name an ImplementationActivation may have
// (Generation names are derived from it).
const MaxActivationName = 40

// Parts of a stamped name: <set prefix>-<node prefix>-<hash>.
const (
	setPrefixLen  = 12
	nodePrefixLen = 18
	hashLen       = 8
)

// ActivationName is the name of the activation set stamps for node: a
// readable prefix of both names (lowercased, characters other than a-z, 0-9
// and '-' turned into '-') and 8 hex digits of SHA-256 over both, at most 40
// characters whatever the node's name.
func ActivationName(set, node string) string {
	sum := sha256.Sum256([]byte(set + "\x00" + node))
	return readable(set, setPrefixLen) + "-" + readable(node, nodePrefixLen) + "-" + hex.EncodeToString(sum[:])[:hashLen]
}

// readable is at most n characters of s that are valid inside a DNS label,
// never starting or ending with '-' ("x" when nothing is left).
func readable(s string, n int) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > n {
		b = b[:n]
	}
	out := strings.Trim(string(b), "-")
	if out == "" {
		return "x"
	}
	return out
}

// Collision is a node whose stamped name another node already has.
type Collision struct {
	// Node lost the name to Holder.
	Node, Holder, Name string
}

// AssignNames gives each node its stamped name; when two nodes' names
// collide, the node first by name keeps it and the others are reported.
// name is ActivationName unless a test gives another.
func AssignNames(set string, nodes []string, name func(set, node string) string) (map[string]string, []Collision) {
	if name == nil {
		name = ActivationName
	}
	sorted := append([]string(nil), nodes...)
	sort.Strings(sorted)
	byName := map[string]string{}
	names := map[string]string{}
	var collisions []Collision
	for _, node := range sorted {
		n := name(set, node)
		if holder, taken := byName[n]; taken {
			collisions = append(collisions, Collision{Node: node, Holder: holder, Name: n})
			continue
		}
		byName[n] = node
		names[node] = n
	}
	return names, collisions
}
