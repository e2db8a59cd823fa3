// Package restarttable is the restart table's caller and its analysis,
// shared by the suites that run it (test/survivor against the local control
// plane, test/node on a real node): one caller calling a counter in a loop,
// each call under its own invocation ID, a failed attempt retried under the
// same ID as a careful client does; and, per case (a hot swap, a manager
// restart, a provider crash …), the attempts it made and the reasons the
// failed ones got, whether every retried call was answered once, whether the
// count went on, and the provider's pids.
package restarttable

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// Answer is one attempt's answer.
type Answer struct {
	OK       bool
	Count    float64
	Replayed bool
	Code     codes.Code
	Msg      string
	Took     time.Duration
}

func (a Answer) String() string {
	if a.OK {
		return fmt.Sprintf("count %v (replayed %v) in %v", a.Count, a.Replayed, a.Took.Round(time.Millisecond))
	}
	msg := a.Msg
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return fmt.Sprintf("%s after %v: %s", a.Code, a.Took.Round(time.Millisecond), msg)
}

var reasonRE = regexp.MustCompile(`^([a-z_]+): `)

// Reason names why an attempt failed: the gateway's reason, or the
// transport's code when no gateway answered (no manager ran).
func (a Answer) Reason() string {
	if m := reasonRE.FindStringSubmatch(a.Msg); m != nil {
		return m[1]
	}
	return fmt.Sprintf("no gateway answered (%s)", a.Code)
}

// Invocation is one invocation ID: its failed attempts, then the answer
// that ended it.
type Invocation struct {
	ID       string
	Failures []Answer
	Final    Answer
}

// Call makes one attempt under an invocation ID.
type Call func(id string) Answer

// Loop is the retrying caller.
type Loop struct {
	call Call
	mu   sync.Mutex
	inv  []*Invocation
	stop chan struct{}
	done chan struct{}
}

// Start starts calling: an attempt that failed UNAVAILABLE or
// DEADLINE_EXCEEDED is retried under the same ID (for at most 30 s); any
// other answer ends the invocation.
func Start(call Call, prefix string) *Loop {
	l := &Loop{call: call, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 1; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			inv := &Invocation{ID: fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, i)}
			for begin := time.Now(); ; {
				r := call(inv.ID)
				retry := r.Code == codes.Unavailable || r.Code == codes.DeadlineExceeded
				if r.OK || !retry || time.Since(begin) > 30*time.Second {
					inv.Final = r
					break
				}
				inv.Failures = append(inv.Failures, r)
				time.Sleep(20 * time.Millisecond)
			}
			l.mu.Lock()
			l.inv = append(l.inv, inv)
			l.mu.Unlock()
			if !inv.Final.OK {
				// A module that cannot serve answers at once: do not spin.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	return l
}

// Ended is how many invocations have their final answer.
func (l *Loop) Ended() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.inv)
}

// Window is the invocations that ended since the from-th.
func (l *Loop) Window(from int) []*Invocation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.inv[from:])
}

// LastCount is the newest answered count (0 before any).
func (l *Loop) LastCount() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.inv) - 1; i >= 0; i-- {
		if l.inv[i].Final.OK {
			return l.inv[i].Final.Count
		}
	}
	return 0
}

// WaitAnswered waits until more invocations have ended (bounded).
func (l *Loop) WaitAnswered(t testing.TB, more int, within time.Duration) {
	t.Helper()
	want := l.Ended() + more
	for start := time.Now(); l.Ended() < want; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > within {
			t.Fatalf("the caller ended %d invocations in %v; want %d", l.Ended(), within, want)
		}
	}
}

// Finish stops the caller and waits for its last attempt.
func (l *Loop) Finish() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// Case is one case of the table.
type Case struct {
	// Kind says what happened.
	Kind string
	// Resumes allows the count to start again from a checkpoint (the
	// provider's memory was lost); otherwise it must go on.
	Resumes bool
	// MayFail are the only reasons an attempt may fail with.
	MayFail []string
}

// Row is one line of the table.
type Row struct {
	Kind, Reasons, Once, Counts, Pids string
	Attempts                          int
}

