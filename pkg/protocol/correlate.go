package protocol

// Correlate checks that resp answers req (docs/reference/protocol.md): the
// same protocol, request ID, implementation and module; the result of req's
// operation, or failed; and, where the result carries them, the same run ID,
// generation, schema and digest. States in snapshotted and migrated results
// are checked in full (Validate), their digests recomputed: the host never
// trusts a claimed state_sha256.
//
// A Failed result correlates (it is an answer) and is returned as such; the
// caller decides what a failure means.
func Correlate(req *Request, resp *Response, contracts *ModuleContracts) error {
	if resp.Protocol != req.Protocol {
		return errorf(ErrMismatch, "/protocol", "%q, the request's is %q", resp.Protocol, req.Protocol)
	}
	if resp.RequestID != req.RequestID {
		return errorf(ErrMismatch, "/request_id", "%q, the outstanding request is %q", resp.RequestID, req.RequestID)
	}
	if resp.ImplementationID != req.ImplementationID {
		return errorf(ErrMismatch, "/implementation_id", "%q, the request's is %q", resp.ImplementationID, req.ImplementationID)
	}
	if resp.Module != req.Module {
		return errorf(ErrMismatch, "/module", "%q, the request's is %q", resp.Module, req.Module)
	}
	if resp.Payload == nil || req.Payload == nil {
		return errorf(ErrMalformed, "/payload", "no payload")
	}
	op := req.Payload.Operation()
	res := resp.Payload.Result()
	if res == ResultFailed {
		f := resp.Payload.(*Failed)
		if err := check(ErrTooLarge, "/payload/code", validText(f.Code, MaxFailedCodeBytes)); err != nil {
			return err
		}
		if f.Code == "" {
			return errorf(ErrInvalid, "/payload/code", "empty failure code")
		}
		return check(ErrTooLarge, "/payload/message", validText(f.Message, MaxFailedMessageBytes))
	}
	if res != op.Success() {
		return errorf(ErrMismatch, "/payload/result", "%q does not answer %q", res, op)
	}
	ack := func(runID string, gen uint64, schema ContractRef, digest string, wantRun string, wantGen uint64, wantSchema ContractRef, wantDigest string) error {
		if runID != wantRun {
			return errorf(ErrMismatch, "/payload/run_id", "%q, want %q", runID, wantRun)
		}
		if gen != wantGen {
			return errorf(ErrMismatch, "/payload/generation", "%d, want %d", gen, wantGen)
		}
		if schema != wantSchema {
			return errorf(ErrMismatch, "/payload/state_schema", "%s@%d, want %s@%d", schema.ID, schema.Version, wantSchema.ID, wantSchema.Version)
		}
		if digest != wantDigest {
			return errorf(ErrMismatch, "/payload/state_sha256", "%s, want %s", digest, wantDigest)
		}
		return nil
	}
	switch p := req.Payload.(type) {
	case *LoadRequest:
		l := resp.Payload.(*Loaded)
		if l.ProviderContract != p.ProviderContract {
			return errorf(ErrMismatch, "/payload/provider_contract", "%s@%d, the module's is %s@%d", l.ProviderContract.ID, l.ProviderContract.Version, p.ProviderContract.ID, p.ProviderContract.Version)
		}
		if l.ObservationSchema != p.ObservationSchema {
			return errorf(ErrMismatch, "/payload/observation_schema", "%s@%d, the module's is %s@%d", l.ObservationSchema.ID, l.ObservationSchema.Version, p.ObservationSchema.ID, p.ObservationSchema.Version)
		}
	case *StartRequest:
		if got := resp.Payload.(*Started).RunID; got != p.RunID {
			return errorf(ErrMismatch, "/payload/run_id", "%q, the started run is %q", got, p.RunID)
		}
	case *CancelRequest:
		if got := resp.Payload.(*Cancelled).RunID; got != p.RunID {
			return errorf(ErrMismatch, "/payload/run_id", "%q, the cancelled run is %q", got, p.RunID)
		}
	case *StopRequest:
	case *SnapshotRequest:
		s := &resp.Payload.(*Snapshotted).State
		if s.ImplementationID != req.ImplementationID {
			return errorf(ErrMismatch, "/payload/state/implementation_id", "%q, want %q", s.ImplementationID, req.ImplementationID)
		}
		if s.Generation != p.Generation {
			return errorf(ErrMismatch, "/payload/state/generation", "%d, want %d", s.Generation, p.Generation)
		}
		if s.StateSchema != p.StateSchema {
			return errorf(ErrMismatch, "/payload/state/state_schema", "%s@%d, want %s@%d", s.StateSchema.ID, s.StateSchema.Version, p.StateSchema.ID, p.StateSchema.Version)
		}
		return s.validate("/payload/state", req.Module, contracts)
	case *MigrateRequest:
		s := &resp.Payload.(*Migrated).State
		if s.ImplementationID != req.ImplementationID {
			return errorf(ErrMismatch, "/payload/state/implementation_id", "%q, migrated state must carry the new implementation %q", s.ImplementationID, req.ImplementationID)
		}
		if s.Generation != p.TargetGeneration {
			return errorf(ErrMismatch, "/payload/state/generation", "%d, want the target %d", s.Generation, p.TargetGeneration)
		}
		if s.StateSchema != p.Source.StateSchema {
			return errorf(ErrMismatch, "/payload/state/state_schema", "%s@%d, want %s@%d", s.StateSchema.ID, s.StateSchema.Version, p.Source.StateSchema.ID, p.Source.StateSchema.Version)
		}
		return s.validate("/payload/state", req.Module, contracts)
	case *RestoreRequest:
		r := resp.Payload.(*Restored)
		s := &p.State
		return ack(r.RunID, r.Generation, r.StateSchema, r.StateSHA256, s.RunID, s.Generation, s.StateSchema, s.StateSHA256)
	case *ReadinessRequest:
		r := resp.Payload.(*Ready)
		return ack(r.RunID, r.Generation, r.StateSchema, r.StateSHA256, p.RunID, p.Generation, p.StateSchema, p.StateSHA256)
	}
	return nil
}

