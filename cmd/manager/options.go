package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/cmd/manager/app"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/verifier"
)

// options are the manager's validated flags.
type options struct {
	kubeconfig             string
	nodeName               string
	stateDir               string
	allowedRoots           []string
	interpreters           []string
	providerUID            uint32
	providerGID            uint32
	metricsBindAddress     string
	healthProbeBindAddress string
	gatewaySocket          string
	gatewayGroup           int
	gatewayAllow           gateway.Allow
	capabilityCeiling      []string
	graph                  *catalog.SeamGraph
	artifacts              app.ArtifactOptions
	survivorSocket         string
	maxParallel            int
	kubeAPIQPS             float64
	kubeAPIBurst           int
	sandbox                *app.SandboxOptions // nil with --sandbox=off
}

// maxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes including the terminating NUL).
const maxSocketPath = 107

// flagError is a bad flag value: it names the flag, the value and why.
type flagError struct {
	flag, value, why string
}

func (e *flagError) Error() string {
	return fmt.Sprintf("--%s=%q: %s", e.flag, e.value, e.why)
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	hostname, _ := os.Hostname()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                                      options
		roots, interpreters, ceiling, uid, gid string
		graphFile                              string
		gatewayAllowValues                     multiFlag
	)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty uses $KUBECONFIG or the in-cluster config")
	fs.StringVar(&o.nodeName, "node-name", hostname, "the node whose activations this manager runs (only objects with this spec.nodeName are watched)")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/iteron/state", "directory for ledgers, durable snapshots and the manager lock")
	fs.StringVar(&roots, "allowed-roots", verifier.DefaultAllowedRoot, "comma-separated absolute directories under which catalogs and artifact roots must lie; may not overlap --state-dir")
	fs.StringVar(&interpreters, "interpreters", "/bin/sh", "comma-separated absolute interpreter paths a '#!' provider script may name")
	fs.StringVar(&uid, "provider-uid", "65534", "uid providers run as")
	fs.StringVar(&gid, "provider-gid", "65534", "gid providers run as")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", "127.0.0.1:8080", "address of the Prometheus metrics endpoint; 0 disables it")
	fs.StringVar(&o.healthProbeBindAddress, "health-probe-bind-address", "127.0.0.1:8081", "address of /healthz and /readyz; 0 disables them")
	fs.StringVar(&o.gatewaySocket, "gateway-socket", "/run/iteron/gateway.sock", "unix socket of the node-local gRPC gateway (at most 107 bytes)")
	fs.IntVar(&o.gatewayGroup, "gateway-group", 0, "group owning the gateway socket (mode 0660): the callers' group")
	fs.Var(&gatewayAllowValues, "gateway-allow", "repeatable: uid:<n>=<ns>[,<ns>...] or gid:<n>=<ns>[,<ns>...]; '*' is every namespace")
	fs.StringVar(&ceiling, "capability-ceiling", "read_only,reversible_local", "comma-separated capabilities this node admits at most")
	fs.StringVar(&graphFile, "graph", "", "custom seam graph file (schema version 2, or 3 with typed requirements; docs/reference/catalog.md), read once at start; empty: the built-in 28-module graph")
	a := &o.artifacts
	fs.StringVar(&a.Store, "artifact-store", artifacts.DefaultStore, "content-addressed store OCI sources are pulled into (its own directory: may not overlap --state-dir or --allowed-roots)")
	fs.Int64Var(&a.MaxBytes, "artifact-store-max-bytes", artifacts.DefaultMaxStoreBytes, "bound of the whole artifact store in bytes")
	fs.StringVar(&a.RegistryConfig, "registry-config", "", "docker config.json with registry credentials (optional; read again when it changes)")
	fs.StringVar(&a.RegistryCA, "registry-ca", "", "PEM bundle of CAs trusted for registries besides the system's")
	fs.BoolVar(&a.PlainHTTP, "registry-plain-http", false, "reach loopback registries (127.0.0.0/8, ::1, localhost) over plain HTTP; every other registry is always HTTPS")
	fs.DurationVar(&a.PullTimeout, "artifact-pull-timeout", artifacts.DefaultPullTimeout, "bound of one pull")
	fs.DurationVar(&a.GCInterval, "artifact-gc-interval", app.DefaultArtifactGCInterval, "how often unreferenced artifacts are collected; 0 never")
	fs.StringVar(&o.survivorSocket, "survivor-socket", "", "control socket of the node's survivor (iteron-survivor, normally <state-dir>/survivor.sock), which owns the providers so that they outlive this manager and holds the gateway socket; empty: this manager owns its providers")
	fs.IntVar(&o.maxParallel, "max-parallel-activations", runtime.NumCPU(), "how many provider processes of one activation are spawned and loaded (or stopped) together; their ledger transactions still run one at a time in plan order; 1 starts each inside its transaction")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", app.DefaultKubeAPIQPS, "sustained requests per second the manager's API client may send (client-side rate limit)")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", app.DefaultKubeAPIBurst, "requests the manager's API client may send at once above --kube-api-qps")
	var sandboxFlags sandbox.Flags
	sandboxFlags.Register(fs, sandbox.ModeEnforce)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.nodeName == "" {
		return nil, &flagError{"node-name", o.nodeName, "must not be empty (no hostname could be read)"}
	}
	if err := checkAbsoluteClean("state-dir", o.stateDir); err != nil {
		return nil, err
	}
	var err error
	if o.allowedRoots, err = parsePathList("allowed-roots", roots); err != nil {
		return nil, err
	}
	for _, root := range o.allowedRoots {
		if within(root, o.stateDir) || within(o.stateDir, root) {
			return nil, &flagError{"allowed-roots", roots, fmt.Sprintf("%s overlaps --state-dir %s: a provider could read or replace the ledger", root, o.stateDir)}
		}
	}
	if err := checkAbsoluteClean("artifact-store", a.Store); err != nil {
		return nil, err
	}
	if within(a.Store, o.stateDir) || within(o.stateDir, a.Store) {
		return nil, &flagError{"artifact-store", a.Store, fmt.Sprintf("overlaps --state-dir %s: the store is a provider's artifact root", o.stateDir)}
	}
	for _, root := range o.allowedRoots {
		if within(root, a.Store) || within(a.Store, root) {
			return nil, &flagError{"artifact-store", a.Store, fmt.Sprintf("overlaps --allowed-roots %s: only the manager writes the store (it is an allowed root of OCI sources by construction)", root)}
		}
	}
	if a.MaxBytes <= 0 {
		return nil, &flagError{"artifact-store-max-bytes", strconv.FormatInt(a.MaxBytes, 10), "must be positive"}
	}
	if a.PullTimeout <= 0 {
		return nil, &flagError{"artifact-pull-timeout", a.PullTimeout.String(), "must be positive"}
	}
	if a.GCInterval < 0 {
		return nil, &flagError{"artifact-gc-interval", a.GCInterval.String(), "must not be negative"}
	}
	for _, f := range []struct{ name, value string }{{"registry-config", a.RegistryConfig}, {"registry-ca", a.RegistryCA}} {
		if f.value != "" {
			if err := checkAbsoluteClean(f.name, f.value); err != nil {
				return nil, err
			}
		}
	}
	if graphFile != "" {
		if err := checkAbsoluteClean("graph", graphFile); err != nil {
			return nil, err
		}
		if o.graph, err = catalog.LoadSeamGraph(graphFile); err != nil {
			return nil, &flagError{"graph", graphFile, err.Error()}
		}
	}
	if o.interpreters, err = parsePathList("interpreters", interpreters); err != nil {
		return nil, err
	}
	if o.providerUID, err = parseID("provider-uid", uid); err != nil {
		return nil, err
	}
	if o.providerGID, err = parseID("provider-gid", gid); err != nil {
		return nil, err
	}
	if err := checkAbsoluteClean("gateway-socket", o.gatewaySocket); err != nil {
		return nil, err
	}
	if len(o.gatewaySocket) > maxSocketPath {
		return nil, &flagError{"gateway-socket", o.gatewaySocket, fmt.Sprintf("is %d bytes; a unix socket path is at most %d", len(o.gatewaySocket), maxSocketPath)}
	}
	if o.gatewayGroup < 0 {
		return nil, &flagError{"gateway-group", strconv.Itoa(o.gatewayGroup), "must be a gid (≥ 0)"}
	}
	if o.gatewayAllow, err = gateway.ParseAllow(gatewayAllowValues); err != nil {
		var rule *gateway.AllowRuleError
		if errors.As(err, &rule) {
			return nil, &flagError{"gateway-allow", rule.Rule, rule.Why}
		}
		return nil, err
	}
	if o.capabilityCeiling, err = parseCapabilities(ceiling); err != nil {
		return nil, err
	}
	if o.maxParallel < 1 {
		return nil, &flagError{"max-parallel-activations", strconv.Itoa(o.maxParallel), "must be at least 1"}
	}
	if !(o.kubeAPIQPS > 0) || math.IsInf(o.kubeAPIQPS, 0) {
		return nil, &flagError{"kube-api-qps", strconv.FormatFloat(o.kubeAPIQPS, 'g', -1, 64), "must be a positive number"}
	}
	if o.kubeAPIBurst < 1 {
		return nil, &flagError{"kube-api-burst", strconv.Itoa(o.kubeAPIBurst), "must be at least 1"}
	}
	policy, launcher, err := sandboxFlags.Parsed()
	if err != nil {
		return nil, err
	}
	o.sandbox = &app.SandboxOptions{Policy: policy, Launcher: launcher}
	if o.survivorSocket != "" {
		if err := checkAbsoluteClean("survivor-socket", o.survivorSocket); err != nil {
			return nil, err
		}
		if len(o.survivorSocket) > maxSocketPath {
			return nil, &flagError{"survivor-socket", o.survivorSocket, fmt.Sprintf("is %d bytes; a unix socket path is at most %d", len(o.survivorSocket), maxSocketPath)}
		}
	}
	return &o, nil
}

