package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// maxStderrLines bounds the stderr lines the text form prints per
// generation (status keeps at most 2 KiB of them).
const maxStderrLines = 20

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a person. Text that came from providers
// or from object fields (messages, stderr) is printed with control
// characters escaped, so a provider cannot drive the reader's terminal.
func WriteText(w io.Writer, r *Report) error {
	p := &printer{w: w}
	a := r.Activation
	p.f("ImplementationActivation %s/%s on node %s: %s\n", a.Namespace, a.Name, a.NodeName, Headline(r))
	p.f("  uid %s; spec generation %d, observed %d; paused %t\n", a.UID, r.Generation, r.ObservedGeneration, r.Paused)
	if r.Deleting != nil {
		p.f("  being deleted since %s; finalizers %v\n", r.Deleting.UTC().Format(time.RFC3339), r.Finalizers)
	}
	p.f("  modules: %d of %d serve now, %d of %d their desired implementation\n", r.ServingCount, r.ModuleCount, r.ActiveCount, r.ModuleCount)
	if r.Retry.Requested != "" {
		p.f("  retry: requested %s, handled %q, pending %t\n", clean(r.Retry.Requested), clean(r.Retry.Handled), r.Retry.Pending)
	}

	p.f("\nConditions:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range r.Conditions {
		stale := ""
		if c.Stale {
			stale = " (stale: describes an older spec)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s%s\n", c.Type, c.Status, c.Reason, clean(c.Message), stale)
	}
	tw.Flush()

	node := string(r.Node.State)
	if r.Node.Detail != "" {
		node += ": " + r.Node.Detail
	}
	p.f("\nNode %s: %s\n", r.Node.Name, node)
	if l := r.Ledger; l != nil {
		p.f("Ledger (%s) %s: ", l.Source, l.Path)
		switch {
		case l.Missing && l.Error == "":
			p.f("does not exist (no transaction has run yet)")
		case l.Rule != "":
			p.f("DOES NOT VERIFY: rule %s at sequence %d", l.Rule, l.Sequence)
			if l.File != "" {
				p.f(" (%s line %d)", l.File, l.Line)
			}
		case l.Error != "":
			p.f("unreadable: %s", clean(l.Error))
		default:
			state := "verified"
			if !l.Verified {
				state = "NOT verified"
			}
			p.f("%d records, head %s, %s", l.Records, l.HeadSHA256, state)
			if l.OpenTransaction != "" {
				p.f("; open transaction %s", l.OpenTransaction)
			}
		}
		p.f("\n")
	}

	if len(r.Sandboxes) > 0 {
		p.f("\nSandboxes of the active generations:\n")
		for _, sb := range r.Sandboxes {
			p.f("  %s: %s: %s\n", clean(sb.Module), clean(sb.Generation), clean(sb.Sandbox))
			if v := violations(sb.Violations); v != "" {
				p.f("    audit: %s did what --sandbox=enforce refuses: %s\n", clean(sb.Generation), v)
			}
		}
	}

	if len(r.Modules) > 0 {
		p.f("\nModules not serving their desired implementation:\n")
		for _, m := range r.Modules {
			p.module(m)
		}
	}

	if len(r.Processes) > 0 {
		p.f("\nProvider process records:\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "  PGID\tPID\tMODULE\tIMPLEMENTATION\tAGE\tVERDICT\tCLAIMED BY\n")
		for _, pr := range r.Processes {
			age := "-"
			switch {
			case pr.Alive && pr.AgeSeconds > 0:
				age = (time.Duration(pr.AgeSeconds) * time.Second).String()
			case pr.Alive:
				age = "<1s"
			}
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\t%s\t%s\n", pr.Pgid, pr.Pid, clean(pr.Module), clean(pr.ImplementationID), age, pr.Verdict, orDash(pr.ClaimedBy))
		}
		tw.Flush()
	}

	if len(r.Events) > 0 {
		p.f("\nEvents (newest last):\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, e := range r.Events {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Time.UTC().Format(time.RFC3339), e.Type, e.Reason, clean(e.Message))
		}
		tw.Flush()
	}

	p.f("\nFindings:\n")
	if len(r.Findings) == 0 {
		p.f("  none: every module serves its desired implementation and Ready is True\n")
	}
	for _, f := range r.Findings {
		mod := ""
		if f.Module != "" {
			mod = " " + f.Module
		}
		p.f("  [%s] %s%s: %s\n", f.Severity, f.Code, mod, clean(f.Summary))
		if f.Hint != "" {
			p.f("      %s\n", clean(f.Hint))
		}
		for _, c := range f.Commands {
			p.f("      $ %s\n", c)
		}
	}
	return p.err
}

func (p *printer) module(m ModuleDiagnosis) {
	phase := m.Phase
	if phase == "" {
		phase = "not in status"
	}
	serving := "serving " + m.ImplementationID
	switch g := m.Active; {
	case m.ImplementationID != "":
	case g != nil:
		serving = fmt.Sprintf("serving nothing (its generation %s, %s, is %s)", g.Name, g.ImplementationID, orDash(g.Phase))
	default:
		serving = "serving nothing"
	}
	p.f("  %s: %s, %s, desired %s\n", m.Module, phase, serving, orDash(m.DesiredImplementationID))
	if m.Reason != "" {
		p.f("    reason:     %s: %s\n", m.Reason, clean(m.Message))
	}
	if g := m.Active; g != nil {
		p.f("    active:     %s\n", generationLine(g))
	}
	if g := m.Target; g != nil {
		p.f("    target:     %s\n", generationLine(g))
	}
	if b := m.LastBlock; b != nil {
		p.f("    last block: sequence %d, %s blocked", b.Sequence, b.Phase)
		if b.BlockKind != "" {
			p.f(" (%s)", b.BlockKind)
		}
		p.f(": %s", clean(b.Reason))
		if b.Ending != "" {
			p.f(" → %s", b.Ending)
		}
		p.f(" [transaction %s, from %s]\n", b.TransactionID, b.Source)
	} else {
		p.f("    last block: none in view\n")
	}
	if m.ChainText != "" {
		p.f("    chain:      %s\n", clean(m.ChainText))
	}
	for _, g := range []*GenerationSummary{m.Target, m.Active} {
		if g == nil || g.Receipts == nil {
			continue
		}
		c := g.Receipts
		evidence := "complete"
		if c.Incomplete {
			evidence = "INCOMPLETE"
			if c.IncompleteReason != "" {
				evidence += " (" + clean(c.IncompleteReason) + ")"
			}
		}
		p.f("    receipts of %s: %d, %d irreversible (never rolled back); evidence %s [from %s]\n", g.Name, c.Total, c.Irreversible, evidence, c.Source)
		for _, r := range c.Recent {
			p.f("      - %s\n", clean(r))
		}
		p.f("      all: %s\n", c.Command)
	}
	for _, g := range []*GenerationSummary{m.Target, m.Active} {
		if g == nil || g.Sandbox == "" {
			continue
		}
		p.f("    sandbox of %s: %s\n", g.Name, clean(g.Sandbox))
		if v := violations(g.SandboxViolations); v != "" {
			p.f("    audit: %s did what --sandbox=enforce refuses: %s\n", g.Name, v)
		}
	}
	for _, g := range []*GenerationSummary{m.Target, m.Active} {
		if g == nil || g.StderrTail == "" {
			continue
		}
		dropped := ""
		if g.StderrDroppedBytes > 0 {
			dropped = fmt.Sprintf(", %d earlier bytes dropped", g.StderrDroppedBytes)
		}
		p.f("    stderr tail of %s (last %d lines%s):\n", g.Name, maxStderrLines, dropped)
		lines := strings.Split(strings.TrimRight(g.StderrTail, "\n"), "\n")
		if len(lines) > maxStderrLines {
			lines = lines[len(lines)-maxStderrLines:]
		}
		for _, l := range lines {
			p.f("      | %s\n", clean(l))
		}
	}
}

// maxHeadlineModules bounds the modules the headline names.
const maxHeadlineModules = 4

// Headline is the report's verdict in one phrase: healthy, or the number of
// problems and what serves now. A module whose active generation is Failed
// or being relaunched serves nothing, whatever implementation status names
// for it, and the headline says so first.
func Headline(r *Report) string {
	if r.Healthy {
		return "healthy"
	}
	n := r.Problems()
	verdict := fmt.Sprintf("NOT HEALTHY, %d problem%s", n, plural(n))
	var none []string
	for _, m := range r.Modules {
		if m.DesiredImplementationID == "" || m.ImplementationID != "" {
			continue // not in the spec, or served
		}
		why := m.Reason
		switch {
		case why != "":
		case m.Phase != "":
			why = m.Phase
		default:
			why = "not in status"
		}
		none = append(none, fmt.Sprintf("%s (%s)", m.Module, why))
	}
	switch {
	case len(none) > maxHeadlineModules:
		return fmt.Sprintf("%s; nothing serves %s and %d more", verdict, strings.Join(none[:maxHeadlineModules], ", "), len(none)-maxHeadlineModules)
	case len(none) > 0:
		return fmt.Sprintf("%s; nothing serves %s", verdict, strings.Join(none, ", "))
	case r.ActiveCount == r.ModuleCount:
		return verdict + "; every module serves its desired implementation"
	}
	return fmt.Sprintf("%s; every module serves, %d of %d its desired implementation", verdict, r.ActiveCount, r.ModuleCount)
}

func generationLine(g *GenerationSummary) string {
	s := fmt.Sprintf("%s  %s", g.Name, orDash(g.Phase))
	if g.Step != "" {
		s += " at " + g.Step
	}
	s += fmt.Sprintf(" (%s %s, lineage %d, attempt %d", g.ImplementationID, g.Version, g.Lineage, g.Attempt)
	if g.Pid > 0 {
		s += fmt.Sprintf(", pid %d", g.Pid)
	}
	if g.Renewals > 0 {
		s += fmt.Sprintf(", %d renewals", g.Renewals)
	}
	s += ")"
	if g.Reason != "" {
		s += ": " + g.Reason + ": " + clean(g.Message)
	}
	return s
}

type printer struct {
	w   io.Writer
	err error
}

// violations is an audit count as "execve 1, socket 3" (by name).
func violations(v map[string]int64) string {
	names := make([]string, 0, len(v))
	for n := range v {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d", clean(n), v[n])
	}
	return strings.Join(parts, ", ")
}

func (p *printer) f(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, format, args...)
}

// clean escapes control characters (a terminal escape sequence included)
// and invalid UTF-8, keeping everything else as it is.
func clean(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
