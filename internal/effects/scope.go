// Package effects tracks the live resources of a generation and the receipts
// of effects that cannot simply be undone (DESIGN §8).
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
	"sync"
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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
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
