// Package localnode runs a real one-node Kubernetes cluster on this machine,
// built from the Go module proxy (hack/build-node.sh, hack/build-controlplane.sh):
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd
// (with runc and the CNI bridge), kubelet and kube-proxy (nftables), for
// test/node and hack/localnode.
//
// What it guarantees:
//
//   - Network: every component runs inside a network namespace the package
//     creates (`ip netns add`, entered with `nsenter --net`, never `ip netns
//     exec`, which remounts /sys). The node's IP (10.200.0.1/24) sits on a
//     bridge there, with the pod range (10.201.0.0/24, the CNI bridge) and the
//     service range (10.202.0.0/24, programmed by kube-proxy). The namespace
//     has no link to the machine's network and no default route: nothing the
//     node runs can reach an address outside it. The test process reaches the
//     API server through [Node.DialContext], which opens its sockets inside
//     the namespace, and runs kubectl under nsenter; a unix socket in the
//     node's root (the gateway's hostPath) needs no network at all.
//   - Isolation: containerd has its own root, state, sockets, runc root and
//     netns mounts under the node's temporary root, NRI off; the kubelet's
//     cgroups live under their own cgroup root (/iteron-localnode-<id>) in
//     every cgroup v1 hierarchy, so the machine's own hierarchies and any
//     other kubelet are untouched.
//   - Teardown, on Stop and after a crash alike: a record of everything the
//     node changes outside its temporary root is written to
//     /run/iteron-localnode/<id>.json *before* each change (the sysctls'
//     values, the namespace, the cgroups, the processes with their start
//     times, directories created on the host). Teardown reads only the
//     record: it ends the recorded processes by pid (checking the start time,
//     so a reused pid is never signalled), then every process left in the
//     node's own pids cgroup (shims and containers, which are the node's
//     descendants), unmounts everything below the root, removes the cgroups,
//     deletes the namespace (its bridges and nft tables go with it), restores
//     the sysctls, removes the kubelet's log symlinks and the root. Start takes
//     an exclusive lock (/run/iteron-localnode/lock) for the node's lifetime
//     and first tears down every record it finds: those are left by runs that
//     died (a test binary killed by its timeout runs no deferred function).
//     `go run ./hack/localnode -cleanup` does the same from .ci/run's exit
//     trap.
//   - Evidence: with Config.CountPackets, Start puts the calling process in a
//     cgroup v2 of its own and adds an nft table in the root network namespace
//     whose counters count every packet a socket of that cgroup (the test and
//     everything it starts) sends, to loopback and to any other address;
//     [Node.PacketCounters] reads them.
//
// The node needs root, cgroup v1 hierarchies under /sys/fs/cgroup (these
// machines mount v1), `ip`, `nsenter` and `nft`; [Available] says why not when
// it cannot run.
package localnode
