package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/fleet"
	"iteron.dev/operator/internal/fleet/analysis"
)

// errInvalidAnalysis marks an analysis the controller cannot carry out (a
// provider missing or not admitting the namespace, a condition that does
// not compile): the set is refused (Stalled) before any node moves.
var errInvalidAnalysis = errors.New("invalid analysis")

// providers reads the AnalysisProviders the set's analysis names and, while
// a rollout is under way (the stable revision is not the update), checks
// the analysis against them.
func (r *Reconciler) providers(ctx context.Context, set *iteronv1.ActivationSet, update fleet.Revision) (map[string]*iteronv1.AnalysisProvider, error) {
	a := set.Spec.Strategy.Analysis
	if a == nil {
		return nil, nil
	}
	out := map[string]*iteronv1.AnalysisProvider{}
	for _, m := range a.Metrics {
		if _, seen := out[m.Provider]; seen {
			continue
		}
		var p iteronv1.AnalysisProvider
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: m.Provider}, &p); {
		case apierrors.IsNotFound(err):
			out[m.Provider] = nil
		case err != nil:
			return nil, fmt.Errorf("read AnalysisProvider %s: %w", m.Provider, err)
		default:
			out[m.Provider] = &p
		}
	}
	if set.Status.CurrentRevision != "" && set.Status.CurrentRevision != update.Name {
		if err := analysis.Validate(a, out, set.Namespace); err != nil {
			return nil, fmt.Errorf("%w: %w", errInvalidAnalysis, err)
		}
	}
	return out, nil
}

// measure makes the measurements due, in parallel (each bounded by its
// provider's timeout).
func (r *Reconciler) measure(ctx context.Context, set *iteronv1.ActivationSet, providers map[string]*iteronv1.AnalysisProvider, due []fleet.MeasureRequest, now time.Time) []fleet.Measured {
	metrics := map[string]*iteronv1.AnalysisMetric{}
	for i := range set.Spec.Strategy.Analysis.Metrics {
		m := &set.Spec.Strategy.Analysis.Metrics[i]
		metrics[m.Name] = m
	}
	out := make([]fleet.Measured, len(due))
	var wg sync.WaitGroup
	for i, req := range due {
		m := metrics[req.Metric]
		out[i].MeasureRequest = req
		if m == nil {
			out[i].Result = iteronv1.Measurement{Phase: iteronv1.AnalysisError, Message: "the metric is no longer in the spec"}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].Result = analysis.Measure(ctx, r.HTTP, analysis.Request{Metric: m, Provider: providers[m.Provider], Seq: req.Seq, Vars: analysis.Vars{
				Set: set.Name, Namespace: set.Namespace, Revision: req.Revision, RevisionHash: req.Hash, Wave: req.Wave, Nodes: req.Nodes,
			}}, now)
		}()
	}
	wg.Wait()
	return out
}

// announceAnalysis emits an event for each analysis run that finished in
// this plan: what was measured and what decided it.
func (r *Reconciler) announceAnalysis(set *iteronv1.ActivationSet, plan fleet.Plan) {
	before := map[string]iteronv1.AnalysisPhase{}
	for _, run := range set.Status.AnalysisRuns {
		before[fmt.Sprintf("%s/%s/%d", run.Metric, run.Revision, run.Wave)] = run.Phase
	}
	for _, run := range plan.Status.AnalysisRuns {
		key := fmt.Sprintf("%s/%s/%d", run.Metric, run.Revision, run.Wave)
		if run.Phase == before[key] || run.Phase == iteronv1.AnalysisRunning {
			continue
		}
		kind, reason := corev1.EventTypeNormal, "AnalysisSucceeded"
		if run.Phase != iteronv1.AnalysisSuccessful {
			kind, reason = corev1.EventTypeWarning, iteronv1.ReasonAnalysisFailed
		}
		r.Recorder.Eventf(set, nil, kind, reason, "Analysis", "analysis %s of wave %d of revision %s (provider %s): %s: %s",
			run.Metric, run.Wave, run.Revision, run.Provider, run.Phase, run.Message)
	}
	if h := plan.Status.Halt; h != nil && h.Cause == iteronv1.HaltAborted && (set.Status.Halt == nil || set.Status.Halt.Cause != iteronv1.HaltAborted) {
		r.Recorder.Eventf(set, nil, corev1.EventTypeWarning, iteronv1.ReasonAborted, "Rollout", "%s", h.Message)
	}
	if p := plan.Status.LastHandledPromoteAt; p != set.Status.LastHandledPromoteAt && set.Status.Phase == iteronv1.RolloutPausedAtStep && plan.Status.Phase != iteronv1.RolloutPausedAtStep {
		r.Recorder.Eventf(set, nil, corev1.EventTypeNormal, "Promoted", "Rollout", "promoted (%s=%s): the rollout goes on from step %d", iteronv1.AnnotationPromote, p, plan.Status.Step)
	}
}
