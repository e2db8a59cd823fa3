package procexec

import (
	"errors"
	"fmt"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// LaunchSealed is Launch with the executable already sealed and checked
// (OpenSealed): nothing is read from the plan's executable path before the
// start (it is still hashed again after it, as tampering evidence). s stays
// owned by the caller.
func (e *Executor) LaunchSealed(plan verifier.LaunchPlan, s *Sealed) (*Process, error) {
	return e.LaunchSealedIn(plan, s, "")
}

// LaunchSealedIn is LaunchSealed with the name of the provider's scratch
// directory (see LaunchIn).
func (e *Executor) LaunchSealedIn(plan verifier.LaunchPlan, s *Sealed, scratch string) (*Process, error) {
	if s == nil {
		return nil, errors.New("procexec: LaunchSealed needs a sealed executable")
	}
	if s.Digest() != plan.ArtifactSHA256() {
		return nil, &Fault{Kind: KindRefused, Op: OpSpawn, Reason: reasons.VerificationFailed,
			Detail: fmt.Sprintf("the sealed executable was checked against %s, the plan says %s", s.Digest(), plan.ArtifactSHA256())}
	}
	exe, err := s.Dup()
	if err != nil {
		return nil, &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "dup of the sealed executable: " + err.Error(), Err: err}
	}
	return e.launch(plan, exe.File(), exe.Head(), scratch)
}
