package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"iteron.dev/operator/internal/graph"
)

// planReport is plan's output: the RuntimePlan, and per module what the
// ceiling dropped and why a module is blocked.
type planReport struct {
	graph.RuntimePlan
	// CapabilitiesNotAdmitted maps a module of the new activation to the
	// requested capabilities its ceiling dropped.
	CapabilitiesNotAdmitted map[string][]string `json:"capabilitiesNotAdmitted"`
	// BlockedReasons maps each blocked module to its reason and message.
	BlockedReasons map[string]string `json:"blockedReasons"`
}

func newPlanCmd() *cobra.Command {
	var flags verifyFlags
	var from, to, output string
	cmd := &cobra.Command{
		Use:   "plan [--from OLD] --to NEW [flags]",
		Short: "Show what applying NEW over OLD would do: Added/Removed/Reloaded/Unchanged, orders, dropped capabilities",
		Long: `Verify both activations against the files on this machine (either form, as
validate reads them), place them in the seam graph and compare epochs: which
modules would be Added, Removed, Reloaded (a new epoch: the module or one of
its direct dependencies changed) or Unchanged (keeps its process), which are
Blocked (not admitted; reasons on stderr), the order transactions run in, the
order removed modules drain in, and the requested capabilities the ceiling does
not admit. Without --from, nothing is active: every admitted module is Added.

Exit status: 0 every module of NEW is admitted, 1 something in NEW is invalid
or blocked, 2 usage. Problems with OLD are reported as warnings.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				return usage(errors.New("--to is required"))
			}
			if output != "text" && output != "json" {
				return usage(fmt.Errorf("--output must be text or json, not %q", output))
			}
			v, err := flags.verifier()
			if err != nil {
				return err
			}
			var old *graph.Evaluation
			if from != "" {
				in, err := loadActivation(cmd, from)
				if err != nil {
					return fmt.Errorf("--from %s: %w", from, err)
				}
				oldEv, err := evaluate(v, in.doc)
				if err != nil {
					return fmt.Errorf("--from %s: %w", from, err)
				}
				for _, s := range oldEv.eval.Modules {
					if !s.Admitted {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: --from: %s is not admitted there either (%s: %s); it is not counted as active\n", s.Module, s.Reason, s.Message)
					}
				}
				old = oldEv.eval
			}
			in, err := loadActivation(cmd, to)
			if err != nil {
				return fmt.Errorf("--to %s: %w", to, err)
			}
			next, err := evaluate(v, in.doc)
			if err != nil {
				return fmt.Errorf("--to %s: %w", to, err)
			}
			report := planReport{RuntimePlan: graph.Plan(old, next.eval), CapabilitiesNotAdmitted: map[string][]string{}, BlockedReasons: map[string]string{}}
			for _, vs := range next.result.Verified() {
				if len(vs.NotAdmittedCapabilities) > 0 {
					report.CapabilitiesNotAdmitted[vs.Module] = vs.NotAdmittedCapabilities
				}
			}
			for _, s := range next.eval.Modules {
				if !s.Admitted {
					report.BlockedReasons[s.Module] = s.Reason + ": " + s.Message
				}
			}
			if output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), report); err != nil {
					return err
				}
			} else {
				printPlan(cmd.OutOrStdout(), report, next.eval.Modules)
			}
			for _, m := range report.Blocked {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", m, report.BlockedReasons[m])
			}
			if len(report.Blocked) > 0 {
				return invalid(fmt.Errorf("--to %s: %d modules blocked", to, len(report.Blocked)))
			}
			return nil
		},
	}
	flags.register(cmd)
	cmd.Flags().StringVar(&from, "from", "", "the activation in force now (either form); omit for a first activation")
	cmd.Flags().StringVar(&to, "to", "", "the activation to apply (either form)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func printPlan(w io.Writer, r planReport, modules []graph.ModuleStatus) {
	list := func(s []string) string { return "[" + strings.Join(s, " ") + "]" }
	fmt.Fprintf(w, "added:          %s\n", list(r.Added))
	fmt.Fprintf(w, "removed:        %s\n", list(r.Removed))
	fmt.Fprintf(w, "reloaded:       %s\n", list(r.Reloaded))
	fmt.Fprintf(w, "unchanged:      %s\n", list(r.Unchanged))
	fmt.Fprintf(w, "blocked:        %s\n", list(r.Blocked))
	fmt.Fprintf(w, "activate order: %s\n", list(r.ActivateOrder))
	fmt.Fprintf(w, "drain order:    %s\n", list(r.DrainOrder))
	fmt.Fprintln(w, "capabilities not admitted:")
	none := true
	for _, s := range modules {
		if caps := r.CapabilitiesNotAdmitted[s.Module]; len(caps) > 0 {
			fmt.Fprintf(w, "  %s: %s\n", s.Module, strings.Join(caps, ","))
			none = false
		}
	}
	if none {
		fmt.Fprintln(w, "  (none)")
	}
}
