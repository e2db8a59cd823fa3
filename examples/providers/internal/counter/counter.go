// Package counter is the logic of the example "counter" provider, shared by
// counter v1.0.0, counter v1.1.0, counter v2.0.0 and faulty (which behaves
// exactly like counter v2 when no fault fires).
//
// A counter keeps a count per key, a total and a bounded history of recent
// runs. A run's input is {"key":"a","add":1}; its terminal observation is
// {"implementation_version":"2.0.0","key":"a","count":N,"total":T}. For tests,
// an input may also ask for "progress" (that many non-terminal observations
// first), "pad" (that many bytes of padding in the terminal observation) and
// "sleep_ms" (a run that takes that long, ending early when cancelled).
//
// The two versions keep the same state (the module's state_schema contract
// does not change) in different layouts:
//
//	v1: {"counts":{"a":1},"history":[{"add":1,"key":"a"}],"total":1}
//	v2: {"keys":[{"count":1,"key":"a"}],"layout":2,"recent":[{"add":1,"count":1,"key":"a"}],"runs":1,"total":1}
//
// v2 migrates v1 state; each version migrates its own state to the next
// lineage; v1.0.0 refuses v2 state (it has no down-migration). v1.1.0 keeps
// the v1 layout and also reads v2's (a down-migration: the per-entry counts
// and the run count are dropped), so a revert from v2 to it keeps the
// counts.
package counter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/provider"
	"iteron.dev/operator/pkg/strictjson"
)

// HistoryLimit bounds the history kept in the state.
const HistoryLimit = 16

// Counter is a counter provider of one layout version (1 or 2).
type Counter struct {
	layout  int
	version string
	// reads are the layouts Migrate accepts.
	reads []int

	mu         sync.Mutex
	counts     map[string]int64
	history    []entry
	total      int64
	runs       int64
	generation uint64
}

type entry struct {
	Key   string
	Add   int64
	Count int64 // 0 when unknown (v1 history does not keep it)
}

// New returns a counter with state layout layout (1 or 2) that reports
// implementation version version in its observations.
func New(layout int, version string) *Counter {
	if layout != 1 && layout != 2 {
		panic(fmt.Sprintf("counter: unknown layout %d", layout))
	}
	reads := []int{1}
	if layout == 2 {
		reads = []int{1, 2}
	}
	return &Counter{layout: layout, version: version, reads: reads, counts: map[string]int64{}}
}

// NewWithDownMigration returns a counter with the v1 layout that also
// migrates v2 state down to it (counter v1.1.0).
func NewWithDownMigration(version string) *Counter {
	c := New(1, version)
	c.reads = []int{1, 2}
	return c
}

// Input is a run's input.
type Input struct {
	Key      string `json:"key"`
	Add      int64  `json:"add"`
	Progress int    `json:"progress,omitzero"`
	Pad      int    `json:"pad,omitzero"`
	SleepMs  int    `json:"sleep_ms,omitzero"`
}

// Load accepts any module: the counter is module-agnostic.
func (c *Counter) Load(ctx context.Context, load *provider.Load) error { return nil }

// Start counts one input.
func (c *Counter) Start(ctx context.Context, run *provider.Run) error {
	var in Input
	if err := strictjson.Decode(run.Input, &in, protocol.MaxPayloadBytes); err != nil {
		return run.EmitValue(map[string]string{"error": "input: " + err.Error()}, true)
	}
	if in.Key == "" || len(in.Key) > 64 {
		return run.EmitValue(map[string]string{"error": "input: key must be 1..64 bytes"}, true)
	}
	if in.Progress < 0 || in.Pad < 0 || in.SleepMs < 0 || in.Pad > protocol.MaxPayloadBytes {
		return run.EmitValue(map[string]string{"error": "input: progress, pad and sleep_ms must be >= 0"}, true)
	}
	for i := range in.Progress {
		if err := run.EmitValue(map[string]int{"progress": i}, false); err != nil {
			return err
		}
	}
	if in.SleepMs > 0 {
		select {
		case <-time.After(time.Duration(in.SleepMs) * time.Millisecond):
		case <-ctx.Done():
			return nil // cancelled (or past its deadline): nothing to report
		}
	}
	c.mu.Lock()
	c.counts[in.Key] += in.Add
	c.total += in.Add
	c.runs++
	count, total := c.counts[in.Key], c.total
	c.history = append(c.history, entry{Key: in.Key, Add: in.Add, Count: count})
	if len(c.history) > HistoryLimit {
		c.history = slices.Clone(c.history[len(c.history)-HistoryLimit:])
	}
	c.mu.Unlock()
	return run.Emit(observation(c.version, in.Key, count, total, in.Pad), true)
}

