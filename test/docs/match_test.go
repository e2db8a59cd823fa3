package docs

import (
	"fmt"
	"regexp"
	"strings"
)

// The output rules (doc.go): blanks, durations, "…", and digests where a
// block says they vary.
var (
	durationRE = regexp.MustCompile(`^(?:\d+(?:\.\d+)?(?:ns|µs|us|ms|s|m|h))+$`)
	hexRE      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// tokenRE splits an expected line into blanks, "…", words of hex or
	// duration candidates, and everything else one character at a time.
	tokenRE = regexp.MustCompile(`[ \t]+|…|[0-9a-f]{64}|[0-9][0-9A-Za-zµ.]*|.`)
)

const durationPattern = `(?:\d+(?:\.\d+)?(?:ns|µs|us|ms|s|m|h))+`

// digestMap binds the digests a guide shows to the ones a run printed, for
// blocks whose digests vary: the same shown digest must always be the same
// actual digest, and two shown digests two actual ones.
type digestMap struct {
	shown, actual map[string]string
}

func newDigestMap() *digestMap {
	return &digestMap{shown: map[string]string{}, actual: map[string]string{}}
}

// lineMatcher is one expected line compiled: a regexp and, per capture
// group, the shown digest it stands for.
type lineMatcher struct {
	re      *regexp.Regexp
	digests []string
	any     bool // the line is "…": any number of lines
}

func compileLine(expected string, digestsVary bool) lineMatcher {
	expected = strings.TrimRight(expected, " \t")
	if strings.TrimSpace(expected) == "…" {
		return lineMatcher{any: true}
	}
	var pat strings.Builder
	var digests []string
	pat.WriteString("^")
	for _, tok := range tokenRE.FindAllString(expected, -1) {
		switch {
		case strings.TrimLeft(tok, " \t") == "":
			pat.WriteString(`[ \t]+`)
		case tok == "…":
			pat.WriteString(`.*?`)
		case digestsVary && hexRE.MatchString(tok):
			pat.WriteString(`([0-9a-f]{64})`)
			digests = append(digests, tok)
		case durationRE.MatchString(tok):
			pat.WriteString(durationPattern)
		default:
			pat.WriteString(regexp.QuoteMeta(tok))
		}
	}
	pat.WriteString("$")
	return lineMatcher{re: regexp.MustCompile(pat.String()), digests: digests}
}

// matchOutput compares actual output with the lines a guide shows. It
// returns "" when they match, else a description of the first difference.
// Bindings of varying digests are added to dm only when the whole output
// matches.
func matchOutput(expected []string, actual string, digestsVary bool, dm *digestMap) string {
	exp := trimTrailingBlank(expected)
	act := trimTrailingBlank(strings.Split(strings.TrimRight(actual, "\n"), "\n"))
	if strings.TrimSpace(actual) == "" {
		act = nil
	}
	ms := make([]lineMatcher, len(exp))
	for i, e := range exp {
		ms[i] = compileLine(e, digestsVary)
	}
	var firstDiff string
	note := func(format string, args ...any) {
		if firstDiff == "" {
			firstDiff = fmt.Sprintf(format, args...)
		}
	}
	// match reports whether expected lines i… match actual lines j… given
	// the digests bound so far, and returns the bindings of the match.
	var match func(i, j int, bind map[string]string) (map[string]string, bool)
	match = func(i, j int, bind map[string]string) (map[string]string, bool) {
		if i == len(ms) {
			if j == len(act) {
				return bind, true
			}
			note("unexpected output line %d: %q", j+1, act[j])
			return nil, false
		}
		if ms[i].any {
			for k := j; k <= len(act); k++ {
				if got, ok := match(i+1, k, bind); ok {
					return got, true
				}
			}
			return nil, false
		}
		if j == len(act) {
			note("output ends before the shown line %d: %q", i+1, exp[i])
			return nil, false
		}
		line := strings.TrimRight(act[j], " \t")
		sub := ms[i].re.FindStringSubmatch(line)
		if sub == nil {
			note("line %d differs:\n      shown: %q\n    printed: %q", j+1, exp[i], line)
			return nil, false
		}
		next := copyMap(bind)
		for k, shown := range ms[i].digests {
			got := sub[k+1]
			if prev, ok := next[shown]; ok && prev != got {
				note("line %d: the guide shows %s twice; the run printed %s and %s", j+1, shown, prev, got)
				return nil, false
			}
			if prev, ok := dm.shown[shown]; ok && prev != got {
				note("line %d: the guide shows digest %s where an earlier command printed %s; now %s", j+1, shown, prev, got)
				return nil, false
			}
			for otherShown, otherGot := range next {
				if otherGot == got && otherShown != shown {
					note("line %d: the run printed %s for both %s and %s, which the guide shows as different digests", j+1, got, otherShown, shown)
					return nil, false
				}
			}
			if other, ok := dm.actual[got]; ok && other != shown {
				note("line %d: the run printed %s for both %s and %s, which the guide shows as different digests", j+1, got, other, shown)
				return nil, false
			}
			next[shown] = got
		}
		return match(i+1, j+1, next)
	}
	bound, ok := match(0, 0, map[string]string{})
	if !ok {
		return firstDiff
	}
	for shown, got := range bound {
		dm.shown[shown], dm.actual[got] = got, shown
	}
	return ""
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func trimTrailingBlank(lines []string) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}
