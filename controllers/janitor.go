package controllers

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/ledger"
)

// LedgerJanitor archives, once at manager start, the ledgers in the state
// dir whose activation no longer exists (deleted while no manager ran): a
// ledger is never deleted, and never left as if it were live.
type LedgerJanitor struct {
	// Client lists the activations of this node (from the cache).
	Client client.Client
	// Cache is waited for before listing.
	Cache cache.Cache
	// StateDir holds the ledgers.
	StateDir string
	// Log receives what was archived.
	Log logr.Logger
}

// Start archives orphaned ledgers and returns (a one-shot Runnable).
func (j *LedgerJanitor) Start(ctx context.Context) error {
	if !j.Cache.WaitForCacheSync(ctx) {
		return nil
	}
	uids, err := ledger.ActivationUIDs(j.StateDir)
	if err != nil {
		j.Log.Error(err, "list the ledgers in the state dir")
		return nil
	}
	var list iteronv1.ImplementationActivationList
	if err := j.Client.List(ctx, &list); err != nil {
		j.Log.Error(err, "list activations")
		return nil
	}
	known := map[string]bool{}
	for _, a := range list.Items {
		known[string(a.UID)] = true
	}
	for _, uid := range uids {
		if known[uid] {
			continue
		}
		path, err := ledger.Archive(j.StateDir, uid, time.Now(), 0)
		if err != nil {
			j.Log.Error(err, "archive the ledger of a deleted activation", "uid", uid)
			continue
		}
		j.Log.Info("archived the ledger of an activation that no longer exists", "uid", uid, "archive", path)
	}
	return nil
}
