package effects

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Retention bounds of the receipt store (docs/reference/receipts.md).
const (
	// MaxReceiptGenerations is the number of generations whose receipts are kept.
	MaxReceiptGenerations = 32
	// MaxReceiptsPerGeneration is the number of receipts kept per generation.
	MaxReceiptsPerGeneration = 256
)

// ReceiptKind says why a receipt was written.
type ReceiptKind string

const (
	// ReceiptRun records a run of a provider whose effects are irreversible
	// or compensatable.
	ReceiptRun ReceiptKind = "run"
	// ReceiptQuiesceCancel records a run cancelled because quiesce timed out.
	ReceiptQuiesceCancel ReceiptKind = "quiesce_cancel"
	// ReceiptDrainTimeout records an old process killed because it would not
	// stop within its cancellation deadline.
	ReceiptDrainTimeout ReceiptKind = "drain_timeout"
)

// Compensation is what became of an effect after the fact.
type Compensation string

const (
	// CompensationNone: nothing was attempted (the effect stands).
	CompensationNone Compensation = "none"
	// CompensationPending: compensation is needed and not yet done.
	CompensationPending Compensation = "pending"
	// CompensationDone: a compensating action ran.
	CompensationDone Compensation = "compensated"
	// CompensationRolledBack: the effect was undone. Never for Irreversible.
	CompensationRolledBack Compensation = "rolled_back"
)

// Receipt is evidence of one effect.
type Receipt struct {
	// ID is unique within its generation (for example a run or invocation ID).
	ID string
	// Owner is the activation (namespace/name).
	Owner string
	// Generation is the Generation object's name.
	Generation string
	// Component is the module.
	Component string
	// Kind says why the receipt was written.
	Kind ReceiptKind
	// Class is the effect's class.
	Class Class
	// StartedAt and FinishedAt bound the effect.
	StartedAt, FinishedAt time.Time
	// Compensation is what became of the effect.
	Compensation Compensation
	// Detail is a short free-form explanation.
	Detail string
}

// ErrIrreversible is returned when asked to mark an irreversible effect as
// rolled back: that claim is never made.
var ErrIrreversible = errors.New("an irreversible effect is never rolled back")

// ErrDuplicateReceipt is returned for a receipt ID already recorded in its generation.
var ErrDuplicateReceipt = errors.New("receipt already recorded")

// ErrNoReceipt is returned when a receipt is not (or no longer) in the store.
var ErrNoReceipt = errors.New("no such receipt")

// ReceiptSummary counts a generation's receipts for status.
type ReceiptSummary struct {
	// Total receipts kept.
	Total int
	// Irreversible receipts kept.
	Irreversible int
	// Truncated is true when receipts of this generation were evicted or
	// lost: the recovery evidence is incomplete and no clean rollback may be
	// claimed.
	Truncated bool
	// IncompleteReason says why the evidence is incomplete ("" when it is
	// complete, or when it was only evicted).
	IncompleteReason string
	// ReversibleRuns counts the generation's runs whose effects are
	// reversible: counted, never recorded one by one.
	ReversibleRuns int64
	// Component is the generation's module, once a receipt or a count
	// named it.
	Component string
}

type generationReceipts struct {
	receipts  []Receipt
	truncated bool
	// incomplete says why receipts were lost, when they were.
	incomplete string
	// reversible counts reversible runs.
	reversible int64
	// component is the generation's module.
	component string
}

// ReceiptStore keeps receipts for at most MaxReceiptGenerations generations
// and MaxReceiptsPerGeneration receipts each, evicting the oldest. A store
// from NewReceiptStore lives in memory only; one from OpenReceiptStore keeps
// its receipts in a file across manager restarts (receiptlog.go). Safe for
// concurrent use.
type ReceiptStore struct {
	// file, when set, receives every change as a line.
	file *receiptFile
	// clean is false when the file loaded had not been closed cleanly.
	clean       bool
	lastDurable time.Time

	mu    sync.Mutex
	order []string // generations, oldest first
	gens  map[string]*generationReceipts
	// evicted remembers (boundedly) generations evicted whole, so a late
	// receipt or a summary still says the evidence is incomplete.
	evicted      map[string]bool
	evictedOrder []string
}

// maxRememberedEvictions bounds the memory of evicted generation names.
const maxRememberedEvictions = 1024

func (s *ReceiptStore) rememberEvicted(generation string) {
	if s.evicted[generation] {
		return
	}
	if len(s.evictedOrder) == maxRememberedEvictions {
		delete(s.evicted, s.evictedOrder[0])
		s.evictedOrder = s.evictedOrder[1:]
	}
	s.evicted[generation] = true
	s.evictedOrder = append(s.evictedOrder, generation)
}

// NewReceiptStore returns an empty store.
func NewReceiptStore() *ReceiptStore {
	return &ReceiptStore{gens: map[string]*generationReceipts{}, evicted: map[string]bool{}}
}

