package sandbox

import (
	"encoding/json"
	"strings"
	"testing"

	"iteron.dev/operator/examples/providers/providertest"
)

func hostile(tb testing.TB) string {
	tb.Helper()
	bin := providertest.Program(tb, "iteron.dev/operator/test/sandbox/hostile")
	impl := providertest.Dir(tb)
	return copyExecutable(tb, bin, impl)
}

type actResult struct {
	Act    string `json:"act"`
	OK     bool   `json:"ok"`
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

func TestExplore(t *testing.T) {
	sb := newSandbox(t, Policy{Mode: ModeEnforce})
	exe := hostile(t)
	for _, c := range []struct{ act, arg string }{
		{"ok", ""}, {"procs", ""}, {"connect", "127.0.0.1:22"}, {"read", "/etc/passwd"}, {"list", "/var/lib"},
		{"write", "/tmp/x"}, {"write", "/x"}, {"exec", "/bin/sh"}, {"exec-memfd", ""}, {"exec-written", "/tmp/h"},
		{"ptrace", "1"}, {"signal", "1"}, {"mount", ""}, {"unshare", ""}, {"keyctl", ""}, {"bpf", ""},
	} {
		r := run(t, sb, exe, nil, Request{}, "", c.act, c.arg)
		var ar actResult
		json.Unmarshal([]byte(strings.TrimSpace(r.out)), &ar)
		t.Logf("%s %s: %+v exit %v stderr %q", c.act, c.arg, ar, r.exit, r.errOut)
	}
}
