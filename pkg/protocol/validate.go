package protocol

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/strictjson"
)

// Capabilities is the closed set of capability names, sorted.
var Capabilities = []string{"code_executing", "irreversible_external", "read_only", "reversible_local", "trust_mutating"}

// ValidID checks an identifier: 1–128 bytes of [A-Za-z0-9._\-/:@+].
func ValidID(s string) error {
	if len(s) == 0 || len(s) > MaxIDBytes {
		return fmt.Errorf("%d bytes, want 1..%d", len(s), MaxIDBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '-', c == '/', c == ':', c == '@', c == '+':
		default:
			return fmt.Errorf("byte %d (%q) is outside [A-Za-z0-9._-/:@+]", i, c)
		}
	}
	return nil
}

// ValidModule checks a module ID: ^[a-z][a-z0-9_]{0,47}$.
func ValidModule(s string) error {
	if len(s) == 0 || len(s) > 48 {
		return fmt.Errorf("%d bytes, want 1..48", len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z':
		case i > 0 && (c >= '0' && c <= '9' || c == '_'):
		default:
			return fmt.Errorf("%q does not match ^[a-z][a-z0-9_]{0,47}$", s)
		}
	}
	return nil
}

// ValidDigest checks a prefixed digest: "sha256:" + 64 lowercase hex.
func ValidDigest(s string) error {
	const prefix = strictjson.DigestPrefix
	if len(s) != len(prefix)+64 || s[:len(prefix)] != prefix {
		return fmt.Errorf("%q is not sha256: followed by 64 lowercase hex digits", s)
	}
	for i := len(prefix); i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%q is not sha256: followed by 64 lowercase hex digits", s)
		}
	}
	return nil
}

// validText checks a free-form string: valid UTF-8 and at most max bytes.
func validText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes exceed %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("not valid UTF-8")
	}
	return nil
}

// ValidPayload checks a free-form raw value: one strict JSON value (no
// duplicate names at any depth, valid UTF-8) of at most max bytes.
func ValidPayload(v jsontext.Value, max int) error {
	if len(v) > max {
		return errorf(ErrTooLarge, "", "%d bytes exceed %d", len(v), max)
	}
	if len(v) == 0 || !strictjson.Check(v) {
		return errorf(ErrMalformed, "", "not one strict JSON value")
	}
	return nil
}

// StateDigest is "sha256:" over the canonical encoding of a state value
// (serde_json's bytes: keys sorted, compact, ryu numbers).
func StateDigest(state jsontext.Value) (string, error) {
	return strictjson.DigestOfValue(state)
}

func check(kind ErrorKind, ptr string, err error) error {
	if err == nil {
		return nil
	}
	if pe, ok := err.(*Error); ok {
		if ptr != "" && pe.Pointer == "" {
			pe.Pointer = ptr
		}
		return pe
	}
	return &Error{Kind: kind, Pointer: ptr, Reason: err.Error()}
}

