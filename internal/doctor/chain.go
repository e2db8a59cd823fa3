package doctor

import (
	"fmt"
	"strings"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
)

// maxChain bounds a chain: an activation has at most 64 modules.
const maxChain = 64

// dependencyChain follows module's seam-graph dependencies that are in the
// activation and do not serve (the coordinator starts a module only after
// its dependencies are Active), from the module to the first one that is
// not itself waiting on another: the root cause. It returns nil when no
// dependency gates the module.
//
// Implementation dependencies (a manifest's dependencies[]) are not visible
// in objects; when one gates a module, its status message, written by the
// graph, names that chain instead.
func dependencyChain(g *catalog.SeamGraph, module string, modules map[string]iteronv1.ModuleStatus) []ChainLink {
	link := func(m string) ChainLink {
		ms := modules[m]
		return ChainLink{Module: m, Phase: string(ms.Phase), Reason: ms.Reason, Message: ms.Message}
	}
	chain := []ChainLink{link(module)}
	seen := map[string]bool{module: true}
	cur := module
	for len(chain) < maxChain {
		next := ""
		for _, d := range g.Dependencies(cur) {
			ms, present := modules[d]
			if present && ms.Phase != iteronv1.PhaseActive && !seen[d] {
				next = d
				break
			}
		}
		if next == "" {
			break
		}
		chain = append(chain, link(next))
		seen[next] = true
		cur = next
	}
	if len(chain) < 2 {
		return nil
	}
	return chain
}

// chainText says a chain in words: "provider_routing waits for
// context_assembly, which waits for prompt_system, which failed
// verification: …".
func chainText(chain []ChainLink) string {
	if len(chain) < 2 {
		return ""
	}
	var b strings.Builder
	b.WriteString(chain[0].Module)
	for i, l := range chain[1:] {
		if i == 0 {
			b.WriteString(" waits for ")
		} else {
			b.WriteString(", which waits for ")
		}
		b.WriteString(l.Module)
	}
	b.WriteString(", which ")
	b.WriteString(rootCause(chain[len(chain)-1]))
	return b.String()
}

// rootCause describes why the last module of a chain does not serve, in
// words that continue "…, which ".
func rootCause(l ChainLink) string {
	detail := func(prefix string) string {
		if l.Message == "" {
			return prefix
		}
		return prefix + ": " + l.Message
	}
	phase := l.Phase
	if phase == "" {
		phase = string(iteronv1.PhaseInactive)
	}
	switch l.Reason {
	case reasons.VerificationFailed:
		return detail("failed verification")
	case reasons.UnsupportedVersion:
		return detail("failed verification (unsupported protocol version)")
	case reasons.SchemaMismatch:
		return detail("failed verification (schema mismatch)")
	case reasons.DependencyUnsatisfied:
		return detail("has an unsatisfied dependency")
	case reasons.DependencyCycle:
		return detail("is on a dependency cycle")
	case reasons.AuthorityChanged:
		return detail("was not started: its admitted capabilities changed")
	case reasons.LedgerCorrupt:
		return detail("is stopped: the ledger is corrupt")
	case "":
		return fmt.Sprintf("is %s with no reason yet (a transaction may be in progress)", phase)
	default:
		return detail(fmt.Sprintf("is %s after %s", phase, l.Reason))
	}
}
