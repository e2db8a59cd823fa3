// Package gitops holds the tests that GitOps tools read ImplementationActivation
// and Generation health the way the design says: the Argo CD health check
// (config/argocd/health.lua) run in the Lua interpreter Argo CD embeds, and
// cli-utils' kstatus (what Flux and `kubectl wait`-style tooling use), both
// against objects whose status was written through the status subresource of
// a real kube-apiserver.
package gitops
