package controllers

import (
	"context"
	"errors"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/graph"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// NewResolver returns the Resolve function of the activation controller:
// verify every source on this node (internal/verifier), then place the
// sources in the seam graph (internal/graph) for admission, epochs and
// orders.
func NewResolver(v *verifier.Verifier) func(context.Context, *iteronv1.ImplementationActivationSpec) Resolution {
	return func(_ context.Context, spec *iteronv1.ImplementationActivationSpec) Resolution {
		res, err := v.VerifySpec(spec)
		if err != nil {
			return Resolution{DocumentError: err, DocumentCode: codeOrDefault(err, reasons.VerificationFailed)}
		}
		ev, err := graph.Evaluate(graph.FromVerification(v.Graph(), res))
		if err != nil {
			return Resolution{DocumentError: err, DocumentCode: reasons.VerificationFailed}
		}
		plans := map[string]*verifier.VerifiedSource{}
		for _, vs := range res.Verified() {
			plans[vs.Module] = vs
		}
		out := Resolution{ActivateOrder: ev.ActivateOrder, DrainOrder: ev.DrainOrder, RetryAfter: retryAfter(res)}
		out.Reusable = len(res.Failed()) == 0 && out.RetryAfter == 0
		for _, vs := range res.Verified() {
			out.Files = append(out.Files, vs.Files...)
		}
		for _, ms := range ev.Modules {
			rm := ResolvedModule{Module: ms.Module, Epoch: ms.Epoch, Identity: ms.Identity, DependsOn: ms.DependsOn, Code: ms.Reason, Message: ms.Message, Diagnostics: ms.Diagnostics}
			if vs, ok := plans[ms.Module]; ok {
				rm.NotAdmitted = vs.NotAdmittedCapabilities
				if ms.Admitted {
					plan := vs.Plan
					rm.Plan, rm.CatalogPath = &plan, vs.CatalogPath
				}
			}
			out.Modules = append(out.Modules, rm)
		}
		return out
	}
}

// retryAfter is when the soonest OCI source still being pulled, or waiting
// for its next attempt, should be looked at again (0 when none is).
func retryAfter(res *verifier.Result) time.Duration {
	var soonest time.Duration
	for _, f := range res.Failed() {
		var ae interface{ RetryIn() time.Duration }
		if errors.As(f.Err, &ae) {
			if d := ae.RetryIn(); d > 0 && (soonest == 0 || d < soonest) {
				soonest = d
			}
		}
	}
	return soonest
}

func codeOrDefault(err error, fallback string) string {
	var rc interface{ ReasonCode() string }
	if errors.As(err, &rc) && rc.ReasonCode() != "" {
		return rc.ReasonCode()
	}
	return fallback
}
