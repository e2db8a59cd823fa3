package localnode

import (
	"fmt"
	"os"
	"path/filepath"
)

// The node's addresses, all inside its own network namespace.
const (
	// NodeIP is the node's address, on a bridge inside its namespace: the API
	// server binds and advertises it, the kubelet registers it.
	NodeIP     = "10.200.0.1"
	nodeCIDR   = "10.200.0.1/24"
	nodeBridge = "node0"
	// PodCIDR is the CNI bridge's range (pods' addresses).
	PodCIDR = "10.201.0.0/24"
	cniBr   = "iteron-cni0"
	// ServiceCIDR is the service range kube-proxy programs; the API
	// server's service is its first address.
	ServiceCIDR = "10.202.0.0/24"
	serviceIP   = "10.202.0.1"
	// cniNetwork names the CNI network (libcni caches its results under
	// /var/lib/cni/results/<network>-…).
	cniNetwork = "iteron-localnode"
)

// containerdConfig is containerd's config (version 3, containerd 2.x): its
// own root, state, sockets and runc root under the node's root, NRI and the
// plugins that would write outside it disabled, restrict_oom_score_adj (root
// here lacks CAP_SYS_RESOURCE), netns mounts under its state dir, the pause
// image built by hack/image as the sandbox image.
func (n *Node) containerdConfig() string {
	d := filepath.Join(n.Root, "containerd")
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
temp = %[3]q
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
]

[grpc]
  address = %[4]q

[ttrpc]
  address = %[5]q

[debug]
  address = ""

[metrics]
  address = ""

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[7]q]
    conf_dir = %[8]q
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[9]q
        Root = %[10]q
        SystemdCgroup = false
`, filepath.Join(d, "root"), filepath.Join(d, "state"), filepath.Join(d, "tmp"),
		n.containerdSocket(), filepath.Join(d, "containerd.ttrpc.sock"),
		n.cfg.SandboxImage, n.cfg.NodeBin, filepath.Join(n.Root, "cni", "net.d"),
		filepath.Join(n.cfg.NodeBin, "runc"), filepath.Join(n.Root, "runc"))
}

func (n *Node) containerdSocket() string {
	return filepath.Join(n.Root, "containerd", "containerd.sock")
}

// cniConfig is the bridge network for pods: no masquerading (there is no
// iptables binary, and nothing leaves the namespace anyway), host-local IPAM
// with its data under the root.
func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "dataDir": %q
      }
    }
  ]
}
`, cniNetwork, cniBr, PodCIDR, filepath.Join(n.Root, "cni", "ipam"))
}

// kubeletConfig: cgroup v1 with cgroupfs under the node's own cgroup root,
// swap tolerated, eviction thresholds loose enough for a small shared disk,
// image GC off, every directory under the root, no DNS servers of the
// machine handed to pods, the API server's client certificates accepted.
func (n *Node) kubeletConfig() string {
	k := filepath.Join(n.Root, "kubelet")
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %[2]s
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: /%[3]s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[4]s
podLogsDir: %[5]s
volumePluginDir: %[6]s
resolvConf: ""
clusterDomain: cluster.local
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 16
serializeImagePulls: false
protectKernelDefaults: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
`, NodeIP, n.pki.path("ca.crt"), n.rec.Cgroup, n.containerdSocket(),
		filepath.Join(k, "pod-logs"), filepath.Join(k, "volume-plugins"))
}

// kubeProxyConfig: nftables mode inside the namespace, conntrack settings
// left as they are (they are global), node ports only on the node IP.
func (n *Node) kubeProxyConfig(kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["%s/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, kubeconfig, n.Name, PodCIDR, NodeIP, NodeIP)
}

func writeFile(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
