// Package effects tracks the live resources of a generation and the receipts
// of effects that cannot simply be undone (docs/reference/receipts.md).
//
// An EffectScope owns every live resource a generation creates — its process,
// its dispatcher route, watches, goroutines — and disposes each exactly once,
// in reverse order of tracking, collecting errors and never skipping the
// rest. A ReceiptStore keeps bounded evidence of effects that were irreversible,
// compensatable, cancelled during quiesce, or cut off by a drain timeout.
package effects

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Class says what disposing an effect can achieve.
type Class int

const (
	// Reversible effects are undone by their dispose function.
	Reversible Class = iota + 1
	// Cancelable effects stop further work when disposed; dispose waits for
	// the work to finish.
	Cancelable
	// Compensatable effects are not undone, but dispose may run a
	// compensating action.
	Compensatable
	// Irreversible effects cannot be undone: only a receipt records them, and
	// they are never reported as rolled back.
	Irreversible
)

func (c Class) String() string {
	switch c {
	case Reversible:
		return "reversible"
	case Cancelable:
		return "cancelable"
	case Compensatable:
		return "compensatable"
	case Irreversible:
		return "irreversible"
	default:
		return fmt.Sprintf("class(%d)", int(c))
	}
}

// DisposeFunc releases one tracked resource. It is called at most once.
type DisposeFunc func(ctx context.Context) error

// ErrDuplicateEffect is returned by Track for an ID already tracked in the scope.
var ErrDuplicateEffect = errors.New("effect already tracked")

// ErrScopeClosed is wrapped by the error Track returns after Dispose: the
// resource was disposed at once instead of being tracked.
var ErrScopeClosed = errors.New("scope already disposed")

// DisposeError is one failed dispose.
type DisposeError struct {
	// ID is the effect's ID.
	ID string
	// Class is the effect's class.
	Class Class
	// Err is what dispose returned (or the recovered panic).
	Err error
}

func (e *DisposeError) Error() string {
	return fmt.Sprintf("dispose %s effect %q: %v", e.Class, e.ID, e.Err)
}

func (e *DisposeError) Unwrap() error { return e.Err }

type effect struct {
	id      string
	class   Class
	dispose DisposeFunc
}

// EffectScope tracks the live resources of one generation. The zero value is
// not usable; use NewScope. Safe for concurrent use.
type EffectScope struct {
	name string

	mu       sync.Mutex
	effects  []effect
	ids      map[string]struct{}
	closed   bool
	disposed chan struct{}
	errs     error
}

// NewScope returns an empty scope; name appears in errors (for example the
// Generation's name).
func NewScope(name string) *EffectScope {
	return &EffectScope{name: name, ids: map[string]struct{}{}, disposed: make(chan struct{})}
}

// Name is the scope's name.
func (s *EffectScope) Name() string { return s.name }

// Track adds a resource to the scope. It refuses an ID already tracked (the
// resource is then not tracked, and the caller still owns it). After Dispose,
// Track disposes the resource at once and returns an error wrapping
// ErrScopeClosed (and the dispose error, if any): a resource created while a
// generation was being torn down never outlives it.
func (s *EffectScope) Track(ctx context.Context, id string, class Class, dispose DisposeFunc) error {
	return s.track(ctx, id, class, dispose, nil)
}

// track is Track; onClosed, when set, replaces the dispose run when the
// scope is already disposed.
func (s *EffectScope) track(ctx context.Context, id string, class Class, dispose DisposeFunc, onClosed func()) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if onClosed != nil {
			onClosed()
			return fmt.Errorf("track %q in %s: %w; cancelled at once", id, s.name, ErrScopeClosed)
		}
		err := fmt.Errorf("track %q in %s: %w; disposed at once", id, s.name, ErrScopeClosed)
		if derr := runDispose(ctx, effect{id, class, dispose}); derr != nil {
			err = errors.Join(err, derr)
		}
		return err
	}
	defer s.mu.Unlock()
	if _, dup := s.ids[id]; dup {
		return fmt.Errorf("track %q in %s: %w", id, s.name, ErrDuplicateEffect)
	}
	s.ids[id] = struct{}{}
	s.effects = append(s.effects, effect{id, class, dispose})
	return nil
}

// Release removes a tracked resource without disposing it, handing ownership
// back to the caller (for example a process that moves to the next scope).
// It reports whether the ID was tracked.
func (s *EffectScope) Release(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[id]; !ok || s.closed {
		return false
	}
	delete(s.ids, id)
	for i, e := range s.effects {
		if e.id == id {
			s.effects = append(s.effects[:i], s.effects[i+1:]...)
			break
		}
	}
	return true
}

