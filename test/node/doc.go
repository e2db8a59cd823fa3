// Package node runs the product as users install it: `kubectl apply -k` of
// config/default on a real node (kubelet v1.37.2, containerd, runc, the CNI
// bridge, kube-proxy; test/localnode), the manager as a DaemonSet pod from
// the image `make image` builds, under its service account with the shipped
// RBAC and admission policy, its state, providers and gateway socket on
// hostPath volumes; beside it the survivor DaemonSet (its own image), which
// owns the providers and the gateway socket (docs/survivor.md). The
// kustomize overlay changes only the host paths (to the node's temporary
// root) and the gateway's group and allow rule (for this test's uid and
// gid).
//
// One scenario, step by step, printing the node's state at each: the
// DaemonSet becomes Ready; an activation becomes Active with providers from
// the hostPath root; a call through the gateway socket from the host; a hot
// swap v1 → v2 carries the state; `kubectl delete pod`, `kubectl rollout
// restart` and `kubectl set image` (another build of the manager: an
// upgrade) each give a new manager pod while a caller calls in a loop: no
// call fails, the count goes on without a gap, the provider processes are
// the same (pids and start times, as reported and as seen from the host),
// the ledger verifies; the probes and the metrics port answer from the pod;
// deleting the activation reaps every provider (in the survivor's pod). Locally it then tears the node down and checks that
// nothing is left (processes, mounts, cgroups, namespace, sysctls) and that
// no packet of this test went to an address outside loopback (nft counters
// in the root network namespace).
//
// Where: on a local node it starts itself (root and cgroup v1 needed; the
// test is skipped with the reason otherwise), or against the cluster in
// KUBECONFIG (hack/kind-e2e.sh: kind, the image loaded, ITERON_NODE_NAME and
// ITERON_NODE_ROOT naming the node and a directory mounted at the same path
// on this machine and on the node).
package node
