package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/localnode"
)

const (
	managerNS  = "iteron-system"
	managerDS  = "iteron-manager"
	survivorDS = "iteron-survivor"
	// sandboxImage is the pause image's name (hack/image -pause-tag), the
	// local node's containerd sandbox image.
	sandboxImage = "localhost/iteron-pause:1"
	// upgradedImage is another build of the manager (hack/image
	// -manager-note): the image a manager upgrade rolls out.
	upgradedImage = "iteron-operator:upgraded"
	// In the manager's container (config/manager/daemonset.yaml).
	podProviders = "/var/lib/iteron/providers"
	podState     = "/var/lib/iteron/state"
)

// cluster is where the scenario runs: a local node this test starts, or the
// cluster in KUBECONFIG (kind, through hack/kind-e2e.sh).
type cluster struct {
	repo string
	// local is the node this test started; nil against KUBECONFIG.
	local *localnode.Node
	// node is the Node's name.
	node string
	// hostRoot holds state/, providers/, run/ and artifacts/ (the hostPath volumes),
	// reachable from this process at the same path as on the node.
	hostRoot string
	// kubeconfig and kubectl: how to run kubectl as an administrator.
	kubeconfig, kubectl string
	config              *rest.Config
	client              client.Client
	clientset           kubernetes.Interface
	// podHTTP reaches pod IPs.
	podHTTP *http.Client
	// plugin is kubectl-iteron built for this machine.
	plugin string
	// sources are hack/catalog's providers, by "<module>/<implementation>",
	// with the paths the manager sees in its container.
	sources map[string]source
	work    string
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

// run runs a command, failing the test with its output when it fails.
func run(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out.String())
	}
	return out.String()
}

// kubectlCmd runs kubectl as an administrator (inside the local node's
// namespace, where its API server is).
func (c *cluster) kubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	if c.local != nil {
		return c.local.KubectlCmd(ctx, args...)
	}
	return exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *cluster) kubectlRun(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return run(t, c.kubectlCmd(ctx, args...))
}