// Analyse checks the invocations of one case and makes its row: no attempt
// failed with a reason the case cannot have (activation_failed never is
// one), every retried invocation asked once more is answered as before (a
// replay of the same count, or the same failure; one refused before it ran
// runs then, once), and the count went on from startCount (or resumed from
// a checkpoint when c.Resumes). ask repeats a call under its ID; pidsBefore
// and pidsAfter name the provider.
func Analyse(t testing.TB, c Case, inv []*Invocation, startCount float64, ask Call, pidsBefore, pidsAfter string) Row {
	t.Helper()
	row := Row{Kind: c.Kind}
	reasons := map[string]int{}
	var wrong []string
	for _, v := range inv {
		row.Attempts += len(v.Failures) + 1
		for _, f := range append(slices.Clone(v.Failures), v.Final) {
			if f.OK {
				continue
			}
			r := f.Reason()
			reasons[r]++
			if !slices.Contains(c.MayFail, r) {
				wrong = append(wrong, fmt.Sprintf("%s: %v", v.ID, f))
			}
		}
	}
	retried, replayed, once := 0, 0, true
	for _, v := range inv {
		if len(v.Failures) == 0 && v.Final.OK {
			continue
		}
		retried++
		if v.Final.Replayed {
			replayed++
		}
		again := ask(v.ID)
		switch {
		case v.Final.OK && (!again.OK || !again.Replayed || again.Count != v.Final.Count):
			once = false
			t.Logf("  %s: answered %v, asked again %v: not the same answer", v.ID, v.Final, again)
		case !v.Final.OK && again.OK:
			// Refused before it ran: no outcome was kept, so asking again
			// ran it — once: a third ask replays that run.
			if third := ask(v.ID); !third.Replayed || third.Count != again.Count {
				once = false
				t.Logf("  %s: refused (%v), asked again ran it (%v), a third time %v: not a replay", v.ID, v.Final, again, third)
			}
		case !v.Final.OK && (again.Code != v.Final.Code || again.Msg != v.Final.Msg):
			once = false
			t.Logf("  %s: failed %v, asked again %v: not the same failure", v.ID, v.Final, again)
		}
	}
	var gaps []string
	last, resumedAt := startCount, -1.0
	for _, v := range inv {
		if !v.Final.OK {
			continue
		}
		switch {
		case v.Final.Count == last+1:
		case c.Resumes && resumedAt < 0 && v.Final.Count <= last:
			resumedAt = v.Final.Count
		default:
			gaps = append(gaps, fmt.Sprintf("%s answered %v after %v", v.ID, v.Final.Count, last))
		}
		last = v.Final.Count
	}
	row.Counts = fmt.Sprintf("%v → %v continuous", startCount, last)
	if resumedAt >= 0 {
		row.Counts = fmt.Sprintf("%v → resumed at %v (state restored from a checkpoint) → %v", startCount, resumedAt, last)
	}
	if len(gaps) > 0 {
		row.Counts = fmt.Sprintf("GAPS %v", gaps)
	}
	var rs []string
	for r, k := range reasons {
		rs = append(rs, fmt.Sprintf("%d %s", k, r))
	}
	sort.Strings(rs)
	row.Reasons = "none failed"
	if len(rs) > 0 {
		row.Reasons = "failed: " + strings.Join(rs, ", ")
	}
	row.Once = "no retry needed"
	if retried > 0 {
		row.Once = fmt.Sprintf("%v: %d retried, %d answered from the first outcome (replayed)", once, retried, replayed)
	}
	row.Pids = fmt.Sprintf("%s → %s (unchanged)", pidsBefore, pidsAfter)
	if pidsBefore != pidsAfter {
		row.Pids = fmt.Sprintf("%s → %s (new process)", pidsBefore, pidsAfter)
	}
	t.Logf("%s: %d attempts (%s); retried answered once: %s; count %s; pids %s", c.Kind, row.Attempts, row.Reasons, row.Once, row.Counts, row.Pids)
	if len(wrong) > 0 {
		t.Errorf("%s: attempts failed with a reason this case cannot have (allowed: %v): %v", c.Kind, c.MayFail, wrong)
	}
	if !once {
		t.Errorf("%s: a retried call was not answered exactly once (see above)", c.Kind)
	}
	if len(gaps) > 0 {
		t.Errorf("%s: the count did not go on: %v", c.Kind, gaps)
	}
	return row
}

// Table renders rows as the restart table (markdown), titled.
func Table(title string, rows []Row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s:\n| case | attempts (failed: reasons) | retried calls answered once? | count | provider pids |\n|---|---|---|---|---|\n", title)
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d (%s) | %s | %s | %s |\n", r.Kind, r.Attempts, r.Reasons, r.Once, r.Counts, r.Pids)
	}
	return b.String()
}
