package tracing

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// A call's spans are planned on its path and made after it is answered.
// Planning decides the sampling (with the installed sampler, as the SDK
// would) and draws the span's IDs: a few nanoseconds and no allocation, and
// the IDs are what a child and the wire need (the run's span context goes
// to a package runtime before the run). The spans are made (Maker.Make)
// within milliseconds, many calls' at once, by Later's goroutine: made on
// the call's path, a sampled call's three spans cost it ~35 µs on a 2-vCPU
// node (mostly allocation and cache misses), and made right after the
// answer, on the goroutine that answered, they still delayed it (the
// answering goroutine runs only after it).

// Planned is a span decided but not yet made.
type Planned struct {
	// SC is the span's context: sampled, with its trace and span IDs.
	// Invalid when the span is not traced.
	SC trace.SpanContext
	// Parent is its parent (invalid for a root).
	Parent trace.SpanContext
	// Start is when it started.
	Start time.Time
}

// Traced reports whether the span is to be made.
func (p Planned) Traced() bool { return p.SC.IsSampled() }

// PlanCall decides whether a call arriving at start below parent (invalid:
// the caller sent none) is traced, as the installed sampler says; a zero
// Planned when it is not or tracing is off.
func PlanCall(parent trace.SpanContext, name string, start time.Time) Planned {
	in := current.Load()
	if in == nil {
		return Planned{}
	}
	tid := parent.TraceID()
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	} else {
		tid = newTraceID()
	}
	res := in.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: ctx, TraceID: tid, Name: name, Kind: trace.SpanKindServer})
	if res.Decision != sdktrace.RecordAndSample {
		return Planned{}
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: newSpanID(), TraceFlags: parent.TraceFlags() | trace.FlagsSampled, TraceState: res.Tracestate})
	return Planned{SC: sc, Parent: parent, Start: start}
}

// PlanChild plans a span below parent, a planned (sampled) span; a zero
// Planned when parent is not sampled.
func PlanChild(parent trace.SpanContext, start time.Time) Planned {
	if !parent.IsSampled() {
		return Planned{}
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: parent.TraceID(), SpanID: newSpanID(), TraceFlags: parent.TraceFlags(), TraceState: parent.TraceState()})
	return Planned{SC: sc, Parent: parent, Start: start}
}

// Make makes the planned span with m's tracer, with the planned IDs and
// start, and returns it for its attributes and its End (at the time it
// ended).
func (m Maker) Make(p Planned, name string, opts ...trace.SpanStartOption) trace.Span {
	ctx := context.WithValue(context.Background(), presetKey{}, p.SC)
	if p.Parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, p.Parent)
	}
	_, span := m.tracer.Start(ctx, name, append(opts, trace.WithTimestamp(p.Start))...)
	return span
}

// Maker makes planned spans, with the tracer that was installed when they
// were handed to Later.
type Maker struct{ tracer trace.Tracer }

// laterDelay is how long planned spans wait to be made: long enough that
// one timer serves the calls of many milliseconds, short against the
// exporter's schedule (OTEL_BSP_SCHEDULE_DELAY, 5 s by default).
const laterDelay = 10 * time.Millisecond

// later holds the work of making planned spans until its timer fires.
var later struct {
	mu    sync.Mutex
	work  []func()
	armed bool
}

// Later hands fn the making of a call's planned spans, to be done within
// laterDelay on a goroutine of its own, never on the call's path. A call
// planned while tracing was on has its spans made even if tracing went
// off since (with the tracer installed last; a provider shut down drops
// them).
func Later(fn func(Maker)) {
	in := current.Load()
	if in == nil {
		if in = last.Load(); in == nil {
			return
		}
	}
	m := Maker{tracer: in.tracer}
	later.mu.Lock()
	later.work = append(later.work, func() { fn(m) })
	arm := !later.armed
	later.armed = true
	later.mu.Unlock()
	if arm {
		time.AfterFunc(laterDelay, Flush)
	}
}

