package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// scenario indexes the records of writeScenario by role.
type scenario struct {
	recs  []Record
	lines [][]byte
}

func (s scenario) at(t testing.TB, txnSuffix string, phase Phase) int {
	return seqOf(t, s.recs, txnSuffix, phase)
}

// Transaction suffixes of writeScenario.
const (
	txFirst    = "prompt_system/g1/a1"
	txSwap     = "prompt_system/g2/a1"
	txBlocked  = "prompt_system/g3/a1"
	txRenewal  = "prompt_system/g2/a1/r1"
	txRelaunch = "context_assembly/g1/a1/r1"
	txCold     = "context_assembly/g2/a1"
	txRetire   = "context_assembly/g2/a1/r1"
)

func loadScenario(t testing.TB) scenario {
	lines := splitLines(scenarioBytes(t))
	return scenario{recs: decodeLines(t, lines), lines: lines}
}

// edit returns the records with f applied, re-chained (and resequenced when
// records were added or removed), so only the targeted rule can fire.
func (s scenario) edit(t testing.TB, resequence bool, f func(recs []Record) []Record) []byte {
	recs := append([]Record(nil), s.recs...)
	for i := range recs {
		// Deep-copy the optional fields so edits do not leak between cases.
		if recs[i].Reason != nil {
			recs[i].Reason = strp(*recs[i].Reason)
		}
		if recs[i].BlockKind != nil {
			k := *recs[i].BlockKind
			recs[i].BlockKind = &k
		}
	}
	return joinLines(rechain(t, f(recs), resequence))
}

// raw returns the original lines edited byte-wise, without re-chaining.
func (s scenario) raw(f func(lines [][]byte) [][]byte) []byte {
	lines := make([][]byte, len(s.lines))
	for i, l := range s.lines {
		lines[i] = bytes.Clone(l)
	}
	return joinLines(f(lines))
}

