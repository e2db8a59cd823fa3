// Command pause is the sandbox ("pause") container of the local node
// (hack/localnode): it holds a pod's namespaces and does nothing else. It is
// built from this repository and packed by hack/image, because the node pulls
// nothing from a registry. Like the upstream pause it exits on SIGINT or
// SIGTERM and reaps children it inherits as PID 1.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
