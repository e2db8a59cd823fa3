package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/sandbox"
)

// exampleBinary builds one example provider into a directory the provider
// uid can traverse (the executable's directory is the provider's cwd).
func exampleBinary(t *testing.T, name string) string {
	t.Helper()
	ex, ok := artifacts.ExampleByName(name)
	if !ok {
		t.Fatalf("no example %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := artifacts.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(providertest.Dir(t), name)
	if err := artifacts.Build(ctx, root, ex.Package, out, ""); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestConformanceExitsZeroForAConformantProviderOneForViolationsTwoForUsage(t *testing.T) {
	counter := exampleBinary(t, artifacts.CounterV2)
	faulty := exampleBinary(t, artifacts.Faulty)
	stateless := exampleBinary(t, artifacts.Stateless)
	launcher := providertest.SandboxLauncher(t)
	cases := []struct {
		name string
		args []string
		code int
		out  []string
	}{
		{"counter v2 as protocol 2", []string{"conformance", counter, "--protocol", "2", "--module", "prompt_system"}, 0,
			[]string{"ok    load", "ok    snapshot", "ok    migrate", "ok    restore", "ok    readiness", "ok    stop", "conformant: 8 operations passed"}},
		{"stateless as protocol 1", []string{"conformance", stateless, "--protocol", "1", "--module", "tool_exposure", "--input", `{"text":"x"}`}, 0,
			[]string{"ok    cancel", "conformant: 4 operations passed",
				"sandbox applied: mode=enforce level=isolated ns=cgroup,ipc,mnt,net,pid,uts network=none exec=no memory=536870912 cpu=" + strconv.FormatInt(sandbox.DefaultCPUMillis, 10) + "m tasks=256 tmp=67108864"}},
		{"stateless admitted irreversible_external gets the node's network", []string{"conformance", stateless, "--protocol", "1", "--module", "tool_exposure", "--capabilities", "irreversible_external"}, 0,
			[]string{"capabilities [irreversible_external]", "sandbox applied: mode=enforce level=isolated ns=cgroup,ipc,mnt,pid,uts network=node exec=no"}},
		{"stateless without the sandbox", []string{"conformance", stateless, "--protocol", "1", "--module", "tool_exposure", "--sandbox=off"}, 0,
			[]string{"sandbox: mode off, level none", "sandbox applied: mode=off level=none ns=none network=node exec=yes"}},
		{"an unknown capability", []string{"conformance", stateless, "--protocol", "1", "--module", "tool_exposure", "--capabilities", "root"}, 2, nil},
		{"faulty's argv after --", []string{"conformance", faulty, "--protocol", "2", "--module", "prompt_system", "--timeout", "500ms", "--", "--fault", "miscorrelate", "--at", "load"}, 1,
			[]string{"FAIL  load", "violation during load: mis-correlation", `frame: {"protocol":"iteron-implementation/2","request_id":"host-999999"`, "not conformant: 1 violation(s)"}},
		{"a provider that hangs", []string{"conformance", faulty, "--protocol", "2", "--module", "prompt_system", "--timeout", "300ms", "--", "--fault", "hang", "--at", "start"}, 1,
			[]string{"violation during start: timeout"}},
		{"--trace prints each frame, host to provider and back, in order", []string{"conformance", stateless, "--protocol", "1", "--module", "tool_exposure", "--implementation-id", "t.1", "--trace"}, 0,
			[]string{`> {"protocol":"iteron-implementation/1","request_id":"host-1","implementation_id":"t.1","module":"tool_exposure","payload":{"operation":"load",`,
				`< {"protocol":"iteron-implementation/1","request_id":"host-1","implementation_id":"t.1","module":"tool_exposure","payload":{"result":"loaded",`,
				`> {"protocol":"iteron-implementation/1","request_id":"host-2",`, `"payload":{"operation":"start",`,
				`< {"protocol":"iteron-implementation/1","implementation_id":"t.1","module":"tool_exposure","run_id":"conformance-1","sequence":0,`,
				`"payload":{"result":"stopped"}}` + "\n  sandbox applied: mode=enforce", "\n  ok    load"}},
		{"a missing module", []string{"conformance", counter, "--protocol", "2"}, 2, nil},
		{"an unknown protocol", []string{"conformance", counter, "--protocol", "3", "--module", "prompt_system"}, 2, nil},
		{"two executables", []string{"conformance", counter, counter, "--protocol", "2", "--module", "prompt_system"}, 2, nil},
		{"an input that is not JSON", []string{"conformance", counter, "--protocol", "2", "--module", "prompt_system", "--input", "{"}, 2, nil},
		{"a missing executable", []string{"conformance", "/nonexistent/provider", "--protocol", "2", "--module", "prompt_system"}, 2, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// Sandboxed as a node sandboxes, with the launcher built for
			// the tests (a user's is beside kubectl-iteron).
			args := append([]string{tc.args[0], "--sandbox-launcher=" + launcher}, tc.args[1:]...)
			code := run(args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout.String(), stderr.String())
			}
			for _, want := range tc.out {
				if !strings.Contains(stdout.String(), want) {
					t.Fatalf("output lacks %q:\n%s", want, stdout.String())
				}
			}
		})
	}
}