func TestReplayRejectsEachTamperByItsRule(t *testing.T) {
	s := loadScenario(t)
	n := len(s.recs)
	type tamper struct {
		name string
		file func() []byte
		rule Rule
		seq  int
	}
	swapRestore := s.at(t, txSwap, PhaseRestore)
	swapShadow := s.at(t, txSwap, PhaseShadowLoad)
	swapQuiesce := s.at(t, txSwap, PhaseQuiesce)
	swapReadiness := s.at(t, txSwap, PhaseReadiness)
	firstCommit := s.at(t, txFirst, PhaseCommitted)
	blockedAt := s.at(t, txBlocked, PhaseMigrate)
	rolledBack := s.at(t, txBlocked, PhaseRolledBack)
	renewalVerify := s.at(t, txRenewal, PhaseVerify)
	renewalDrain := s.at(t, txRenewal, PhaseDrain)
	coldVerify := s.at(t, txCold, PhaseVerify)
	relaunchShadow := s.at(t, txRelaunch, PhaseShadowLoad)
	swapVerify := s.at(t, txSwap, PhaseVerify)
	swapSnapshot := s.at(t, txSwap, PhaseSnapshot)

	cases := []tamper{
		{"one byte changed", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapRestore] = bytes.Replace(ls[swapRestore], []byte(`"prompt-smart"`), []byte(`"prompt-smarT"`), 1)
				return ls
			})
		}, RuleRecordHash, swapRestore},
		{"a line deleted", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte { return append(ls[:swapShadow], ls[swapShadow+1:]...) })
		}, RuleSequence, swapShadow},
		{"a line duplicated", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				out := append([][]byte(nil), ls[:swapShadow+1]...)
				out = append(out, ls[swapShadow])
				return append(out, ls[swapShadow+1:]...)
			})
		}, RuleSequence, swapShadow + 1},
		{"two lines swapped", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapShadow], ls[swapShadow+1] = ls[swapShadow+1], ls[swapShadow]
				return ls
			})
		}, RuleSequence, swapShadow},
		{"an identity changed inside a transaction, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapRestore].NewImplementationID = "prompt-evil"; return r })
		}, RuleIdentityChanged, swapRestore},
		{"a start time changed inside a transaction, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapRestore].StartedUnixMs++; return r })
		}, RuleIdentityChanged, swapRestore},
		{"a state digest changed after it was set, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapReadiness].OldStateSHA256 = dg("forged"); return r })
		}, RuleStateDigest, swapReadiness},
		{"a state digest cleared after it was set, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapReadiness].NewStateSHA256 = ""; return r })
		}, RuleStateDigest, swapReadiness},
		{"a state digest set before its phase, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapShadow].OldStateSHA256 = dg("early"); return r })
		}, RuleStateDigest, swapShadow},
		{"a terminal record dropped, re-chained", func() []byte {
			return s.edit(t, true, func(r []Record) []Record { return append(r[:firstCommit], r[firstCommit+1:]...) })
		}, RuleMissingTerminal, firstCommit},
		{"a phase skipped, re-chained", func() []byte {
			return s.edit(t, true, func(r []Record) []Record { return append(r[:swapQuiesce], r[swapQuiesce+1:]...) })
		}, RulePhaseGrammar, swapQuiesce},
		{"a phase repeated, re-chained", func() []byte {
			return s.edit(t, true, func(r []Record) []Record {
				out := append([]Record(nil), r[:swapShadow+1]...)
				out = append(out, r[swapShadow])
				return append(out, r[swapShadow+1:]...)
			})
		}, RuleDuplicatePhase, swapShadow + 1},
		{"a transaction_id reused by a later transaction, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record {
				for i := coldVerify; i < coldVerify+6; i++ {
					r[i].TransactionID = r[relaunchShadow].TransactionID
				}
				return r
			})
		}, RuleDuplicatePhase, coldVerify},
		{"a rolled_back without the block's reason, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[rolledBack].Reason, r[rolledBack].BlockKind = nil, nil; return r })
		}, RuleRollbackMismatch, rolledBack},
		{"a rolled_back with another reason, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[rolledBack].Reason = strp("provider_failed: something else"); return r })
		}, RuleRollbackMismatch, rolledBack},
		{"a reason with a newline, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record {
				r[blockedAt].Reason, r[rolledBack].Reason = strp("provider_failed: a\nb"), strp("provider_failed: a\nb")
				return r
			})
		}, RuleReason, blockedAt},
		{"a reason over 1024 bytes, re-chained", func() []byte {
			long := "provider_failed: " + strings.Repeat("x", MaxReasonBytes)
			return s.edit(t, false, func(r []Record) []Record { r[blockedAt].Reason, r[rolledBack].Reason = &long, &long; return r })
		}, RuleReason, blockedAt},
		{"a reason not in <code>: <message> form, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record {
				r[blockedAt].Reason, r[rolledBack].Reason = strp("it broke"), strp("it broke")
				return r
			})
		}, RuleReason, blockedAt},
		{"a block kind that is not its code's, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record {
				k := BlockDeadline
				r[blockedAt].BlockKind, r[rolledBack].BlockKind = &k, &k
				return r
			})
		}, RuleReason, blockedAt},
		{"a reason on an applied record, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapShadow].Reason = strp("provider_failed: x"); return r })
		}, RuleReason, swapShadow},
		{"a shadow_load note that is an empty sandbox note, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapShadow].Reason = strp(SandboxNotePrefix); return r })
		}, RuleReason, swapShadow},
		{"a sandbox note on a record other than shadow_load, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapQuiesce].Reason = strp(SandboxNotePrefix + "mode=off"); return r })
		}, RuleReason, swapQuiesce},
		{"a drain note that is not cleanup_failed, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[renewalDrain].Reason = strp("provider_failed: x"); return r })
		}, RuleReason, renewalDrain},
		{"two schemas in one file, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[n-1].SchemaID = SchemaFamily; return r })
		}, RuleMixedSchemas, n - 1},
		{"an unknown schema, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[0].SchemaID = "iteron-hotswap-ledger/2"; return r })
		}, RuleUnknownSchema, 0},
		{"a duplicate JSON key", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapSnapshot] = bytes.Replace(ls[swapSnapshot], []byte(`,"module":`), []byte(`,"module":"prompt_system","module":`), 1)
				return ls
			})
		}, RuleInvalidJSON, swapSnapshot},
		{"a space between members", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapSnapshot] = bytes.Replace(ls[swapSnapshot], []byte(`,"module":`), []byte(`, "module":`), 1)
				return ls
			})
		}, RuleInvalidJSON, swapSnapshot},
		{"a member missing", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapSnapshot] = bytes.Replace(ls[swapSnapshot], []byte(`,"deadline_ms":30000`), nil, 1)
				return ls
			})
		}, RuleInvalidJSON, swapSnapshot},
		{"an unknown member", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapSnapshot] = bytes.Replace(ls[swapSnapshot], []byte(`,"deadline_ms":30000`), []byte(`,"deadline_ms":30000,"kind":"swap"`), 1)
				return ls
			})
		}, RuleInvalidJSON, swapSnapshot},
		{"an empty line", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				return append(ls[:swapSnapshot], append([][]byte{{}}, ls[swapSnapshot:]...)...)
			})
		}, RuleInvalidJSON, swapSnapshot},
		{"a line over 16 KiB", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[swapSnapshot] = bytes.Repeat([]byte("x"), MaxRecordBytes+1)
				return ls
			})
		}, RuleRecordTooLarge, swapSnapshot},
		{"a torn tail", func() []byte {
			return append(scenarioBytes(t), s.lines[0][:100]...)
		}, RuleTornRecord, n},
		{"a NUL tail", func() []byte {
			return append(scenarioBytes(t), make([]byte, 512)...)
		}, RuleTornRecord, n},
		{"a broken chain link, re-hashed", func() []byte {
			lines := rechain(t, s.recs, false)
			r := s.recs[renewalVerify]
			r.PreviousSHA256 = dg("elsewhere")
			line, _, err := encodeRecord(&r)
			must(t, err)
			lines[renewalVerify] = line
			return joinLines(lines)
		}, RuleChain, renewalVerify},
		{"a record hash replaced", func() []byte {
			return s.raw(func(ls [][]byte) [][]byte {
				ls[renewalVerify] = bytes.Replace(ls[renewalVerify], []byte(s.recs[renewalVerify].RecordSHA256), []byte(dg("forged")), 1)
				return ls
			})
		}, RuleRecordHash, renewalVerify},
		{"an outcome that does not fit its phase, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[swapVerify].Outcome = OutcomeCommitted; return r })
		}, RuleOutcome, swapVerify},
		{"rollback_failed without a switch, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[rolledBack].Outcome = OutcomeRollbackFailed; return r })
		}, RuleOutcome, rolledBack},
		{"generations that fit no kind, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record {
				for i := swapVerify; i < swapVerify+10; i++ {
					r[i].NewGeneration = 4
				}
				return r
			})
		}, RuleGeneration, swapVerify},
		{"a transaction_id not of the operator's form, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record {
				for i := 0; i <= firstCommit; i++ {
					r[i].TransactionID = "swap-1"
				}
				return r
			})
		}, RuleTransactionID, 0},
		{"a zero deadline, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[0].DeadlineMs = 0; return r })
		}, RuleInvalidField, 0},
		{"a digest in upper case, re-chained", func() []byte {
			return s.edit(t, false, func(r []Record) []Record { r[0].CandidateSHA256 = strings.ToUpper(r[0].CandidateSHA256); return r })
		}, RuleInvalidField, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.file()
			dir := writeSegment(t, data)
			_, err := Verify(dir, VerifyOptions{})
			re := asRuleError(t, err)
			if re.Rule != tc.rule || re.Sequence != uint64(tc.seq) {
				t.Fatalf("Verify = %v\nwant rule %s at sequence %d", err, tc.rule, tc.seq)
			}
			t.Logf("%s", err)
			// The single file verifies the same way.
			if _, err := Verify(filepath.Join(dir, SegmentName(1)), VerifyOptions{}); !sameRule(err, re) {
				t.Fatalf("Verify(file) = %v, Verify(dir) = %v", err, re)
			}
			// Opening for append rejects it too and changes nothing, but a
			// torn tail, which it truncates (TestOpenTruncatesOnlyTheTornTail).
			if tc.rule == RuleTornRecord {
				return
			}
			if l, _, err := Open(dir, Options{}); !sameRule(err, re) {
				if l != nil {
					l.Close()
				}
				t.Fatalf("Open = %v, want %v", err, re)
			}
			after, err := os.ReadFile(filepath.Join(dir, SegmentName(1)))
			must(t, err)
			if !bytes.Equal(after, data) {
				t.Fatal("Open changed a corrupt ledger")
			}
		})
	}
}

