package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"iteron.dev/operator/cmd/manager/app"
)

// Roles of the manager binary: node (the default: one per node, a
// DaemonSet) and fleet (the ActivationSet controller: a Deployment with
// leader election).
const (
	roleNode  = "node"
	roleFleet = "fleet"
)

// splitRole takes --role=<r> (or --role <r>) out of args.
func splitRole(args []string) (role string, rest []string, err error) {
	role = roleNode
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "role" {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return "", nil, &flagError{"role", "", "needs a value: node or fleet"}
			}
			i++
			value = args[i]
		}
		if value != roleNode && value != roleFleet {
			return "", nil, &flagError{"role", value, "must be node (one manager per node) or fleet (the ActivationSet controller)"}
		}
		role = value
	}
	return role, rest, nil
}

// fleetOptions are the fleet role's validated flags.
type fleetOptions struct {
	kubeconfig                                string
	leaderElect                               bool
	leaderElectionNamespace, leaderElectionID string
	leaseDuration, renewDeadline, retryPeriod time.Duration
	metricsBindAddress                        string
	healthProbeBindAddress                    string
}

func parseFleetOptions(args []string, stderr io.Writer) (*fleetOptions, error) {
	fs := flag.NewFlagSet("manager --role=fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "iteron-system"
	}
	var o fleetOptions
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty uses $KUBECONFIG or the in-cluster config")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect one leader among the replicas on a Lease (only the leader reconciles)")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", ns, "namespace of the Lease (default $POD_NAMESPACE, else iteron-system)")
	fs.StringVar(&o.leaderElectionID, "leader-election-id", "iteron-fleet", "name of the Lease")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the leader's last renewal before taking over")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up (the process then exits)")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often replicas try to acquire or renew the Lease")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", "127.0.0.1:8080", "address of the Prometheus metrics endpoint; 0 disables it")
	fs.StringVar(&o.healthProbeBindAddress, "health-probe-bind-address", "127.0.0.1:8081", "address of /healthz and /readyz; 0 disables them")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if errs := validation.IsDNS1123Label(o.leaderElectionNamespace); len(errs) > 0 {
		return nil, &flagError{"leader-election-namespace", o.leaderElectionNamespace, strings.Join(errs, "; ")}
	}
	if errs := validation.IsDNS1123Subdomain(o.leaderElectionID); len(errs) > 0 {
		return nil, &flagError{"leader-election-id", o.leaderElectionID, strings.Join(errs, "; ")}
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"leader-elect-lease-duration", o.leaseDuration}, {"leader-elect-renew-deadline", o.renewDeadline}, {"leader-elect-retry-period", o.retryPeriod}} {
		if d.value <= 0 {
			return nil, &flagError{d.name, d.value.String(), "must be a positive duration"}
		}
	}
	if o.renewDeadline >= o.leaseDuration {
		return nil, &flagError{"leader-elect-renew-deadline", o.renewDeadline.String(), fmt.Sprintf("must be shorter than --leader-elect-lease-duration (%s)", o.leaseDuration)}
	}
	if o.retryPeriod >= o.renewDeadline {
		return nil, &flagError{"leader-elect-retry-period", o.retryPeriod.String(), fmt.Sprintf("must be shorter than --leader-elect-renew-deadline (%s)", o.renewDeadline)}
	}
	return &o, nil
}

// runFleet is `manager --role=fleet`.
func runFleet(args []string, stderr io.Writer) int {
	opts, err := parseFleetOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitUsage
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(stderr)))
	flush, err := startTracing("iteron-fleet", stderr)
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitUsage
	}
	defer flush()
	cfg, err := restConfig(opts.kubeconfig)
	if err != nil {
		fmt.Fprintln(stderr, "manager: kubeconfig:", err)
		return exitFailure
	}
	f, err := app.NewFleet(cfg, app.FleetOptions{
		LeaderElection: opts.leaderElect, LeaderElectionNamespace: opts.leaderElectionNamespace, LeaderElectionID: opts.leaderElectionID,
		LeaseDuration: opts.leaseDuration, RenewDeadline: opts.renewDeadline, RetryPeriod: opts.retryPeriod,
		MetricsBindAddress: opts.metricsBindAddress, HealthProbeBindAddress: opts.healthProbeBindAddress, Log: ctrl.Log,
	})
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	ctrl.Log.WithName("setup").Info("starting the fleet controller", "identity", f.Identity, "pid", os.Getpid(),
		"leaderElection", opts.leaderElect, "lease", opts.leaderElectionNamespace+"/"+opts.leaderElectionID)
	if err := f.Run(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	return exitOK
}
