package pkgruntime

import (
	"strings"
	"testing"

	caminopb "iteron.dev/operator/api/quixos/camino"
	"iteron.dev/operator/test/pkgruntimetest"
)

func kvConformance() ConformanceInput {
	key := map[string]*caminopb.Value{"key": str("k")}
	return ConformanceInput{
		Invoke: map[string]map[string]*caminopb.Value{
			"get": key,
			"put": {"key": str("k"), "value": str("v")},
		},
		Watch:     map[string]map[string]*caminopb.Value{"watch": key},
		Namespace: "conformance",
	}
}

func failed(checks []ConformanceCheck) []ConformanceCheck {
	var out []ConformanceCheck
	for _, c := range checks {
		if !c.Passed {
			out = append(out, c)
		}
	}
	return out
}

func TestBothImplementationsConform(t *testing.T) {
	for _, name := range []string{pkgruntimetest.KV, pkgruntimetest.Seed} {
		t.Run(name, func(t *testing.T) {
			s := mustDial(t, name, pinFor(name))
			checks := Conform(ctxT(t), s.conn, kvConformance())
			if len(checks) != 9 {
				t.Errorf("%d checks, want 9: handshake, 2 invokes and their status, watch (first event, cancel, end), unseen status", len(checks))
			}
			for _, c := range checks {
				t.Logf("%-40s %v  %s", c.Name, c.Passed, c.Detail)
			}
			if f := failed(checks); len(f) != 0 {
				t.Fatalf("violations: %+v", f)
			}
		})
	}
}

func TestConformanceReportsEachViolationWithTheOffendingMessage(t *testing.T) {
	cases := []struct {
		fault, check, detail, offending string
	}{
		{"not-initial", "watch watch: first event", "the first event of a watch must have initial set", `"watchId":"inv-3"`},
		{"bad-state", "status of invoke get", `"done" is not one of`, ""},
		{"ignore-cancel", "watch watch: stream ends after cancel", "did not end watch", ""},
	}
	for _, c := range cases {
		t.Run(c.fault, func(t *testing.T) {
			s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault="+c.fault)
			checks := Conform(ctxT(t), s.conn, kvConformance())
			var hit *ConformanceCheck
			for i := range checks {
				if checks[i].Name == c.check {
					hit = &checks[i]
				}
			}
			if hit == nil || hit.Passed || !strings.Contains(hit.Detail, c.detail) {
				t.Fatalf("check %q: %+v; want a violation saying %q (all: %+v)", c.check, hit, c.detail, checks)
			}
			if !strings.Contains(strings.ReplaceAll(hit.Offending, " ", ""), c.offending) {
				t.Fatalf("check %q shows the offending message %q; want it to contain %s", c.check, hit.Offending, c.offending)
			}
		})
	}
}

func TestAnInvokeAnswerThatIsNotAResponseIsShownAsSent(t *testing.T) {
	s := mustDial(t, pkgruntimetest.Seed, pinFor(pkgruntimetest.Seed), "-fault=big-result")
	checks := Conform(ctxT(t), s.conn, ConformanceInput{Invoke: kvConformance().Invoke, Namespace: "c"})
	f := failed(checks)
	if len(f) == 0 || f[0].Name != "invoke get" || !strings.Contains(f[0].Detail, "max_message_bytes") {
		t.Fatalf("violations %+v; want invoke get over the message bound", f)
	}
}
