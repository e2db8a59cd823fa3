package localnode

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"iteron.dev/operator/test/childproc"
)

// Config says where the node's binaries and images are.
type Config struct {
	// NodeBin holds kubelet, kube-proxy, kube-controller-manager,
	// kube-scheduler, containerd, ctr, containerd-shim-runc-v2, runc and the
	// CNI plugins (make node: bin/node).
	NodeBin string
	// K8sBin holds etcd, kube-apiserver and kubectl (make controlplane:
	// bin/k8s).
	K8sBin string
	// Images are image tarballs imported into containerd before the kubelet
	// starts (make image: bin/image/*.tar); SandboxImage must be among them.
	Images []string
	// SandboxImage is containerd's sandbox (pause) image.
	SandboxImage string
	// Name is the node's name (default iteron-localnode).
	Name string
	// Log receives one line per step (default os.Stderr).
	Log io.Writer
	// LockWait is how long Start waits for another local node to end
	// (default 20 minutes).
	LockWait time.Duration
	// CountPackets puts this process in a cgroup of its own and counts,
	// in the root network namespace, every packet its sockets send (see
	// PacketCounters).
	CountPackets bool
}

// Node is a running local node.
type Node struct {
	// ID names this run (its root, namespace, cgroups and record).
	ID string
	// Name is the node's name.
	Name string
	// Root is the node's temporary root; everything the node writes is
	// below it.
	Root string
	// NetNS is the path of the node's network namespace.
	NetNS string
	// Kubeconfig is an administrator's kubeconfig (the server is NodeIP:
	// use it from inside the namespace, as Command does).
	Kubeconfig string
	// Kubectl is the kubectl built beside the control plane.
	Kubectl string
	// Config reaches the API server as an administrator from this process
	// (its connections are opened inside the node's namespace).
	Config *rest.Config
	// Clientset is a clientset for Config.
	Clientset kubernetes.Interface

	cfg  Config
	rec  *record
	lock *lock
	pki  *pki
	nsFD int
	log  io.Writer

	mu       sync.Mutex
	procs    map[string]*exec.Cmd
	exited   map[string]error
	stopOnce sync.Once
	stopErr  error
	// sandboxIDs are the pod sandboxes containerd had when Stop began.
	sandboxIDs []string
}

// Start starts the node and returns when its Node object is Ready and
// kube-proxy runs. On error everything it started is torn down.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = os.Stderr
	}
	if cfg.Name == "" {
		cfg.Name = "iteron-localnode"
	}
	if cfg.LockWait == 0 {
		cfg.LockWait = 20 * time.Minute
	}
	for _, bin := range []string{"kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler", "containerd", "ctr", "containerd-shim-runc-v2", "runc", "bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cfg.NodeBin, bin)); err != nil {
			return nil, fmt.Errorf("node binary %s is missing from %s (run `make node`): %w", bin, cfg.NodeBin, err)
		}
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(cfg.K8sBin, bin)); err != nil {
			return nil, fmt.Errorf("control-plane binary %s is missing from %s (run `make controlplane`): %w", bin, cfg.K8sBin, err)
		}
	}
	l, err := acquireLock(cfg.Log, cfg.LockWait)
	if err != nil {
		return nil, err
	}
	if err := cleanupStale(cfg.Log); err != nil {
		l.release()
		return nil, fmt.Errorf("a local node left by an earlier run could not be cleaned up: %w", err)
	}
	idBytes := make([]byte, 3)
	_, _ = rand.Read(idBytes)
	id := hex.EncodeToString(idBytes)
	n := &Node{
		ID: id, Name: cfg.Name, Root: filepath.Join(os.TempDir(), "iteron-node-"+id),
		Kubectl: filepath.Join(cfg.K8sBin, "kubectl"),
		cfg:     cfg, lock: l, log: cfg.Log, nsFD: -1,
		procs: map[string]*exec.Cmd{}, exited: map[string]error{},
	}
	n.rec = &record{ID: id, Owner: os.Getpid(), Root: n.Root}
	defer func() {
		if err != nil {
			fmt.Fprintf(n.log, "localnode: start failed: %v\n", err)
			n.printTails(40)
			if serr := n.Stop(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}()
	if err := n.rec.save(); err != nil {
		return n, err
	}
	if err := os.MkdirAll(filepath.Join(n.Root, "logs"), 0o755); err != nil {
		return n, err
	}
	// The root and its parents must be traversable by providers (uid 65534).
	if err := os.Chmod(n.Root, 0o755); err != nil {
		return n, err
	}
	n.say("root %s, sysctls saved, host paths noted", n.Root)
	n.rec.Sysctls = ReadSysctls()
	for _, d := range []string{"/var/log/containers", "/var/lib/cni", "/var/lib/cni/results"} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			n.rec.CreatedDirs = append(n.rec.CreatedDirs, d)
		}
	}
	if err := makeCgroups(n.rec, "iteron-localnode-"+id); err != nil {
		return n, fmt.Errorf("cgroups: %w", err)
	}
	if cfg.CountPackets {
		if err := n.countPackets(); err != nil {
			return n, fmt.Errorf("packet counters: %w", err)
		}
	}
	if err := n.makeNetNS(); err != nil {
		return n, fmt.Errorf("network namespace: %w", err)
	}
	if err := n.startControlPlane(ctx); err != nil {
		return n, err
	}
	if err := n.startNode(ctx); err != nil {
		return n, err
	}
	return n, nil
}

