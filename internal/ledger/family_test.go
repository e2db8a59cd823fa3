package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"testing"
)

// familyRecord is the family's record, written here with encoding/json and
// crypto/sha256 only, independently of the package's encoder. Its values are
// ASCII without <, > or &, where encoding/json's bytes equal serde_json's.
type familyRecord struct {
	SchemaID            string  `json:"schema_id"`
	Sequence            uint64  `json:"sequence"`
	PreviousSHA256      string  `json:"previous_sha256"`
	RecordSHA256        string  `json:"record_sha256"`
	TransactionID       string  `json:"transaction_id"`
	Module              string  `json:"module"`
	CandidateSHA256     string  `json:"candidate_sha256"`
	OldGeneration       uint64  `json:"old_generation"`
	OldImplementationID string  `json:"old_implementation_id"`
	OldArtifactSHA256   string  `json:"old_artifact_sha256"`
	OldStateSHA256      string  `json:"old_state_sha256"`
	NewGeneration       uint64  `json:"new_generation"`
	NewImplementationID string  `json:"new_implementation_id"`
	NewArtifactSHA256   string  `json:"new_artifact_sha256"`
	NewStateSHA256      string  `json:"new_state_sha256"`
	AuthoritySHA256     string  `json:"authority_sha256"`
	Phase               string  `json:"phase"`
	Outcome             string  `json:"outcome"`
	BlockKind           *string `json:"block_kind"`
	Reason              *string `json:"reason"`
	StartedUnixMs       uint64  `json:"started_unix_ms"`
	ElapsedMs           uint64  `json:"elapsed_ms"`
	DeadlineMs          uint64  `json:"deadline_ms"`
}

// familySwap is one family transaction: its identity and its records'
// phases, outcomes and reasons.
type familySwap struct {
	id       string
	old, new uint64
	steps    [][2]string // phase, outcome
	block    *string
	reason   *string
}

func tenPhases() [][2]string {
	var s [][2]string
	for _, p := range phaseOrder[:9] {
		s = append(s, [2]string{string(p), "applied"})
	}
	return append(s, [2]string{"committed", "committed"})
}

// familyRecords builds the family records of the swaps, unchained.
func familyRecords(swaps []familySwap) []familyRecord {
	var recs []familyRecord
	for _, sw := range swaps {
		for i, st := range sw.steps {
			r := familyRecord{
				SchemaID: string(SchemaFamily), TransactionID: sw.id, Module: "prompt_system",
				CandidateSHA256: dg("family candidate"),
				OldGeneration:   sw.old, OldImplementationID: "prompt-g" + itoa(int(sw.old)),
				OldArtifactSHA256: dg("artifact g" + itoa(int(sw.old))), OldStateSHA256: dg("state g" + itoa(int(sw.old))),
				NewGeneration: sw.new, NewImplementationID: "prompt-g" + itoa(int(sw.new)),
				NewArtifactSHA256: dg("artifact g" + itoa(int(sw.new))), NewStateSHA256: dg("state g" + itoa(int(sw.new))),
				AuthoritySHA256: dg("family authority"), Phase: st[0], Outcome: st[1],
				StartedUnixMs: 1_700_000_000_000 + sw.old*1000, ElapsedMs: uint64(i * 3), DeadlineMs: 10000,
			}
			if st[1] == "blocked" || st[0] == "rolled_back" {
				r.BlockKind, r.Reason = sw.block, sw.reason
			}
			recs = append(recs, r)
		}
	}
	return recs
}

// chainFamily sequences, chains and hashes family records with
// encoding/json and crypto/sha256.
func chainFamily(t testing.TB, recs []familyRecord) []byte {
	var out bytes.Buffer
	prev := "sha256:" + hex.EncodeToString(make([]byte, 32))
	for i := range recs {
		r := recs[i]
		r.Sequence, r.PreviousSHA256, r.RecordSHA256 = uint64(i), prev, ""
		blank, err := json.Marshal(r)
		must(t, err)
		sum := sha256.Sum256(blank)
		r.RecordSHA256 = "sha256:" + hex.EncodeToString(sum[:])
		line, err := json.Marshal(r)
		must(t, err)
		out.Write(line)
		out.WriteByte('\n')
		prev = r.RecordSHA256
	}
	return out.Bytes()
}

