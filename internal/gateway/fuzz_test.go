package gateway

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzParseAllow: any rule list either parses into rules whose namespaces
// are all valid (or "*") and whose rendering parses back to the same
// permissions, or is refused with an AllowRuleError naming one of the rules.
func FuzzParseAllow(f *testing.F) {
	for _, seed := range []string{
		"uid:1000=team-a,team-b", "gid:2000=*", "uid:0=default\ngid:5=a", "uid:=x", "uid:1=", "pid:1=a",
		"uid:4294967296=a", "uid:1=A", "uid:1=a,,b", "gid:1=-a", "uid:1=a=b", "uid:1:2=a",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		rules := strings.Split(input, "\n")
		allow, err := ParseAllow(rules)
		if err != nil {
			var re *AllowRuleError
			if !errorsAs(err, &re) {
				t.Fatalf("error %T %v is not an AllowRuleError", err, err)
			}
			found := false
			for _, r := range rules {
				found = found || r == re.Rule
			}
			if !found {
				t.Fatalf("the error names %q, which is not one of the rules", re.Rule)
			}
			return
		}
		var rendered []string
		for kind, m := range map[string]map[uint32][]string{"uid": allow.UIDs, "gid": allow.GIDs} {
			for id, nss := range m {
				for _, ns := range nss {
					if ns != AllNamespaces && !IsNamespaceName(ns) {
						t.Fatalf("accepted namespace %q", ns)
					}
				}
				rendered = append(rendered, kind+":"+itoa(id)+"="+strings.Join(nss, ","))
			}
		}
		again, err := ParseAllow(rendered)
		if err != nil {
			t.Fatalf("the rendering %q of accepted rules does not parse: %v", rendered, err)
		}
		for id, nss := range allow.UIDs {
			for _, ns := range nss {
				if !again.Permits(id, ^uint32(0), ns) {
					t.Fatalf("uid %d lost namespace %s in the round trip", id, ns)
				}
			}
		}
	})
}

// FuzzReasonOf: any status message yields a reason without spaces that
// prefixes the message, or none.
func FuzzReasonOf(f *testing.F) {
	for _, seed := range []string{"queue_full: 3 waiting", "no reason here", ": empty", "a b: c", "stale_generation: ", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		fl, ok := ReasonOf(status.Error(codes.Unknown, msg))
		if !ok {
			t.Fatal("a status was not read")
		}
		if fl.Reason == "" {
			return
		}
		if strings.ContainsAny(fl.Reason, " \t") || !strings.HasPrefix(msg, fl.Reason+": ") || fl.Message != msg[len(fl.Reason)+2:] {
			t.Fatalf("message %q read as reason %q, message %q", msg, fl.Reason, fl.Message)
		}
	})
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}