// Validate checks every value of r, for a provider speaking v. If contracts
// is not nil, every contract reference must equal the module's graph entry.
// The host validates every request before writing it; the SDK validates every
// request it receives.
func (r *Request) Validate(v Version, contracts *ModuleContracts) error {
	if !v.Valid() {
		return errorf(ErrInvalid, "/protocol", "unknown protocol version %d", int(v))
	}
	if r.Protocol != v.String() {
		return errorf(ErrMismatch, "/protocol", "%q, want %q", r.Protocol, v.String())
	}
	if err := check(ErrInvalid, "/request_id", ValidID(r.RequestID)); err != nil {
		return err
	}
	if err := check(ErrInvalid, "/implementation_id", ValidID(r.ImplementationID)); err != nil {
		return err
	}
	if err := check(ErrInvalid, "/module", ValidModule(r.Module)); err != nil {
		return err
	}
	if r.Payload == nil {
		return errorf(ErrMalformed, "/payload", "no payload")
	}
	op := r.Payload.Operation()
	if !op.SupportedBy(v) {
		return errorf(ErrInvalid, "/payload/operation", "%s is a state operation, which protocol 1 does not have", op)
	}
	var want ContractRef
	if contracts != nil {
		want = contracts.Lifecycle(op)
	}
	contract := func(ptr string, got, want ContractRef) error {
		if err := check(ErrInvalid, ptr+"/id", ValidID(got.ID)); err != nil {
			return err
		}
		if contracts != nil && got != want {
			return errorf(ErrMismatch, ptr, "contract %s@%d is not the module's %s@%d", got.ID, got.Version, want.ID, want.Version)
		}
		return nil
	}
	deadline := func(ms uint64) error {
		if ms == 0 || ms > MaxDeadlineMs {
			return errorf(ErrInvalid, "/payload/deadline_ms", "%d, want 1..%d", ms, MaxDeadlineMs)
		}
		return nil
	}
	lineage := func(runID string, generation uint64) error {
		if runID != LineageRunID(r.Module) {
			return errorf(ErrInvalid, "/payload/run_id", "%q, want %q", runID, LineageRunID(r.Module))
		}
		if generation == 0 {
			return errorf(ErrInvalid, "/payload/generation", "lineage numbers start at 1")
		}
		return nil
	}
	var c ModuleContracts
	if contracts != nil {
		c = *contracts
	}
	switch p := r.Payload.(type) {
	case *LoadRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := contract("/payload/definition_contract", p.DefinitionContract, c.Definition); err != nil {
			return err
		}
		if err := contract("/payload/provider_contract", p.ProviderContract, c.Provider); err != nil {
			return err
		}
		if err := contract("/payload/consumer_contract", p.ConsumerContract, c.Consumer); err != nil {
			return err
		}
		if err := contract("/payload/observation_schema", p.ObservationSchema, c.Observation); err != nil {
			return err
		}
		if err := check(ErrInvalid, "/payload/artifact_sha256", ValidDigest(p.ArtifactSHA256)); err != nil {
			return err
		}
		return check(ErrInvalid, "/payload/admitted_capabilities", ValidCapabilities(p.AdmittedCapabilities))
	case *StartRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := check(ErrInvalid, "/payload/run_id", ValidID(p.RunID)); err != nil {
			return err
		}
		if err := check(ErrInvalid, "/payload/candidate_sha256", ValidDigest(p.CandidateSHA256)); err != nil {
			return err
		}
		if err := contract("/payload/input_schema", p.InputSchema, c.Consumer); err != nil {
			return err
		}
		if sameBytes(p.Input, p.checked) {
			// Checked already (decoded strictly, or a Payload): only its size is left to check.
			if len(p.Input) > MaxPayloadBytes {
				return errorf(ErrTooLarge, "/payload/input", "%d bytes exceed %d", len(p.Input), MaxPayloadBytes)
			}
		} else if err := check(ErrMalformed, "/payload/input", ValidPayload(p.Input, MaxPayloadBytes)); err != nil {
			return err
		}
		return deadline(p.DeadlineMs)
	case *CancelRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := check(ErrInvalid, "/payload/run_id", ValidID(p.RunID)); err != nil {
			return err
		}
		return check(ErrInvalid, "/payload/reason", validText(p.Reason, MaxReasonBytes))
	case *StopRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		return check(ErrInvalid, "/payload/reason", validText(p.Reason, MaxReasonBytes))
	case *SnapshotRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := lineage(p.RunID, p.Generation); err != nil {
			return err
		}
		if err := contract("/payload/state_schema", p.StateSchema, c.Snapshot); err != nil {
			return err
		}
		return deadline(p.DeadlineMs)
	case *MigrateRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := p.Source.validate("/payload/source", r.Module, contracts); err != nil {
			return err
		}
		if p.TargetGeneration != p.Source.Generation+1 || p.TargetGeneration == 0 {
			return errorf(ErrInvalid, "/payload/target_generation", "%d, want exactly the source's %d + 1", p.TargetGeneration, p.Source.Generation)
		}
		return deadline(p.DeadlineMs)
	case *RestoreRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := p.State.validate("/payload/state", r.Module, contracts); err != nil {
			return err
		}
		if p.State.ImplementationID != r.ImplementationID {
			return errorf(ErrMismatch, "/payload/state/implementation_id", "%q is not the provider's %q (migrate it first)", p.State.ImplementationID, r.ImplementationID)
		}
		return deadline(p.DeadlineMs)
	case *ReadinessRequest:
		if err := contract("/payload/lifecycle_contract", p.LifecycleContract, want); err != nil {
			return err
		}
		if err := lineage(p.RunID, p.Generation); err != nil {
			return err
		}
		if err := contract("/payload/state_schema", p.StateSchema, c.Snapshot); err != nil {
			return err
		}
		if err := check(ErrInvalid, "/payload/state_sha256", ValidDigest(p.StateSHA256)); err != nil {
			return err
		}
		return deadline(p.DeadlineMs)
	}
	return errorf(ErrMalformed, "/payload", "unknown payload type %T", r.Payload)
}

