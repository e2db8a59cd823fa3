package effects

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a dispose log shared by the effects of one test.
type recorder struct {
	mu    sync.Mutex
	order []string
}

func (r *recorder) dispose(id string, err error) DisposeFunc {
	return func(context.Context) error {
		r.mu.Lock()
		r.order = append(r.order, id)
		r.mu.Unlock()
		return err
	}
}

func (r *recorder) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

func TestDisposeRunsInReverseOrderExactlyOnce(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	s := NewScope("gen-1")
	for _, id := range []string{"process", "route", "watch"} {
		if err := s.Track(ctx, id, Reversible, rec.dispose(id, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Dispose(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Dispose(ctx); err != nil {
		t.Fatalf("second dispose: %v", err)
	}
	if got, want := rec.log(), []string{"watch", "route", "process"}; !slices.Equal(got, want) {
		t.Fatalf("dispose order %v, want %v (reverse, once each)", got, want)
	}
	if s.Len() != 0 {
		t.Fatalf("Len after dispose = %d", s.Len())
	}
}

func TestConcurrentDisposeCallsShareOneRun(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	s := NewScope("gen-1")
	_ = s.Track(ctx, "a", Cancelable, rec.dispose("a", errors.New("boom")))
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Dispose(ctx) }()
	}
	wg.Wait()
	if got := rec.log(); len(got) != 1 {
		t.Fatalf("dispose ran %d times, want 1", len(got))
	}
	for i, err := range errs {
		if err == nil || err.Error() != errs[0].Error() {
			t.Fatalf("caller %d got %v, want the shared result %v", i, err, errs[0])
		}
	}
}

func TestAMidActivationFailureDisposesWhatWasTracked(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	activate := func(s *EffectScope) error {
		if err := s.Track(ctx, "shadow-process", Reversible, rec.dispose("shadow-process", nil)); err != nil {
			return err
		}
		if err := s.Track(ctx, "stderr-drain", Cancelable, rec.dispose("stderr-drain", nil)); err != nil {
			return err
		}
		return errors.New("load failed")
	}
	s := NewScope("gen-2")
	if err := activate(s); err == nil {
		t.Fatal("activation unexpectedly succeeded")
	}
	_ = s.Dispose(ctx)
	if got, want := rec.log(), []string{"stderr-drain", "shadow-process"}; !slices.Equal(got, want) {
		t.Fatalf("disposed %v, want %v", got, want)
	}
}

func TestCleanupErrorsAreCollectedAndNeverSkipTheRest(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	s := NewScope("gen-3")
	_ = s.Track(ctx, "first", Reversible, rec.dispose("first", errors.New("first failed")))
	_ = s.Track(ctx, "panics", Reversible, func(context.Context) error { panic("bad dispose") })
	_ = s.Track(ctx, "last", Compensatable, rec.dispose("last", errors.New("last failed")))
	err := s.Dispose(ctx)
	if got, want := rec.log(), []string{"last", "first"}; !slices.Equal(got, want) {
		t.Fatalf("disposed %v, want %v", got, want)
	}
	var ids []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var de *DisposeError
		if !errors.As(e, &de) {
			t.Fatalf("error %v is not a *DisposeError", e)
		}
		ids = append(ids, de.ID)
	}
	if want := []string{"last", "panics", "first"}; !slices.Equal(ids, want) {
		t.Fatalf("errors for %v, want %v", ids, want)
	}
}

func TestTrackingAfterCloseDisposesAtOnce(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	s := NewScope("gen-4")
	_ = s.Dispose(ctx)
	err := s.Track(ctx, "late-goroutine", Cancelable, rec.dispose("late-goroutine", nil))
	if !errors.Is(err, ErrScopeClosed) {
		t.Fatalf("Track after Dispose: %v, want ErrScopeClosed", err)
	}
	if got := rec.log(); !slices.Equal(got, []string{"late-goroutine"}) {
		t.Fatalf("late resource disposed %v, want at once", got)
	}
}

func TestADuplicateIDIsRefused(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	s := NewScope("gen-5")
	_ = s.Track(ctx, "process", Reversible, rec.dispose("process-1", nil))
	if err := s.Track(ctx, "process", Reversible, rec.dispose("process-2", nil)); !errors.Is(err, ErrDuplicateEffect) {
		t.Fatalf("duplicate Track: %v, want ErrDuplicateEffect", err)
	}
	_ = s.Dispose(ctx)
	if got := rec.log(); !slices.Equal(got, []string{"process-1"}) {
		t.Fatalf("disposed %v: the refused duplicate must stay the caller's", got)
	}
}

func TestReleaseHandsOwnershipBack(t *testing.T) {
	ctx := context.Background()
	var rec recorder
	s := NewScope("gen-6")
	_ = s.Track(ctx, "process", Reversible, rec.dispose("process", nil))
	if !s.Release("process") || s.Release("process") {
		t.Fatal("Release should succeed once")
	}
	_ = s.Dispose(ctx)
	if got := rec.log(); len(got) != 0 {
		t.Fatalf("released resource was disposed: %v", got)
	}
}

func TestAnIrreversibleReceiptIsNeverReportedRolledBack(t *testing.T) {
	store := NewReceiptStore()
	if err := store.Record(Receipt{ID: "run-1", Generation: "g1", Class: Irreversible, Compensation: CompensationRolledBack}); !errors.Is(err, ErrIrreversible) {
		t.Fatalf("Record rolled-back irreversible: %v, want ErrIrreversible", err)
	}
	if err := store.Record(Receipt{ID: "run-1", Generation: "g1", Class: Irreversible, Kind: ReceiptRun}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetCompensation("g1", "run-1", CompensationRolledBack); !errors.Is(err, ErrIrreversible) {
		t.Fatalf("SetCompensation rolled back: %v, want ErrIrreversible", err)
	}
	if got := store.Receipts("g1")[0].Compensation; got != CompensationNone {
		t.Fatalf("compensation = %s after a refused rollback claim, want none", got)
	}
	if err := store.SetCompensation("g1", "run-1", CompensationDone); err != nil {
		t.Fatalf("a compensating action may be recorded: %v", err)
	}
	if sum := store.Summary("g1"); sum.Total != 1 || sum.Irreversible != 1 || sum.Truncated {
		t.Fatalf("summary %+v", sum)
	}
}

func TestADuplicateReceiptIsRefused(t *testing.T) {
	store := NewReceiptStore()
	r := Receipt{ID: "inv-7", Generation: "g1", Class: Compensatable}
	if err := store.Record(r); err != nil {
		t.Fatal(err)
	}
	if err := store.Record(r); !errors.Is(err, ErrDuplicateReceipt) {
		t.Fatalf("duplicate receipt: %v, want ErrDuplicateReceipt", err)
	}
}

func TestRetentionIsBoundedAndEvictionMarksEvidenceIncomplete(t *testing.T) {
	store := NewReceiptStore()
	for i := range MaxReceiptsPerGeneration + 1 {
		if err := store.Record(Receipt{ID: fmt.Sprint("r", i), Generation: "g0", Class: Compensatable}); err != nil {
			t.Fatal(err)
		}
	}
	sum := store.Summary("g0")
	if sum.Total != MaxReceiptsPerGeneration || !sum.Truncated {
		t.Fatalf("after %d receipts: %+v, want %d kept and truncated", MaxReceiptsPerGeneration+1, sum, MaxReceiptsPerGeneration)
	}
	if first := store.Receipts("g0")[0].ID; first != "r1" {
		t.Fatalf("oldest kept receipt %s, want r1 (r0 evicted)", first)
	}
	for i := 1; i <= MaxReceiptGenerations; i++ {
		_ = store.Record(Receipt{ID: "r", Generation: fmt.Sprint("g", i), Class: Irreversible})
	}
	if got := store.Receipts("g0"); got != nil {
		t.Fatalf("generation g0 still holds %d receipts after %d newer generations", len(got), MaxReceiptGenerations)
	}
	if sum := store.Summary("g0"); !sum.Truncated || sum.Total != 0 {
		t.Fatalf("evicted generation summary %+v, want truncated", sum)
	}
	if sum := store.Summary("g1"); sum.Truncated || sum.Total != 1 {
		t.Fatalf("kept generation summary %+v", sum)
	}
	store.MarkIncomplete("g1", "the manager restarted")
	if sum := store.Summary("g1"); !sum.Truncated || sum.IncompleteReason != "the manager restarted" || sum.Total != 1 {
		t.Fatalf("MarkIncomplete: summary %+v, want truncated with the reason and the receipt kept", sum)
	}
	store.MarkIncomplete("g-new", "the manager restarted")
	if err := store.Record(Receipt{ID: "r", Generation: "g-new", Class: Cancelable}); err != nil {
		t.Fatal(err)
	}
	if sum := store.Summary("g-new"); !sum.Truncated || sum.Total != 1 || sum.IncompleteReason == "" {
		t.Fatalf("a receipt recorded after MarkIncomplete must not make the evidence look complete: %+v", sum)
	}
}

func TestResourcesListWhatIsTrackedInRegistrationOrder(t *testing.T) {
	ctx := context.Background()
	s := NewScope("gen-1")
	_ = s.Track(ctx, "process", Reversible, nil)
	_ = s.Track(ctx, "route", Reversible, nil)
	_ = s.TrackWork(ctx, "stream run-1", func() {}, make(chan struct{}))
	got := FormatResources(s.Resources())
	if want := "process (reversible), route (reversible), stream run-1 (cancelable)"; got != want {
		t.Fatalf("resources %q, want %q", got, want)
	}
	s.Release("route")
	if got := FormatResources(s.Resources()); got != "process (reversible), stream run-1 (cancelable)" {
		t.Fatalf("after releasing the route: %q", got)
	}
}

func TestDisposeWaitsForWorkThatEndsWithinTheDeadline(t *testing.T) {
	s := NewScope("gen-1")
	done := make(chan struct{})
	cancelled := false
	_ = s.TrackWork(context.Background(), "stream", func() { cancelled = true }, done)
	go func() { time.Sleep(20 * time.Millisecond); close(done) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Dispose(ctx); err != nil || cancelled {
		t.Fatalf("dispose: %v (cancelled %v); want the work waited for, not cancelled", err, cancelled)
	}
}

func TestWorkPastTheDrainDeadlineIsCancelledAndReportedAsATimeoutNotAFailure(t *testing.T) {
	var rec recorder
	s := NewScope("gen-1")
	_ = s.Track(context.Background(), "process", Reversible, rec.dispose("process", nil))
	_ = s.Track(context.Background(), "socket", Reversible, rec.dispose("socket", errors.New("EIO")))
	stuck := make(chan struct{})
	_ = s.TrackWork(context.Background(), "stream stuck", func() { close(stuck) }, stuck)
	never := make(chan struct{})
	_ = s.TrackWork(context.Background(), "stream deaf", func() {}, never)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Dispose(ctx)
	timeouts, failures := SplitDisposeErrors(err)
	ids := func(des []*DisposeError) []string {
		var out []string
		for _, d := range des {
			out = append(out, d.ID)
		}
		return out
	}
	if got := ids(timeouts); !slices.Equal(got, []string{"stream deaf", "stream stuck"}) {
		t.Fatalf("timeouts %v", got)
	}
	if got := ids(failures); !slices.Equal(got, []string{"socket"}) {
		t.Fatalf("failures %v", got)
	}
	if !strings.Contains(timeouts[0].Error(), "did not end within") {
		t.Fatalf("the work that ignored its cancellation: %v", timeouts[0])
	}
	if got := rec.log(); !slices.Equal(got, []string{"socket", "process"}) {
		t.Fatalf("disposed %v after the timeouts; want the rest still disposed", got)
	}
	if d := time.Since(start); d > CancelGrace+5*time.Second {
		t.Fatalf("dispose took %s", d)
	}
}

func TestWorkTrackedAfterDisposeIsCancelledWithoutWaiting(t *testing.T) {
	s := NewScope("gen-1")
	_ = s.Dispose(context.Background())
	cancelled := false
	err := s.TrackWork(context.Background(), "stream late", func() { cancelled = true }, make(chan struct{}))
	if !errors.Is(err, ErrScopeClosed) || !cancelled {
		t.Fatalf("TrackWork on a disposed scope: %v (cancelled %v)", err, cancelled)
	}
}
