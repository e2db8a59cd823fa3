// Command localcluster runs the local control plane for the demo: etcd and
// kube-apiserver (built into bin/k8s by hack/build-controlplane.sh), bound to
// 127.0.0.1, with this repository's CRDs installed and a Node object for the
// local node (the local control plane has no kubelet and no
// kube-controller-manager). It writes an administrator kubeconfig and runs
// until SIGINT or SIGTERM, then stops both servers and removes their data.
//
//	go run ./hack/localcluster -write-kubeconfig bin/demo/kubeconfig -node "$(hostname)"
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"iteron.dev/operator/test/kubeapi"
)

func main() {
	kubeconfig := flag.String("write-kubeconfig", "", "where to write the administrator kubeconfig (required)")
	node := flag.String("node", "", "the Node object to create (required)")
	flag.Parse()
	if *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "localcluster: -write-kubeconfig and -node are required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *node); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(kubeconfigPath, node string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	env, err := kubeapi.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	if err := kubeapi.EnsureNode(ctx, env.Client, node); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "localcluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src, err := env.Kubeconfig(dir)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfigPath), 0o755); err != nil {
		return err
	}
	tmp := kubeconfigPath + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, kubeconfigPath); err != nil {
		return err
	}
	fmt.Printf("localcluster: kube-apiserver %s at %s; kubeconfig %s; node %s\n", env.ServerVersion, env.Config.Host, kubeconfigPath, node)
	<-ctx.Done()
	_ = os.Remove(kubeconfigPath)
	return nil
}