func familyLedger() []familySwap {
	blocked := tenPhases()[:6] // verify … restore
	blocked = append(blocked[:5], [2]string{"restore", "blocked"}, [2]string{"rolled_back", "rolled_back"})
	return []familySwap{
		{id: "swap-0001", old: 1, new: 2, steps: tenPhases()},
		{id: "swap-0002", old: 2, new: 3, steps: blocked, block: strp("provider"), reason: strp("restore failed: digest mismatch")},
		{id: "swap-0003", old: 2, new: 3, steps: tenPhases()},
	}
}

func TestAFamilyLedgerVerifiesWithTheFamilyGrammar(t *testing.T) {
	data := chainFamily(t, familyRecords(familyLedger()))
	path := filepath.Join(t.TempDir(), "family.jsonl")
	must(t, writeFile(path, data))
	st, err := Verify(path, VerifyOptions{})
	if err != nil {
		t.Fatalf("Verify(family ledger): %v", err)
	}
	if st.Schema != SchemaFamily || st.NextSequence != 27 || st.Open != nil {
		t.Fatalf("state = %+v", st)
	}
	c := st.LastCommitted["prompt_system"]
	if c.TransactionID != "swap-0003" || c.Generation != 3 || c.Kind != KindHotSwap || c.StateSHA256 != dg("state g3") {
		t.Fatalf("last committed = %+v", c)
	}
	// This operator does not append to a family ledger.
	dir := writeSegment(t, data)
	if _, _, err := Open(dir, Options{}); asRuleError(t, err).Rule != RuleMixedSchemas {
		t.Fatalf("Open(family ledger) = %v", err)
	}
}

func TestAFamilyLedgerIsRejectedWhereTheFamilyGrammarIsStricter(t *testing.T) {
	cases := []struct {
		name string
		edit func([]familyRecord) []familyRecord
		rule Rule
		seq  uint64
	}{
		{"the last transaction is open", func(r []familyRecord) []familyRecord { return r[:len(r)-1] }, RuleMissingTerminal, 25},
		{"a state digest changes inside a transaction", func(r []familyRecord) []familyRecord {
			r[3].OldStateSHA256 = dg("other")
			return r
		}, RuleIdentityChanged, 3},
		{"a state digest is empty", func(r []familyRecord) []familyRecord {
			for i := 0; i < 10; i++ {
				r[i].NewStateSHA256 = ""
			}
			return r
		}, RuleInvalidField, 0},
		{"a swap skips migrate", func(r []familyRecord) []familyRecord { return append(r[:4], r[5:]...) }, RulePhaseGrammar, 4},
		{"a swap skips the state phases (a cold replace is ours only)", func(r []familyRecord) []familyRecord {
			return append(r[:3], r[7:]...) // verify shadow_load quiesce atomic_switch …
		}, RulePhaseGrammar, 3},
		{"a rollback_failed outcome", func(r []familyRecord) []familyRecord { r[16].Outcome = "rollback_failed"; return r }, RuleOutcome, 16},
		{"a first activation", func(r []familyRecord) []familyRecord {
			for i := 0; i < 10; i++ {
				r[i].OldGeneration = 0
			}
			return r
		}, RuleGeneration, 0},
		{"a drain note", func(r []familyRecord) []familyRecord {
			r[8].Reason = strp("cleanup_failed: killed")
			return r
		}, RuleReason, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := chainFamily(t, tc.edit(familyRecords(familyLedger())))
			_, err := Verify(writeSegment(t, data), VerifyOptions{})
			if re := asRuleError(t, err); re.Rule != tc.rule || re.Sequence != tc.seq {
				t.Fatalf("Verify = %v, want rule %s at sequence %d", err, tc.rule, tc.seq)
			}
		})
	}
}
