package spawn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/strictjson"
)

// Record is the durable trace of one live provider group, written (with
// fsync of the file and the directory) when the process starts and removed
// when its group is gone. A manager that died leaves its records behind, and
// Sweep at the next start kills the groups they name: pid, pgid and start
// time (and the boot) must all match, so a reused pid is never killed.
type Record struct {
	// PID is the group's leader.
	PID int `json:"pid"`
	// PGID is the group's id.
	PGID int `json:"pgid"`
	// StartTime is the leader's start time in clock ticks since boot.
	StartTime uint64 `json:"start_time"`
	// BootID is the boot the group was started in.
	BootID string `json:"boot_id"`
	// UID is the uid the provider runs as.
	UID int `json:"uid"`
	// Module is the module the provider fills.
	Module string `json:"module"`
	// ImplementationID is the provider's implementation.
	ImplementationID string `json:"implementation_id"`
	// ArtifactSHA256 is the digest of the bytes it runs.
	ArtifactSHA256 string `json:"artifact_sha256"`
}

// maxRecordBytes bounds a record file.
const maxRecordBytes = 4096

func (r Record) fileName() string { return fmt.Sprintf("%d-%d.json", r.PID, r.StartTime) }

// WriteRecord writes r durably into dir (temporary file, fsync, rename,
// fsync of the directory) and returns its path.
func WriteRecord(dir string, r Record) (string, error) {
	b, err := strictjson.Canonical(r)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, r.fileName())
	return path, statedir.WriteFile(path, append(b, '\n'), 0o600)
}

// ReadRecord reads one record file strictly.
func ReadRecord(path string) (Record, error) {
	var r Record
	f, err := os.Open(path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	b, err := strictjson.ReadBounded(f, maxRecordBytes)
	if err != nil {
		return r, err
	}
	if err := strictjson.Decode(b, &r, maxRecordBytes); err != nil {
		return r, err
	}
	if r.PID <= 0 || r.PGID <= 0 {
		return r, fmt.Errorf("record %s: pid %d, pgid %d", path, r.PID, r.PGID)
	}
	return r, nil
}

// SweepReport says what Sweep found.
type SweepReport struct {
	// Killed are the records whose groups were still alive and were killed.
	Killed []Record
	// Stale counts records naming no live process (a reused pid included).
	Stale int
	// Invalid lists record files that could not be read; they are removed.
	Invalid []string
}

// SweepRecords kills the leftover groups recorded in dir by an earlier manager and
// removes their records. live names the groups of this executor, which are
// never touched.
func SweepRecords(dir string, live func(pid int) bool) (SweepReport, error) {
	var rep SweepReport
	entries, err := os.ReadDir(dir)
	if err != nil {
		return rep, err
	}
	boot := BootID()
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		if statedir.IsTemporary(name) {
			os.Remove(path) // an interrupted write: the process was not yet recorded
			continue
		}
		if !strings.HasSuffix(name, ".json") || !e.Type().IsRegular() {
			continue
		}
		r, err := ReadRecord(path)
		if err != nil {
			rep.Invalid = append(rep.Invalid, path)
			os.Remove(path)
			continue
		}
		if live(r.PID) {
			continue
		}
		if r.BootID != boot || !killRecorded(r) {
			rep.Stale++
		} else {
			rep.Killed = append(rep.Killed, r)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rep, err
		}
	}
	return rep, statedir.SyncDir(dir)
}

// killRecorded kills what is left of a recorded group and reports whether
// anything was. The leader is killed (with its group) only if pid, pgid and
// start time all still match. A leader that is gone may have left members:
// they are killed if they are still in the recorded group, run as the
// recorded uid and started after the leader (a later group reusing the pgid
// would need a leader of its own, which is checked first).
func killRecorded(r Record) bool {
	if st, err := ReadStat(r.PID); err == nil {
		if st.StartTime != r.StartTime || st.PGID != r.PGID {
			return false // the pid was reused
		}
		syscall.Kill(-r.PGID, syscall.SIGKILL)
		syscall.Kill(r.PID, syscall.SIGKILL)
		return true
	}
	if st, err := ReadStat(r.PGID); err == nil && st.PGID == r.PGID && st.StartTime != r.StartTime {
		return false // another group now owns this pgid
	}
	members, err := GroupMembers(r.PGID)
	if err != nil {
		return false
	}
	killed := false
	for _, m := range members {
		if m.StartTime < r.StartTime {
			continue
		}
		if uid, err := readUID(m.PID); err != nil || uid != r.UID {
			continue
		}
		syscall.Kill(m.PID, syscall.SIGKILL)
		killed = true
	}
	return killed
}
