package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"iteron.dev/operator/internal/hotswap"
)

const nobody = 65534

func TestACallerUnderAnotherUIDIsAuthorizedPerNamespace(t *testing.T) {
	h := newHarness(t, func(_ *hotswap.Config, c *Config) {
		c.Allow, _ = ParseAllow([]string{"uid:0=*", "uid:65534=team-a", "gid:4343=team-b"})
	})
	h.counterActivation("team-a", "stack")
	h.counterActivation("team-b", "stack")
	h.counterActivation("team-c", "stack")
	dir := filepath.Dir(h.socket)
	call := func(ns string) clientSpecCall {
		return clientSpecCall{Namespace: ns, Activation: "stack", Module: module, Input: `{"key":"u","add":1}`}
	}

	t.Run("a uid allowed for one namespace calls it and is denied the others, naming uid and namespace", func(t *testing.T) {
		rep := runClientAs(t, dir, nobody, testGroup, clientSpec{Socket: h.socket, Calls: []clientSpecCall{call("team-a"), call("team-b"), call("team-c")}})
		if r := rep.Results[0]; r.Code != "OK" || !strings.Contains(r.Observation, `"count":1`) {
			t.Fatalf("team-a: %+v; want OK", r)
		}
		for i, ns := range []string{"team-b", "team-c"} {
			r := rep.Results[i+1]
			if r.Code != codes.PermissionDenied.String() || r.Reason != "permission_denied" ||
				!strings.Contains(r.Message, "uid 65534") || !strings.Contains(r.Message, `namespace "`+ns+`"`) {
				t.Fatalf("%s: %+v; want PermissionDenied naming uid 65534 and the namespace", ns, r)
			}
		}
		if rep.Handshake == nil {
			t.Fatalf("handshake: %s", rep.HandshakeE)
		}
		if c := rep.Handshake.Caller; c.Uid != nobody || c.Gid != testGroup || strings.Join(c.Namespaces, ",") != "team-a" {
			t.Fatalf("caller %+v; want uid 65534, gid %d, team-a", c, testGroup)
		}
		if len(rep.Handshake.Modules) != 1 || rep.Handshake.Modules[0].Namespace != "team-a" {
			t.Fatalf("modules %v; want only team-a's", rep.Handshake.Modules)
		}
	})

	t.Run("a gid rule allows the caller whose effective gid it names", func(t *testing.T) {
		// 4343 is not the socket's group: the socket must let it in by
		// another way, so widen the socket for this case only.
		if err := os.Chmod(h.socket, 0o666); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(h.socket, SocketMode)
		rep := runClientAs(t, dir, 1234, 4343, clientSpec{Socket: h.socket, Calls: []clientSpecCall{call("team-b"), call("team-a")}})
		if r := rep.Results[0]; r.Code != "OK" {
			t.Fatalf("team-b via gid 4343: %+v; want OK", r)
		}
		if r := rep.Results[1]; r.Code != codes.PermissionDenied.String() || !strings.Contains(r.Message, "uid 1234 (gid 4343)") {
			t.Fatalf("team-a: %+v; want PermissionDenied", r)
		}
	})

	t.Run("a caller outside the socket's group cannot even connect", func(t *testing.T) {
		rep := runClientAs(t, dir, nobody, nobody, clientSpec{Socket: h.socket, Calls: []clientSpecCall{call("team-a")}})
		if rep.Handshake != nil || !strings.Contains(rep.HandshakeE, "permission denied") {
			t.Fatalf("handshake %+v / %q; want the connect refused by the socket's mode", rep.Handshake, rep.HandshakeE)
		}
		if r := rep.Results[0]; r.Code != codes.Unavailable.String() {
			t.Fatalf("call: %+v; want Unavailable (no connection)", r)
		}
	})
}

func TestAllowRules(t *testing.T) {
	allow, err := ParseAllow([]string{"uid:1000=team-a,team-b", "gid:2000=*", "uid:1000=team-c", "uid:1000=team-a", "gid:3000=team-x"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		uid, gid uint32
		ns       string
		permits  bool
		sees     string
	}{
		{"a uid rule permits its namespaces", 1000, 1, "team-b", true, "team-a,team-b,team-c"},
		{"rules for the same uid add up", 1000, 1, "team-c", true, "team-a,team-b,team-c"},
		{"a uid rule permits nothing else", 1000, 1, "team-d", false, "team-a,team-b,team-c"},
		{"a gid rule with * permits every namespace", 7, 2000, "anything", true, "*"},
		{"uid and gid rules combine", 1000, 3000, "team-x", true, "team-a,team-b,team-c,team-x"},
		{"root is not allowed unless a rule says so", 0, 0, "default", false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := allow.Permits(tc.uid, tc.gid, tc.ns); got != tc.permits {
				t.Fatalf("Permits(%d, %d, %s) = %v", tc.uid, tc.gid, tc.ns, got)
			}
			if got := strings.Join(allow.Namespaces(tc.uid, tc.gid), ","); got != tc.sees {
				t.Fatalf("Namespaces(%d, %d) = %q, want %q", tc.uid, tc.gid, got, tc.sees)
			}
		})
	}
	if (Allow{}).Permits(0, 0, "default") {
		t.Fatal("the zero Allow permits root")
	}
}

func TestBadAllowRulesAreRefusedNamingTheRule(t *testing.T) {
	cases := []struct {
		name, rule, why string
	}{
		{"a rule without a kind", "1000=default", "must look like"},
		{"a rule of an unknown kind", "pid:1=default", "must look like"},
		{"a rule without namespaces", "uid:1000", "must look like"},
		{"a non-numeric id", "uid:root=default", `"root" is not a numeric uid`},
		{"an id over 32 bits", "gid:4294967296=default", "not a numeric gid"},
		{"an uppercase namespace", "uid:1=Default", `"Default" is not a namespace name`},
		{"an empty namespace", "uid:1=a,,b", `"" is not a namespace name`},
		{"a namespace ending in a dash", "uid:1=team-", "not a namespace name"},
		{"a namespace of 64 characters", "uid:1=" + strings.Repeat("a", 64), "not a namespace name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAllow([]string{"uid:5=ok", tc.rule})
			var re *AllowRuleError
			if err == nil || !errorsAs(err, &re) || re.Rule != tc.rule || !strings.Contains(re.Why, tc.why) {
				t.Fatalf("ParseAllow(%q) = %v; want an AllowRuleError naming the rule and %q", tc.rule, err, tc.why)
			}
		})
	}
}
