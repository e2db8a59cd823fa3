package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// writeSteps prints a set's steps, the one the rollout is at marked.
func writeSteps(out io.Writer, set *iteronv1.ActivationSet) {
	steps := set.Spec.Strategy.Steps
	if len(steps) == 0 {
		return
	}
	at := int(set.Status.Step)
	rolling := set.Status.CurrentRevision != set.Status.UpdateRevision
	wave := 0
	for i, s := range steps {
		k := i + 1
		label := "Steps:"
		if i > 0 {
			label = ""
		}
		mark, state := " ", ""
		switch {
		case !rolling:
		case k < at:
			state = "done"
		case k == at:
			mark, state = ">", "current"
			if set.Status.Phase == iteronv1.RolloutPausedAtStep {
				state = "waiting for kubectl iteron rollout promote " + set.Name
			}
		}
		what := ""
		if s.Pause != nil {
			what = "pause"
			if d := s.Pause.DurationSeconds; d != nil {
				what += fmt.Sprintf(" %ds", *d)
			}
		} else if w := s.Wave; w != nil {
			wave++
			var parts []string
			switch {
			case w.Nodes != nil:
				parts = append(parts, fmt.Sprintf("%d nodes", *w.Nodes))
			case w.Percent != nil:
				parts = append(parts, fmt.Sprintf("%d%%", *w.Percent))
			}
			if w.Selector != nil {
				if sel, err := metav1.LabelSelectorAsSelector(w.Selector); err == nil {
					parts = append(parts, "cohort "+sel.String())
				}
			}
			what = fmt.Sprintf("wave %d: %s", wave, strings.Join(parts, " of "))
			if d := ptr.Deref(w.SoakSeconds, 0); d > 0 {
				what += fmt.Sprintf(", soak %ds", d)
			}
		}
		fmt.Fprintf(out, "%-12s %s %2d %-40s %s\n", label, mark, k, what, state)
	}
}

// writeAnalysis prints the analysis runs with their measurements.
func writeAnalysis(out io.Writer, set *iteronv1.ActivationSet) {
	for i, r := range set.Status.AnalysisRuns {
		label := "Analysis:"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(out, "%-12s %s, wave %d of %s (provider %s): %s: %s\n", label, r.Metric, r.Wave, r.Revision, r.Provider, r.Phase, r.Message)
		for _, m := range r.Measurements {
			line := fmt.Sprintf("%-12s   %s %s", "", m.At.UTC().Format(time.TimeOnly), m.Phase)
			if m.Value != "" {
				line += " " + m.Value
			}
			if m.Message != "" {
				line += " (" + m.Message + ")"
			}
			fmt.Fprintln(out, line)
		}
	}
}

// writeProbes prints the nodes' probe outcomes.
func writeProbes(out io.Writer, acts []iteronv1.ImplementationActivation) {
	first := true
	for _, a := range acts {
		for _, p := range a.Status.Probes {
			label := ""
			if first {
				label, first = "Probes:", false
			}
			fmt.Fprintf(out, "%-12s %s %s on %s (%s, %d ms): %s: %s\n", label, a.Spec.NodeName, p.Name, p.Module, p.GenerationName, p.LatencyMilliseconds, p.Phase, p.Message)
		}
	}
}

func newRolloutPromoteCmd() *cobra.Command {
	return newRolloutAnnotateCmd(&cobra.Command{
		Use:   "promote SET",
		Short: "Release the pause step a rollout waits at (the iteron.dev/promote annotation)",
		Long: `Sets the iteron.dev/promote annotation to the current time: the fleet
controller releases the pause step the rollout waits at (phase PausedAtStep)
and goes on with the next step. A set that is not waiting at a pause step is
refused (exit 1) and not changed: a promotion never releases a later pause.`,
	}, iteronv1.AnnotationPromote, "promoted", "", func(key client.ObjectKey, s *iteronv1.ActivationSet) error {
		if s.Status.Phase != iteronv1.RolloutPausedAtStep {
			return fmt.Errorf("%s is not waiting at a pause step (phase %s): nothing to promote", key, orDash(string(s.Status.Phase)))
		}
		return nil
	})
}

func newRolloutAbortCmd() *cobra.Command {
	return newRolloutAnnotateCmd(&cobra.Command{
		Use:   "abort SET",
		Short: "Stop the rollout under way and move every node back to the stable revision (the iteron.dev/abort annotation)",
		Long: `Sets the iteron.dev/abort annotation to the current time: the fleet
controller stops the rollout under way and reverts it whatever
spec.strategy.onFailure says (phase Reverting, then Reverted), with
spec.strategy.revertStateDisposition. The template stays: kubectl iteron
rollout resume tries it again, kubectl iteron rollout undo (or a new
template) moves on. A set with no rollout under way, or one reverting
already, is refused (exit 1) and not changed.`,
	}, iteronv1.AnnotationAbort, "aborted", "its moved nodes go back to the stable revision", func(key client.ObjectKey, s *iteronv1.ActivationSet) error {
		if s.Status.UpdateRevision == "" || s.Status.CurrentRevision == s.Status.UpdateRevision {
			return fmt.Errorf("%s has no rollout under way (phase %s): nothing to abort", key, orDash(string(s.Status.Phase)))
		}
		if h := s.Status.Halt; h != nil && h.Action == iteronv1.FailurePolicyRevert && h.Revision == s.Status.UpdateRevision {
			return fmt.Errorf("%s is reverting revision %s already (phase %s): nothing to abort", key, h.Revision, s.Status.Phase)
		}
		return nil
	})
}

// newRolloutAnnotateCmd completes cmd: it sets annotation on the set to
// the current time when allowed accepts the set (its error, exit 1, when
// not: nothing is written), and says what it did (verb, then note).
func newRolloutAnnotateCmd(cmd *cobra.Command, annotation, verb, note string, allowed func(client.ObjectKey, *iteronv1.ActivationSet) error) *cobra.Command {
	var f rolloutFlags
	cmd.Args = cobra.ExactArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, ns, err := f.client()
		if err != nil {
			return err
		}
		key := client.ObjectKey{Namespace: ns, Name: args[0]}
		now := time.Now().UTC().Format(time.RFC3339Nano)
		err = editSetIf(cmd, c, key, func(s *iteronv1.ActivationSet) error {
			if err := allowed(key, s); err != nil {
				return invalid(err)
			}
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[annotation] = now
			return nil
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "activationset %s %s (%s=%s)\n", key, verb, annotation, now)
		if note != "" {
			fmt.Fprintln(cmd.OutOrStdout(), note)
		}
		return nil
	}
	f.add(cmd)
	return cmd
}

// editSetIf changes a set when check allows it (retrying on conflicts); a
// set check refuses is not written, and check's error is returned as it is.
func editSetIf(cmd *cobra.Command, c client.Client, key client.ObjectKey, check func(*iteronv1.ActivationSet) error) error {
	var s iteronv1.ActivationSet
	if err := c.Get(cmd.Context(), key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return usage(fmt.Errorf("ActivationSet %s not found", key))
		}
		return err
	}
	if err := check(s.DeepCopy()); err != nil {
		return err
	}
	var refused error
	err := editSet(cmd.Context(), c, key, func(s *iteronv1.ActivationSet) { refused = check(s) })
	if refused != nil {
		return refused
	}
	return err
}