func (n *Node) say(format string, args ...any) {
	fmt.Fprintf(n.log, "localnode: "+format+"\n", args...)
}

// makeNetNS creates the namespace with the node's IP on a bridge, loopback
// up, and no route out.
func (n *Node) makeNetNS() error {
	name := "iteron-localnode-" + n.ID
	n.rec.NetNS = name
	if err := n.rec.save(); err != nil {
		return err
	}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	n.NetNS = filepath.Join("/run/netns", name)
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", nodeBridge, "type", "bridge"},
		{"addr", "add", nodeCIDR, "dev", nodeBridge},
		{"link", "set", nodeBridge, "up"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + n.NetNS, "--", "ip"}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s (in %s): %v: %s", strings.Join(args, " "), name, err, out)
		}
	}
	fd, err := unix.Open(n.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	n.nsFD = fd
	n.say("network namespace %s: %s on %s, no route out", name, nodeCIDR, nodeBridge)
	return nil
}

// countPackets moves this process into a cgroup v2 of its own and adds the
// counting table in the root namespace.
func (n *Node) countPackets() error {
	origin, err := ownCgroupV2()
	if err != nil {
		return err
	}
	dir := filepath.Join(cgroupV2Root, n.rec.Cgroup)
	n.rec.NFTTable = "iteron_localnode_" + n.ID
	n.rec.CountedPid, n.rec.CountedOrigin = os.Getpid(), origin
	if err := n.rec.save(); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return err
	}
	cg := fmt.Sprintf("%q", strings.TrimPrefix(filepath.Join(strings.TrimPrefix(cgroupV2Root, cgroupV1Root+"/"), n.rec.Cgroup), "/"))
	rules := fmt.Sprintf(`table inet %[1]s {
  chain output {
    type filter hook output priority -300; policy accept;
    socket cgroupv2 level 1 %[2]s ip daddr 127.0.0.0/8 counter comment "test-to-loopback"
    socket cgroupv2 level 1 %[2]s ip6 daddr ::1 counter comment "test-to-loopback6"
    socket cgroupv2 level 1 %[2]s ip daddr != 127.0.0.0/8 counter comment "test-to-elsewhere"
    socket cgroupv2 level 1 %[2]s ip6 daddr != ::1 counter comment "test-to-elsewhere6"
    ip daddr { %[3]s } counter comment "any-to-node-ranges"
  }
  chain forward {
    type filter hook forward priority -300; policy accept;
    ip saddr { %[3]s } counter comment "forwarded-from-node-ranges"
    ip daddr { %[3]s } counter comment "forwarded-to-node-ranges"
  }
}
`, n.rec.NFTTable, cg, "10.200.0.0/24, "+PodCIDR+", "+ServiceCIDR)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %v: %s", err, out)
	}
	n.say("counting this process's packets in the root network namespace (nft table inet %s, cgroup %s)", n.rec.NFTTable, dir)
	return nil
}

// ownCgroupV2 is this process's cgroup in the unified hierarchy.
func ownCgroupV2() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "0::") {
			return strings.TrimPrefix(line, "0::"), nil
		}
	}
	return "", errors.New("this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)")
}

