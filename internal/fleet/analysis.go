package fleet

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Bounds of the analysis history in status.
const (
	maxRuns         = 16
	maxMeasurements = 10
	maxRunMessage   = 512
)

// MeasureRequest is a measurement due now: the reconciler makes it (the
// analysis package asks the provider) and computes the plan again with
// its result in Input.Measured.
type MeasureRequest struct {
	// Metric is the name of the spec's metric.
	Metric string
	// Revision is the update revision's name and Hash its hash.
	Revision, Hash string
	// Wave is the wave measured and Nodes its nodes.
	Wave  int32
	Nodes []string
	// Seq is the measurement's number in its run, from 1.
	Seq int32
}

// Measured is a measurement made for a request.
type Measured struct {
	MeasureRequest
	// Result is what the measurement found.
	Result iteronv1.Measurement
}

// runOf is the analysis run of metric for wave w of the update revision.
func (p *planner) runOf(metric string, w int32) *iteronv1.AnalysisRun {
	for i := range p.status.AnalysisRuns {
		r := &p.status.AnalysisRuns[i]
		if r.Metric == metric && r.Revision == p.update.Name && r.Wave == w {
			return r
		}
	}
	return nil
}

// startRun adds a run, newest first, and drops the oldest beyond maxRuns
// (the current wave's runs are the newest: at most 8 metrics).
func (p *planner) startRun(r iteronv1.AnalysisRun) *iteronv1.AnalysisRun {
	runs := append([]iteronv1.AnalysisRun{r}, p.status.AnalysisRuns...)
	if len(runs) > maxRuns {
		runs = runs[:maxRuns]
	}
	p.status.AnalysisRuns = runs
	return &p.status.AnalysisRuns[0]
}

// analyse advances the analysis of wave w (nodes): it starts the wave's
// runs, records the measurements this reconcile made, and asks for the ones
// due. done: every run succeeded; failed: a run that failed (nil: none);
// next: when the next measurement is due (0: none pending).
func (p *planner) analyse(w int32, nodes []string) (done bool, failed *iteronv1.AnalysisRun, next time.Duration) {
	a := p.in.Set.Spec.Strategy.Analysis
	if a == nil || len(a.Metrics) == 0 {
		return true, nil, 0
	}
	now := p.in.Now
	done = true
	for i := range a.Metrics {
		m := &a.Metrics[i]
		r := p.runOf(m.Name, w)
		if r == nil {
			r = p.startRun(iteronv1.AnalysisRun{Metric: m.Name, Provider: m.Provider, Revision: p.update.Name, Wave: w,
				Phase: iteronv1.AnalysisRunning, StartedAt: metav1.NewTime(now)})
		}
		if r.Phase == iteronv1.AnalysisRunning {
			seq := r.Successful + r.Failed + r.Errors + 1
			for _, x := range p.in.Measured {
				if x.Metric == m.Name && x.Revision == p.update.Name && x.Wave == w && x.Seq == seq {
					record(r, m, x.Result)
					seq++
					break
				}
			}
		}
		switch r.Phase {
		case iteronv1.AnalysisFailed, iteronv1.AnalysisError:
			if failed == nil {
				failed = r
			}
			done = false
			continue
		case iteronv1.AnalysisSuccessful:
			continue
		}
		done = false
		// The first measurement one interval after the wave was Ready,
		// each next one an interval after the last.
		seq := r.Successful + r.Failed + r.Errors + 1
		due := r.StartedAt.Add(interval(m))
		if n := len(r.Measurements); n > 0 {
			due = r.Measurements[n-1].At.Add(interval(m))
		}
		if !now.Before(due) {
			p.measure = append(p.measure, MeasureRequest{Metric: m.Name, Revision: p.update.Name, Hash: p.update.Hash, Wave: w, Nodes: nodes, Seq: seq})
			due = now.Add(interval(m)) // looked at again once made
		}
		if left := due.Sub(now); next == 0 || left < next {
			next = left
		}
	}
	return done, failed, next
}

func interval(m *iteronv1.AnalysisMetric) time.Duration {
	return time.Duration(max(ptr.Deref(m.IntervalSeconds, 30), 1)) * time.Second
}

