package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/doctor"
)

// newDoctorCmd is `kubectl iteron doctor <activation>`.
func newDoctorCmd() *cobra.Command {
	var (
		kubeconfig, kubeContext, namespace string
		stateDir, output                   string
		orphanGrace, timeout               time.Duration
	)
	cmd := &cobra.Command{
		Use:   "doctor <activation>",
		Short: "Explain why an activation's modules are not Active, with the commands that fix what can be fixed",
		Long: `Reads the ImplementationActivation, its Generations, its Node and its events,
and says for each module that does not serve its desired implementation: the
reason and message, the active and the failed (or in-progress) Generation with
its step, the module's last blocked ledger record (phase, block kind, reason),
the dependency chain that gates it, and the provider's stderr tail. It also
reports the conditions, a paused spec, a retry annotation not yet handled, a
status that lags the spec, and a finalizer that waits for a Node that no longer
exists (a cluster with no Node objects at all counts as unknown, not missing),
printing the exact kubectl command to clear it.

With --state-dir (on the node, as a user that can read the manager's state
directory) it also verifies the ledger file read-only (the broken rule and
sequence when it does not verify) and checks every recorded provider process
group against /proc: a live group that no status shows serving is orphaned, and
the kill command is printed. Nothing is ever changed.

Every finding is explained in docs/troubleshooting.md.

Exit status: 0 every module is Active at its desired implementation and Ready
is True; 1 the doctor found a problem; 2 usage error, activation not found, or
API server unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return usage(fmt.Errorf("--output must be text or json, not %q", output))
			}
			c, ns, err := doctorClient(kubeconfig, kubeContext, namespace, timeout)
			if err != nil {
				return usage(err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			in, err := doctor.Gather(ctx, c, ns, args[0], doctor.GatherOptions{NodeView: stateDir != ""})
			if err != nil {
				return usage(err)
			}
			var local *doctor.Local
			if stateDir != "" {
				local = doctor.ReadLocal(stateDir, in.Activation)
			}
			report := doctor.Diagnose(in, local, doctor.Options{OrphanGrace: orphanGrace})
			if output == "json" {
				err = doctor.WriteJSON(cmd.OutOrStdout(), report)
			} else {
				err = doctor.WriteText(cmd.OutOrStdout(), report)
			}
			if err != nil {
				return err
			}
			if !report.Healthy {
				n := report.Problems()
				if n == 0 {
					return invalid(fmt.Errorf("%s/%s is not healthy (Ready is not True for the current spec)", ns, args[0]))
				}
				return invalid(fmt.Errorf("%s/%s: %d problem(s) found", ns, args[0], n))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&kubeContext, "context", "", "the kubeconfig context to use")
	f.StringVarP(&namespace, "namespace", "n", "", "the activation's namespace (default: the context's namespace, else default)")
	f.StringVar(&stateDir, "state-dir", "", "the manager's state directory on this node: also verify the ledger file and check recorded provider processes")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	f.DurationVar(&orphanGrace, "orphan-grace", doctor.DefaultOrphanGrace, "how long a live recorded provider group may go unclaimed by any status before it is called orphaned (negative: no grace)")
	f.DurationVar(&timeout, "request-timeout", 30*time.Second, "bound on all reads from the API server")
	return cmd
}

// doctorClient builds a client for the kubeconfig, context and namespace
// flags, resolved as kubectl resolves them.
func doctorClient(kubeconfig, kubeContext, namespace string, timeout time.Duration) (client.Client, string, error) {
	if timeout <= 0 {
		return nil, "", errors.New("--request-timeout must be positive")
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	overrides.Context.Namespace = namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig namespace: %w", err)
	}
	cfg.Timeout = timeout
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	if err := iteronv1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	return c, ns, nil
}
