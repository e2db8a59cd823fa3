package artifacts

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"iteron.dev/operator/internal/reasons"
)

// Backoff of artifact_unavailable pulls.
const (
	DefaultRetryBase = time.Second
	DefaultRetryMax  = 2 * time.Minute
	// pendingRetry is how soon a reconcile looks again at a pull in progress.
	pendingRetry = 500 * time.Millisecond
	// recentlyUsed is how long a resolved source is kept from GC whatever
	// the keep set says (a reconcile between resolving a source and
	// creating the Generation that names it).
	recentlyUsed = 30 * time.Minute
)

// Resolver answers the manager's reconciles without blocking them: a source
// already laid out is returned at once; otherwise one pull starts in the
// background and the reconcile is told artifact_unavailable (pending) with
// when to look again. A pull that failed with artifact_unavailable is tried
// again after a backoff (RetryBase doubling to RetryMax); one refused
// (artifact_refused, verification_failed) is not tried again until the
// caller's token (the spec) or the registry credentials change.
type Resolver struct {
	p         *Puller
	retryBase time.Duration
	retryMax  time.Duration
	now       func() time.Time
	// OnDone, when set, is called after every background pull ends.
	OnDone func(ref string)

	mu     sync.Mutex
	states map[string]*pullState
	used   map[string]time.Time
	// pulls are the pulls that laid a source out, by its directory, until
	// the first transaction that runs it takes the record (TakePull) or it
	// is older than recentlyUsed.
	pulls map[string]PullRecord
}

// PullRecord is a pull that laid a source out in the store.
type PullRecord struct {
	// Digest is the reference's manifest digest.
	Digest string
	// Dir is the source's directory in the store.
	Dir string
	// Start and End bound the pull.
	Start, End time.Time
}

type pullState struct {
	inFlight    bool
	err         *Error
	failures    int
	nextAttempt time.Time
	// token and credentials of a refused pull.
	token, creds string
}

// NewResolver wraps p. retryBase and retryMax of 0 take the defaults.
func NewResolver(p *Puller, retryBase, retryMax time.Duration) *Resolver {
	if retryBase <= 0 {
		retryBase = DefaultRetryBase
	}
	if retryMax <= 0 {
		retryMax = DefaultRetryMax
	}
	return &Resolver{p: p, retryBase: retryBase, retryMax: retryMax, now: time.Now, states: map[string]*pullState{}, used: map[string]time.Time{}, pulls: map[string]PullRecord{}}
}

// Store is the store the resolver pulls into.
func (r *Resolver) Store() *Store { return r.p.Store() }

// Resolve returns ref's laid-out source, or an *Error: pending or failed
// (artifact_unavailable with RetryAfter), refused (artifact_refused or
// verification_failed, until token or the credentials change).
func (r *Resolver) Resolve(refString, token string) (*Layout, error) {
	ref, err := ParseRef(refString)
	if err != nil {
		return nil, &Error{Code: reasons.SchemaMismatch, Ref: refString, Detail: err.Error(), Err: err}
	}
	if l, ok := r.p.Store().Lookup(ref.Digest); ok {
		r.mu.Lock()
		r.used[ref.Digest] = r.now()
		delete(r.states, ref.Digest)
		r.mu.Unlock()
		return l, nil
	}
	creds := r.p.CredentialsVersion()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.states[ref.Digest]
	if st == nil {
		// Looked again under the lock: a pull may have laid the source out
		// (and a Resolve dropped its state) since the look above.
		if l, ok := r.p.Store().Lookup(ref.Digest); ok {
			r.used[ref.Digest] = r.now()
			return l, nil
		}
		st = &pullState{}
		r.states[ref.Digest] = st
	}
	now := r.now()
	switch {
	case st.inFlight:
		return nil, r.pending(refString)
	case st.err != nil && !st.err.Retryable() && st.token == token && st.creds == creds:
		e := *st.err
		e.RetryAfter = r.retryMax // a look at the credentials, not a pull
		if !strings.Contains(e.Detail, notRetried) {
			e.Detail += notRetried
		}
		return nil, &e
	case st.err != nil && st.err.Retryable() && now.Before(st.nextAttempt):
		e := *st.err
		e.RetryAfter = st.nextAttempt.Sub(now)
		e.Detail = fmt.Sprintf("%s (attempt %d failed; the next in %s)", st.err.Detail, st.failures, e.RetryAfter.Round(time.Millisecond))
		return nil, &e
	}
	st.inFlight = true
	go r.pull(st, refString, ref.Digest, token, creds)
	return nil, r.pending(refString)
}

const notRetried = " (not tried again until the spec or the registry credentials change)"

func (r *Resolver) pending(ref string) *Error {
	return &Error{Code: reasons.ArtifactUnavailable, Ref: ref, Pending: true, RetryAfter: pendingRetry,
		Detail: fmt.Sprintf("pulling %s into the artifact store", ref)}
}

// pull runs one background pull for st. A Resolve that finds the source
// laid out (this pull's own layout, visible before this goroutine takes the
// lock) drops the digest's state: then only the use is recorded.
func (r *Resolver) pull(st *pullState, refString, digest, token, creds string) {
	start := r.now()
	l, err := r.p.Pull(context.Background(), refString)
	r.mu.Lock()
	st.inFlight = false
	current := r.states[digest] == st
	if err == nil {
		end := r.now()
		for dir, p := range r.pulls {
			if end.Sub(p.End) > recentlyUsed {
				delete(r.pulls, dir)
			}
		}
		r.pulls[l.Dir] = PullRecord{Digest: l.Digest, Dir: l.Dir, Start: start, End: end}
		if current {
			delete(r.states, digest)
		}
		r.used[digest] = r.now()
	} else if current {
		ae, ok := err.(*Error)
		if !ok {
			ae = &Error{Code: reasons.ArtifactUnavailable, Ref: refString, Detail: err.Error(), Err: err}
		}
		st.err, st.token, st.creds = ae, token, creds
		if ae.Retryable() {
			st.failures++
			delay := r.retryBase << min(st.failures-1, 20)
			if delay > r.retryMax || delay <= 0 {
				delay = r.retryMax
			}
			st.nextAttempt = r.now().Add(delay)
		} else {
			st.failures = 0
		}
	}
	r.mu.Unlock()
	if r.OnDone != nil {
		r.OnDone(refString)
	}
}

// TakePull returns, once, the pull that laid out the source whose
// directory holds artifactRoot (false when it was laid out before, or the
// record was taken already): the first transaction that runs a pulled
// source opens its trace with the pull.
func (r *Resolver) TakePull(artifactRoot string) (PullRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for dir, p := range r.pulls {
		if artifactRoot == dir || strings.HasPrefix(artifactRoot, dir+string(filepath.Separator)) {
			delete(r.pulls, dir)
			return p, true
		}
	}
	return PullRecord{}, false
}

// RecentlyUsed returns the digests resolved within the grace period; GC
// keeps them whatever else says.
func (r *Resolver) RecentlyUsed() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	now := r.now()
	for d, at := range r.used {
		if now.Sub(at) > recentlyUsed {
			delete(r.used, d)
			continue
		}
		out[d] = true
	}
	for d, st := range r.states {
		if st.inFlight {
			out[d] = true
		}
	}
	return out
}