// Record stores a receipt. Compensation defaults to none. When the
// generation already holds MaxReceiptsPerGeneration receipts the oldest is
// evicted and the generation marked truncated; when a new generation would
// exceed MaxReceiptGenerations the oldest generation is evicted whole.
func (s *ReceiptStore) Record(r Receipt) error {
	if r.ID == "" || r.Generation == "" {
		return fmt.Errorf("receipt needs an ID and a generation: %+v", r)
	}
	if r.Class == Irreversible && r.Compensation == CompensationRolledBack {
		return fmt.Errorf("receipt %q: %w", r.ID, ErrIrreversible)
	}
	if r.Compensation == "" {
		r.Compensation = CompensationNone
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.recordLocked(r); err != nil {
		return err
	}
	s.writeLocked(receiptToLine(r))
	return nil
}

// genLocked returns (creating, evicting the oldest beyond the bound) a
// generation's receipts.
func (s *ReceiptStore) genLocked(generation string) *generationReceipts {
	g, ok := s.gens[generation]
	if !ok {
		if len(s.order) == MaxReceiptGenerations {
			oldest := s.order[0]
			s.order = s.order[1:]
			delete(s.gens, oldest)
			s.rememberEvicted(oldest)
		}
		g = &generationReceipts{truncated: s.evicted[generation]}
		s.gens[generation] = g
		s.order = append(s.order, generation)
	}
	return g
}

// recordLocked stores a valid receipt in memory.
func (s *ReceiptStore) recordLocked(r Receipt) error {
	if r.Class == Irreversible && r.Compensation == CompensationRolledBack {
		return fmt.Errorf("receipt %q: %w", r.ID, ErrIrreversible)
	}
	g := s.genLocked(r.Generation)
	if g.component == "" {
		g.component = r.Component
	}
	if slices.ContainsFunc(g.receipts, func(x Receipt) bool { return x.ID == r.ID }) {
		return fmt.Errorf("receipt %q of %s: %w", r.ID, r.Generation, ErrDuplicateReceipt)
	}
	if len(g.receipts) == MaxReceiptsPerGeneration {
		g.receipts = g.receipts[1:]
		g.truncated = true
	}
	g.receipts = append(g.receipts, r)
	return nil
}

// SetCompensation records what became of an effect. Marking an irreversible
// effect rolled back fails with ErrIrreversible and changes nothing.
func (s *ReceiptStore) SetCompensation(generation, id string, c Compensation) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.setCompensationLocked(generation, id, c); err != nil {
		return err
	}
	s.writeLocked(receiptLine{Type: lineCompensation, Generation: generation, ID: id, Compensation: string(c)})
	return nil
}

func (s *ReceiptStore) setCompensationLocked(generation, id string, c Compensation) error {
	g, ok := s.gens[generation]
	if !ok {
		return fmt.Errorf("receipt %q of %s: %w", id, generation, ErrNoReceipt)
	}
	for i := range g.receipts {
		if g.receipts[i].ID != id {
			continue
		}
		if c == CompensationRolledBack && g.receipts[i].Class == Irreversible {
			return fmt.Errorf("receipt %q of %s: %w", id, generation, ErrIrreversible)
		}
		g.receipts[i].Compensation = c
		return nil
	}
	return fmt.Errorf("receipt %q of %s: %w", id, generation, ErrNoReceipt)
}

// Receipts returns a copy of a generation's receipts, oldest first.
func (s *ReceiptStore) Receipts(generation string) []Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.gens[generation]; ok {
		return slices.Clone(g.receipts)
	}
	return nil
}

// Summary counts a generation's receipts. A generation evicted whole reports
// Truncated with no receipts.
func (s *ReceiptStore) Summary(generation string) ReceiptSummary {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.gens[generation]
	if !ok {
		return ReceiptSummary{Truncated: s.evicted[generation]}
	}
	sum := ReceiptSummary{Total: len(g.receipts), Truncated: g.truncated, IncompleteReason: g.incomplete, ReversibleRuns: g.reversible, Component: g.component}
	for _, r := range g.receipts {
		if r.Class == Irreversible {
			sum.Irreversible++
		}
	}
	return sum
}

// MarkIncomplete records that a generation's evidence is incomplete and
// why (for example after a manager restart lost the in-memory receipts):
// its summary then says so, however many receipts follow.
func (s *ReceiptStore) MarkIncomplete(generation, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.markIncompleteLocked(generation, why)
	s.writeLocked(receiptLine{Type: lineIncomplete, Generation: generation, Reason: why})
}

func (s *ReceiptStore) markIncompleteLocked(generation, why string) {
	g := s.genLocked(generation)
	g.truncated, g.incomplete = true, why
}

// CountReversible counts one reversible run of a generation of component.
// It writes nothing: the count reaches the file at the next Sync.
func (s *ReceiptStore) CountReversible(generation, component string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.genLocked(generation)
	g.reversible++
	if g.component == "" {
		g.component = component
	}
}
