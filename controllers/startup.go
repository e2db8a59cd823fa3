package controllers

import (
	"context"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// StartupCoordinator is what StartupRecovery tells the coordinator.
type StartupCoordinator interface {
	// ExpectActivations names the activations of this node that exist.
	ExpectActivations(uids []string)
	// RemoveOrphans archives the state of activations that no longer exist.
	RemoveOrphans(live map[string]bool) ([]string, error)
}

// StartupRecovery runs once when the manager starts, after the cache has
// synced: it tells the coordinator which activations of this node exist (so
// that, until each is prepared, a call for one is told to retry, never that
// it does not exist), and has the coordinator archive the ledgers and remove
// the snapshots of activations deleted while no manager ran — the same
// removal a finalizer does: a ledger is never deleted, and never left as if
// it were live.
type StartupRecovery struct {
	// Client lists the activations of this node (from the node-scoped cache).
	Client client.Client
	// Cache is waited for before listing.
	Cache cache.Cache
	// Coordinator is told.
	Coordinator StartupCoordinator
	// Log receives what was archived.
	Log logr.Logger
}

// Start does the work once and returns (a one-shot Runnable).
func (s *StartupRecovery) Start(ctx context.Context) error {
	if !s.Cache.WaitForCacheSync(ctx) {
		return nil
	}
	var list iteronv1.ImplementationActivationList
	if err := s.Client.List(ctx, &list); err != nil {
		s.Log.Error(err, "list this node's activations at start; the gateway answers 'recovering' until they are known or two minutes have passed")
		return nil
	}
	live := map[string]bool{}
	uids := make([]string, 0, len(list.Items))
	for _, a := range list.Items {
		live[string(a.UID)] = true
		uids = append(uids, string(a.UID))
	}
	s.Coordinator.ExpectActivations(uids)
	archived, err := s.Coordinator.RemoveOrphans(live)
	for _, uid := range archived {
		s.Log.Info("archived the ledger of an activation that no longer exists", "uid", uid)
	}
	if err != nil {
		s.Log.Error(err, "archive the state of activations that no longer exist")
	}
	return nil
}

// NeedLeaderElection is false: every node's manager does this for itself.
func (s *StartupRecovery) NeedLeaderElection() bool { return false }
