package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"iteron.dev/operator/internal/ledger"
)

// newLedgerCmd is `kubectl iteron ledger verify|show <file|dir>`.
func newLedgerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Verify or show a hot-swap ledger (a segment file or a ledger directory)",
	}
	cmd.AddCommand(newLedgerVerifyCmd(), newLedgerShowCmd())
	return cmd
}

func newLedgerVerifyCmd() *cobra.Command {
	var anchor string
	cmd := &cobra.Command{
		Use:   "verify <file|dir>",
		Short: "Replay a ledger and check every rule; exit 1 with the rule and sequence on stderr",
		Long: `Replays a ledger read-only and checks every rule of docs/reference/ledger.md:
canonical strict JSON, sequence, hash chain, record hashes, the transaction
grammar of the file's schema (iteron-operator-ledger/1 or the family's
iteron-hotswap-ledger/1).
A directory is verified from its oldest retained segment; a single file must be a
complete ledger. A torn tail is reported, never repaired. An open last
transaction of iteron-operator-ledger/1 is allowed (the manager closes it on
restart) and reported.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := ledger.VerifyOptions{}
			if anchor != "" {
				a, err := parseAnchor(anchor)
				if err != nil {
					return usage(err)
				}
				opts.Anchor = &a
			}
			st, err := ledger.Verify(args[0], opts)
			if err != nil {
				return invalid(err)
			}
			printVerified(cmd.OutOrStdout(), args[0], st, opts.Anchor != nil)
			return nil
		},
	}
	cmd.Flags().StringVar(&anchor, "anchor", "", "`SEQUENCE=sha256:…` that must be in the chain (e.g. the status head: records-1 and headSHA256)")
	return cmd
}

// parseAnchor reads "<sequence>=<sha256:hex>".
func parseAnchor(s string) (ledger.Anchor, error) {
	seq, digest, ok := strings.Cut(s, "=")
	n, err := strconv.ParseUint(seq, 10, 64)
	if !ok || err != nil || !strings.HasPrefix(digest, "sha256:") {
		return ledger.Anchor{}, fmt.Errorf("--anchor %q: want SEQUENCE=sha256:<hex>", s)
	}
	return ledger.Anchor{Sequence: n, RecordSHA256: digest}, nil
}

func printVerified(w io.Writer, path string, st ledger.State, anchored bool) {
	if st.NextSequence == 0 {
		fmt.Fprintf(w, "ok: %s: empty ledger\n", path)
		return
	}
	fmt.Fprintf(w, "ok: %s: %s, %d records (sequences %d..%d)", path, st.Schema, st.Records, st.FirstSequence, st.NextSequence-1)
	if st.LastSegment > 0 {
		fmt.Fprintf(w, " in segments %d..%d", st.FirstSegment, st.LastSegment)
	}
	fmt.Fprintf(w, ", head %s\n", st.HeadSHA256)
	if anchored {
		if st.AnchorVerified {
			fmt.Fprintln(w, "anchor: found in the chain")
		} else {
			fmt.Fprintln(w, "anchor: before the retained segments, not checked")
		}
	}
	if o := st.Open; o != nil {
		fate := "roll it back"
		if o.Switched {
			fate = "commit it (atomic_switch is durable)"
		}
		kinds := make([]string, len(o.Kinds))
		for i, k := range o.Kinds {
			kinds[i] = k.String()
		}
		last := "nothing"
		if o.Blocked != nil {
			last, fate = "blocked "+string(o.Blocked.Phase), "finish its rollback"
		} else if len(o.Applied) > 0 {
			last = string(o.Applied[len(o.Applied)-1])
		}
		fmt.Fprintf(w, "open transaction: %s (%s) after %s; a restarted manager will %s\n",
			o.Identity.TransactionID, strings.Join(kinds, " or "), last, fate)
	}
}

func newLedgerShowCmd() *cobra.Command {
	var tail int
	var wide bool
	cmd := &cobra.Command{
		Use:   "show <file|dir>",
		Short: "Print a ledger's records as a table (verified records; then the first broken rule, exit 1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tail < 0 {
				return usage(errors.New("--tail must be ≥ 0"))
			}
			var rows []ledger.Record
			st, err := ledger.Replay(args[0], ledger.VerifyOptions{}, func(r *ledger.Record) error {
				rows = append(rows, *r)
				if tail > 0 && len(rows) > 2*tail {
					rows = append(rows[:0], rows[len(rows)-tail:]...)
				}
				return nil
			})
			if tail > 0 && len(rows) > tail {
				rows = rows[len(rows)-tail:]
			}
			writeTable(cmd.OutOrStdout(), rows, wide)
			if err != nil {
				return invalid(err)
			}
			printVerified(cmd.OutOrStdout(), args[0], st, false)
			return nil
		},
	}
	cmd.Flags().IntVar(&tail, "tail", 0, "show only the last `N` records (0: all)")
	cmd.Flags().BoolVar(&wide, "wide", false, "show whole reasons and hashes")
	return cmd
}

func writeTable(w io.Writer, rows []ledger.Record, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTRANSACTION\tPHASE\tOUTCOME\tGEN\tELAPSED\tRECORD\tREASON")
	for _, r := range rows {
		reason := "-"
		if r.Reason != nil {
			reason = printable(*r.Reason)
			if !wide {
				reason = shorten(reason, 60)
			}
		}
		hash := strings.TrimPrefix(r.RecordSHA256, "sha256:")
		if !wide && len(hash) > 12 {
			hash = hash[:12]
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d→%d\t%dms\t%s\t%s\n",
			r.Sequence, r.TransactionID, r.Phase, r.Outcome, r.OldGeneration, r.NewGeneration, r.ElapsedMs, hash, reason)
	}
	tw.Flush()
}

// printable escapes what would break a table row (U+2028 and other
// non-graphic characters are valid in a reason).
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsGraphic(r) {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// shorten cuts s to at most n bytes at a character boundary, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