// PacketCounters lists the root namespace's counters (comment → packets)
// when the node counts packets: "test-to-elsewhere" and "test-to-elsewhere6"
// count what this process and its children sent to an address outside
// loopback from the root namespace; "test-to-loopback" shows the rule
// matches their sockets at all.
func (n *Node) PacketCounters() (map[string]uint64, string, error) {
	if n.rec.NFTTable == "" {
		return nil, "", errors.New("the node was started without CountPackets")
	}
	out, err := exec.Command("nft", "list", "table", "inet", n.rec.NFTTable).CombinedOutput()
	if err != nil {
		return nil, string(out), fmt.Errorf("nft list table: %v: %s", err, out)
	}
	counters := map[string]uint64{}
	for _, line := range strings.Split(string(out), "\n") {
		i := strings.Index(line, "counter packets ")
		j := strings.Index(line, `comment "`)
		if i < 0 || j < 0 {
			continue
		}
		var packets uint64
		fmt.Sscanf(line[i+len("counter packets "):], "%d", &packets)
		comment := line[j+len(`comment "`):]
		comment = comment[:strings.IndexByte(comment, '"')]
		counters[comment] = packets
	}
	return counters, string(out), nil
}

// start runs bin in the node's namespace and its daemons cgroup, logging to
// logs/<name>.log, and records it.
func (n *Node) start(name, bin string, args ...string) error {
	logf, err := os.OpenFile(filepath.Join(n.Root, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	daemons := filepath.Join(cgroupV1Root, "pids", n.rec.Cgroup, "daemons")
	// nsenter execs (no fork for --net alone), then sh joins the cgroup and
	// execs the daemon: the pid is the daemon's from the start.
	script := `echo $$ > "$1/cgroup.procs" && shift && exec "$@"`
	cmd := exec.Command("nsenter", append([]string{"--net=" + n.NetNS, "--", "/bin/sh", "-c", script, "sh", daemons, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PATH="+n.cfg.NodeBin+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := childproc.Start(cmd, syscall.SIGKILL); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		return err
	}
	n.rec.Procs = append(n.rec.Procs, proc{Name: name, Pid: cmd.Process.Pid, Start: st})
	if err := n.rec.save(); err != nil {
		return err
	}
	n.mu.Lock()
	n.procs[name] = cmd
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exited with status 0")
		}
		n.mu.Lock()
		n.exited[name] = err
		n.mu.Unlock()
	}()
	n.say("started %s (pid %d)", name, cmd.Process.Pid)
	return nil
}

// Exited reports the node's components that have ended, with how.
func (n *Node) Exited() map[string]error {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]error{}
	for k, v := range n.exited {
		out[k] = v
	}
	return out
}

// waitFor polls check until it returns nil, a component exits, or timeout
// passes; the error names what it waited for and what it saw last.
func (n *Node) waitFor(ctx context.Context, what string, timeout time.Duration, check func() error, tails ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		for name, why := range n.Exited() {
			return fmt.Errorf("waiting for %s: %s ended (%v); its log ends:\n%s", what, name, why, n.LogTail(name, 30))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var b strings.Builder
			for _, t := range tails {
				fmt.Fprintf(&b, "\n--- %s log (last 30 lines):\n%s", t, n.LogTail(t, 30))
			}
			return fmt.Errorf("%s not within %s: %v%s", what, timeout, err, b.String())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (n *Node) startControlPlane(ctx context.Context) error {
	p, err := newPKI(filepath.Join(n.Root, "pki"))
	if err != nil {
		return err
	}
	n.pki = p
	ip := net.ParseIP(NodeIP)
	server := "https://" + NodeIP + ":6443"
	certs := []struct {
		name, cn string
		orgs     []string
		ips      []net.IP
		dns      []string
	}{
		{"apiserver", "kube-apiserver", nil, []net.IP{ip, net.ParseIP(serviceIP), net.ParseIP("127.0.0.1")},
			[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil},
		{"admin", "iteron-localnode-admin", []string{"system:masters"}, nil, nil},
		{"controller-manager", "system:kube-controller-manager", nil, nil, nil},
		{"scheduler", "system:kube-scheduler", nil, nil, nil},
		{"kubelet", "system:node:" + n.Name, []string{"system:nodes"}, nil, nil},
		{"kube-proxy", "system:kube-proxy", nil, nil, nil},
	}
	kubeconfigs := map[string]string{}
	for _, c := range certs {
		if err := p.issue(c.name, c.cn, c.orgs, c.ips, c.dns); err != nil {
			return err
		}
		if kubeconfigs[c.name], err = p.kubeconfig(c.name, server); err != nil {
			return err
		}
	}
	n.Kubeconfig = kubeconfigs["admin"]
	if n.Config, err = clientcmd.BuildConfigFromFlags("", n.Kubeconfig); err != nil {
		return err
	}
	n.Config.Dial = n.DialContext
	n.Config.QPS, n.Config.Burst = 50, 100
	if n.Clientset, err = kubernetes.NewForConfig(n.Config); err != nil {
		return err
	}

	if err := n.start("etcd", filepath.Join(n.cfg.K8sBin, "etcd"),
		"--name=localnode", "--data-dir="+filepath.Join(n.Root, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=localnode=http://127.0.0.1:2380", "--listen-metrics-urls=",
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	plain := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: n.DialContext}}
	if err := n.waitFor(ctx, "etcd to be healthy", time.Minute, func() error {
		resp, err := plain.Get("http://127.0.0.1:2379/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("/health: %s", resp.Status)
		}
		return nil
	}, "etcd"); err != nil {
		return err
	}
	if err := n.start("kube-apiserver", filepath.Join(n.cfg.K8sBin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+NodeIP, "--advertise-address="+NodeIP, "--secure-port=6443",
		"--cert-dir="+filepath.Join(n.Root, "apiserver-certs"),
		"--tls-cert-file="+p.path("apiserver.crt"), "--tls-private-key-file="+p.path("apiserver.key"),
		"--client-ca-file="+p.path("ca.crt"),
		"--kubelet-client-certificate="+p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+p.path("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-cluster-ip-range="+ServiceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.path("sa.pub"),
		"--service-account-signing-key-file="+p.path("sa.key"),
		"--authorization-mode=Node,RBAC", "--allow-privileged=true",
		"--anonymous-auth=false", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	if err := n.waitFor(ctx, "kube-apiserver to be ready", 3*time.Minute, func() error {
		_, err := n.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}, "kube-apiserver"); err != nil {
		return err
	}
	info, err := n.Clientset.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	n.say("kube-apiserver %s ready on https://%s:6443 (inside the namespace)", info.GitVersion, NodeIP)

	if err := n.start("kube-controller-manager", filepath.Join(n.cfg.NodeBin, "kube-controller-manager"),
		"--kubeconfig="+kubeconfigs["controller-manager"],
		"--authentication-kubeconfig="+kubeconfigs["controller-manager"],
		"--authorization-kubeconfig="+kubeconfigs["controller-manager"],
		"--bind-address=127.0.0.1", "--leader-elect=false",
		"--root-ca-file="+p.path("ca.crt"),
		"--service-account-private-key-file="+p.path("sa.key"),
		"--use-service-account-credentials=true",
		"--allocate-node-cidrs=false", "--cluster-name=localnode", "--v=1"); err != nil {
		return err
	}
	return n.start("kube-scheduler", filepath.Join(n.cfg.NodeBin, "kube-scheduler"),
		"--kubeconfig="+kubeconfigs["scheduler"],
		"--authentication-kubeconfig="+kubeconfigs["scheduler"],
		"--authorization-kubeconfig="+kubeconfigs["scheduler"],
		"--bind-address=127.0.0.1", "--leader-elect=false", "--v=1")
}

func (n *Node) startNode(ctx context.Context) error {
	if err := writeFile(filepath.Join(n.Root, "containerd", "config.toml"), n.containerdConfig()); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(n.Root, "cni", "net.d", "10-iteron.conflist"), n.cniConfig()); err != nil {
		return err
	}
	if err := n.start("containerd", filepath.Join(n.cfg.NodeBin, "containerd"),
		"--config="+filepath.Join(n.Root, "containerd", "config.toml"), "--log-level=info"); err != nil {
		return err
	}
	ctr := func(args ...string) *exec.Cmd {
		return exec.Command(filepath.Join(n.cfg.NodeBin, "ctr"), append([]string{"--address", n.containerdSocket(), "--namespace", "k8s.io"}, args...)...)
	}
	if err := n.waitFor(ctx, "containerd to serve", time.Minute, func() error {
		out, err := ctr("version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}, "containerd"); err != nil {
		return err
	}
	for _, img := range n.cfg.Images {
		start := time.Now()
		out, err := ctr("images", "import", "--no-unpack=false", img).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v\n%s", img, err, out)
		}
		n.say("imported %s in %s", filepath.Base(img), time.Since(start).Round(100*time.Millisecond))
	}
	if out, err := ctr("images", "ls", "-q").CombinedOutput(); err != nil || !strings.Contains(string(out), n.cfg.SandboxImage) {
		return fmt.Errorf("the sandbox image %s is not among containerd's images after the import (%v):\n%s", n.cfg.SandboxImage, err, out)
	}

	kubeletDir := filepath.Join(n.Root, "kubelet")
	if err := writeFile(filepath.Join(kubeletDir, "config.yaml"), n.kubeletConfig()); err != nil {
		return err
	}
	kubeletKubeconfig, err := n.pki.kubeconfig("kubelet", "https://"+NodeIP+":6443")
	if err != nil {
		return err
	}
	if err := n.start("kubelet", filepath.Join(n.cfg.NodeBin, "kubelet"),
		"--config="+filepath.Join(kubeletDir, "config.yaml"),
		"--kubeconfig="+kubeletKubeconfig,
		"--root-dir="+filepath.Join(kubeletDir, "root"),
		"--cert-dir="+filepath.Join(kubeletDir, "pki"),
		"--hostname-override="+n.Name, "--node-ip="+NodeIP, "--v=1"); err != nil {
		return err
	}
	if err := n.waitFor(ctx, "the Node to be Ready", 3*time.Minute, func() error {
		node, err := n.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("Ready=%s: %s %s", c.Status, c.Reason, c.Message)
			}
		}
		return errors.New("no Ready condition yet")
	}, "kubelet", "containerd"); err != nil {
		return err
	}
	n.say("node %s Ready (kubelet %s, cgroup root /%s)", n.Name, kubeletVersion(ctx, n), n.rec.Cgroup)

	proxyKubeconfig := filepath.Join(n.Root, "pki", "kube-proxy.kubeconfig")
	if err := writeFile(filepath.Join(n.Root, "kube-proxy", "config.yaml"), n.kubeProxyConfig(proxyKubeconfig)); err != nil {
		return err
	}
	if err := n.start("kube-proxy", filepath.Join(n.cfg.NodeBin, "kube-proxy"),
		"--config="+filepath.Join(n.Root, "kube-proxy", "config.yaml"), "--v=1"); err != nil {
		return err
	}
	plain := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: n.DialContext}}
	return n.waitFor(ctx, "kube-proxy to have synced its rules", 2*time.Minute, func() error {
		resp, err := plain.Get("http://127.0.0.1:10256/healthz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("/healthz: %s %s", resp.Status, body)
		}
		return nil
	}, "kube-proxy")
}

// Versions says what the node runs: the API server's, the kubelet's and the
// container runtime's versions as the API server reports them.
func (n *Node) Versions(ctx context.Context) string {
	info, err := n.Clientset.Discovery().ServerVersion()
	if err != nil {
		return "?"
	}
	return "kube-apiserver " + info.GitVersion + ", kubelet " + kubeletVersion(ctx, n)
}

func kubeletVersion(ctx context.Context, n *Node) string {
	node, err := n.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return "?"
	}
	return node.Status.NodeInfo.KubeletVersion + ", " + node.Status.NodeInfo.ContainerRuntimeVersion
}

// DialContext opens a connection from inside the node's network namespace:
// the socket is created on an OS thread that joined the namespace (and ends
// with its goroutine, never returning to the pool).
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread stays in the namespace and exits with this goroutine
		if err := unix.Setns(n.nsFD, unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns into %s: %w", n.NetNS, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// HTTPClient reaches addresses inside the node's namespace (pods, the
// node IP).
func (n *Node) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: n.DialContext, DisableKeepAlives: true}}
}