func sameRule(err error, want *RuleError) bool {
	var re *RuleError
	return errors.As(err, &re) && re.Rule == want.Rule && re.Sequence == want.Sequence
}

func TestReplayRejectsAFileReplacedBySymlink(t *testing.T) {
	dir := writeSegment(t, scenarioBytes(t))
	seg := filepath.Join(dir, SegmentName(1))
	elsewhere := filepath.Join(t.TempDir(), "real.jsonl")
	must(t, os.Rename(seg, elsewhere))
	must(t, os.Symlink(elsewhere, seg))
	for _, path := range []string{dir, seg} {
		_, err := Verify(path, VerifyOptions{})
		if re := asRuleError(t, err); re.Rule != RuleNotRegularFile || re.Sequence != 0 {
			t.Fatalf("Verify(%s) = %v", path, err)
		}
	}
	if _, _, err := Open(dir, Options{}); asRuleError(t, err).Rule != RuleNotRegularFile {
		t.Fatalf("Open = %v", err)
	}
	// A ledger directory that is a symlink is refused as well.
	link := filepath.Join(t.TempDir(), "link")
	must(t, os.Symlink(dir, link))
	if _, err := Verify(link, VerifyOptions{}); asRuleError(t, err).Rule != RuleNotRegularFile {
		t.Fatalf("Verify(symlinked dir) = %v", err)
	}
}

