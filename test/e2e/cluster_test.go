package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"iteron.dev/operator/test/childproc"
	"iteron.dev/operator/test/kubeapi"
)

// cluster is where the suite runs: a cluster from KUBECONFIG with the
// manager deployed as a DaemonSet (hack/kind-e2e.sh), or the local control
// plane with the real manager binary running as a process.
type cluster struct {
	local bool
	// client reaches the API server as an administrator.
	client client.Client
	// kubeconfig and kubectl for shelling out like a user.
	kubeconfig, kubectl string
	// node is the node whose manager runs the activations.
	node string
	// sources are the laid-out example providers, by "<module>/<id>".
	sources map[string]source
	// stateDir is the manager's state dir (on this machine, or in the pod).
	stateDir string
	// socket is the gateway socket (on this machine, or in the pod).
	socket string

	plugin     string // kubectl-iteron on this machine
	managerNS  string // kind: the manager DaemonSet's namespace
	env        *kubeapi.Environment
	manager    *exec.Cmd
	managerOut *bytes.Buffer
	managerErr chan error
	work       string
}

// source is one implementation as hack/catalog prints it.
type source struct {
	Module           string `json:"module"`
	ImplementationID string `json:"implementation_id"`
	CatalogPath      string `json:"catalog_path"`
	ArtifactRoot     string `json:"artifact_root"`
	ManifestSHA256   string `json:"manifest_sha256"`
	ArtifactSHA256   string `json:"artifact_sha256"`
}

var c *cluster

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	var err error
	c, err = setup()
	if c != nil {
		defer c.teardown()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	return m.Run()
}

func setup() (*cluster, error) {
	root, err := kubeapi.RepoRoot()
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "iteron-e2e-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, err
	}
	c := &cluster{work: work, kubectl: filepath.Join(root, "bin", "k8s", "kubectl"), plugin: filepath.Join(work, "kubectl-iteron")}
	if out, err := exec.Command("go", "build", "-o", c.plugin, filepath.Join(root, "cmd", "kubectl-iteron")).CombinedOutput(); err != nil {
		return c, fmt.Errorf("build kubectl-iteron: %v\n%s", err, out)
	}
	if os.Getenv("KUBECONFIG") != "" {
		return c, c.setupExisting()
	}
	return c, c.setupLocal(root)
}

// setupExisting uses the cluster in KUBECONFIG (hack/kind-e2e.sh).
func (c *cluster) setupExisting() error {
	c.kubeconfig = os.Getenv("KUBECONFIG")
	c.node = os.Getenv("ITERON_E2E_NODE_NAME")
	c.managerNS = envOr("ITERON_E2E_MANAGER_NAMESPACE", "iteron-system")
	c.stateDir, c.socket = "/var/lib/iteron/state", "/run/iteron/gateway.sock"
	if c.node == "" {
		return fmt.Errorf("KUBECONFIG is set: ITERON_E2E_NODE_NAME must name the node (hack/kind-e2e.sh sets it)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return err
	}
	scheme, err := kubeapi.NewScheme()
	if err != nil {
		return err
	}
	if c.client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	data, err := os.ReadFile(os.Getenv("ITERON_E2E_SOURCES"))
	if err != nil {
		return fmt.Errorf("ITERON_E2E_SOURCES must name hack/catalog's output for the providers on the node: %w", err)
	}
	return c.readSources(data, os.Getenv("ITERON_E2E_LOCAL_PROVIDERS"), envOr("ITERON_E2E_PROVIDER_ROOT", "/var/lib/iteron/providers"))
}

// setupLocal starts the local control plane and the manager binary.
func (c *cluster) setupLocal(root string) error {
	c.local = true
	providers := filepath.Join(c.work, "providers")
	c.stateDir = filepath.Join(c.work, "state")
	c.socket = filepath.Join(c.work, "gw.sock")
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	c.node = strings.ToLower(host)
	cmd := exec.Command("go", "run", "./hack/catalog", "-out", providers, "-modules", "prompt_system,context_assembly")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("hack/catalog: %v\n%s", err, stderr.String())
	}
	if err := c.readSources(out, "", ""); err != nil {
		return err
	}
	if c.env, err = kubeapi.Start(); err != nil {
		return err
	}
	fmt.Printf("e2e tests run against kube-apiserver %s (the local control plane, the manager binary as a process)\n", c.env.ServerVersion)
	c.client = c.env.Client
	if err := kubeapi.EnsureNode(context.Background(), c.client, c.node); err != nil {
		return err
	}
	if c.kubeconfig, err = c.env.Kubeconfig(c.work); err != nil {
		return err
	}
	manager := filepath.Join(c.work, "manager")
	if out, err := exec.Command("go", "build", "-o", manager, filepath.Join(root, "cmd", "manager")).CombinedOutput(); err != nil {
		return fmt.Errorf("build the manager: %v\n%s", err, out)
	}
	if err := kubeapi.BuildSandboxLauncher(root, c.work); err != nil {
		return err
	}
	c.manager = exec.Command(manager, "--kubeconfig="+c.kubeconfig, "--node-name="+c.node, "--state-dir="+c.stateDir,
		"--allowed-roots="+providers, "--gateway-socket="+c.socket, fmt.Sprintf("--gateway-allow=uid:%d=*", os.Getuid()),
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	c.managerOut = &bytes.Buffer{}
	c.manager.Stdout, c.manager.Stderr = c.managerOut, c.managerOut
	c.manager.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := childproc.Start(c.manager, syscall.SIGKILL); err != nil {
		return err
	}
	c.managerErr = make(chan error, 1)
	go func() { c.managerErr <- c.manager.Wait() }()
	return nil
}

func (c *cluster) readSources(data []byte, localPrefix, nodePrefix string) error {
	var doc struct {
		Sources []source `json:"sources"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("read hack/catalog's output: %w", err)
	}
	c.sources = map[string]source{}
	for _, s := range doc.Sources {
		if localPrefix != "" {
			s.CatalogPath = nodePrefix + strings.TrimPrefix(s.CatalogPath, localPrefix)
			s.ArtifactRoot = nodePrefix + strings.TrimPrefix(s.ArtifactRoot, localPrefix)
		}
		c.sources[s.Module+"/"+s.ImplementationID] = s
	}
	return nil
}

func (c *cluster) teardown() {
	if c.manager != nil && c.manager.Process != nil {
		_ = c.manager.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.managerErr:
		case <-time.After(50 * time.Second):
			_ = syscall.Kill(-c.manager.Process.Pid, syscall.SIGKILL)
			<-c.managerErr
		}
	}
	if c.env != nil {
		_ = c.env.Stop()
	}
	_ = os.RemoveAll(c.work)
}

// nodeCommand runs a command where the manager's files are: on this machine,
// or inside the manager pod on the node.
func (c *cluster) nodeCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	if c.local {
		if name == "kubectl-iteron" {
			name = c.plugin
		}
		return exec.CommandContext(ctx, name, args...)
	}
	pod := c.managerPod(ctx)
	return exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig, "-n", c.managerNS, "exec", pod, "--", name}, args...)...)
}

// managerPod is the manager pod on the node (kind mode).
func (c *cluster) managerPod(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig, "-n", c.managerNS, "get", "pods",
		"--field-selector", "spec.nodeName="+c.node, "-l", "app.kubernetes.io/component=manager", "-o", "jsonpath={.items[0].metadata.name}").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
