package procexec

import (
	"errors"
	"os"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/spawn"
)

// The process layer below the executor (internal/spawn) is shared with the
// package-runtime host; these names keep the executor's API as it was.

// Exit describes how a provider process ended (spawn.Exit).
type Exit = spawn.Exit

// Record is the durable trace of one live provider group (spawn.Record).
type Record = spawn.Record

// SweepReport says what Sweep found (spawn.SweepReport).
type SweepReport = spawn.SweepReport

// ReapOrphans scans /proc at once, as the reaper does on SIGCHLD: it reaps
// zombie members of recorded provider groups re-parented to the manager and
// kills (and reaps) descendants that left their provider's group. It returns
// the pids of the escaped descendants killed since the last call, which the
// conformance check reports as processes left behind (spawn.ReapOrphans).
func ReapOrphans() []int { return spawn.ReapOrphans() }

// MaxExecutableBytes bounds an executable (docs/security.md).
const MaxExecutableBytes = spawn.MaxExecutableBytes

// Sealed is a sealed memfd holding an executable whose bytes hash to its
// digest (spawn.Sealed). A manager that hands its providers to a survivor
// (docs/survivor.md) seals the executable itself and passes this descriptor
// over SCM_RIGHTS, never a path; the survivor checks it with OpenSealed and
// launches it with Executor.LaunchSealed.
type Sealed = spawn.Sealed

// SealExecutable copies the executable at path into a sealed memfd while
// hashing what the memfd holds, and refuses it (a KindRefused fault with
// reason verification_failed) unless its digest is want.
func SealExecutable(path, want string) (*Sealed, error) {
	s, err := spawn.SealExecutable(path, want)
	return s, sealFault(err)
}

// OpenSealed takes a descriptor received from elsewhere (the manager) and
// returns it as a Sealed executable only if it is a memfd sealed against
// write, growth and shrinking, at most MaxExecutableBytes, whose bytes hash
// to want (a KindRefused fault otherwise). It takes ownership of f.
func OpenSealed(f *os.File, want string) (*Sealed, error) {
	s, err := spawn.OpenSealed(f, want)
	return s, sealFault(err)
}

// SealCache keeps sealed executables by digest, bounded in bytes (least
// recently used first out), so that a renewal or relaunch of an artifact
// already sealed copies and hashes nothing. Its errors are Faults.
type SealCache struct{ c *spawn.SealCache }

// NewSealCache returns a cache of at most maxBytes of executables (0 keeps
// none).
func NewSealCache(maxBytes int64) *SealCache { return &SealCache{c: spawn.NewSealCache(maxBytes)} }

// Seal returns a sealed copy of the executable at path with digest want: a
// cached one (a fresh descriptor) or a new one, then kept. The caller closes
// the result.
func (sc *SealCache) Seal(path, want string) (*Sealed, error) {
	s, err := sc.c.Seal(path, want)
	return s, sealFault(err)
}

// sealFault turns a sealing error into the executor's Fault: a refusal is
// KindRefused, anything else KindSpawn, with reason verification_failed
// where the bytes could not be verified.
func sealFault(err error) error {
	if err == nil {
		return nil
	}
	f := &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: err.Error(), Err: err}
	var se *spawn.SealError
	if errors.As(err, &se) {
		f.Detail, f.Err = se.Detail, se.Err
		if se.Refused {
			f.Kind = KindRefused
		}
		if se.Refused || se.Verification {
			f.Reason = reasons.VerificationFailed
		}
	}
	return f
}
