package docs

import (
	"fmt"
	"regexp"
	"strings"
)

// block is one fenced code block of a guide.
type block struct {
	// Line is the 1-based line of the opening fence.
	Line int
	// Lang is the info string's first word ("sh", "go", …).
	Lang string
	// Body is the block's lines, the fence's indentation removed.
	Body []string
	// Directive is the doctest comment right before the block, if any:
	// "skip: why", "your-values", "file path", "digests vary".
	Directive string
}

var (
	fenceRE     = regexp.MustCompile("^( {0,12})(```+)\\s*([A-Za-z0-9_+-]*)")
	directiveRE = regexp.MustCompile(`^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$`)
)

// parseBlocks returns the fenced code blocks of a Markdown document, each
// with the doctest directive on the last non-blank line before it.
func parseBlocks(text string) ([]block, error) {
	lines := strings.Split(text, "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, fence := m[1], m[2]
		b := block{Line: i + 1, Lang: m[3]}
		for j := i - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) == "" {
				continue
			}
			if d := directiveRE.FindStringSubmatch(lines[j]); d != nil {
				b.Directive = d[1]
			}
			break
		}
		closed := false
		for i++; i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) == fence {
				closed = true
				break
			}
			line := lines[i]
			if strings.HasPrefix(line, indent) {
				line = line[len(indent):]
			} else if strings.TrimSpace(line) != "" {
				return nil, fmt.Errorf("line %d: a line of the block at line %d is indented less than its fence", i+1, b.Line)
			}
			b.Body = append(b.Body, line)
		}
		if !closed {
			return nil, fmt.Errorf("line %d: the block never closes", b.Line)
		}
		out = append(out, b)
	}
	return out, nil
}

// command is one command of a shell block and the output the guide shows
// for it (nil when it shows none).
type command struct {
	// Line is the 1-based line of the command in the guide.
	Line int
	// Text is the command as bash reads it (continuations and here-document
	// bodies included, prompts removed).
	Text string
	// Output is the output shown, one string per line; nil: not shown.
	Output []string
}

var heredocRE = regexp.MustCompile(`<<-?\s*(['"]?)([A-Za-z_][A-Za-z0-9_]*)(['"]?)`)

// commands splits a shell block into commands. A block with "$ " prompts is
// a session: the prompted lines are commands and the lines between them
// their output. Any other block is a script: every line that is not blank
// or a comment starts a command.
func commands(b block) ([]command, error) {
	session := false
	for _, l := range b.Body {
		if strings.HasPrefix(l, "$ ") {
			session = true
			break
		}
	}
	var out []command
	var cur *command
	for i := 0; i < len(b.Body); i++ {
		l := b.Body[i]
		lineNo := b.Line + 1 + i
		var text string
		switch {
		case session && strings.HasPrefix(l, "$ "):
			text = strings.TrimPrefix(l, "$ ")
		case session:
			if cur == nil {
				return nil, fmt.Errorf("line %d: output before the first $ command", lineNo)
			}
			cur.Output = append(cur.Output, l)
			continue
		case strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#"):
			continue
		default:
			text = l
		}
		// Continuation lines and here-document bodies belong to the command.
		for strings.HasSuffix(text, "\\") && i+1 < len(b.Body) {
			i++
			text += "\n" + b.Body[i]
		}
		for _, h := range heredocRE.FindAllStringSubmatch(text, -1) {
			delim := h[2]
			found := false
			for i+1 < len(b.Body) {
				i++
				text += "\n" + b.Body[i]
				if strings.TrimSpace(b.Body[i]) == delim {
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("line %d: here-document %s never ends", lineNo, delim)
			}
		}
		out = append(out, command{Line: lineNo, Text: text})
		cur = &out[len(out)-1]
	}
	return out, nil
}

// headingSlugs returns the anchors GitHub gives the headings of a document.
func headingSlugs(text string) map[string]bool {
	slugs := map[string]bool{}
	inFence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '…' && r != '→' && r != '—':
				b.WriteRune(r)
			}
		}
		slug := b.String()
		for n := 1; slugs[slug]; n++ {
			slug = fmt.Sprintf("%s-%d", b.String(), n)
		}
		slugs[slug] = true
	}
	return slugs
}
