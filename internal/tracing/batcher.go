package tracing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTEL_BSP_* defaults of the OpenTelemetry specification.
const (
	DefaultScheduleDelay  = 5 * time.Second
	DefaultExportTimeout  = 30 * time.Second
	DefaultMaxQueueSize   = 2048
	DefaultMaxExportBatch = 512
)

// BatchSettings tune the batcher (OTEL_BSP_SCHEDULE_DELAY,
// OTEL_BSP_EXPORT_TIMEOUT in milliseconds, OTEL_BSP_MAX_QUEUE_SIZE,
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE).
type BatchSettings struct {
	ScheduleDelay  time.Duration
	ExportTimeout  time.Duration
	MaxQueueSize   int
	MaxExportBatch int
}

// readBatchSettings reads the OTEL_BSP_* variables; an unusable value is an
// error naming it.
func readBatchSettings(env func(string) string) (BatchSettings, error) {
	s := BatchSettings{DefaultScheduleDelay, DefaultExportTimeout, DefaultMaxQueueSize, DefaultMaxExportBatch}
	for _, v := range []struct {
		key string
		set func(n int)
	}{
		{"OTEL_BSP_SCHEDULE_DELAY", func(n int) { s.ScheduleDelay = time.Duration(n) * time.Millisecond }},
		{"OTEL_BSP_EXPORT_TIMEOUT", func(n int) { s.ExportTimeout = time.Duration(n) * time.Millisecond }},
		{"OTEL_BSP_MAX_QUEUE_SIZE", func(n int) { s.MaxQueueSize = n }},
		{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", func(n int) { s.MaxExportBatch = n }},
	} {
		raw := strings.TrimSpace(env(v.key))
		if raw == "" {
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n <= 0 {
			return BatchSettings{}, fmt.Errorf("%s=%q: want a positive integer", v.key, raw)
		}
		v.set(n)
	}
	s.MaxExportBatch = min(s.MaxExportBatch, s.MaxQueueSize)
	return s, nil
}

// batcher is the span processor of the manager: it batches ended, sampled
// spans and exports them from one goroutine every ScheduleDelay, or as soon
// as a batch is full. Unlike the SDK's batch span processor, which hands
// every span to its goroutine through a channel (a goroutine wake-up per
// span, three or four per traced call), ending a span here only appends it
// to a slice under a mutex: the exporter is woken once per batch. A full
// queue drops the span and counts it (Dropped).
type batcher struct {
	exp sdktrace.SpanExporter
	set BatchSettings

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	stopped bool
	dropped atomic.Uint64

	full    chan struct{} // a batch is ready (capacity 1)
	flushes chan chan error
	stop    chan struct{}
	done    chan struct{}
}

// NewBatcher returns a span processor exporting to exp as set says.
func NewBatcher(exp sdktrace.SpanExporter, set BatchSettings) sdktrace.SpanProcessor {
	b := &batcher{exp: exp, set: set, queue: make([]sdktrace.ReadOnlySpan, 0, set.MaxExportBatch),
		full: make(chan struct{}, 1), flushes: make(chan chan error), stop: make(chan struct{}), done: make(chan struct{})}
	go b.loop()
	return b
}

// OnStart does nothing: only ended spans are exported.
func (b *batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues a sampled span for export.
func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	b.mu.Lock()
	if b.stopped || len(b.queue) >= b.set.MaxQueueSize {
		b.mu.Unlock()
		b.dropped.Add(1)
		return
	}
	b.queue = append(b.queue, s)
	ready := len(b.queue) == b.set.MaxExportBatch
	b.mu.Unlock()
	if ready {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

// Dropped is how many spans a full queue dropped.
func (b *batcher) Dropped() uint64 { return b.dropped.Load() }

func (b *batcher) loop() {
	defer close(b.done)
	tick := time.NewTicker(b.set.ScheduleDelay)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			b.export() //nolint:errcheck // the next batch tries again; an exporter logs its own errors
		case <-b.full:
			b.export() //nolint:errcheck // as above
		case reply := <-b.flushes:
			reply <- b.export()
		case <-b.stop:
			b.export() //nolint:errcheck // shutting down: what cannot be sent is lost
			return
		}
	}
}

// export sends everything queued, a batch at a time.
func (b *batcher) export() error {
	b.mu.Lock()
	spans := b.queue
	b.queue = make([]sdktrace.ReadOnlySpan, 0, b.set.MaxExportBatch)
	b.mu.Unlock()
	var errs []error
	for len(spans) > 0 {
		n := min(len(spans), b.set.MaxExportBatch)
		ctx, cancel := context.WithTimeout(context.Background(), b.set.ExportTimeout)
		if err := b.exp.ExportSpans(ctx, spans[:n]); err != nil {
			errs = append(errs, err)
		}
		cancel()
		spans = spans[n:]
	}
	return errors.Join(errs...)
}

// ForceFlush exports everything queued now.
func (b *batcher) ForceFlush(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case b.flushes <- reply:
	case <-b.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued and stops the exporter; spans ended
// after it are dropped.
func (b *batcher) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	already := b.stopped
	b.stopped = true
	b.mu.Unlock()
	if already {
		return nil
	}
	close(b.stop)
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.exp.Shutdown(ctx)
}