// Flush makes every planned span handed to Later now (the exporter's
// flush and shutdown call it first).
func Flush() {
	later.mu.Lock()
	work := later.work
	later.work, later.armed = nil, false
	later.mu.Unlock()
	for _, fn := range work {
		fn()
	}
}

// presetKey carries the IDs of a planned span to IDGenerator.
type presetKey struct{}

// IDGenerator draws trace and span IDs, and gives a planned span
// (Planned.Make) the IDs it was planned with. The manager's tracer
// provider uses it (NewProvider); one that does not makes planned spans
// with IDs of its own, which breaks their children's parent links.
func IDGenerator() sdktrace.IDGenerator { return idGenerator{} }

type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if sc, ok := ctx.Value(presetKey{}).(trace.SpanContext); ok {
		return sc.TraceID(), sc.SpanID()
	}
	return newTraceID(), newSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if sc, ok := ctx.Value(presetKey{}).(trace.SpanContext); ok {
		return sc.SpanID()
	}
	return newSpanID()
}

// newTraceID and newSpanID draw random, non-zero IDs (math/rand/v2's
// generator is seeded from the OS and safe for concurrent use).
func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		hi, lo := rand.Uint64(), rand.Uint64()
		for i := range 8 {
			id[i], id[8+i] = byte(hi>>(8*i)), byte(lo>>(8*i))
		}
	}
	return id
}

func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		v := rand.Uint64()
		for i := range 8 {
			id[i] = byte(v >> (8 * i))
		}
	}
	return id
}

// IncomingParent is the caller's span context in a gRPC server's incoming
// metadata (traceparent, tracestate); invalid when it sent none, sent a
// malformed one, or tracing is off. It reads those two keys only, without
// copying the metadata.
func IncomingParent(ctx context.Context) trace.SpanContext {
	if !Enabled() {
		return trace.SpanContext{}
	}
	tp := metadata.ValueFromIncomingContext(ctx, "traceparent")
	if len(tp) == 0 {
		return trace.SpanContext{}
	}
	sc, ok := parseTraceparent(tp[0])
	if !ok {
		return trace.SpanContext{}
	}
	if ts := metadata.ValueFromIncomingContext(ctx, "tracestate"); len(ts) > 0 {
		if state, err := trace.ParseTraceState(ts[0]); err == nil {
			sc = sc.WithTraceState(state)
		}
	}
	return sc
}

// parseTraceparent parses a W3C traceparent of version 00 (or a later
// version's first four fields, as the recommendation says): 00-<32 hex
// trace ID>-<16 hex parent ID>-<2 hex flags>, lower case, neither ID all
// zeros.
func parseTraceparent(v string) (trace.SpanContext, bool) {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' || (len(v) > 55 && (v[0:2] == "00" || v[55] != '-')) || v[0:2] == "ff" {
		return trace.SpanContext{}, false
	}
	if !lowerHex(v[0:2]) || !lowerHex(v[3:35]) || !lowerHex(v[36:52]) || !lowerHex(v[53:55]) {
		return trace.SpanContext{}, false
	}
	tid, err := trace.TraceIDFromHex(v[3:35])
	if err != nil {
		return trace.SpanContext{}, false
	}
	sid, err := trace.SpanIDFromHex(v[36:52])
	if err != nil {
		return trace.SpanContext{}, false
	}
	flags := hexByte(v[53], v[54])
	if v[0:2] == "00" && flags > 3 {
		// Version 00 reserves every flag bit but sampled and random.
		return trace.SpanContext{}, false
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags) & (trace.FlagsSampled | trace.FlagsRandom), Remote: true}), true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// hexByte is the byte two lower-case hex digits spell.
func hexByte(hi, lo byte) byte {
	v := func(c byte) byte {
		if c <= '9' {
			return c - '0'
		}
		return c - 'a' + 10
	}
	return v(hi)<<4 | v(lo)
}