// record applies a measurement to its run: the counts, the newest
// measurements, and the run's phase (Argo Rollouts' rules: more failures
// than failureLimit fail it, more errors in a row than
// consecutiveErrorLimit make it Error, count measurements made without
// either succeed it; a measurement that could not be made does not count
// towards count).
func record(r *iteronv1.AnalysisRun, m *iteronv1.AnalysisMetric, x iteronv1.Measurement) {
	r.Measurements = append(r.Measurements, x)
	if len(r.Measurements) > maxMeasurements {
		r.Measurements = r.Measurements[len(r.Measurements)-maxMeasurements:]
	}
	failureLimit, errorLimit, count := ptr.Deref(m.FailureLimit, 0), ptr.Deref(m.ConsecutiveErrorLimit, 2), max(ptr.Deref(m.Count, 1), 1)
	switch x.Phase {
	case iteronv1.AnalysisSuccessful:
		r.Successful++
		r.ConsecutiveErrors = 0
	case iteronv1.AnalysisFailed:
		r.Failed++
		r.ConsecutiveErrors = 0
	default:
		r.Errors++
		r.ConsecutiveErrors++
	}
	at := x.At
	switch {
	case r.Failed > failureLimit:
		r.Phase, r.FinishedAt = iteronv1.AnalysisFailed, &at
		r.Message = truncate(fmt.Sprintf("%d of %d measurements failed (failureLimit %d); last: %s", r.Failed, r.Successful+r.Failed, failureLimit, describeMeasurement(x)), maxRunMessage)
	case r.ConsecutiveErrors > errorLimit:
		r.Phase, r.FinishedAt = iteronv1.AnalysisError, &at
		r.Message = truncate(fmt.Sprintf("%d measurements in a row could not be made (consecutiveErrorLimit %d); last: %s", r.ConsecutiveErrors, errorLimit, describeMeasurement(x)), maxRunMessage)
	case r.Successful+r.Failed >= count:
		r.Phase, r.FinishedAt = iteronv1.AnalysisSuccessful, &at
		r.Message = truncate(fmt.Sprintf("%d of %d measurements succeeded (failureLimit %d); last: %s", r.Successful, r.Successful+r.Failed, failureLimit, describeMeasurement(x)), maxRunMessage)
	default:
		r.Message = truncate(fmt.Sprintf("%d of %d measurements made; last: %s", r.Successful+r.Failed, count, describeMeasurement(x)), maxRunMessage)
	}
}

func describeMeasurement(x iteronv1.Measurement) string {
	s := string(x.Phase)
	if x.Value != "" {
		s += " " + x.Value
	}
	if x.Message != "" {
		s += " (" + x.Message + ")"
	}
	return s
}