// Resource is one tracked resource, as Resources lists it.
type Resource struct {
	// ID is the resource's ID in its scope ("process", "route",
	// "crash-watch", "stream gw-…").
	ID string
	// Class is the resource's class.
	Class Class
}

func (r Resource) String() string { return r.ID + " (" + r.Class.String() + ")" }

// Resources lists the resources tracked and not yet disposed, in tracking
// order (the reverse of the order Dispose releases them in): what a
// generation holds, for status and diagnosis.
func (s *EffectScope) Resources() []Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Resource, len(s.effects))
	for i, e := range s.effects {
		out[i] = Resource{ID: e.id, Class: e.class}
	}
	return out
}

// FormatResources is the resources of a scope on one line, for logs and
// messages: "process (reversible), route (reversible), …".
func FormatResources(rs []Resource) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}

// ErrDrainTimeout is wrapped by the DisposeError of cancelable work that
// had not ended when the dispose context's deadline (the drain deadline)
// passed: it was cancelled. A drain timeout is evidence for a receipt, not
// a cleanup failure.
var ErrDrainTimeout = errors.New("still running at the drain deadline: cancelled")

// CancelGrace bounds how long dispose waits for cancelable work to end
// once it was cancelled.
const CancelGrace = 5 * time.Second

// TrackWork tracks cancelable work that ends by itself (a stream, a run):
// dispose waits for done until the dispose context ends (the drain
// deadline), then calls cancel and waits for done at most CancelGrace. Work
// that had to be cancelled is reported as a DisposeError wrapping
// ErrDrainTimeout (ended, or not even after its cancellation), so the
// caller can record a drain_timeout receipt. Work started after the scope
// was disposed is cancelled at once, without waiting for it (the caller may
// be the work itself), and the error wraps ErrScopeClosed.
func (s *EffectScope) TrackWork(ctx context.Context, id string, cancel func(), done <-chan struct{}) error {
	return s.track(ctx, id, Cancelable, func(ctx context.Context) error {
		select {
		case <-done:
			return nil
		default:
		}
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			select {
			case <-done: // ended right at the deadline
				return nil
			default:
			}
		}
		cancel()
		t := time.NewTimer(CancelGrace)
		defer t.Stop()
		select {
		case <-done:
			return ErrDrainTimeout
		case <-t.C:
			return fmt.Errorf("%w; it did not end within %s of its cancellation", ErrDrainTimeout, CancelGrace)
		}
	}, cancel)
}

// SplitDisposeErrors separates what Dispose returned into the work cut off
// by the drain deadline (ErrDrainTimeout: receipts) and the cleanups that
// failed (cleanup_failed).
func SplitDisposeErrors(err error) (timeouts, failures []*DisposeError) {
	if err == nil {
		return nil, nil
	}
	var all []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		all = j.Unwrap()
	} else {
		all = []error{err}
	}
	for _, e := range all {
		var de *DisposeError
		if !errors.As(e, &de) {
			de = &DisposeError{ID: "?", Err: e}
		}
		if errors.Is(de.Err, ErrDrainTimeout) {
			timeouts = append(timeouts, de)
		} else {
			failures = append(failures, de)
		}
	}
	return timeouts, failures
}

// Len is the number of resources tracked and not yet disposed.
func (s *EffectScope) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.effects)
}

// Dispose disposes every tracked resource in reverse order of tracking, each
// exactly once. A failing or panicking dispose is recorded and the rest still
// run. The joined errors (each a *DisposeError) are returned; calling Dispose
// again, from any goroutine, waits for the first call and returns the same
// result.
func (s *EffectScope) Dispose(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.disposed
		return s.errs
	}
	s.closed = true
	effects := s.effects
	s.effects = nil
	s.mu.Unlock()

	var errs []error
	for i := len(effects) - 1; i >= 0; i-- {
		if err := runDispose(ctx, effects[i]); err != nil {
			errs = append(errs, err)
		}
	}
	s.errs = errors.Join(errs...)
	close(s.disposed)
	return s.errs
}

// Disposed is closed once Dispose has finished.
func (s *EffectScope) Disposed() <-chan struct{} { return s.disposed }

func runDispose(ctx context.Context, e effect) (err error) {
	if e.dispose == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = &DisposeError{ID: e.id, Class: e.class, Err: fmt.Errorf("panic: %v", r)}
		}
	}()
	if derr := e.dispose(ctx); derr != nil {
		return &DisposeError{ID: e.id, Class: e.class, Err: derr}
	}
	return nil
}
