package effects

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"iteron.dev/operator/internal/statedir"
)

// The receipts file keeps a store's receipts across manager restarts
// (docs/reference/receipts.md): one JSON object per line, appended as each
// receipt is recorded (no fsync per receipt), made durable by Sync (a "sync"
// line, then fsync) at each checkpoint, and closed by Close (a "closed"
// line, then fsync) when the manager stops. Loading replays the lines
// through the same bounds, so evictions come out as they were; a file whose
// last line is not "closed" was not stopped cleanly — its tail after the last
// durable sync may be lost — and every generation in it is marked
// incomplete.

// ReceiptsFormat is the format name in a receipts file's first line.
const ReceiptsFormat = "iteron-receipts/1"

// maxReceiptLineBytes bounds one line of a receipts file.
const maxReceiptLineBytes = 16 << 10

// maxDetailBytes bounds a receipt's detail as written.
const maxDetailBytes = 1024

// compactAfterLines is how many lines a file may grow to before it is
// rewritten from memory (at the next append or sync): about twice what the
// bounds retain.
const compactAfterLines = 2*MaxReceiptGenerations*MaxReceiptsPerGeneration + 1024

// Line types of a receipts file.
const (
	lineOpen         = "open"
	lineReceipt      = "receipt"
	lineCompensation = "compensation"
	lineIncomplete   = "incomplete"
	lineEvicted      = "evicted"
	lineReversible   = "reversible"
	lineSync         = "sync"
	lineClosed       = "closed"
)

