// Package fleet holds the ActivationSet reconciler: it stamps one
// ImplementationActivation per selected node and rolls template changes out
// wave by wave. It runs in the fleet controller (cmd/manager --role=fleet, a
// Deployment of its own with leader election), never in the node managers:
// it needs create/update/delete on activations cluster-wide, and losing a
// leader lease ends the process, which a node manager must never do.
//
// The reconciler is thin: it reads the set, the selected Nodes (metadata
// only), the activations and the template revisions from the cache, asks
// internal/fleet what to do, writes the status first (guarded by the set's
// resourceVersion, so a reconcile of a stale set acts on nothing) and then
// carries out the actions. Its RBAC markers generate config/fleet/role.yaml
// (make manifests), separate from the node managers' role.
package fleet
