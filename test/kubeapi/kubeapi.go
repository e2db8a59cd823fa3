// Package kubeapi starts the real local control plane (etcd and
// kube-apiserver built by hack/build-controlplane.sh) for test packages, with
// this repository's CRDs installed. Start it once per package, in TestMain:
// it takes seconds.
package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Environment is a running etcd + kube-apiserver with the CRDs installed.
type Environment struct {
	// Config reaches the API server as a cluster administrator.
	Config *rest.Config
	// Client is a controller-runtime client for Config with Scheme.
	Client client.Client
	// Scheme knows the built-in types and this repository's API.
	Scheme *runtime.Scheme
	// ServerVersion is what the API server reports (for example v1.37.2).
	ServerVersion string
	// RepoRoot is the repository's root directory.
	RepoRoot string

	env      *envtest.Environment
	watchdog *exec.Cmd
}

// Start starts etcd and kube-apiserver and installs the CRDs from
// config/crd/bases. The binaries come from KUBEBUILDER_ASSETS or, when it is
// unset, from bin/k8s (make controlplane builds them).
func Start() (*Environment, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin", "k8s")
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("control-plane binary %s is missing from %s (run `make controlplane`): %w", bin, assets, err)
		}
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start etcd and kube-apiserver from %s: %w", assets, err)
	}
	e := &Environment{Config: cfg, Scheme: scheme, RepoRoot: root, env: env}
	// envtest allocated these under the temporary directory; Stop removes
	// them, and so does the watchdog when Stop never runs.
	dirs := []string{env.ControlPlane.Etcd.DataDir, env.ControlPlane.APIServer.CertDir, env.WebhookInstallOptions.LocalServingCertDir}
	if e.watchdog, _, err = startWatchdog([]string{"etcd", "kube-apiserver"}, dirs...); err != nil {
		_ = env.Stop()
		return nil, err
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = e.Stop()
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	info, err := dc.ServerVersion()
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("read the API server's version: %w", err)
	}
	e.ServerVersion = info.GitVersion
	return e, nil
}

// NewScheme knows the built-in types and this repository's API.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := iteronv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (e *Environment) Stop() error {
	err := e.env.Stop()
	if e.watchdog != nil {
		// SIGKILL: its trap must not run once the control plane is gone;
		// to its group, so that its sleep goes with it.
		_ = syscall.Kill(-e.watchdog.Process.Pid, syscall.SIGKILL)
		_ = e.watchdog.Wait()
		e.watchdog = nil
	}
	return err
}

// KubectlPath is the kubectl built beside the control plane.
func (e *Environment) KubectlPath() string {
	return filepath.Join(e.env.BinaryAssetsDirectory, "kubectl")
}

// Kubeconfig writes a kubeconfig for the administrator into dir and returns
// its path, for running kubectl and the manager binary against the server.
func (e *Environment) Kubeconfig(dir string) (string, error) {
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "iteron-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// RepoRoot finds the repository root: the nearest parent directory whose
// go.mod declares module iteron.dev/operator.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module iteron.dev/operator\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found: no parent directory has the go.mod of iteron.dev/operator")
		}
		dir = parent
	}
}

// EnsureNode creates a Node object named name if there is none: the local
// control plane runs no kubelet, and the doctor tells a missing Node from a
// cluster without Node objects.
func EnsureNode(ctx context.Context, c client.Client, name string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Node %s: %w", name, err)
	}
	return nil
}
