package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/strictjson"
)

// maxProcessRecordBytes bounds one record file (procexec writes a few
// hundred bytes; it reads at most 4 KiB).
const maxProcessRecordBytes = 4096

// maxProcessRecords bounds how many record files are read: a node runs at
// most a few hundred providers.
const maxProcessRecords = 4096

// Local is what the doctor read on the node, under --state-dir.
type Local struct {
	// StateDir is the state directory read.
	StateDir string
	// Err is set when the state directory itself could not be read.
	Err string
	// Ledger is the activation's ledger; nil when Err is set.
	Ledger *LocalLedger
	// Processes are the process records, in file-name order.
	Processes []LocalProcess
	// ProcessesErr is set when the record directory could not be read.
	ProcessesErr string
	// Receipts is the activation's receipts file; nil when it could not be
	// read (ReceiptsErr says why).
	Receipts *effects.LoadedReceipts
	// ReceiptsErr is set when the receipts file could not be read.
	ReceiptsErr string
}

// LocalLedger is the activation's ledger as read from the node.
type LocalLedger struct {
	// Dir is <state-dir>/ledgers/<uid>.
	Dir string
	// Missing is true when the directory does not exist.
	Missing bool
	// State is what the replay established; nil when it did not verify.
	State *ledger.State
	// Broken is the rule the ledger broke, nil when none.
	Broken *ledger.RuleError
	// Err is any error reading it (a broken rule included).
	Err string
	// Anchored is true when the head mirrored in status was checked to be
	// in the chain.
	Anchored bool
	// LastBlocks maps each module to its last blocked record that no later
	// committed transaction of the module superseded. A ledger that breaks
	// a rule still contributes the records before the break.
	LastBlocks map[string]LedgerBlock
}

// LocalProcess is one process record and whether its group still runs.
type LocalProcess struct {
	// File is the record file.
	File string
	// Record is its content (zero when ReadErr is set).
	Record procexec.Record
	// ReadErr is set when the file could not be read or is not a record.
	ReadErr string
	// Alive is true when the recorded leader runs (pid, pgid, start time
	// and boot all match), or when members of its group started after it
	// and running as its uid are left.
	Alive bool
	// Members are the group's live members when the leader is gone.
	Members []int
	// Age is how long the leader has run (0 when unknown).
	Age time.Duration
	// Gone says why a record names no live process.
	Gone string
}

// ReadLocal reads the node-local evidence of act under stateDir: its ledger
// (verified read-only, anchored at the head its status mirrors) and every
// process record checked against /proc. Nothing is changed: no lock is
// taken, nothing is repaired or removed. Problems are reported in the
// result, never as an error, so the diagnosis can go on without them.
func ReadLocal(stateDir string, act *iteronv1.ImplementationActivation) *Local {
	loc := &Local{StateDir: stateDir}
	st, err := os.Stat(stateDir)
	switch {
	case err != nil:
		loc.Err = err.Error()
		return loc
	case !st.IsDir():
		loc.Err = stateDir + " is not a directory"
		return loc
	}
	loc.Ledger = readLedger(stateDir, act)
	if path, err := statedir.Dir(stateDir).Receipts(string(act.UID)); err != nil {
		loc.ReceiptsErr = err.Error()
	} else if loc.Receipts, err = effects.ReadReceiptsFile(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// No file yet is no problem: nothing recorded a receipt.
		loc.ReceiptsErr = err.Error()
	}
	loc.Processes, err = readProcessRecords(statedir.Dir(stateDir).ProcessRecords())
	if err != nil {
		loc.ProcessesErr = err.Error()
	}
	return loc
}

// transientRules are what a replay can see while the manager appends: the
// file grew under the reader, or a record is half written. They are retried
// before being reported.
var transientRules = map[ledger.Rule]bool{ledger.RuleSizeChanged: true, ledger.RuleTornRecord: true}

const ledgerReadAttempts = 5

