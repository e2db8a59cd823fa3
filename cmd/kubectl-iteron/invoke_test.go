package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/test/pkgruntimetest"
)

func TestMain(m *testing.M) { providertest.Main(m) }

// liveGateway runs counter v2 as prompt_system of default/stack, and the
// extra targets (package runtimes launched with runtimes), behind a real
// gateway socket, and returns the socket path.
func liveGateway(t *testing.T, runtimes *pkgruntime.Launcher, extra ...hotswap.ModuleTarget) string {
	t.Helper()
	records, err := os.MkdirTemp("", "iteron-cli-procs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(records) })
	ex, err := procexec.NewExecutor(procexec.DefaultConfig(records))
	if err != nil {
		t.Fatal(err)
	}
	coord, err := hotswap.New(hotswap.Config{StateDir: t.TempDir(), Launch: providers.WithPackageRuntimes(providers.NewExecutorLauncher(ex), runtimes)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = coord.Shutdown(ctx)
	})
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2})
	key := hotswap.ActivationKey{Namespace: "default", Name: "stack", UID: "c0000000-0000-4000-8000-000000000001"}
	target := hotswap.ModuleTarget{
		Module: "prompt_system", Plan: providertest.Plan(t, impl), Lineage: 1, Attempt: 1,
		Epoch: "sha256:" + strings.Repeat("1", 64), GenerationName: "stack-prompt-system-g1-1",
	}
	desired := hotswap.Desired{
		Key: key, SpecGeneration: 1, CandidateSHA256: providertest.CandidateSHA256,
		Swap: hotswap.SwapPolicy{Deadline: 30 * time.Second, QuiesceTimeout: 5 * time.Second}, Modules: append([]hotswap.ModuleTarget{target}, extra...),
	}
	for _, m := range desired.Modules {
		desired.ActivateOrder = append(desired.ActivateOrder, m.Module)
		desired.DrainOrder = append([]string{m.Module}, desired.DrainOrder...)
	}
	if err := coord.Apply(desired); err != nil {
		t.Fatal(err)
	}
	active := func(st hotswap.ActivationStatus) bool {
		for _, m := range desired.Modules {
			if st.Modules[m.Module].Active != m.GenerationName {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st, ok := coord.Status(key.UID); ok && !st.Busy && active(st) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the counter did not become active")
		}
	}
	allow, err := gateway.ParseAllow([]string{"uid:0=default"})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "gateway.sock")
	srv, err := gateway.New(gateway.Config{NodeName: "node-cli", Coordinator: coord, Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := gateway.Listen(socket, -1)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(context.Background()) })
	return socket
}

func TestInvokeCallsAModuleThroughTheGateway(t *testing.T) {
	socket := liveGateway(t, nil)
	base := []string{"invoke", "--socket", socket, "--activation", "stack", "--module", "prompt_system"}
	args := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }

	cases := []struct {
		name    string
		stdin   string
		args    []string
		code    int
		stdout  []string // lines, exactly
		stderr  string
		prepare func()
	}{
		{name: "it prints the terminal observation", args: args("--input", `{"key":"a","add":2}`), code: exitOK,
			stdout: []string{`{"implementation_version":"2.0.0","key":"a","count":2,"total":2}`}},
		{name: "it reads the input from stdin with --input -", stdin: `{"key":"a","add":3}`, args: args("--input", "-", "-n", "default"), code: exitOK,
			stdout: []string{`{"implementation_version":"2.0.0","key":"a","count":5,"total":5}`}},
		{name: "--watch prints every observation, one per line", args: args("--watch", "--input", `{"key":"b","add":1,"progress":2}`), code: exitOK,
			stdout: []string{`{"progress":0}`, `{"progress":1}`, `{"implementation_version":"2.0.0","key":"b","count":1,"total":6}`}},
		{name: "an invocation id makes the call idempotent", args: args("--invocation-id", "cli-1", "--input", `{"key":"c","add":1}`), code: exitOK,
			stdout: []string{`{"implementation_version":"2.0.0","key":"c","count":1,"total":7}`}},
		{name: "the same invocation id returns the first outcome", args: args("--invocation-id", "cli-1", "--input", `{"key":"c","add":1}`), code: exitOK,
			stdout: []string{`{"implementation_version":"2.0.0","key":"c","count":1,"total":7}`}},
		{name: "a call pinned to another generation fails with stale_generation", args: args("--pin-generation", "2", "--input", `{"key":"d","add":1}`), code: exitInvalid,
			stderr: "error: stale_generation: module prompt_system serves generation 1, the call pins 2 (gRPC FailedPrecondition)"},
		{name: "a namespace the caller may not call is denied", args: args("-n", "team-b"), code: exitInvalid,
			stderr: `error: permission_denied: uid 0 (gid 0) may not call namespace "team-b" (gRPC PermissionDenied)`},
		{name: "an unknown activation is not found", args: []string{"invoke", "--socket", socket, "--activation", "nope", "--module", "prompt_system"}, code: exitInvalid,
			stderr: "error: not_found: no activation default/nope on this node (gRPC NotFound)"},
		{name: "a socket nobody listens on fails the call", args: []string{"invoke", "--socket", filepath.Join(filepath.Dir(socket), "none.sock"), "--activation", "stack", "--module", "prompt_system"}, code: exitInvalid,
			stderr: "(gRPC Unavailable)"},
		{name: "a missing --activation is a usage error", args: []string{"invoke", "--socket", socket, "--module", "prompt_system"}, code: exitUsage, stderr: "--activation is required"},
		{name: "an input that is not strict JSON is a usage error", args: args("--input", `{"a":1,"a":2}`), code: exitUsage, stderr: "--input"},
		{name: "stdin over 512 KiB is a usage error", stdin: `"` + strings.Repeat("x", 512<<10) + `"`, args: args("--input", "-"), code: exitUsage, stderr: "--input - (stdin)"},
		{name: "a zero timeout is a usage error", args: args("--timeout", "0s"), code: exitUsage, stderr: "--timeout"},
		{name: "a generation of 0 is a usage error", args: args("--pin-generation", "0"), code: exitUsage, stderr: "--pin-generation"},
		{name: "a relative socket path is a usage error", args: []string{"invoke", "--socket", "gw.sock", "--activation", "stack", "--module", "prompt_system"}, code: exitUsage, stderr: "absolute"},
		{name: "a module that is not a module ID is a usage error", args: []string{"invoke", "--socket", socket, "--activation", "stack", "--module", "Prompt"}, code: exitUsage, stderr: "--module"},
		{name: "an argument is a usage error", args: args("extra"), code: exitUsage, stderr: "unknown command"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.stdin, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout, stderr)
			}
			if tc.stdout != nil {
				if got := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(tc.stdout, "\n") {
					t.Fatalf("stdout:\n%s\nwant:\n%s", stdout, strings.Join(tc.stdout, "\n"))
				}
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("stderr %q does not contain %q", stderr, tc.stderr)
			}
			if tc.code != exitOK && stdout != "" {
				t.Fatalf("a failed call printed %q", stdout)
			}
		})
	}
}