// Command runs name inside the node's network namespace (nsenter --net).
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.NetNS, "--", name}, args...)...)
}

// KubectlCmd runs the built kubectl as the administrator inside the node's
// namespace.
func (n *Node) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	return n.Command(ctx, n.Kubectl, append([]string{"--kubeconfig", n.Kubeconfig}, args...)...)
}

// LogTail returns the last lines of a component's log.
func (n *Node) LogTail(name string, lines int) string {
	data, err := os.ReadFile(filepath.Join(n.Root, "logs", name+".log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func (n *Node) printTails(lines int) {
	n.mu.Lock()
	var names []string
	for name := range n.procs {
		names = append(names, name)
	}
	n.mu.Unlock()
	for _, name := range names {
		fmt.Fprintf(n.log, "--- %s log (last %d lines):\n%s\n", name, lines, n.LogTail(name, lines))
	}
}

// Stop tears the node down (see the package doc) and releases the lock. It
// is safe to call more than once.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() {
		start := time.Now()
		sandboxes, _ := filepath.Glob(filepath.Join(n.Root, "containerd", "*", "io.containerd.grpc.v1.cri", "sandboxes", "*"))
		for _, sb := range sandboxes {
			n.sandboxIDs = append(n.sandboxIDs, filepath.Base(sb))
		}
		var buf bytes.Buffer
		n.stopErr = teardown(io.MultiWriter(n.log, &buf), n.rec)
		if n.nsFD >= 0 {
			unix.Close(n.nsFD)
		}
		n.lock.release()
		if n.stopErr == nil {
			n.say("torn down in %s: processes, mounts, cgroups, namespace, sysctls, host files, root", time.Since(start).Round(100*time.Millisecond))
		}
	})
	return n.stopErr
}

