// Command localnode runs a real one-node cluster on this machine — etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd with
// runc and the CNI bridge, kubelet and kube-proxy — inside a network
// namespace of its own, until Ctrl-C (see test/localnode for what it changes
// and how it undoes it):
//
//	make node image                # once: bin/node, bin/image
//	go run ./hack/localnode        # prints how to reach it; Ctrl-C tears it down
//	go run ./hack/localnode -cleanup   # tears down what a crashed run left
//
// It needs root and cgroup v1 (these machines); nothing it starts talks to an
// address outside loopback and its own namespace.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/localnode"
)

func main() {
	cleanup := flag.Bool("cleanup", false, "tear down every local node a crashed run left (records in "+localnode.RecordDir+"), then exit")
	count := flag.Bool("count-packets", false, "count this process's packets in the root network namespace and print the counters at exit")
	flag.Parse()
	if *cleanup {
		if err := localnode.Cleanup(os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "localnode:", err)
			os.Exit(1)
		}
		fmt.Println("localnode: nothing left to clean up")
		return
	}
	if err := run(*count); err != nil {
		fmt.Fprintln(os.Stderr, "localnode:", err)
		os.Exit(1)
	}
}

func run(count bool) error {
	if err := localnode.Available(); err != nil {
		return err
	}
	root, err := kubeapi.RepoRoot()
	if err != nil {
		return err
	}
	images := []string{filepath.Join(root, "bin", "image", "pause.tar"), filepath.Join(root, "bin", "image", "iteron-operator.tar"),
		filepath.Join(root, "bin", "image", "iteron-survivor.tar")}
	for _, img := range images {
		if _, err := os.Stat(img); err != nil {
			return fmt.Errorf("%s is missing: run `make image` first", img)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	n, err := localnode.Start(ctx, localnode.Config{
		NodeBin: filepath.Join(root, "bin", "node"), K8sBin: filepath.Join(root, "bin", "k8s"),
		Images: images, SandboxImage: "localhost/iteron-pause:1", Log: os.Stdout, CountPackets: count,
	})
	if err != nil {
		return err
	}
	fmt.Printf(`
localnode: node %s is Ready (%s). Everything runs in network namespace %s:
  nsenter --net=%s %s --kubeconfig %s get nodes -o wide
The images iteron-operator:dev and iteron-survivor:dev are imported (config/manager's DaemonSets).
Its root is %s. Ctrl-C tears everything down.
`, n.Name, time.Since(start).Round(time.Second), n.NetNS, n.NetNS, n.Kubectl, n.Kubeconfig, n.Root)
	<-ctx.Done()
	fmt.Println("\nlocalnode: stopping")
	if count {
		if _, text, err := n.PacketCounters(); err == nil {
			fmt.Print(text)
		}
	}
	return n.Stop()
}
