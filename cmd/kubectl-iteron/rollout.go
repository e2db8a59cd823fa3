package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/fleet"
)

// rolloutFlags are the connection flags every rollout subcommand takes.
type rolloutFlags struct {
	kubeconfig, kubeContext, namespace string
	timeout                            time.Duration
}

func (f *rolloutFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	fl.StringVar(&f.kubeContext, "context", "", "the kubeconfig context to use")
	fl.StringVarP(&f.namespace, "namespace", "n", "", "the set's namespace (default: the context's namespace, else default)")
	fl.DurationVar(&f.timeout, "request-timeout", 30*time.Second, "bound on each request to the API server")
}

func (f *rolloutFlags) client() (client.Client, string, error) {
	c, ns, err := doctorClient(f.kubeconfig, f.kubeContext, f.namespace, f.timeout)
	if err != nil {
		return nil, "", usage(err)
	}
	return c, ns, nil
}

// newRolloutCmd is `kubectl iteron rollout
// status|pause|resume|promote|abort|undo SET`, after Argo Rollouts' kubectl
// plugin.
func newRolloutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Watch, pause, resume, promote, abort and undo the rollout of an ActivationSet",
		Long: `An ActivationSet stamps one ImplementationActivation per selected node and
rolls a changed template out wave by wave, each wave judged by its analysis
and its nodes' probes (docs/fleet.md). These commands show where a rollout
stands and steer it; they change only the set (spec.paused, the
iteron.dev/resume, iteron.dev/promote and iteron.dev/abort annotations,
spec.template), never an activation.`,
	}
	cmd.AddCommand(newRolloutStatusCmd(), newRolloutPauseCmd(), newRolloutResumeCmd(), newRolloutPromoteCmd(), newRolloutAbortCmd(), newRolloutUndoCmd())
	return cmd
}