func TestInvokeCallsAPackageRuntimeThroughTheGateway(t *testing.T) {
	dir := providertest.Dir(t)
	bins, err := pkgruntimetest.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	sockets, err := os.MkdirTemp("", "clirt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockets) })
	runtimes, err := pkgruntime.NewLauncher(pkgruntime.LaunchConfig{ProviderUID: 65534, ProviderGID: 65534,
		RecordDir: filepath.Join(dir, "records"), SocketDir: sockets, SealCacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	planner := hotswap.ModuleTarget{
		Module: "prompt_planner", Plan: pkgruntimetest.Plan(t, "prompt_planner", bins[pkgruntimetest.KV], "kv-1.0.0"), Lineage: 1, Attempt: 1,
		Epoch: "sha256:" + strings.Repeat("2", 64), GenerationName: "stack-prompt-planner-g1-1",
	}
	socket := liveGateway(t, runtimes, planner)
	call := func(module string, extra ...string) []string {
		return append([]string{"invoke", "--socket", socket, "--activation", "stack", "--module", module}, extra...)
	}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{name: "put prints the runtime's result value", args: call("prompt_planner", "--export", "put", "--input", `{"key":"k","value":{"n":1}}`), code: exitOK, stdout: `{"n":1}`},
		{name: "get reads it back, with an object and a session", args: call("prompt_planner", "--export", "get", "--object-id", "obj-1", "--session-id", "s-1", "--input", `{"key":"k"}`), code: exitOK, stdout: `{"n":1}`},
		{name: "a runtime's ok=false fails the call after printing its value", args: call("prompt_planner", "--export", "get", "--input", `{}`), code: exitInvalid, stdout: "null",
			stderr: "error: the runtime answered ok=false: input.key: a string is required"},
		{name: "a call without --export to a runtime of several exports names them", args: call("prompt_planner", "--input", `{"key":"k"}`), code: exitInvalid,
			stderr: "error: schema_mismatch: export: module prompt_planner's runtime has the exports [get put watch]; the call must name one (gRPC FailedPrecondition)"},
		{name: "an export the runtime does not have is not found", args: call("prompt_planner", "--export", "delete", "--input", `{"key":"k"}`), code: exitInvalid,
			stderr: `error: not_found: export: "delete" is not one of the runtime's exports [get put watch] (gRPC NotFound)`},
		{name: "--export to a line-protocol provider is refused, not dropped", args: call("prompt_system", "--export", "get"), code: exitInvalid,
			stderr: "error: schema_mismatch: export: module prompt_system is served by a line-protocol provider (generation 1); export applies to package runtimes only (gRPC FailedPrecondition)"},
		{name: "--watch prints the initial value and ends at the timeout", args: call("prompt_planner", "--watch", "--export", "watch", "--input", `{"key":"k"}`, "--timeout", "1s"), code: exitInvalid,
			stdout: `{"n":1}`, stderr: "error: deadline_exceeded: the caller stopped watching"},
		{name: "an --export that is not an ID is a usage error", args: call("prompt_planner", "--export", "a b"), code: exitUsage, stderr: "--export"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "", tc.args...)
			if code != tc.code || strings.TrimSuffix(stdout, "\n") != tc.stdout || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr containing %q", code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}