// analysisProgress is a sentence on wave w's runs, for the Soaking message.
func (p *planner) analysisProgress(w int32) string {
	a := p.in.Set.Spec.Strategy.Analysis
	if a == nil {
		return ""
	}
	var parts []string
	for i := range a.Metrics {
		m := &a.Metrics[i]
		r := p.runOf(m.Name, w)
		if r == nil {
			continue
		}
		made := r.Successful + r.Failed
		s := fmt.Sprintf("%s %d/%d", m.Name, made, max(ptr.Deref(m.Count, 1), 1))
		if n := len(r.Measurements); n > 0 {
			last := r.Measurements[n-1]
			s += fmt.Sprintf(" (last %s %s)", last.Phase, last.Value)
		}
		if r.Phase == iteronv1.AnalysisSuccessful {
			s += " passed"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return ""
	}
	return "analysis " + strings.Join(parts, ", ")
}

// haltForAnalysis stops the rollout because run failed for wave w (nodes).
func (p *planner) haltForAnalysis(r *iteronv1.AnalysisRun, w int32, nodes []string) {
	h := p.newHalt(iteronv1.HaltAnalysisFailed)
	for _, n := range nodes {
		if len(h.Nodes) < maxHaltNodes {
			h.Nodes = append(h.Nodes, n)
		}
	}
	what := "failed"
	if r.Phase == iteronv1.AnalysisError {
		what = "could not be measured"
	}
	h.Message = truncate(fmt.Sprintf("analysis %s (provider %s) of wave %d (%s) %s: %s", r.Metric, r.Provider, w, list(nodes), what, r.Message), iteronv1.MaxMessageBytes)
	p.status.Halt = h
}

// newHalt is a halt of the update revision as the strategy says (Halt, or
// Revert to the stable revision with revertStateDisposition).
func (p *planner) newHalt(cause iteronv1.HaltCause) *iteronv1.RolloutHalt {
	st := p.in.Set.Spec.Strategy
	h := &iteronv1.RolloutHalt{Revision: p.update.Name, Action: st.OnFailure, At: metav1.NewTime(p.in.Now), Cause: cause}
	if h.Action == "" {
		h.Action = iteronv1.FailurePolicyHalt
	}
	if cause == iteronv1.HaltAborted {
		h.Action = iteronv1.FailurePolicyRevert
	}
	if h.Action == iteronv1.FailurePolicyRevert {
		h.ToRevision, h.StateDisposition = p.current.Name, st.RevertStateDisposition
		if h.StateDisposition == "" {
			h.StateDisposition = iteronv1.StateDispositionMigrate
		}
		p.status.SoakedRevision, p.status.SoakStartedAt = "", nil
	}
	return h
}

// finalSettled reports whether the last wave of a rollout passed its
// analysis (every node is on the update revision: nothing is left to
// soak for, but a wave is never left unjudged).
func (p *planner) finalSettled() bool {
	if p.current.Name == p.update.Name || p.in.Set.Spec.Strategy.Analysis == nil {
		return true
	}
	w := p.maxWave()
	if w == 0 {
		return true
	}
	for _, m := range p.in.Set.Spec.Strategy.Analysis.Metrics {
		if r := p.runOf(m.Name, w); r == nil || r.Phase != iteronv1.AnalysisSuccessful {
			return false
		}
	}
	return true
}

// analysisStarted reports whether wave w of the update revision has
// analysis runs.
func (p *planner) analysisStarted(w int32) bool {
	if p.in.Set.Spec.Strategy.Analysis == nil {
		return false
	}
	for _, r := range p.status.AnalysisRuns {
		if r.Revision == p.update.Name && r.Wave == w {
			return true
		}
	}
	return false
}

// maxWave is the latest wave that moved nodes to the update revision.
func (p *planner) maxWave() int32 {
	var w int32
	for _, m := range p.all {
		if m.onRevision(p.update) {
			w = max(w, m.wave)
		}
	}
	return w
}

// waveNodes are the nodes of wave w on the update revision.
func (p *planner) waveNodes(w int32) []string {
	var out []string
	for _, m := range p.all {
		if m.onRevision(p.update) && m.wave == w {
			out = append(out, m.node)
		}
	}
	return out
}

// AnalysisCondition is the set's AnalysisFailed condition (see
// iteronv1.ConditionAnalysisFailed), for a set whose strategy has an
// analysis or whose template has probes; ok is false for any other set.
func AnalysisCondition(set *iteronv1.ActivationSet, st *iteronv1.ActivationSetStatus) (metav1.Condition, bool) {
	if set.Spec.Strategy.Analysis == nil && len(set.Spec.Template.Probes) == 0 {
		return metav1.Condition{}, false
	}
	c := metav1.Condition{Type: iteronv1.ConditionAnalysisFailed, Status: metav1.ConditionFalse, ObservedGeneration: set.Generation}
	if h := st.Halt; h != nil && (h.Cause == iteronv1.HaltAnalysisFailed || h.Cause == iteronv1.HaltProbeFailed) {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, string(h.Cause), truncate(h.Message, iteronv1.MaxMessageBytes)
		return c, true
	}
	for _, r := range st.AnalysisRuns {
		if r.Revision == st.UpdateRevision && r.Phase == iteronv1.AnalysisRunning {
			c.Reason, c.Message = iteronv1.ReasonAnalysisRunning, truncate(fmt.Sprintf("analysis %s of wave %d is running: %s", r.Metric, r.Wave, r.Message), iteronv1.MaxMessageBytes)
			return c, true
		}
	}
	c.Reason, c.Message = iteronv1.ReasonSucceeded, "no analysis or probe failed"
	return c, true
}