// ObservationExpectation is what the host knows about the active run when an
// observation arrives.
type ObservationExpectation struct {
	// Protocol, ImplementationID and Module are the process's identity.
	Protocol, ImplementationID, Module string
	// RunID is the active run; "" when no run is active.
	RunID string
	// Schema is the module's observation contract.
	Schema ContractRef
	// LastSequence is the previous observation's sequence, if HaveLast.
	LastSequence uint64
	HaveLast     bool
}

// CheckObservation checks an observation against the active run: identity,
// run, the module's exact schema, a strictly increasing sequence and the
// payload bound.
func CheckObservation(o *Observation, want ObservationExpectation) error {
	if o.Protocol != want.Protocol {
		return errorf(ErrMismatch, "/protocol", "%q, want %q", o.Protocol, want.Protocol)
	}
	if o.ImplementationID != want.ImplementationID {
		return errorf(ErrMismatch, "/implementation_id", "%q, want %q", o.ImplementationID, want.ImplementationID)
	}
	if o.Module != want.Module {
		return errorf(ErrMismatch, "/module", "%q, want %q", o.Module, want.Module)
	}
	if want.RunID == "" {
		return errorf(ErrMismatch, "/run_id", "observation for run %q while no run is active", o.RunID)
	}
	if o.RunID != want.RunID {
		return errorf(ErrMismatch, "/run_id", "observation for run %q, the active run is %q", o.RunID, want.RunID)
	}
	if o.Schema != want.Schema {
		return errorf(ErrMismatch, "/schema", "%s@%d is not the module's observation schema %s@%d", o.Schema.ID, o.Schema.Version, want.Schema.ID, want.Schema.Version)
	}
	if want.HaveLast && o.Sequence <= want.LastSequence {
		return errorf(ErrMismatch, "/sequence", "%d after %d: sequence must strictly increase", o.Sequence, want.LastSequence)
	}
	if len(o.Observation) > MaxPayloadBytes {
		return errorf(ErrTooLarge, "/observation", "%d bytes exceed %d", len(o.Observation), MaxPayloadBytes)
	}
	return nil
}
