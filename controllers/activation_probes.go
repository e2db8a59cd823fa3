package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/fleet/probe"
	"iteron.dev/operator/internal/reasons"
)

// ProbeInvoker makes the Invoke of one activation's probes (probe.Dispatch
// over the node's coordinator in the manager).
type ProbeInvoker func(namespace, name string) probe.Invoke

// admitProbes refuses a spec whose probes name a module not admitted
// read_only alone, or whose check or input is malformed: nothing changes
// on the node (the verification problem stalls the activation).
func admitProbes(s *activationScope) {
	if len(s.act.Spec.Probes) == 0 || s.res.DocumentError != nil {
		return
	}
	admitted := func(module string) ([]string, bool) {
		for _, rm := range s.res.Modules {
			if rm.Module == module && rm.Plan != nil {
				return rm.Plan.AdmittedCapabilities(), true
			}
		}
		return nil, false
	}
	if err := probe.Admit(s.act.Spec.Probes, admitted); err != nil {
		s.res.DocumentError, s.res.DocumentCode = err, reasons.SchemaMismatch
	}
}

// reconcileProbes runs the spec's probes once every module serves its
// desired generation: a probe runs again for another generation, another
// spec, or a retry of one that failed. Their outcomes go into the status
// this reconcile writes anyway.
func (r *ActivationReconciler) reconcileProbes(ctx context.Context, s *activationScope) error {
	act := s.act
	s.probes = nil
	if len(act.Spec.Probes) == 0 || !s.resolved || s.res.DocumentError != nil {
		return nil
	}
	// The outcomes kept are those of the probes the spec still has.
	for _, st := range act.Status.Probes {
		if slices.ContainsFunc(act.Spec.Probes, func(p iteronv1.ActivationProbe) bool { return p.Name == st.Name }) {
			s.probes = append(s.probes, st)
		}
	}
	if !r.servesDesired(s) {
		return nil
	}
	retry := s.retryHandled != "" && s.retryHandled != act.Status.LastHandledRetryAt
	for _, p := range act.Spec.Probes {
		generation := s.status.Modules[p.Module].Active
		i := slices.IndexFunc(s.probes, func(st iteronv1.ProbeStatus) bool { return st.Name == p.Name })
		due := probe.Due(p, s.probes, generation, act.Generation) || retry && i >= 0 && s.probes[i].Phase == iteronv1.ProbeFailed
		if !due {
			continue
		}
		st := iteronv1.ProbeStatus{Name: p.Name, Module: p.Module, Phase: iteronv1.ProbeFailed, At: s.act.CreationTimestamp, Message: "this manager runs no probes"}
		if r.Probe != nil {
			st = probe.Run(ctx, p, r.Probe(act.Namespace, act.Name), r.Now)
		}
		if st.GenerationName == "" {
			st.GenerationName = generation
		}
		st.SpecGeneration = act.Generation
		if st.Phase == iteronv1.ProbeFailed {
			r.Recorder.Eventf(act, nil, corev1.EventTypeWarning, iteronv1.ReasonProbeFailed, "Probe", "probe %s on module %s (%s): %s", p.Name, p.Module, st.GenerationName, st.Message)
		}
		if i >= 0 {
			s.probes[i] = st
		} else {
			s.probes = append(s.probes, st)
		}
	}
	return nil
}

// servesDesired reports whether, but for its probes, the activation would
// be Ready now.
func (r *ActivationReconciler) servesDesired(s *activationScope) bool {
	tmp := *s
	act := *s.act
	act.Spec.Probes = nil
	act.Status.Modules = moduleStatuses(s)
	tmp.act = &act
	tmp.lagging = generationsLag(s)
	return summarizeActivation(&tmp, nil).ready()
}

// probeProblems are what the probes stand for in the summary: a failed
// probe stalls the activation; one that has not run against the
// generations serving now keeps it from Ready.
func probeProblems(s *activationScope) (problems []problem, pending string) {
	act := s.act
	for _, p := range act.Spec.Probes {
		generation := s.status.Modules[p.Module].Active
		i := slices.IndexFunc(s.probes, func(st iteronv1.ProbeStatus) bool { return st.Name == p.Name })
		switch {
		case i < 0 || probe.Due(p, s.probes, generation, act.Generation):
			if pending == "" {
				pending = fmt.Sprintf("probe %s has not run against module %s's generation %s yet", p.Name, p.Module, orNone(generation))
			}
		case s.probes[i].Phase == iteronv1.ProbeFailed:
			st := s.probes[i]
			problems = append(problems, problem{severity: severityFailedTarget, code: reasons.ProbeFailed, stalled: true,
				message: fmt.Sprintf("probe %s on module %s (%s) failed: %s (it keeps serving; change the spec or set %s to probe again)", p.Name, p.Module, st.GenerationName, st.Message, iteronv1.AnnotationRetry)})
		}
	}
	return problems, pending
}
