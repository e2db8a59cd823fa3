package analysis

import (
	"regexp"
	"strconv"
	"testing"
)

func TestAQueryIsRenderedWithTheWaveAndTheRevision(t *testing.T) {
	v := Vars{Set: "web", Namespace: "default", Revision: "web-5d8f", RevisionHash: "5d8f", Wave: 2, Nodes: []string{"node-1.zone-a", "node-12"}}
	got := Render(`sum(rate(iteron_gateway_calls_total{revision="{{revision}}",node=~"{{nodes}}",code!="ok"}[1m])) # {{wave}} {{set}} {{namespace}} {{revisionName}} {{other}}`, v)
	want := `sum(rate(iteron_gateway_calls_total{revision="5d8f",node=~"node-1\\.zone-a|node-12",code!="ok"}[1m])) # 2 web default web-5d8f {{other}}`
	if got != want {
		t.Fatalf("rendered\n%s\nwant\n%s", got, want)
	}
}

// TestTheNodesRegexpMatchesExactlyTheWavesNodes reads the regular
// expression as Prometheus does (the PromQL string unquoted, the match
// anchored) and checks it against names that differ by one character.
func TestTheNodesRegexpMatchesExactlyTheWavesNodes(t *testing.T) {
	nodes := []string{"node-1", "a.b", "ip-10-0-0-1.ec2.internal"}
	lit, err := strconv.Unquote(`"` + NodesRegexp(nodes) + `"`)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("^(?:" + lit + ")$")
	for _, n := range nodes {
		if !re.MatchString(n) {
			t.Errorf("%q does not match %s", n, lit)
		}
	}
	for _, n := range []string{"node-10", "node-", "axb", "ip-10-0-0-1xec2.internal", "", "node-1|a.b"} {
		if re.MatchString(n) {
			t.Errorf("%q matches %s", n, lit)
		}
	}
}