// multiFlag collects the values of a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func checkAbsoluteClean(name, p string) error {
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return &flagError{name, p, "must be an absolute, clean path other than /"}
	}
	return nil
}

func parsePathList(name, value string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(value, ",") {
		if err := checkAbsoluteClean(name, p); err != nil {
			return nil, &flagError{name, value, fmt.Sprintf("%q must be an absolute, clean path other than /", p)}
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// within reports whether p is dir or lies under it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func parseID(name, value string) (uint32, error) {
	n, err := strconv.ParseUint(value, 10, 32)
	if err != nil || n == 0 && name == "provider-uid" {
		why := "must be a number from 1 to 4294967295"
		if err == nil {
			why = "must not be 0: providers never run as root"
		}
		return 0, &flagError{name, value, why}
	}
	return uint32(n), nil
}

func parseCapabilities(value string) ([]string, error) {
	known := []string{
		string(iteronv1.CapabilityReadOnly), string(iteronv1.CapabilityReversibleLocal), string(iteronv1.CapabilityCodeExecuting),
		string(iteronv1.CapabilityTrustMutating), string(iteronv1.CapabilityIrreversibleExternal),
	}
	var out []string
	if value == "" {
		return out, nil
	}
	for _, c := range strings.Split(value, ",") {
		if !slices.Contains(known, c) {
			return nil, &flagError{"capability-ceiling", value, fmt.Sprintf("unknown capability %q (known: %s)", c, strings.Join(known, ", "))}
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out, nil
}

var errLocked = errors.New("another manager holds the state directory")