// receiptLine is one line of a receipts file.
type receiptLine struct {
	Type       string `json:"type"`
	Format     string `json:"format,omitempty"`
	AtUnixMs   int64  `json:"at_unix_ms,omitempty"`
	ID         string `json:"id,omitempty"`
	Owner      string `json:"owner,omitempty"`
	Generation string `json:"generation,omitempty"`
	Component  string `json:"component,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Class      string `json:"class,omitempty"`
	// StartedUnixMs and FinishedUnixMs bound the effect (0: unknown).
	StartedUnixMs  int64  `json:"started_unix_ms,omitempty"`
	FinishedUnixMs int64  `json:"finished_unix_ms,omitempty"`
	Compensation   string `json:"compensation,omitempty"`
	Detail         string `json:"detail,omitempty"`
	Reason         string `json:"reason,omitempty"`
	Runs           int64  `json:"runs,omitempty"`
}

func parseClass(s string) (Class, error) {
	for _, c := range []Class{Reversible, Cancelable, Compensatable, Irreversible} {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown class %q", s)
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromUnixMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func receiptToLine(r Receipt) receiptLine {
	detail := r.Detail
	if len(detail) > maxDetailBytes {
		detail = detail[:maxDetailBytes]
	}
	return receiptLine{Type: lineReceipt, ID: r.ID, Owner: r.Owner, Generation: r.Generation, Component: r.Component,
		Kind: string(r.Kind), Class: r.Class.String(), StartedUnixMs: unixMs(r.StartedAt), FinishedUnixMs: unixMs(r.FinishedAt),
		Compensation: string(r.Compensation), Detail: detail}
}

func lineToReceipt(l receiptLine) (Receipt, error) {
	c, err := parseClass(l.Class)
	if err != nil {
		return Receipt{}, err
	}
	return Receipt{ID: l.ID, Owner: l.Owner, Generation: l.Generation, Component: l.Component, Kind: ReceiptKind(l.Kind), Class: c,
		StartedAt: fromUnixMs(l.StartedUnixMs), FinishedAt: fromUnixMs(l.FinishedUnixMs), Compensation: Compensation(l.Compensation), Detail: l.Detail}, nil
}

// receiptFile is the open file behind a store.
type receiptFile struct {
	path  string
	f     *os.File
	lines int
	now   func() time.Time
	// synced are the reversible counts as last written.
	synced map[string]int64
	// err is the first write error: from then on the evidence is incomplete.
	err error
}

// LoadedReceipts is what a receipts file holds, read without changing it.
type LoadedReceipts struct {
	// Path is the file read.
	Path string
	// Generations are the generations with receipts or counts, oldest first.
	Generations []string
	// Receipts are each generation's receipts, oldest first.
	Receipts map[string][]Receipt
	// Summaries are each generation's counts and completeness.
	Summaries map[string]ReceiptSummary
	// Clean is true when the file's last line is "closed": the manager that
	// wrote it stopped cleanly and nothing recorded was lost.
	Clean bool
	// LastDurableAt is when the file was last made durable (zero: never).
	LastDurableAt time.Time
	// DurableBytes is the length of the file up to its last durable point.
	DurableBytes int64
	// CutAt is set when the file ended in a torn line (the machine stopped
	// while it was written): it was ignored.
	CutAt int64
	// Unreadable are the whole lines that could not be read (not JSON, an
	// unknown type or field, a line over the bound …): each was skipped and
	// the lines after it were still read.
	Unreadable []UnreadableLine
}

// UnreadableLine is a line of a receipts file that could not be read.
type UnreadableLine struct {
	// Line is its 1-based line number, Offset the byte offset it starts at.
	Line   int
	Offset int64
	// Why says what is wrong with it.
	Why string
}

// String is "line N (byte O): why".
func (u UnreadableLine) String() string {
	return fmt.Sprintf("line %d (byte %d): %s", u.Line, u.Offset, u.Why)
}

// unreadableSummary names the unreadable lines for an incompleteness
// reason (the first three, and how many more).
func unreadableSummary(path string, lines []UnreadableLine) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d unreadable line(s) in %s were skipped, and the receipts they held are lost: ", len(lines), path)
	for i, u := range lines {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(lines)-3)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(u.String())
	}
	return b.String()
}

// ReadReceiptsFile reads a receipts file read-only (kubectl iteron
// receipts, doctor). Evidence is reported as the manager recorded it: a
// file that is not closed (Clean false) may be one a running manager is
// writing, so it is not marked incomplete here; the manager that loads it
// next does that, durably, if its writer did not close it.
func ReadReceiptsFile(path string) (*LoadedReceipts, error) {
	s := NewReceiptStore()
	loaded, _, err := s.load(path, false)
	if err != nil {
		return nil, err
	}
	loaded.Generations = append([]string(nil), s.order...)
	loaded.Receipts = map[string][]Receipt{}
	loaded.Summaries = map[string]ReceiptSummary{}
	for _, g := range s.order {
		loaded.Receipts[g] = s.Receipts(g)
		loaded.Summaries[g] = s.Summary(g)
	}
	return loaded, nil
}

// load replays path into s (which must be empty) and returns what it found
// and the offset of the end of its last good line. markUnclean marks every
// generation incomplete when the file was not closed cleanly.
func (s *ReceiptStore) load(path string, markUnclean bool) (*LoadedReceipts, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	out := &LoadedReceipts{Path: path}
	r := bufio.NewReaderSize(f, 64<<10)
	var off int64
	lastType := ""
	first := true
	for n := 1; ; n++ {
		line, size, err := readLine(r)
		if errors.Is(err, io.EOF) && size == 0 {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, 0, fmt.Errorf("read %s: %w", path, err)
		}
		if errors.Is(err, io.EOF) {
			// A torn last line: the machine stopped while it was written.
			out.CutAt = off
			break
		}
		var l receiptLine
		why := ""
		if size > maxReceiptLineBytes {
			why = fmt.Sprintf("%d bytes, over the bound of %d", size, maxReceiptLineBytes)
		} else {
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			if derr := dec.Decode(&l); derr != nil {
				why = "not a receipts line: " + derr.Error()
			}
		}
		if first {
			if why != "" || l.Type != lineOpen || l.Format != ReceiptsFormat {
				return nil, 0, fmt.Errorf("%s: the first line must be {\"type\":\"open\",\"format\":%q,…}, not %s", path, ReceiptsFormat, bytes.TrimSpace(line))
			}
			first = false
		}
		if why == "" {
			if aerr := s.apply(l); aerr != nil {
				why = aerr.Error()
			}
		}
		if why != "" {
			// One bad line loses what it held, never the lines after it.
			out.Unreadable = append(out.Unreadable, UnreadableLine{Line: n, Offset: off, Why: why})
			off += size
			continue
		}
		off += size
		lastType = l.Type
		switch l.Type {
		case lineSync, lineClosed:
			out.LastDurableAt = fromUnixMs(l.AtUnixMs)
			out.DurableBytes = off
		}
	}
	if first {
		return nil, 0, fmt.Errorf("%s is empty: not a receipts file", path)
	}
	out.Clean = lastType == lineClosed && out.CutAt == 0
	if !markUnclean {
		return out, off, nil
	}
	var whys []string
	if len(out.Unreadable) > 0 {
		whys = append(whys, unreadableSummary(path, out.Unreadable))
	}
	if !out.Clean {
		why := "the manager stopped without closing the receipts file"
		if out.LastDurableAt.IsZero() {
			why += " and it was never made durable: any receipt may be lost"
		} else {
			why += fmt.Sprintf(": receipts recorded after it was last made durable (%s) may be lost", out.LastDurableAt.Format(time.RFC3339Nano))
		}
		whys = append(whys, why)
	}
	if len(whys) > 0 {
		why := strings.Join(whys, "; ")
		for _, g := range append([]string(nil), s.order...) {
			s.markIncompleteLocked(g, why)
		}
	}
	return out, off, nil
}

// readLine reads one line with its newline, and its size: io.EOF when the
// file ends before a newline (a torn line). Of a line over
// maxReceiptLineBytes only the size is kept (the rest is read and dropped,
// so the next line is found).
func readLine(r *bufio.Reader) ([]byte, int64, error) {
	var buf []byte
	var size int64
	for {
		chunk, err := r.ReadSlice('\n')
		size += int64(len(chunk))
		if size <= maxReceiptLineBytes {
			buf = append(buf, chunk...)
		} else {
			buf = nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return buf, size, err
	}
}

// apply replays one line into the store (no file attached yet).
func (s *ReceiptStore) apply(l receiptLine) error {
	switch l.Type {
	case lineOpen, lineSync, lineClosed:
		return nil
	case lineReceipt:
		r, err := lineToReceipt(l)
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.recordLocked(r)
	case lineCompensation:
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.setCompensationLocked(l.Generation, l.ID, Compensation(l.Compensation)); err != nil && !errors.Is(err, ErrNoReceipt) {
			return err
		}
		return nil
	case lineIncomplete:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.markIncompleteLocked(l.Generation, l.Reason)
		return nil
	case lineEvicted:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.rememberEvicted(l.Generation)
		return nil
	case lineReversible:
		s.mu.Lock()
		defer s.mu.Unlock()
		g := s.genLocked(l.Generation)
		g.reversible = l.Runs
		if g.component == "" {
			g.component = l.Component
		}
		return nil
	}
	return fmt.Errorf("unknown line type %q", l.Type)
}

// OpenReceiptStore opens the receipts file at path, creating it (and its
// directory) when missing, and returns a store holding what it kept. A torn
// tail is cut off; a file not closed cleanly marks every generation in it
// incomplete (Clean reports it). now stamps the file's lines.
func OpenReceiptStore(path string, now func() time.Time) (*ReceiptStore, error) {
	if now == nil {
		now = time.Now
	}
	s := NewReceiptStore()
	s.clean = true
	if _, err := os.Stat(path); err == nil {
		loaded, end, err := s.load(path, true)
		if err != nil {
			return nil, err
		}
		s.clean, s.lastDurable = loaded.Clean, loaded.LastDurableAt
		f, err := os.OpenFile(path, os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if loaded.CutAt != 0 {
			// Cut the torn tail, so that appends follow a whole line.
			if err := f.Truncate(end); err != nil {
				f.Close()
				return nil, fmt.Errorf("cut the torn tail of %s: %w", path, err)
			}
		}
		if _, err := f.Seek(0, io.SeekEnd); err != nil {
			f.Close()
			return nil, err
		}
		s.file = &receiptFile{path: path, f: f, now: now, synced: map[string]int64{}}
		for g, gr := range s.gens {
			s.file.synced[g] = gr.reversible
		}
		s.file.lines = s.countLinesLocked()
		if !loaded.Clean || len(loaded.Unreadable) > 0 {
			// The incompleteness found is kept in the file too, so that a
			// clean stop later does not make it complete again.
			for _, g := range s.order {
				s.writeLocked(receiptLine{Type: lineIncomplete, Generation: g, Reason: s.gens[g].incomplete})
			}
		}
		return s, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := statedir.WriteFileWith(path, 0o600, func(w io.Writer) error {
		return writeLine(w, receiptLine{Type: lineOpen, Format: ReceiptsFormat, AtUnixMs: now().UnixMilli()})
	}); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	s.file = &receiptFile{path: path, f: f, now: now, synced: map[string]int64{}, lines: 1}
	return s, nil
}

// countLinesLocked estimates the file's lines from what it holds (for the
// compaction threshold).
func (s *ReceiptStore) countLinesLocked() int {
	n := 1
	for _, g := range s.gens {
		n += len(g.receipts) + 1
	}
	return n
}

func writeLine(w io.Writer, l receiptLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// writeLocked appends a line (no fsync). A failed write is kept: the
// evidence of every generation is incomplete from then on.
func (s *ReceiptStore) writeLocked(l receiptLine) {
	if s.file == nil || s.file.f == nil {
		return
	}
	if s.file.lines >= compactAfterLines && s.file.err == nil {
		// Bounded even when nothing syncs (no checkpoints): rewrite what
		// is kept, durably. The change l records is already in memory, so
		// the rewrite holds it — unless it is a count or a mark.
		if err := s.compactLocked(); err != nil {
			s.file.err = err
		} else if l.Type == lineReceipt || l.Type == lineCompensation || l.Type == lineIncomplete || l.Type == lineEvicted {
			return
		}
	}
	if err := writeLine(s.file.f, l); err != nil {
		if s.file.err == nil {
			s.file.err = err
			for _, g := range s.order {
				s.gens[g].truncated = true
				if s.gens[g].incomplete == "" {
					s.gens[g].incomplete = "the receipts file could not be written: " + err.Error()
				}
			}
		}
		return
	}
	s.file.lines++
}

// Clean reports whether the file the store was opened from had been closed
// cleanly (true for a new file), and when it was last made durable.
func (s *ReceiptStore) Clean() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clean, s.lastDurable
}

// Sync makes everything recorded so far durable: the reversible counts that
// changed, a "sync" line, then fsync. A file grown past its bound is first
// rewritten from memory (durably). A store without a file does nothing.
func (s *ReceiptStore) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.syncLocked(lineSync)
}

// Close makes the file durable with a "closed" line — the manager stopped
// cleanly, nothing recorded was lost — and closes it.
func (s *ReceiptStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil || s.file.f == nil {
		return nil
	}
	err := s.syncLocked(lineClosed)
	if cerr := s.file.f.Close(); err == nil {
		err = cerr
	}
	s.file.f = nil
	return err
}

func (s *ReceiptStore) syncLocked(mark string) error {
	if s.file == nil || s.file.f == nil {
		return nil
	}
	if s.file.lines > compactAfterLines {
		if err := s.compactLocked(); err != nil {
			return err
		}
	}
	if s.file.err != nil {
		return fmt.Errorf("receipts file %s: %w", s.file.path, s.file.err)
	}
	for _, g := range s.order {
		if n := s.gens[g].reversible; n != s.file.synced[g] {
			s.writeLocked(receiptLine{Type: lineReversible, Generation: g, Component: s.gens[g].component, Runs: n})
			s.file.synced[g] = n
		}
	}
	now := s.file.now()
	s.writeLocked(receiptLine{Type: mark, AtUnixMs: now.UnixMilli()})
	if s.file.err != nil {
		return fmt.Errorf("receipts file %s: %w", s.file.path, s.file.err)
	}
	if err := s.file.f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", s.file.path, err)
	}
	s.lastDurable = now
	return nil
}

// compactLocked rewrites the file from memory: what is retained, nothing
// evicted, durably (a temporary file, fsync, rename, directory fsync).
func (s *ReceiptStore) compactLocked() error {
	path := s.file.path
	lines := 0
	err := statedir.WriteFileWith(path, 0o600, func(w io.Writer) error {
		put := func(l receiptLine) error { lines++; return writeLine(w, l) }
		if err := put(receiptLine{Type: lineOpen, Format: ReceiptsFormat, AtUnixMs: s.file.now().UnixMilli()}); err != nil {
			return err
		}
		for _, g := range s.evictedOrder {
			if err := put(receiptLine{Type: lineEvicted, Generation: g}); err != nil {
				return err
			}
		}
		for _, g := range s.order {
			gr := s.gens[g]
			for _, r := range gr.receipts {
				if err := put(receiptToLine(r)); err != nil {
					return err
				}
			}
			if gr.truncated {
				if err := put(receiptLine{Type: lineIncomplete, Generation: g, Reason: gr.incomplete}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("compact %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	s.file.f.Close()
	s.file.f, s.file.lines = f, lines
	s.file.synced = map[string]int64{}
	return nil
}
