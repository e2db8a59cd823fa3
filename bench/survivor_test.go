package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/internal/verifier"
)

// BenchmarkStartToTerminalSurvivor is BenchmarkStartToTerminal on the path
// the deployed manager takes: the run goes through the survivor (the
// manager's client → the control socket → the survivor's executor → the
// provider's pipes, whole frames relayed, the outcome recorded and
// acknowledged as for a gateway call) instead of the manager's own
// executor. The survivor runs in the benchmark's process (its own socket
// hop, not its own CPU). The go-plugin call is the same as there,
// interleaved.
func BenchmarkStartToTerminalSurvivor(b *testing.B) {
	echo := buildInto(b, "iteron.dev/operator/bench/echo", "echo")
	gp := startGoPlugin(b)

	dir, err := os.MkdirTemp("", "svb") // a short path: socket paths ≤ 107 bytes
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	lock, err := os.OpenFile(statedir.Dir(dir).Lock(), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b.Fatal(err)
	}
	srv, err := survivor.NewServer(survivor.ServerConfig{StateDir: dir, GatewaySocket: filepath.Join(dir, "gw.sock"), GatewayGroup: -1,
		Executor: procexec.DefaultConfig(filepath.Join(dir, "procs")), Log: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	c, err := survivor.NewClient(survivor.ClientConfig{Socket: statedir.Dir(dir).SurvivorSocket(), Lock: lock, Log: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := c.Attached(actx); err != nil {
		b.Fatal(err)
	}

	impl := providertest.Implement(b, artifacts.Spec{Binary: echo, ImplementationID: "echo", Protocol: 1, Version: [3]uint64{1, 0, 0}})
	plan := providertest.Plan(b, impl, func(f *verifier.LaunchPlanFields) { f.RuntimeDeadline = time.Hour })
	exe, err := procexec.SealExecutable(plan.Executable(), plan.ArtifactSHA256())
	if err != nil {
		b.Fatal(err)
	}
	var rp *survivor.RemoteProcess
	launches := 0
	launch := func() {
		if rp != nil {
			rp.Close()
		}
		launches++
		tag := survivor.Tag{ActivationUID: "uid-bench", Module: plan.Module(), Generation: "g" + strconv.Itoa(launches),
			Transaction: "uid-bench/" + plan.Module() + "/g1/a" + strconv.Itoa(launches)}
		if rp, err = c.Launch(ctx, plan, exe, tag); err != nil {
			b.Fatal(err)
		}
		if err := rp.Load(ctx); err != nil {
			b.Fatal(err)
		}
	}
	launch()
	defer func() { rp.Close() }()

	interleaved(b, gp, func(n int) bool { return rp.Budget().StdinBytes < int64(n)+4096 }, launch, func(i int, in jsontext.Value) ([]byte, error) {
		id := "run-" + strconv.Itoa(i)
		call := &survivor.Invocation{Namespace: "default", InvocationID: id, Fingerprint: "f", Activation: "a", Module: plan.Module(), Generation: 1, GenerationName: "g"}
		_, out, err := rp.Run(ctx, id, in, 10*time.Second, call, nil)
		return out, err
	})
}