// observation writes the terminal observation by hand, so that "pad" makes
// its size exact.
func observation(version, key string, count, total int64, pad int) jsontext.Value {
	b := []byte(`{"implementation_version":`)
	b, _ = jsontext.AppendQuote(b, version)
	b = append(b, `,"key":`...)
	b, _ = jsontext.AppendQuote(b, key)
	b = fmt.Appendf(b, `,"count":%d,"total":%d`, count, total)
	if pad > 0 {
		b = append(b, `,"pad":"`...)
		b = append(b, strings.Repeat("x", pad)...)
		b = append(b, '"')
	}
	return append(b, '}')
}

// ObservationSize is the size of the terminal observation for key, count,
// total and pad, so that tests can aim at a limit exactly.
func ObservationSize(version, key string, count, total int64, pad int) int {
	return len(observation(version, key, count, total, pad))
}

// Cancel has nothing to release: a cancelled run changes nothing.
func (c *Counter) Cancel(ctx context.Context, runID, reason string) error { return nil }

type stateV1 struct {
	Counts  map[string]int64 `json:"counts"`
	History []entryV1        `json:"history"`
	Total   int64            `json:"total"`
}

type entryV1 struct {
	Add int64  `json:"add"`
	Key string `json:"key"`
}

type stateV2 struct {
	Keys   []keyCount `json:"keys"`
	Layout int        `json:"layout"`
	Recent []entryV2  `json:"recent"`
	Runs   int64      `json:"runs"`
	Total  int64      `json:"total"`
}

type keyCount struct {
	Count int64  `json:"count"`
	Key   string `json:"key"`
}

type entryV2 struct {
	Add   int64  `json:"add"`
	Count int64  `json:"count"`
	Key   string `json:"key"`
}

func (c *Counter) encodeLocked() (jsontext.Value, error) {
	if c.layout == 1 {
		s := stateV1{Counts: c.counts, History: []entryV1{}, Total: c.total}
		for _, e := range c.history {
			s.History = append(s.History, entryV1{Add: e.Add, Key: e.Key})
		}
		return json.Marshal(s, json.Deterministic(true))
	}
	s := stateV2{Keys: []keyCount{}, Layout: 2, Recent: []entryV2{}, Runs: c.runs, Total: c.total}
	for _, k := range slices.Sorted(mapsKeys(c.counts)) {
		s.Keys = append(s.Keys, keyCount{Count: c.counts[k], Key: k})
	}
	for _, e := range c.history {
		s.Recent = append(s.Recent, entryV2{Add: e.Add, Count: e.Count, Key: e.Key})
	}
	return json.Marshal(s, json.Deterministic(true))
}

func mapsKeys(m map[string]int64) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Snapshot returns the state in this version's layout.
func (c *Counter) Snapshot(ctx context.Context, lineage provider.Lineage) (jsontext.Value, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generation == 0 {
		c.generation = lineage.Generation
	}
	return c.encodeLocked()
}

// decoded is a state in either layout, converted to the counter's fields.
type decoded struct {
	counts  map[string]int64
	history []entry
	total   int64
	runs    int64
}

