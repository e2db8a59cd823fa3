package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// conflictRequeue is how soon a reconcile whose status patch lost to a newer
// write runs again. The watch event of that write usually comes first.
const conflictRequeue = time.Second

// patchStatusFrom writes obj's status as a merge patch against base, guarded
// by base's resourceVersion. A merge patch computed from a stale cache read
// would otherwise merge two reconciles' views field by field (a plan listing
// one module as both reloaded and unchanged). It reports conflict when the
// object changed since base was read: the caller requeues and reads again
// instead of writing a status derived from an old object.
//
// A status that changes nothing is not written: every reconcile mirrors the
// coordinator again (the watch event of the controller's own write brings
// one), and an empty patch would still cost a request and a new
// resourceVersion for nothing.
func patchStatusFrom(ctx context.Context, c client.Client, obj, base client.Object) (conflict bool, err error) {
	if data, err := client.MergeFrom(base).Data(obj); err == nil && string(data) == "{}" {
		return false, nil
	}
	err = c.Status().Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}