// Lifecycle returns the lifecycle contract of op.
func (c ModuleContracts) Lifecycle(op Operation) ContractRef {
	switch op {
	case OpLoad:
		return c.Load
	case OpStart:
		return c.Start
	case OpCancel:
		return c.Cancel
	case OpStop:
		return c.Stop
	case OpSnapshot:
		return c.Snapshot
	case OpMigrate:
		return c.Migrate
	case OpRestore:
		return c.Restore
	case OpReadiness:
		return c.Readiness
	}
	return ContractRef{}
}

// ValidCapabilities checks an admitted capability array: known names, sorted
// byte-wise, no duplicates.
func ValidCapabilities(caps []string) error {
	if len(caps) > MaxAdmittedCapabilities {
		return fmt.Errorf("%d capabilities, at most %d exist", len(caps), MaxAdmittedCapabilities)
	}
	for i, c := range caps {
		if !slices.Contains(Capabilities, c) {
			return fmt.Errorf("unknown capability %q", c)
		}
		if i > 0 && caps[i-1] >= c {
			return fmt.Errorf("capabilities must be sorted and unique: %q after %q", c, caps[i-1])
		}
	}
	return nil
}

// Validate checks a state for module: lineage run ID, a lineage number, the
// snapshot contract (if contracts is not nil), its size and that its claimed
// digest is the digest of its canonical encoding.
func (s *State) Validate(module string, contracts *ModuleContracts) error {
	return s.validate("", module, contracts)
}

func (s *State) validate(ptr, module string, contracts *ModuleContracts) error {
	if s.Module != module {
		return errorf(ErrMismatch, ptr+"/module", "%q, want %q", s.Module, module)
	}
	if err := check(ErrInvalid, ptr+"/implementation_id", ValidID(s.ImplementationID)); err != nil {
		return err
	}
	if s.RunID != LineageRunID(module) {
		return errorf(ErrInvalid, ptr+"/run_id", "%q, want %q", s.RunID, LineageRunID(module))
	}
	if s.Generation == 0 {
		return errorf(ErrInvalid, ptr+"/generation", "lineage numbers start at 1")
	}
	if err := check(ErrInvalid, ptr+"/state_schema/id", ValidID(s.StateSchema.ID)); err != nil {
		return err
	}
	if contracts != nil && s.StateSchema != contracts.Snapshot {
		return errorf(ErrMismatch, ptr+"/state_schema", "%s@%d is not the module's %s@%d", s.StateSchema.ID, s.StateSchema.Version, contracts.Snapshot.ID, contracts.Snapshot.Version)
	}
	if err := check(ErrInvalid, ptr+"/state_sha256", ValidDigest(s.StateSHA256)); err != nil {
		return err
	}
	if len(s.State) > MaxStateBytes {
		return errorf(ErrTooLarge, ptr+"/state", "%d bytes exceed %d", len(s.State), MaxStateBytes)
	}
	if len(s.State) == 0 {
		return errorf(ErrMalformed, ptr+"/state", "missing state")
	}
	digest, err := StateDigest(s.State)
	if err != nil {
		return errorf(ErrMalformed, ptr+"/state", "not one strict JSON value: %v", err)
	}
	if digest != s.StateSHA256 {
		return errorf(ErrMismatch, ptr+"/state_sha256", "claims %s, the state's digest is %s", s.StateSHA256, digest)
	}
	return nil
}

// sameBytes reports whether a and b are the very same slice.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}