// kubectlOut runs kubectl for a diagnostic: its output or its error.
func (c *cluster) kubectlOut(args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.kubectlCmd(ctx, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// setupLocal builds the images, starts the local node and lays out the
// providers in its root.
func setupLocal(t *testing.T, c *cluster) {
	nodeBin := filepath.Join(c.repo, "bin", "node")
	if _, err := os.Stat(filepath.Join(nodeBin, "kubelet")); err != nil {
		t.Fatalf("bin/node/kubelet is missing: run `make node` (make test does): %v", err)
	}
	images := filepath.Join(c.work, "images")
	start := time.Now()
	// The image of the code under test, built as `make image` builds it;
	// -offline: busybox-static's .deb must already be in bin/image/debs
	// (make image fetched it), so this test fetches nothing.
	cmd := exec.Command("go", "run", "./hack/image", "-offline", "-debs", filepath.Join(c.repo, "bin", "image", "debs"),
		"-out", filepath.Join(images, "iteron-operator.tar"), "-survivor-out", filepath.Join(images, "iteron-survivor.tar"),
		"-pause-out", filepath.Join(images, "pause.tar"), "-pause-tag", sandboxImage)
	cmd.Dir = c.repo
	out := run(t, cmd)
	// A new release of the manager: another build (other bytes), another
	// image name, for the upgrade step.
	cmd = exec.Command("go", "run", "./hack/image", "-offline", "-debs", filepath.Join(c.repo, "bin", "image", "debs"),
		"-out", filepath.Join(images, "iteron-operator-upgraded.tar"), "-tag", upgradedImage, "-manager-note", "upgraded",
		"-survivor-out", "", "-pause-out", "")
	cmd.Dir = c.repo
	out += run(t, cmd)
	t.Logf("built the images in %s:\n%s", time.Since(start).Round(time.Second), out)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n, err := localnode.Start(ctx, localnode.Config{
		NodeBin: nodeBin, K8sBin: filepath.Join(c.repo, "bin", "k8s"),
		Images:       []string{filepath.Join(images, "pause.tar"), filepath.Join(images, "iteron-operator.tar"), filepath.Join(images, "iteron-survivor.tar"), filepath.Join(images, "iteron-operator-upgraded.tar")},
		SandboxImage: sandboxImage, Log: testLog{t}, CountPackets: true,
	})
	if n != nil {
		c.local = n
	}
	if err != nil {
		t.Fatalf("start the local node: %v", err)
	}
	// hack/test.sh shows this line ("run against kube-apiserver") as it goes.
	fmt.Printf("node tests run against %s (a real local node: kubelet, containerd, runc)\n", n.Versions(ctx))
	c.node, c.kubeconfig, c.kubectl = n.Name, n.Kubeconfig, n.Kubectl
	c.config, c.clientset, c.podHTTP = n.Config, n.Clientset, n.HTTPClient(10*time.Second)
	c.hostRoot = filepath.Join(n.Root, "host")
}

// setupExisting uses the cluster in KUBECONFIG: ITERON_NODE_NAME names the
// node, ITERON_NODE_ROOT a directory mounted at the same path here and on
// the node (hack/kind-e2e.sh sets all three and loads the image).
func setupExisting(t *testing.T, c *cluster) {
	c.kubeconfig = os.Getenv("KUBECONFIG")
	c.node, c.hostRoot = os.Getenv("ITERON_NODE_NAME"), os.Getenv("ITERON_NODE_ROOT")
	if c.node == "" || c.hostRoot == "" {
		t.Fatal("KUBECONFIG is set: ITERON_NODE_NAME and ITERON_NODE_ROOT must name the node and a directory mounted at the same path here and on it (hack/kind-e2e.sh sets them)")
	}
	c.kubectl = filepath.Join(c.repo, "bin", "k8s", "kubectl")
	if p, err := exec.LookPath("kubectl"); err == nil && os.Getenv("ITERON_NODE_SYSTEM_KUBECTL") == "1" {
		c.kubectl = p
	}
	var err error
	if c.config, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
		t.Fatal(err)
	}
	if c.clientset, err = kubernetes.NewForConfig(c.config); err != nil {
		t.Fatal(err)
	}
	// Pod IPs of a kind node are reached from the node itself: the probes
	// and metrics are read through the API server's pod proxy instead.
	c.podHTTP = nil
}

// setupCommon builds the CLI, lays out the providers and makes the clients.
func setupCommon(t *testing.T, c *cluster) {
	for _, d := range []string{"state", "providers", "run"} {
		if err := os.MkdirAll(filepath.Join(c.hostRoot, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.plugin = filepath.Join(c.work, "kubectl-iteron")
	build := exec.Command("go", "build", "-o", c.plugin, "./cmd/kubectl-iteron")
	build.Dir = c.repo
	run(t, build)
	cat := exec.Command("go", "run", "./hack/catalog", "-out", filepath.Join(c.hostRoot, "providers"), "-modules", "prompt_system,context_assembly")
	cat.Dir = c.repo
	cat.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cat.Stderr = &stderr
	out, err := cat.Output()
	if err != nil {
		t.Fatalf("hack/catalog: %v\n%s", err, stderr.String())
	}
	var doc struct {
		Sources []source `json:"sources"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("hack/catalog's output: %v", err)
	}
	c.sources = map[string]source{}
	hostProviders := filepath.Join(c.hostRoot, "providers")
	for _, s := range doc.Sources {
		s.CatalogPath = podProviders + strings.TrimPrefix(s.CatalogPath, hostProviders)
		s.ArtifactRoot = podProviders + strings.TrimPrefix(s.ArtifactRoot, hostProviders)
		c.sources[s.Module+"/"+s.ImplementationID] = s
	}
	scheme, err := kubeapi.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if c.client, err = client.New(c.config, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
}

// overlay writes the kustomization this test applies: config/default with
// the host paths of both DaemonSets moved into hostRoot and the gateway
// opened to this process's uid and gid for the namespace "default". Nothing
// else changes.
func (c *cluster) overlay(t *testing.T) string {
	dir := filepath.Join(c.work, "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := filepath.Rel(dir, filepath.Join(c.repo, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf(`# test/node: config/default with the host paths in the test's root and the
# gateway opened to the test's uid and gid.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %[1]s
patches:
- target:
    kind: DaemonSet
    name: iteron-manager
  patch: |-
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: iteron-manager
    spec:
      template:
        spec:
          volumes:
          - name: state
            hostPath:
              path: %[2]s
          - name: providers
            hostPath:
              path: %[3]s
          - name: gateway
            hostPath:
              path: %[4]s
          - name: artifacts
            hostPath:
              path: %[7]s
- target:
    kind: DaemonSet
    name: iteron-manager
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --gateway-group=%[5]d
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --gateway-allow=uid:%[6]d=default
- target:
    kind: DaemonSet
    name: iteron-survivor
  patch: |-
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: iteron-survivor
    spec:
      template:
        spec:
          volumes:
          - name: state
            hostPath:
              path: %[2]s
          - name: providers
            hostPath:
              path: %[3]s
          - name: gateway
            hostPath:
              path: %[4]s
          - name: artifacts
            hostPath:
              path: %[7]s
- target:
    kind: DaemonSet
    name: iteron-survivor
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --gateway-group=%[5]d
`, base, filepath.Join(c.hostRoot, "state"), filepath.Join(c.hostRoot, "providers"), filepath.Join(c.hostRoot, "run"), os.Getgid(), os.Getuid(), filepath.Join(c.hostRoot, "artifacts"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (c *cluster) socket() string { return filepath.Join(c.hostRoot, "run", "gateway.sock") }

// managerPod is the Ready manager pod on the node, or an error saying what
// the pods are doing.
func (c *cluster) managerPod(ctx context.Context) (*corev1.Pod, error) {
	return c.readyPod(ctx, "manager")
}

// survivorPod is the Ready survivor pod on the node.
func (c *cluster) survivorPod(ctx context.Context) (*corev1.Pod, error) {
	return c.readyPod(ctx, "survivor")
}

func (c *cluster) readyPod(ctx context.Context, component string) (*corev1.Pod, error) {
	pods, err := c.clientset.CoreV1().Pods(managerNS).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=" + component, FieldSelector: "spec.nodeName=" + c.node})
	if err != nil {
		return nil, err
	}
	var seen []string
	for i := range pods.Items {
		p := &pods.Items[i]
		ready := false
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if ready && p.DeletionTimestamp == nil {
			return p, nil
		}
		seen = append(seen, fmt.Sprintf("%s %s ready=%v deleting=%v", p.Name, p.Status.Phase, ready, p.DeletionTimestamp != nil))
	}
	return nil, fmt.Errorf("no Ready %s pod on %s (pods: %v)", component, c.node, seen)
}

// diagnostics is what a failure prints: the node's objects, events, the
// manager's log and, locally, the node components' logs.
func (c *cluster) diagnostics() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== pods and DaemonSets:\n%s", c.kubectlOut("get", "nodes,ds,pods", "-A", "-o", "wide"))
	fmt.Fprintf(&b, "\n=== manager pods:\n%s", c.kubectlOut("-n", managerNS, "describe", "pods"))
	fmt.Fprintf(&b, "\n=== events:\n%s", c.kubectlOut("get", "events", "-A", "--sort-by=.lastTimestamp"))
	fmt.Fprintf(&b, "\n=== manager log (last 80 lines):\n%s", c.kubectlOut("-n", managerNS, "logs", "ds/"+managerDS, "--tail=80"))
	fmt.Fprintf(&b, "\n=== previous manager log (last 40 lines):\n%s", c.kubectlOut("-n", managerNS, "logs", "ds/"+managerDS, "--previous", "--tail=40"))
	fmt.Fprintf(&b, "\n=== survivor log (last 40 lines):\n%s", c.kubectlOut("-n", managerNS, "logs", "ds/"+survivorDS, "--tail=40"))
	fmt.Fprintf(&b, "\n=== activations and generations:\n%s", c.kubectlOut("get", "implementationactivations,generations", "-A", "-o", "yaml"))
	if c.local != nil {
		for _, name := range []string{"kubelet", "containerd", "kube-controller-manager", "kube-scheduler"} {
			fmt.Fprintf(&b, "\n=== %s log (last 30 lines):\n%s\n", name, c.local.LogTail(name, 30))
		}
	}
	return b.String()
}

// waitFor polls check every 250 ms until it returns nil; on timeout it
// fails with check's last error and the diagnostics.
func (c *cluster) waitFor(t *testing.T, what string, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if c.local != nil {
			for name, why := range c.local.Exited() {
				t.Fatalf("waiting for %s: the node's %s ended (%v):\n%s%s", what, name, why, c.local.LogTail(name, 40), c.diagnostics())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v%s", what, timeout, err, c.diagnostics())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// state prints the node's state: what `make e2e-node` shows at each step.
func (c *cluster) state(t *testing.T, step string) {
	t.Helper()
	t.Logf("==> %s\n%s%s", step,
		c.kubectlOut("get", "nodes,pods", "-A", "-o", "wide"),
		c.kubectlOut("get", "implementationactivations,generations", "-A", "-o", "wide"))
}

// testLog sends the local node's progress lines to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
