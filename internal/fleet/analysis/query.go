package analysis

import (
	"regexp"
	"strconv"
	"strings"
)

// Vars are what a measurement knows of the wave it judges.
type Vars struct {
	// Set and Namespace name the ActivationSet.
	Set, Namespace string
	// Revision is the update revision's name (<set>-<hash>) and
	// RevisionHash its hash: the label value the stamped activations and
	// the managers' call metrics carry.
	Revision, RevisionHash string
	// Wave is the wave's number.
	Wave int32
	// Nodes are the wave's nodes.
	Nodes []string
}

// NodesRegexp is a regular expression matching exactly the node names,
// written as the body of a PromQL double-quoted string (backslashes
// doubled): node=~"<it>". Prometheus anchors label matchers, so it matches
// no other name.
func NodesRegexp(nodes []string) string {
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = regexp.QuoteMeta(n)
	}
	re := strings.Join(parts, "|")
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(re)
}

// Render fills a query's placeholders: {{revision}} (the revision's hash),
// {{revisionName}}, {{nodes}} (NodesRegexp), {{wave}}, {{set}} and
// {{namespace}}. Anything else is left as written.
func Render(query string, v Vars) string {
	if !strings.Contains(query, "{{") {
		return query
	}
	return strings.NewReplacer(
		"{{revision}}", promString(v.RevisionHash),
		"{{revisionName}}", promString(v.Revision),
		"{{nodes}}", NodesRegexp(v.Nodes),
		"{{wave}}", strconv.Itoa(int(v.Wave)),
		"{{set}}", promString(v.Set),
		"{{namespace}}", promString(v.Namespace),
	).Replace(query)
}

// promString escapes s for the inside of a PromQL double-quoted string
// (the names are DNS labels and hex today; this keeps a query well formed
// whatever they become).
func promString(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
