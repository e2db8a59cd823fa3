// Package e2e is the end-to-end suite: the same scenario against the cluster
// in KUBECONFIG (hack/kind-e2e.sh deploys config/default on kind) or, when
// KUBECONFIG is unset, against the local control plane with the real manager
// binary running as a process. apply → Active; invoke through the gateway;
// apply v2 → a stateful hot swap; verify the ledger with the CLI; re-apply
// unchanged (server-side) → nothing restarts; delete → everything reaped.
package e2e