func TestReplayRejectsAFIFOWithoutBlocking(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	must(t, os.Mkdir(dir, 0o700))
	fifo := filepath.Join(dir, SegmentName(1))
	if err := mkfifo(fifo); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if _, err := Verify(dir, VerifyOptions{}); asRuleError(t, err).Rule != RuleNotRegularFile {
		t.Fatalf("Verify = %v", err)
	}
}

func TestReplayRejectsASegmentOver16MiB(t *testing.T) {
	dir := writeSegment(t, scenarioBytes(t))
	// A sparse file: the bound is checked before a byte is read.
	must(t, os.Truncate(filepath.Join(dir, SegmentName(1)), MaxSegmentBytes+1))
	_, err := Verify(dir, VerifyOptions{})
	if re := asRuleError(t, err); re.Rule != RuleSegmentTooLarge {
		t.Fatalf("Verify = %v", err)
	}
}

func TestReplayRejectsABadSegmentLayout(t *testing.T) {
	data := scenarioBytes(t)
	cases := []struct {
		name  string
		build func(dir string)
	}{
		{"a segment missing between two", func(dir string) {
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(1)), data, 0o600))
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(3)), nil, 0o600))
		}},
		{"a stray file", func(dir string) {
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(1)), data, 0o600))
			must(t, os.WriteFile(filepath.Join(dir, "ledger-1.jsonl"), nil, 0o600))
		}},
		{"an empty sealed segment", func(dir string) {
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(1)), nil, 0o600))
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(2)), data, 0o600))
		}},
		{"no segment at all", func(string) {}},
		{"a segment sealed inside a transaction", func(dir string) {
			lines := splitLines(data)
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(1)), joinLines(lines[:2]), 0o600))
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(2)), joinLines(lines[2:]), 0o600))
		}},
		{"an empty oldest retained segment", func(dir string) {
			must(t, os.WriteFile(filepath.Join(dir, SegmentName(5)), nil, 0o600))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ledger")
			must(t, os.Mkdir(dir, 0o700))
			tc.build(dir)
			_, err := Verify(dir, VerifyOptions{})
			if re := asRuleError(t, err); re.Rule != RuleSegmentLayout {
				t.Fatalf("Verify = %v", err)
			}
			t.Logf("%v", err)
		})
	}
}
