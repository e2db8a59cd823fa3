// Command survivor is iteron-survivor: one per node (its own DaemonSet,
// updateStrategy OnDelete), it owns the node's provider processes and the
// gateway's listening socket so that they outlive every restart and upgrade
// of the manager (docs/survivor.md). It accepts commands only from the
// manager that holds its node's state-dir lock, over
// <state-dir>/survivor.sock, and knows nothing of Kubernetes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/survivor"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// shutdownTimeout bounds the checkpoint request and stopping the providers
// on SIGTERM; it stays under the DaemonSet's
// terminationGracePeriodSeconds (60).
const shutdownTimeout = 50 * time.Second

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	opts, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "survivor:", err)
		return exitUsage
	}
	log := zap.New(zap.WriteTo(stderr)).WithName("survivor")
	// The survivor launches the node's providers, so it builds their
	// sandbox, below its own cgroup (docs/security.md).
	sbLog := log.WithName("sandbox")
	sb, err := sandbox.New(sandbox.Config{Policy: opts.sandbox, Launcher: opts.launcher, ScratchDir: statedir.Dir(opts.stateDir).Scratch(),
		Log: func(msg string, kv ...any) { sbLog.Info(msg, kv...) }})
	if err != nil {
		fmt.Fprintln(stderr, "survivor:", err)
		return exitFailure
	}
	defer sb.Close()
	c := sb.Capacity()
	log.Info("providers are sandboxed", "mode", c.Mode, "level", c.Level.String(), "cgroups", c.Cgroups, "cgroupsWhy", c.CgroupsWhy, "landlock", c.Landlock, "launcher", c.Launcher)
	srv, err := survivor.NewServer(survivor.ServerConfig{
		StateDir: opts.stateDir, GatewaySocket: opts.gatewaySocket, GatewayGroup: opts.gatewayGroup,
		ManagerUID: opts.managerUID, CheckpointTimeout: opts.checkpointTimeout, Log: log,
		Executor: procexec.Config{ProviderUID: opts.providerUID, ProviderGID: opts.providerGID, Interpreters: opts.interpreters,
			ExecutableCacheBytes: procexec.DefaultExecutableCacheBytes, Sandbox: sb},
	})
	if err != nil {
		fmt.Fprintln(stderr, "survivor:", err)
		return exitFailure
	}
	log.Info("starting", "stateDir", opts.stateDir, "gatewaySocket", opts.gatewaySocket, "instance", srv.Instance(), "pid", os.Getpid(),
		"managerUID", opts.managerUID, "providerUID", opts.providerUID, "providerGID", opts.providerGID, "protocol", survivor.ProtocolVersion)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	select {
	case s := <-sig:
		log.Info("stopping: the providers of this node stop with the survivor", "signal", s.String())
	case err := <-served:
		log.Error(err, "serving the control socket failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		fmt.Fprintln(stderr, "survivor:", err)
		return exitFailure
	}
	return exitOK
}