// decodeState parses a state of either layout; accept says which layouts
// the caller takes.
func decodeState(raw jsontext.Value, accept ...int) (decoded, error) {
	layout := 1
	if strings.Contains(string(raw), `"layout"`) {
		layout = 2
	}
	if !slices.Contains(accept, layout) {
		return decoded{}, provider.Failf("unsupported_layout", "state layout %d cannot be read by this version (accepts %v)", layout, accept)
	}
	d := decoded{counts: map[string]int64{}}
	if layout == 1 {
		var s stateV1
		if err := strictjson.Decode(raw, &s, protocol.MaxStateBytes); err != nil {
			return d, provider.Failf("invalid_state", "v1 state: %v", err)
		}
		for k, v := range s.Counts {
			d.counts[k] = v
		}
		for _, e := range s.History {
			d.history = append(d.history, entry{Key: e.Key, Add: e.Add, Count: 0})
		}
		d.total = s.Total
		d.runs = int64(len(s.History))
		return d, nil
	}
	var s stateV2
	if err := strictjson.Decode(raw, &s, protocol.MaxStateBytes); err != nil {
		return d, provider.Failf("invalid_state", "v2 state: %v", err)
	}
	if s.Layout != 2 {
		return d, provider.Failf("invalid_state", "layout %d, want 2", s.Layout)
	}
	for _, k := range s.Keys {
		d.counts[k.Key] = k.Count
	}
	for _, e := range s.Recent {
		d.history = append(d.history, entry{Key: e.Key, Add: e.Add, Count: e.Count})
	}
	d.total, d.runs = s.Total, s.Runs
	return d, nil
}

// Migrate converts source into this version's layout at target. v2 and
// v1.1 read both layouts; v1.0 reads only its own.
func (c *Counter) Migrate(ctx context.Context, source *protocol.State, target provider.Lineage) (jsontext.Value, error) {
	d, err := decodeState(source.State, c.reads...)
	if err != nil {
		return nil, err
	}
	if c.layout == 2 {
		// v1 history has no per-entry count: rebuild it by replaying the
		// history against the counts it ended with.
		running := map[string]int64{}
		for k, v := range d.counts {
			running[k] = v
		}
		for i := len(d.history) - 1; i >= 0; i-- {
			if d.history[i].Count == 0 {
				d.history[i].Count = running[d.history[i].Key]
			}
			running[d.history[i].Key] -= d.history[i].Add
		}
	}
	tmp := &Counter{layout: c.layout, counts: d.counts, history: d.history, total: d.total, runs: d.runs}
	return tmp.encodeLocked()
}

// Restore installs state, which must be in this version's layout.
func (c *Counter) Restore(ctx context.Context, state *protocol.State) error {
	d, err := decodeState(state.State, c.layout)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts, c.history, c.total, c.runs, c.generation = d.counts, d.history, d.total, d.runs, state.Generation
	return nil
}

// Readiness proves the counter holds exactly the state with stateSHA256.
func (c *Counter) Readiness(ctx context.Context, lineage provider.Lineage, stateSHA256 string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generation != 0 && c.generation != lineage.Generation {
		return provider.Failf("wrong_generation", "holding lineage %d, asked about %d", c.generation, lineage.Generation)
	}
	raw, err := c.encodeLocked()
	if err != nil {
		return err
	}
	digest, err := protocol.StateDigest(raw)
	if err != nil {
		return err
	}
	if digest != stateSHA256 {
		return provider.Failf("state_mismatch", "holding %s, asked about %s", digest, stateSHA256)
	}
	return nil
}

// Main serves a counter of layout on stdio and exits; the counter binaries'
// main functions are this one call.
func Main(layout int, version string) int {
	return serve(New(layout, version))
}

// MainWithDownMigration serves counter v1.1.0 (NewWithDownMigration).
func MainWithDownMigration(version string) int {
	return serve(NewWithDownMigration(version))
}

func serve(c *Counter) int {
	version := c.version
	if err := provider.Serve(context.Background(), stdin, stdout, c); err != nil {
		fmt.Fprintf(stderr, "counter %s: %v\n", version, err)
		return 1
	}
	return 0
}
