package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/statedir"
)

// newReceiptsCmd is `kubectl iteron receipts <activation> [--module M]`.
func newReceiptsCmd() *cobra.Command {
	var (
		kubeconfig, kubeContext, namespace string
		stateDir, module, output           string
		timeout                            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "receipts <activation>",
		Short: "Print an activation's effect receipts, as the manager on this node keeps them",
		Long: `Reads the activation's receipts file under the manager's state directory on
this node (read-only, as a user that can read it) and prints, per generation,
whether its evidence is complete, its receipts and its count of reversible
runs, then every receipt: its ID, generation, component (module), kind (run,
quiesce_cancel, drain_timeout), class (cancelable, compensatable,
irreversible), start and finish, compensation status and detail.

The activation's UID is read from the API server. Evidence is incomplete when
receipts were evicted beyond the retention bounds (32 generations, 256
receipts each), or when the manager that wrote the file did not close it
(killed, or the machine stopped): what it recorded after its last checkpoint
may be lost. The format is in docs/reference/receipts.md.

Exit status: 0 printed; 2 usage error, activation not found, API server
unreachable, or the file unreadable.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return usage(fmt.Errorf("--output must be text or json, not %q", output))
			}
			c, ns, err := doctorClient(kubeconfig, kubeContext, namespace, timeout)
			if err != nil {
				return usage(err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var act iteronv1.ImplementationActivation
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: args[0]}, &act); err != nil {
				return usage(fmt.Errorf("activation %s/%s: %w", ns, args[0], err))
			}
			path, err := statedir.Dir(stateDir).Receipts(string(act.UID))
			if err != nil {
				return usage(err)
			}
			loaded, err := effects.ReadReceiptsFile(path)
			if err != nil {
				return usage(fmt.Errorf("activation %s/%s: %w", ns, args[0], err))
			}
			view := receiptsView(ns+"/"+args[0], string(act.UID), loaded, module)
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(view)
			}
			printReceipts(cmd.OutOrStdout(), view)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&kubeContext, "context", "", "the kubeconfig context to use")
	f.StringVarP(&namespace, "namespace", "n", "", "the activation's namespace (default: the context's namespace, else default)")
	f.StringVar(&stateDir, "state-dir", "/var/lib/iteron/state", "the manager's state directory on this node")
	f.StringVar(&module, "module", "", "only this module's generations and receipts")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	f.DurationVar(&timeout, "request-timeout", 30*time.Second, "bound on all reads from the API server")
	return cmd
}

// receiptsOutput is what `kubectl iteron receipts` prints (-o json).
type receiptsOutput struct {
	Activation    string               `json:"activation"`
	UID           string               `json:"uid"`
	File          string               `json:"file"`
	ClosedCleanly bool                 `json:"closedCleanly"`
	LastDurableAt string               `json:"lastDurableAt,omitempty"`
	Generations   []receiptsGeneration `json:"generations"`
	Receipts      []receiptOutput      `json:"receipts"`
	// Unreadable are the file's lines that could not be read (skipped).
	Unreadable []unreadableOutput `json:"unreadable,omitempty"`
}

// unreadableOutput is a line of the receipts file that could not be read.
type unreadableOutput struct {
	Line   int    `json:"line"`
	Offset int64  `json:"offset"`
	Why    string `json:"why"`
}

type receiptsGeneration struct {
	Name             string `json:"name"`
	Module           string `json:"module,omitempty"`
	Complete         bool   `json:"complete"`
	IncompleteReason string `json:"incompleteReason,omitempty"`
	Receipts         int    `json:"receipts"`
	Irreversible     int    `json:"irreversible"`
	ReversibleRuns   int64  `json:"reversibleRuns"`
}

type receiptOutput struct {
	ID           string `json:"id"`
	Owner        string `json:"owner"`
	Generation   string `json:"generation"`
	Component    string `json:"component"`
	Kind         string `json:"kind"`
	Class        string `json:"class"`
	StartedAt    string `json:"startedAt,omitempty"`
	FinishedAt   string `json:"finishedAt,omitempty"`
	Compensation string `json:"compensation"`
	Detail       string `json:"detail,omitempty"`
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func receiptsView(activation, uid string, l *effects.LoadedReceipts, module string) receiptsOutput {
	out := receiptsOutput{Activation: activation, UID: uid, File: l.Path, ClosedCleanly: l.Clean, LastDurableAt: stamp(l.LastDurableAt),
		Generations: []receiptsGeneration{}, Receipts: []receiptOutput{}}
	for _, u := range l.Unreadable {
		out.Unreadable = append(out.Unreadable, unreadableOutput{Line: u.Line, Offset: u.Offset, Why: u.Why})
	}
	for _, g := range l.Generations {
		sum := l.Summaries[g]
		if module != "" && sum.Component != module {
			continue
		}
		why := sum.IncompleteReason
		if sum.Truncated && why == "" {
			why = "receipts were evicted beyond the retention bounds"
		}
		out.Generations = append(out.Generations, receiptsGeneration{Name: g, Module: sum.Component, Complete: !sum.Truncated, IncompleteReason: why,
			Receipts: sum.Total, Irreversible: sum.Irreversible, ReversibleRuns: sum.ReversibleRuns})
		for _, r := range l.Receipts[g] {
			out.Receipts = append(out.Receipts, receiptOutput{ID: r.ID, Owner: r.Owner, Generation: r.Generation, Component: r.Component,
				Kind: string(r.Kind), Class: r.Class.String(), StartedAt: stamp(r.StartedAt), FinishedAt: stamp(r.FinishedAt),
				Compensation: string(r.Compensation), Detail: r.Detail})
		}
	}
	return out
}

func printReceipts(w io.Writer, v receiptsOutput) {
	fmt.Fprintf(w, "Activation %s (uid %s)\nFile %s: ", v.Activation, v.UID, v.File)
	if v.ClosedCleanly {
		fmt.Fprintf(w, "closed cleanly, durable at %s\n", v.LastDurableAt)
	} else if v.LastDurableAt != "" {
		fmt.Fprintf(w, "open (a running manager writes it, or the last one stopped without closing it); last durable at %s\n", v.LastDurableAt)
	} else {
		fmt.Fprintf(w, "open (a running manager writes it, or the last one stopped without closing it); never made durable\n")
	}
	for _, u := range v.Unreadable {
		fmt.Fprintf(w, "unreadable: %s line %d (byte %d): %s; skipped, the receipts it held are lost\n", v.File, u.Line, u.Offset, u.Why)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GENERATION\tMODULE\tEVIDENCE\tRECEIPTS\tIRREVERSIBLE\tREVERSIBLE RUNS")
	for _, g := range v.Generations {
		ev := "complete"
		if !g.Complete {
			ev = "INCOMPLETE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", g.Name, g.Module, ev, g.Receipts, g.Irreversible, g.ReversibleRuns)
	}
	tw.Flush()
	for _, g := range v.Generations {
		if !g.Complete {
			fmt.Fprintf(w, "  %s: evidence incomplete: %s\n", g.Name, g.IncompleteReason)
		}
	}
	if len(v.Generations) == 0 {
		fmt.Fprintln(w, "(no generations)")
	}
	fmt.Fprintln(w)
	if len(v.Receipts) == 0 {
		fmt.Fprintln(w, "No receipts.")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RECEIPT\tGENERATION\tCOMPONENT\tKIND\tCLASS\tSTARTED\tFINISHED\tCOMPENSATION\tDETAIL")
	for _, r := range v.Receipts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Generation, r.Component, r.Kind, r.Class,
			dash(r.StartedAt), dash(r.FinishedAt), r.Compensation, oneLine(r.Detail))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