func newRolloutStatusCmd() *cobra.Command {
	var (
		f       rolloutFlags
		watch   bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status SET",
		Short: "Show a set's rollout: phase, revisions, waves, every node, and where and why it stopped",
		Long: `Prints the set's phase and message, its revisions, the node counts, its steps
(the current one marked), its analysis runs with the values measured, one line
per node (its activation, revision, wave, readiness and, for a failed node, the
reason and message of its Stalled condition), the nodes' probes, then the
conflicts.

With --watch (the default) it prints a line at each change until the rollout is
at rest, like kubectl rollout status.

With --watch it also stops at a pause step (PausedAtStep): the rollout waits
for kubectl iteron rollout promote.

Exit status: 0 the rollout completed, waits at a pause step (or, without
--watch, is under way or paused); 1 it halted, reverted or failed to revert,
or --timeout passed; 2 usage error or set not found.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := f.client()
			if err != nil {
				return err
			}
			key := client.ObjectKey{Namespace: ns, Name: args[0]}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			return rolloutStatus(ctx, cmd.OutOrStdout(), c, key, watch)
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVarP(&watch, "watch", "w", true, "wait until the rollout is at rest, printing each change")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "with --watch: give up after this long (0: never)")
	return cmd
}

// rolloutStatus prints the set once (or, with watch, a line per change
// until it is at rest, then the whole of it).
func rolloutStatus(ctx context.Context, out io.Writer, c client.Client, key client.ObjectKey, watch bool) error {
	last := ""
	for {
		set, acts, err := readSet(ctx, c, key)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && watch {
				return invalid(fmt.Errorf("%s: not at rest before --timeout (last: %s)", key, last))
			}
			return err
		}
		rest := fleet.AtRest(set.Status.Phase) && set.Status.ObservedGeneration == set.Generation && set.Status.Phase != ""
		if !watch || rest {
			writeRollout(out, set, acts)
			return rolloutExit(set)
		}
		if line := progressLine(set); line != last {
			fmt.Fprintln(out, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return invalid(fmt.Errorf("%s: not at rest before --timeout (last: %s)", key, last))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// rolloutExit is the status command's verdict.
func rolloutExit(set *iteronv1.ActivationSet) error {
	switch set.Status.Phase {
	case iteronv1.RolloutHalted, iteronv1.RolloutReverted, iteronv1.RolloutRevertFailed:
		return invalid(fmt.Errorf("%s/%s: rollout %s", set.Namespace, set.Name, strings.ToLower(string(set.Status.Phase))))
	case "":
		if set.Status.UpdateRevision != "" || set.Status.ObservedGeneration == set.Generation {
			return invalid(fmt.Errorf("%s/%s: the spec cannot be acted on", set.Namespace, set.Name))
		}
	}
	return nil
}

func readSet(ctx context.Context, c client.Client, key client.ObjectKey) (*iteronv1.ActivationSet, []iteronv1.ImplementationActivation, error) {
	var set iteronv1.ActivationSet
	if err := c.Get(ctx, key, &set); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, usage(fmt.Errorf("ActivationSet %s not found", key))
		}
		return nil, nil, err
	}
	var list iteronv1.ImplementationActivationList
	if err := c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{iteronv1.LabelActivationSet: key.Name}); err != nil {
		return nil, nil, err
	}
	var acts []iteronv1.ImplementationActivation
	for _, a := range list.Items {
		if metav1.IsControlledBy(&a, &set) {
			acts = append(acts, a)
		}
	}
	sort.Slice(acts, func(i, j int) bool { return acts[i].Spec.NodeName < acts[j].Spec.NodeName })
	return &set, acts, nil
}

// progressLine is one line of --watch output.
func progressLine(set *iteronv1.ActivationSet) string {
	st := set.Status
	msg := ""
	if c := meta.FindStatusCondition(st.Conditions, iteronv1.ConditionReady); c != nil {
		msg = c.Message
	}
	return fmt.Sprintf("%s: wave %d, %d/%d updated, %d ready, %d failed: %s", orDash(string(st.Phase)), st.Wave, st.UpdatedNodes, st.DesiredNodes, st.ReadyNodes, st.FailedNodes, msg)
}

// writeRollout prints the whole status of a set and its nodes.
func writeRollout(out io.Writer, set *iteronv1.ActivationSet, acts []iteronv1.ImplementationActivation) {
	st := set.Status
	fmt.Fprintf(out, "ActivationSet %s/%s: %s\n", set.Namespace, set.Name, orDash(string(st.Phase)))
	if c := meta.FindStatusCondition(st.Conditions, iteronv1.ConditionReady); c != nil {
		fmt.Fprintf(out, "  %s\n", c.Message)
	}
	if st.ObservedGeneration != set.Generation && fleet.AtRest(st.Phase) {
		fmt.Fprintf(out, "  (status describes generation %d; the spec is at %d)\n", st.ObservedGeneration, set.Generation)
	}
	fmt.Fprintf(out, "Revisions:   stable %s, update %s\n", orDash(st.CurrentRevision), orDash(st.UpdateRevision))
	fmt.Fprintf(out, "Nodes:       %d desired, %d updated, %d ready, %d failed; wave %d", st.DesiredNodes, st.UpdatedNodes, st.ReadyNodes, st.FailedNodes, st.Wave)
	if len(st.WaveNodes) > 0 {
		fmt.Fprintf(out, " (%s)", strings.Join(st.WaveNodes, ", "))
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "Strategy:    %s\n", strategyText(set))
	writeSteps(out, set)
	if h := st.Halt; h != nil {
		cause := ""
		if h.Cause != "" {
			cause = " (" + string(h.Cause) + ")"
		}
		fmt.Fprintf(out, "Stopped:     %s%s of revision %s at %s: %s\n", h.Action, cause, h.Revision, h.At.UTC().Format(time.RFC3339), h.Message)
		if h.Action == iteronv1.FailurePolicyRevert {
			fmt.Fprintf(out, "Revert:      to revision %s, state %s\n", h.ToRevision, dispositionText(h.StateDisposition))
		}
	}
	if len(acts) > 0 {
		fmt.Fprintln(out)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tACTIVATION\tREVISION\tWAVE\tREADY\tREASON")
		for _, a := range acts {
			rev := fleet.RevisionName(set.Name, a.Labels[iteronv1.LabelRevision])
			if a.Annotations[iteronv1.AnnotationRevertedFrom] != "" {
				rev += " (reverted)"
			}
			ready, reason := nodeState(&a)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Spec.NodeName, a.Name, rev, orDash(a.Annotations[iteronv1.AnnotationWave]), ready, reason)
		}
		_ = tw.Flush()
	}
	writeAnalysis(out, set)
	writeProbes(out, acts)
	for _, f := range st.Failed {
		fmt.Fprintf(out, "Failed:      node %s (%s, revision %s): %s: %s\n", f.Node, f.Activation, f.Revision, f.Reason, f.Message)
	}
	for _, c := range st.Conflicts {
		fmt.Fprintf(out, "Conflict:    node %s (%s): %s: %s\n", c.Node, c.Activation, c.Reason, c.Message)
	}
}

// nodeState is an activation's readiness for its current spec and, when
// not Ready, why.
func nodeState(a *iteronv1.ImplementationActivation) (string, string) {
	if !a.DeletionTimestamp.IsZero() {
		return "False", "deleting (its manager retires the providers)"
	}
	if a.Status.ObservedGeneration != a.Generation {
		return "False", fmt.Sprintf("its manager has not observed generation %d yet", a.Generation)
	}
	if s := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionStalled); s != nil && s.Status == metav1.ConditionTrue {
		return "False", "Stalled: " + s.Reason + ": " + s.Message
	}
	r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
	if r == nil {
		return "Unknown", ""
	}
	if r.Status == metav1.ConditionTrue {
		return "True", ""
	}
	return string(r.Status), r.Reason + ": " + r.Message
}

func strategyText(set *iteronv1.ActivationSet) string {
	s := set.Spec.Strategy
	var parts []string
	if c := s.Canary; c != nil {
		parts = append(parts, fmt.Sprintf("canary %d (soak %ds)", c.Nodes, ptr.Deref(c.SoakSeconds, 60)))
	}
	if n := len(s.Steps); n > 0 {
		parts = append(parts, fmt.Sprintf("%d steps", n))
	}
	if a := s.Analysis; a != nil {
		var names []string
		for _, m := range a.Metrics {
			names = append(names, m.Name)
		}
		parts = append(parts, "analysis "+strings.Join(names, ", "))
	}
	mu := "1"
	if s.MaxUnavailable != nil {
		mu = s.MaxUnavailable.String()
	}
	parts = append(parts, "maxUnavailable "+mu, fmt.Sprintf("onFailure %s", orDash(string(s.OnFailure))))
	if s.OnFailure == iteronv1.FailurePolicyRevert {
		parts = append(parts, "revertStateDisposition "+orDash(string(s.RevertStateDisposition)))
	}
	if set.Spec.Paused {
		parts = append(parts, "PAUSED")
	}
	return strings.Join(parts, ", ")
}

func dispositionText(d iteronv1.StateDisposition) string {
	if d == iteronv1.StateDispositionDiscard {
		return "discarded (Discard: the previous implementation starts empty)"
	}
	return "migrated back (Migrate: the previous implementation reads the newer state)"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newRolloutPauseCmd() *cobra.Command {
	var f rolloutFlags
	cmd := &cobra.Command{
		Use:   "pause SET",
		Short: "Stop moving nodes (spec.paused: true); new nodes still get the stable revision",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := f.client()
			if err != nil {
				return err
			}
			key := client.ObjectKey{Namespace: ns, Name: args[0]}
			if err := editSet(cmd.Context(), c, key, func(s *iteronv1.ActivationSet) { s.Spec.Paused = true }); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "activationset %s paused\n", key)
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func newRolloutResumeCmd() *cobra.Command {
	var f rolloutFlags
	cmd := &cobra.Command{
		Use:   "resume SET",
		Short: "Unpause a set and resume a halted or reverted rollout (its failed nodes are retried)",
		Long: `Sets spec.paused to false and the iteron.dev/resume annotation to the current
time: the fleet controller lifts a halt (or a revert) of the current template,
asks the managers of the failed nodes to retry their swap (iteron.dev/retry),
and goes on wave by wave.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := f.client()
			if err != nil {
				return err
			}
			key := client.ObjectKey{Namespace: ns, Name: args[0]}
			now := time.Now().UTC().Format(time.RFC3339Nano)
			if err := editSet(cmd.Context(), c, key, func(s *iteronv1.ActivationSet) {
				s.Spec.Paused = false
				if s.Annotations == nil {
					s.Annotations = map[string]string{}
				}
				s.Annotations[iteronv1.AnnotationResume] = now
			}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "activationset %s resumed (%s=%s)\n", key, iteronv1.AnnotationResume, now)
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func newRolloutUndoCmd() *cobra.Command {
	var (
		f          rolloutFlags
		toRevision int64
	)
	cmd := &cobra.Command{
		Use:   "undo SET",
		Short: "Roll the template back to an earlier revision (default: the one before the current template)",
		Long: `Copies the template of an earlier revision (a ControllerRevision of the set)
into spec.template, as kubectl rollout undo does for a Deployment: the fleet
controller then rolls that template out like any change. A set managed by
GitOps is changed back by its controller at the next sync: revert in Git
instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if toRevision < 0 {
				return usage(fmt.Errorf("--to-revision must be a revision number (kubectl iteron rollout status shows them), not %d", toRevision))
			}
			c, ns, err := f.client()
			if err != nil {
				return err
			}
			key := client.ObjectKey{Namespace: ns, Name: args[0]}
			rev, err := undoTarget(cmd.Context(), c, key, toRevision)
			if err != nil {
				return err
			}
			if err := editSet(cmd.Context(), c, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = *rev.Template }); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "activationset %s rolled back to revision %d (%s)\n", key, rev.Number, rev.Name)
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().Int64Var(&toRevision, "to-revision", 0, "the revision number to go back to (0: the one before the template's)")
	return cmd
}

// undoTarget is the revision undo goes back to.
func undoTarget(ctx context.Context, c client.Client, key client.ObjectKey, number int64) (fleet.Revision, error) {
	var set iteronv1.ActivationSet
	if err := c.Get(ctx, key, &set); err != nil {
		if apierrors.IsNotFound(err) {
			return fleet.Revision{}, usage(fmt.Errorf("ActivationSet %s not found", key))
		}
		return fleet.Revision{}, err
	}
	var list appsv1.ControllerRevisionList
	if err := c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{iteronv1.LabelActivationSet: key.Name}); err != nil {
		return fleet.Revision{}, err
	}
	var revs []fleet.Revision
	current := int64(-1)
	for i := range list.Items {
		if !metav1.IsControlledBy(&list.Items[i], &set) {
			continue
		}
		r, err := fleet.RevisionOf(&list.Items[i])
		if err != nil {
			continue
		}
		revs = append(revs, r)
		if fleet.SameTemplate(r.Template, &set.Spec.Template) {
			current = r.Number
		}
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i].Number > revs[j].Number })
	var numbers []string
	for _, r := range revs {
		numbers = append(numbers, strconv.FormatInt(r.Number, 10))
	}
	for _, r := range revs {
		if number > 0 && r.Number == number || number == 0 && r.Number < current {
			if fleet.SameTemplate(r.Template, &set.Spec.Template) {
				return fleet.Revision{}, invalid(fmt.Errorf("revision %d (%s) is the current template already", r.Number, r.Name))
			}
			return r, nil
		}
	}
	if number > 0 {
		return fleet.Revision{}, invalid(fmt.Errorf("%s has no revision %d (it has %s)", key, number, orDash(strings.Join(numbers, ", "))))
	}
	return fleet.Revision{}, invalid(fmt.Errorf("%s has no revision before the current template's (it has %s)", key, orDash(strings.Join(numbers, ", "))))
}

// editSet changes a set, retrying on conflicts.
func editSet(ctx context.Context, c client.Client, key client.ObjectKey, edit func(*iteronv1.ActivationSet)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var s iteronv1.ActivationSet
		if err := c.Get(ctx, key, &s); err != nil {
			return err
		}
		edit(&s)
		return c.Update(ctx, &s)
	})
	if apierrors.IsNotFound(err) {
		return usage(fmt.Errorf("ActivationSet %s not found", key))
	}
	return err
}