// PodProcess is a process in the node's pod cgroups, as this machine sees it.
type PodProcess struct {
	Pid     int
	UID     int
	Cmdline string
}

// PodProcesses lists the processes in the kubelet's pod cgroups (the
// kubepods tree under the node's cgroup root).
func (n *Node) PodProcesses() ([]PodProcess, error) {
	pids, err := cgroupPids(filepath.Join(cgroupV1Root, "pids", n.rec.Cgroup, "kubepods"))
	if err != nil {
		return nil, err
	}
	var out []PodProcess
	for _, pid := range pids {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // ended meanwhile
		}
		p := PodProcess{Pid: pid, UID: -1}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
				fmt.Sscanf(f[1], "%d", &p.UID)
			}
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		p.Cmdline = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
		out = append(out, p)
	}
	return out, nil
}

// Leftovers lists, after Stop, anything of the node that is still there: a
// recorded process, a mount below the root, a cgroup, the namespace, the nft
// table, a kubelet log symlink, libcni results, the root, the record.
func (n *Node) Leftovers() ([]string, error) {
	var left []string
	for _, p := range n.rec.Procs {
		if sameProcess(p) {
			left = append(left, fmt.Sprintf("process %s (pid %d)", p.Name, p.Pid))
		}
	}
	mounts, err := mountsBelow(n.Root)
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		left = append(left, "mount "+m)
	}
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	dirs := []string{filepath.Join(cgroupV2Root, n.rec.Cgroup)}
	for _, h := range hs {
		dirs = append(dirs, filepath.Join(cgroupV1Root, h, n.rec.Cgroup))
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "cgroup "+d)
		}
	}
	if n.rec.NetNS != "" {
		if _, err := os.Stat(filepath.Join("/run/netns", n.rec.NetNS)); err == nil {
			left = append(left, "network namespace "+n.rec.NetNS)
		}
		if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); strings.Contains(string(out), n.rec.NetNS) {
			left = append(left, "ip netns lists "+n.rec.NetNS)
		}
	}
	if n.rec.NFTTable != "" {
		if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), n.rec.NFTTable) {
			left = append(left, "nft table "+n.rec.NFTTable)
		}
	}
	links, _ := filepath.Glob("/var/log/containers/*")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, n.Root+"/") {
			left = append(left, "symlink "+l)
		}
	}
	leftResults, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", cniNetwork+"-*"))
	for _, id := range n.sandboxIDs {
		more, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "*-"+id+"-*"))
		leftResults = append(leftResults, more...)
	}
	for _, r := range leftResults {
		left = append(left, "libcni result "+r)
	}
	for _, d := range n.rec.CreatedDirs {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "directory "+d+" (the node created it)")
		}
	}
	for _, p := range []string{n.Root, n.rec.path()} {
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	return left, nil
}
