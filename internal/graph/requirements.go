package graph

import (
	"fmt"
	"slices"
	"strings"

	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/pkg/strictjson"
)

// bindRequirements binds v's typed requirements (seam graph schema version
// 3) to the sources of the activation:
//   - a requirement on a module binds that module's source; on a contract,
//     the selected provider's source, or the only providing source present
//     (two or more without a selection: dependency_conflict, naming them);
//   - a required requirement with nothing to bind, or whose source's
//     version is outside its range, leaves v unmet (dependency_unsatisfied
//     naming the range and the version found);
//   - an optional one in that case is a diagnostic and binds nothing;
//   - a bound requirement is a direct dependency (order and epoch); an
//     optional one stops gating if its source is not admitted (resolve).
func bindRequirements(g *catalog.SeamGraph, v *vertex, vs []*vertex, byModule map[string]int) {
	for _, r := range g.Requirements(v.module) {
		target, conflict := requirementSource(g, v.module, r, byModule)
		if conflict != nil {
			if v.conflict == "" {
				names := make([]string, len(conflict))
				for i, c := range conflict {
					names[i] = describeSource(vs[c])
				}
				v.conflict = fmt.Sprintf("%s, which %d sources provide: %s; the seam graph selects none (set the requirement's \"select\")", r.Target(), len(conflict), strings.Join(names, " and "))
			}
			continue
		}
		want := r.Target()
		if !r.Range.IsAny() {
			want += " " + r.Range.String()
		}
		var problem string
		switch {
		case target < 0:
			problem = want + ", which has no source in the activation"
		case vs[target].node != nil && !r.Range.Contains(vs[target].node.Version):
			problem = fmt.Sprintf("%s, but %s has %s at %s", want, vs[target].module, vs[target].node.ImplementationID, vs[target].node.Version)
		}
		switch {
		case problem != "" && r.Optional:
			v.diagnose("optional dependency " + problem + "; activated without it")
		case problem != "":
			if v.unmet == "" {
				v.unmet = problem
			}
		default:
			already := slices.Contains(v.deps, target)
			switch {
			case !r.Optional:
				// Required here: whatever made it optional elsewhere no
				// longer does.
				delete(v.optional, target)
			case !already:
				// Optional only if nothing else (a manifest dependency, a
				// required requirement) binds it already.
				if v.optional == nil {
					v.optional = map[int]string{}
				}
				v.optional[target] = want
			}
			if !already {
				v.deps = append(v.deps, target)
				slices.Sort(v.deps)
			}
		}
	}
}

// requirementSource returns the vertex a requirement binds (-1: none
// present), or the providing vertices when several are and none is
// selected.
func requirementSource(g *catalog.SeamGraph, self string, r catalog.Requirement, byModule map[string]int) (int, []int) {
	switch {
	case r.Module != "":
		if i, ok := byModule[r.Module]; ok {
			return i, nil
		}
		return -1, nil
	case r.Select != "":
		if i, ok := byModule[r.Select]; ok {
			return i, nil
		}
		return -1, nil
	}
	var present []int
	for _, p := range g.Providers(r.Contract) {
		if i, ok := byModule[p]; ok && p != self {
			present = append(present, i)
		}
	}
	switch len(present) {
	case 0:
		return -1, nil
	case 1:
		return present[0], nil
	}
	return -1, present
}

// describeSource names a source in a message: "module (implementation)".
func describeSource(v *vertex) string {
	if v.node != nil {
		return v.module + " (" + v.node.ImplementationID + ")"
	}
	return v.module + " (" + v.rejected.ImplementationID + ")"
}

// epochMember is what a module contributes to an epoch: its identity, and,
// when its graph entry carries contract schema hashes (schema version 3),
// "|schema:" and the digest of those hashes, so a schema change reloads the
// module and its consumers. Without schema hashes it is the identity alone:
// the family's graphs yield the epochs they always did.
func epochMember(g *catalog.SeamGraph, identity, module string) string {
	hashes := g.SchemaHashes(module)
	if len(hashes) == 0 {
		return identity
	}
	b, err := strictjson.Canonical(hashes)
	if err != nil {
		// Keys and values are validated ASCII; unreachable.
		return identity + "|schema:invalid"
	}
	return identity + "|schema:" + strictjson.Digest(b)
}