func readLedger(stateDir string, act *iteronv1.ImplementationActivation) *LocalLedger {
	dir, err := ledger.ActivationDir(stateDir, string(act.UID))
	if err != nil {
		return &LocalLedger{Err: err.Error()}
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return &LocalLedger{Dir: dir, Missing: true, Err: fmt.Sprintf("%s does not exist", dir)}
	}
	var opts ledger.VerifyOptions
	if ls := act.Status.Ledger; ls != nil && ls.Records > 0 && ls.HeadSHA256 != "" {
		opts.Anchor = &ledger.Anchor{Sequence: uint64(ls.Records - 1), RecordSHA256: ls.HeadSHA256}
	}
	var out *LocalLedger
	for attempt := 0; attempt < ledgerReadAttempts; attempt++ {
		out = replayLedger(dir, opts)
		if out.Broken == nil || !transientRules[out.Broken.Rule] {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out
}

// replayLedger verifies dir and keeps each module's last blocked record.
func replayLedger(dir string, opts ledger.VerifyOptions) *LocalLedger {
	out := &LocalLedger{Dir: dir, LastBlocks: map[string]LedgerBlock{}}
	committedAt := map[string]uint64{}
	blockedAt := map[string]uint64{}
	st, err := ledger.Replay(dir, opts, func(r *ledger.Record) error {
		switch r.Outcome {
		case ledger.OutcomeBlocked:
			b := LedgerBlock{Source: "file", Sequence: int64(r.Sequence), TransactionID: r.TransactionID, Phase: string(r.Phase)}
			if r.BlockKind != nil {
				b.BlockKind = string(*r.BlockKind)
			}
			if r.Reason != nil {
				b.Reason = *r.Reason
			}
			out.LastBlocks[r.Module] = b
			blockedAt[r.Module] = r.Sequence
		case ledger.OutcomeRolledBack, ledger.OutcomeRollbackFailed:
			if b, ok := out.LastBlocks[r.Module]; ok && b.TransactionID == r.TransactionID {
				b.Ending = string(r.Outcome)
				out.LastBlocks[r.Module] = b
			}
		case ledger.OutcomeCommitted:
			committedAt[r.Module] = r.Sequence
		}
		return nil
	})
	for m, seq := range blockedAt {
		if committedAt[m] > seq {
			delete(out.LastBlocks, m)
		}
	}
	if err != nil {
		out.Err = err.Error()
		var re *ledger.RuleError
		if errors.As(err, &re) {
			out.Broken = re
		}
		return out
	}
	out.State = &st
	out.Anchored = opts.Anchor != nil && st.AnchorVerified
	return out
}

// readProcessRecords reads every record file of dir (a missing dir holds
// none) and checks each against /proc.
func readProcessRecords(dir string) ([]LocalProcess, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	boot := bootID()
	up, upErr := uptime()
	var out []LocalProcess
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") || !e.Type().IsRegular() {
			continue // files being written (statedir.IsTemporary) among them
		}
		if len(out) == maxProcessRecords {
			return out, fmt.Errorf("%s holds more than %d records; the rest were not read", dir, maxProcessRecords)
		}
		p := LocalProcess{File: filepath.Join(dir, e.Name())}
		rec, err := readProcessRecord(p.File)
		if err != nil {
			p.ReadErr = err.Error()
			out = append(out, p)
			continue
		}
		p.Record = rec
		checkAlive(&p, boot)
		if p.Alive && upErr == nil && p.Members == nil {
			if age := up - time.Duration(rec.StartTime)*time.Second/clockTicksPerSecond; age > 0 {
				p.Age = age
			}
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b LocalProcess) int { return strings.Compare(a.File, b.File) })
	return out, nil
}

// readProcessRecord reads one record strictly (bounded, no unknown or
// duplicate field) and checks what names a process.
func readProcessRecord(path string) (procexec.Record, error) {
	var r procexec.Record
	b, err := readBounded(path, maxProcessRecordBytes)
	if err != nil {
		return r, err
	}
	if err := strictjson.Decode(b, &r, maxProcessRecordBytes); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	if r.PID <= 0 || r.PGID <= 0 || r.StartTime == 0 {
		return r, fmt.Errorf("%s: pid %d, pgid %d, start time %d: not a live-process record", path, r.PID, r.PGID, r.StartTime)
	}
	return r, nil
}

// checkAlive decides whether a record's group still runs, with the same
// identity checks the executor's sweep makes before it kills: a pid whose
// start time or group differs is a reused pid, not the provider.
func checkAlive(p *LocalProcess, boot string) {
	r := p.Record
	if r.BootID != boot {
		p.Gone = fmt.Sprintf("recorded in another boot (%s; this boot is %s)", r.BootID, boot)
		return
	}
	st, err := readStat(r.PID)
	switch {
	case err == nil && st.startTime == r.StartTime && st.pgid == r.PGID:
		p.Alive = true
		return
	case err == nil && st.startTime != r.StartTime:
		p.Gone = fmt.Sprintf("pid %d now names another process (start time %d, recorded %d)", r.PID, st.startTime, r.StartTime)
	case err == nil:
		p.Gone = fmt.Sprintf("pid %d left process group %d (now in %d)", r.PID, r.PGID, st.pgid)
	case errors.Is(err, fs.ErrNotExist):
		p.Gone = fmt.Sprintf("no process %d", r.PID)
	default:
		p.Gone = fmt.Sprintf("pid %d: %v", r.PID, err)
	}
	// The leader is gone; members that stayed in its group are still the
	// provider's (a later group reusing the pgid would have its own leader
	// with that pid, which is checked first).
	if st, err := readStat(r.PGID); err == nil && st.pgid == r.PGID && st.startTime != r.StartTime {
		return
	}
	members, err := groupMembers(r.PGID, r.StartTime, r.UID)
	if err == nil && len(members) > 0 {
		p.Alive, p.Members = true, members
		p.Gone = fmt.Sprintf("the leader %d is gone but %d member(s) of group %d run: %v", r.PID, len(members), r.PGID, members)
	}
}
