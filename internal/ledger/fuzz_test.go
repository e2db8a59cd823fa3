package ledger

import (
	"bytes"
	"reflect"
	"testing"

	"iteron.dev/operator/pkg/strictjson"
)

// FuzzParseLine checks the fast canonical parser against the strict
// decoder: a line is accepted by one exactly when it is accepted by the
// other (strict JSON that is the record's canonical encoding), with the same
// record and hash span, and an accepted line re-encodes to itself.
//
// It also checks the shortcut that takes a string equal to the previous
// record's without scanning it: with the previous record being a scenario
// record, or the line itself, the result must not change.
func FuzzParseLine(f *testing.F) {
	seeds := splitLines(scenarioBytes(f))
	for _, l := range seeds[:8] {
		f.Add(l)
	}
	var prevs []Record
	var prevPlains []uint32
	for i := 0; i < len(seeds); i += 5 {
		l := seeds[i]
		r, _, plain, ok := parseCanonical(l, nil, 0)
		if !ok {
			f.Fatalf("seed %q is not canonical", l)
		}
		prevs, prevPlains = append(prevs, r), append(prevPlains, plain)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if len(line) > MaxRecordBytes {
			return
		}
		fast, fastSpan, plain, ok := parseCanonical(line, nil, 0)
		for i := range prevs {
			r, span, _, okPrev := parseCanonical(line, &prevs[i], prevPlains[i])
			if okPrev != ok || ok && (!reflect.DeepEqual(r, fast) || span != fastSpan) {
				t.Fatalf("with previous record %d: accepted=%v %+v, without: accepted=%v %+v", i, okPrev, r, ok, fast)
			}
		}
		slow, slowSpan, err := parseStrict(line)
		if ok != (err == nil) {
			t.Fatalf("fast path accepted=%v, strict path error=%v, for %q", ok, err, line)
		}
		if !ok {
			if err.Rule != RuleInvalidJSON {
				t.Fatalf("strict path rule %s for %q", err.Rule, line)
			}
			return
		}
		if !reflect.DeepEqual(fast, slow) || fastSpan != slowSpan {
			t.Fatalf("fast %+v %v, strict %+v %v", fast, fastSpan, slow, slowSpan)
		}
		// Sharing strings with a previous record changes nothing.
		again, span, _, ok := parseCanonical(line, &fast, plain)
		if !ok || !reflect.DeepEqual(again, fast) || span != fastSpan {
			t.Fatalf("parse with prev = %+v, %v", again, ok)
		}
		// The append path's encoder writes exactly strictjson.Canonical's
		// bytes, for whatever record a line can hold.
		quick, qerr := canonicalRecord(&fast)
		slowBytes, serr := strictjson.Canonical(&fast)
		if qerr != nil || serr != nil || !bytes.Equal(quick, slowBytes) {
			t.Fatalf("canonicalRecord = %q, %v; strictjson.Canonical = %q, %v", quick, qerr, slowBytes, serr)
		}
		blank := fast
		blank.RecordSHA256 = ""
		canon, _, encErr := encodeRecord(&blank)
		if encErr != nil {
			t.Fatal(encErr)
		}
		withHash := append(append(bytes.Clone(canon[:fastSpan.start]), fast.RecordSHA256...), canon[fastSpan.start+71:]...)
		if len(fast.RecordSHA256) == 71 && !bytes.Equal(withHash, line) {
			t.Fatalf("re-encoding %q gives %q", line, withHash)
		}
	})
}

// FuzzReplay feeds arbitrary segment bytes to the reader: it must never
// panic, and whatever it accepts must re-encode byte for byte, chain, and
// end where its torn-tail report says.
func FuzzReplay(f *testing.F) {
	// Small seeds: the fuzzer minimizes what it finds, and minimizing runs
	// the target once per attempt.
	lines := splitLines(scenarioBytes(f))
	f.Add(joinLines(lines[:4]))
	f.Add(append(joinLines(lines[:3]), 0, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		v := newValidator(nil)
		var accepted [][]byte
		// A small chunk puts lines across reads, as a large segment does.
		ss := segmentStream{v: v, h: newLineHasher(), path: "fuzz", chunk: 97}
		ss.fn = func(r *Record) error {
			line, digest, err := encodeRecord(r)
			if err != nil {
				t.Fatalf("accepted record does not encode: %v", err)
			}
			if digest != r.RecordSHA256 {
				t.Fatalf("accepted record %d hashes to %s, claims %s", r.Sequence, digest, r.RecordSHA256)
			}
			accepted = append(accepted, line)
			return nil
		}
		torn, _, size, err := ss.run(bytes.NewReader(data).ReadAt)
		if err != nil {
			return
		}
		if size != int64(len(data)) {
			t.Fatalf("read %d of %d bytes", size, len(data))
		}
		complete := data
		if torn != nil {
			complete = data[:torn.offset]
			if torn.offset+torn.bytes != int64(len(data)) || bytes.IndexByte(data[torn.offset:], '\n') >= 0 {
				t.Fatalf("torn tail %+v of %d bytes", torn, len(data))
			}
		}
		if !bytes.Equal(joinLines(accepted), complete) {
			t.Fatal("accepted records do not re-encode to the segment")
		}
		_ = v.finish(true)
		_ = v.state()
	})
}
