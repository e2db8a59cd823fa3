package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/protocol"
)

// Serve speaks the protocol on in (requests) and out (responses and
// observations) until the host stops the provider (it returns nil), in ends
// (io.ErrUnexpectedEOF: the host went away without a stop), ctx ends, or the
// provider breaks the protocol in a way no frame can report (a run that
// fails or ends without a terminal observation). Each frame is written to out
// in one Write call.
func Serve(ctx context.Context, in io.Reader, out io.Writer, p Provider) error {
	s := &server{p: p, out: out, version: protocol.V1, fatal: make(chan error, 1)}
	if sp, ok := p.(StatefulProvider); ok {
		s.sp, s.version = sp, protocol.V2
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type lineOrErr struct {
		line []byte
		err  error
	}
	lines := make(chan lineOrErr)
	go func() {
		lr := protocol.NewLineReader(in, protocol.MaxFrameBytes)
		for {
			line, err := lr.Next()
			select {
			case lines <- lineOrErr{line, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer s.endRun("provider shutting down")
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-s.fatal:
			return err
		case l := <-lines:
			if l.err != nil {
				if errors.Is(l.err, io.EOF) {
					return io.ErrUnexpectedEOF
				}
				return fmt.Errorf("provider: reading a request: %w", l.err)
			}
			stop, err := s.handle(ctx, l.line)
			if err != nil || stop {
				return err
			}
		}
	}
}

type server struct {
	p       Provider
	sp      StatefulProvider
	version protocol.Version
	out     io.Writer
	fatal   chan error

	wmu sync.Mutex
	buf []byte

	loaded            bool
	module, impl      string
	observationSchema protocol.ContractRef

	run *Run
}

// handle answers one request; stop is true once "stopped" has been written.
func (s *server) handle(ctx context.Context, line []byte) (stop bool, err error) {
	req, err := protocol.DecodeRequest(line)
	if err != nil {
		// Without a decodable envelope there is nothing to correlate a
		// failure with: the host wrote a frame no host should write.
		return false, fmt.Errorf("provider: undecodable request: %w", err)
	}
	env := req.Envelope
	fail := func(code, format string, args ...any) (bool, error) {
		return false, s.respond(env, &protocol.Failed{Code: code, Message: fmt.Sprintf(format, args...)})
	}
	if err := req.Validate(s.version, nil); err != nil {
		if protocol.KindOf(err) == protocol.ErrInvalid && req.Payload != nil && !req.Payload.Operation().SupportedBy(s.version) {
			return fail("unsupported_operation", "%v", err)
		}
		return fail("invalid_request", "%v", err)
	}
	op := req.Payload.Operation()
	if !s.loaded {
		if op != protocol.OpLoad && op != protocol.OpStop {
			return fail("not_loaded", "%s before load", op)
		}
	} else if op == protocol.OpLoad {
		return fail("already_loaded", "the provider is loaded for %s/%s", s.module, s.impl)
	} else if env.Module != s.module || env.ImplementationID != s.impl {
		return fail("wrong_identity", "request for %s/%s, loaded as %s/%s", env.Module, env.ImplementationID, s.module, s.impl)
	}
	switch r := req.Payload.(type) {
	case *protocol.LoadRequest:
		load := &Load{Version: s.version, Module: env.Module, ImplementationID: env.ImplementationID, Request: r}
		if err := s.p.Load(ctx, load); err != nil {
			return false, s.respondError(env, err)
		}
		s.loaded, s.module, s.impl, s.observationSchema = true, env.Module, env.ImplementationID, r.ObservationSchema
		return false, s.respond(env, &protocol.Loaded{ProviderContract: r.ProviderContract, ObservationSchema: r.ObservationSchema})
	case *protocol.StartRequest:
		if s.run != nil && !s.run.finished() {
			return fail("run_active", "run %q is active", s.run.ID)
		}
		s.startRun(ctx, env, r)
		return false, nil
	case *protocol.CancelRequest:
		if s.run != nil && s.run.ID == r.RunID {
			s.endRun(r.Reason)
		}
		if err := s.p.Cancel(ctx, r.RunID, r.Reason); err != nil {
			return false, s.respondError(env, err)
		}
		return false, s.respond(env, &protocol.Cancelled{RunID: r.RunID})
	case *protocol.StopRequest:
		s.endRun(r.Reason)
		if st, ok := s.p.(Stopper); ok {
			if err := st.Stop(ctx, r.Reason); err != nil {
				return false, s.respondError(env, err)
			}
		}
		return true, s.respond(env, &protocol.Stopped{})
	}
	// State operations: protocol 2 only (Validate refused them for v1), never
	// while a run is active.
	if s.run != nil && !s.run.finished() {
		return fail("run_active", "run %q is active: quiesce before %s", s.run.ID, op)
	}
	switch r := req.Payload.(type) {
	case *protocol.SnapshotRequest:
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		lineage := Lineage{Module: s.module, RunID: r.RunID, Generation: r.Generation, Schema: r.StateSchema}
		raw, err := s.sp.Snapshot(sctx, lineage)
		if err != nil {
			return false, s.respondError(env, err)
		}
		st, err := s.state(raw, lineage)
		if err != nil {
			return false, s.respondError(env, err)
		}
		return false, s.respond(env, &protocol.Snapshotted{State: st})
	case *protocol.MigrateRequest:
		if err := r.Source.Validate(s.module, nil); err != nil {
			return fail("invalid_state", "%v", err)
		}
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		target := Lineage{Module: s.module, RunID: r.Source.RunID, Generation: r.TargetGeneration, Schema: r.Source.StateSchema}
		raw, err := s.sp.Migrate(sctx, &r.Source, target)
		if err != nil {
			return false, s.respondError(env, err)
		}
		st, err := s.state(raw, target)
		if err != nil {
			return false, s.respondError(env, err)
		}
		return false, s.respond(env, &protocol.Migrated{State: st})
	case *protocol.RestoreRequest:
		if err := r.State.Validate(s.module, nil); err != nil {
			return fail("invalid_state", "%v", err)
		}
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		if err := s.sp.Restore(sctx, &r.State); err != nil {
			return false, s.respondError(env, err)
		}
		return false, s.respond(env, &protocol.Restored{RunID: r.State.RunID, Generation: r.State.Generation, StateSchema: r.State.StateSchema, StateSHA256: r.State.StateSHA256})
	case *protocol.ReadinessRequest:
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		lineage := Lineage{Module: s.module, RunID: r.RunID, Generation: r.Generation, Schema: r.StateSchema}
		if err := s.sp.Readiness(sctx, lineage, r.StateSHA256); err != nil {
			return false, s.respondError(env, err)
		}
		return false, s.respond(env, &protocol.Ready{RunID: r.RunID, Generation: r.Generation, StateSchema: r.StateSchema, StateSHA256: r.StateSHA256})
	}
	return fail("invalid_request", "unsupported operation %s", op)
}

// state builds the State envelope around a provider's raw state: the SDK,
// never the provider, computes the digest.
func (s *server) state(raw jsontext.Value, lineage Lineage) (protocol.State, error) {
	if err := protocol.ValidPayload(raw, protocol.MaxStateBytes); err != nil {
		return protocol.State{}, &Error{Code: "invalid_state", Message: "the provider's state: " + err.Error()}
	}
	digest, err := protocol.StateDigest(raw)
	if err != nil {
		return protocol.State{}, &Error{Code: "invalid_state", Message: "the provider's state: " + err.Error()}
	}
	return protocol.State{
		Module: s.module, ImplementationID: s.impl, RunID: lineage.RunID, Generation: lineage.Generation,
		StateSchema: lineage.Schema, StateSHA256: digest, State: raw,
	}, nil
}

func withDeadlineMs(ctx context.Context, ms uint64) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
}

func (s *server) respond(env protocol.Envelope, payload protocol.ResponsePayload) error {
	return s.write(func(b []byte) ([]byte, error) {
		return protocol.AppendResponse(b, &protocol.Response{Envelope: env, Payload: payload})
	})
}

func (s *server) respondError(env protocol.Envelope, err error) error {
	var pe *Error
	f := &protocol.Failed{Code: "provider_error", Message: err.Error()}
	if errors.As(err, &pe) && pe.Code != "" {
		f.Code, f.Message = pe.Code, pe.Message
	}
	f.Code = truncateUTF8(f.Code, protocol.MaxFailedCodeBytes)
	f.Message = truncateUTF8(f.Message, protocol.MaxFailedMessageBytes)
	return s.respond(env, f)
}

// write encodes one frame and writes it, newline included, in one call.
func (s *server) write(encode func([]byte) ([]byte, error)) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	b, err := encode(s.buf[:0])
	if err != nil {
		return err
	}
	if len(b) > protocol.MaxFrameBytes {
		return fmt.Errorf("provider: frame of %d bytes exceeds %d", len(b), protocol.MaxFrameBytes)
	}
	b = append(b, '\n')
	if cap(b) <= 64<<10 {
		s.buf = b
	}
	_, err = s.out.Write(b)
	return err
}

func truncateUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	for max > 0 && !utf8.RuneStart(s[max]) {
		max--
	}
	return s[:max]
}

// Run is one run of a provider, handed to Start.
type Run struct {
	// ID is the host's run ID.
	ID string
	// CandidateSHA256 is the activation candidate the run is bound to.
	CandidateSHA256 string
	// Input is the run's input, raw JSON (strictly valid, at most 512 KiB).
	Input jsontext.Value
	// Deadline is when the host stops waiting for the terminal observation.
	Deadline time.Time

	s      *server
	env    protocol.Envelope
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	seq      uint64
	ended    bool // terminal emitted or cancelled: Emit refuses
	terminal bool
}

// Emit sends one observation (raw JSON in the module's observation schema);
// terminal ends the run. It returns ErrRunEnded after the terminal
// observation or once the host has cancelled the run.
func (r *Run) Emit(observation jsontext.Value, terminal bool) error {
	if err := protocol.ValidPayload(observation, protocol.MaxPayloadBytes); err != nil {
		return fmt.Errorf("provider: observation: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return ErrRunEnded
	}
	o := protocol.Observation{
		Protocol: r.env.Protocol, ImplementationID: r.env.ImplementationID, Module: r.env.Module,
		RunID: r.ID, Sequence: r.seq, Schema: r.s.observationSchema, Terminal: terminal, Observation: observation,
	}
	if err := r.s.write(func(b []byte) ([]byte, error) { return protocol.AppendObservation(b, &o) }); err != nil {
		return err
	}
	r.seq++
	if terminal {
		r.ended, r.terminal = true, true
	}
	return nil
}

// EmitValue marshals v with encoding/json/v2 semantics and emits it.
func (r *Run) EmitValue(v any, terminal bool) error {
	b, err := json.Marshal(v, json.Deterministic(true))
	if err != nil {
		return fmt.Errorf("provider: observation: %w", err)
	}
	return r.Emit(b, terminal)
}

// finished reports whether the run is over. A run that emitted its terminal
// observation is over for the host, which may send its next request at
// once, possibly before the run's Start has returned: wait for it to
// return, so that nothing the run does overlaps that request (and the
// request is not refused with run_active).
func (r *Run) finished() bool {
	r.mu.Lock()
	terminal := r.terminal
	r.mu.Unlock()
	if terminal {
		<-r.done
		return true
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (s *server) startRun(ctx context.Context, env protocol.Envelope, req *protocol.StartRequest) {
	deadline := time.Now().Add(time.Duration(req.DeadlineMs) * time.Millisecond)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	run := &Run{
		ID: req.RunID, CandidateSHA256: req.CandidateSHA256, Input: req.Input, Deadline: deadline,
		s: s, env: env, cancel: cancel, done: make(chan struct{}),
	}
	s.run = run
	if err := s.respond(env, &protocol.Started{RunID: req.RunID}); err != nil {
		cancel()
		close(run.done)
		s.reportFatal(err)
		return
	}
	go func() {
		defer close(run.done)
		defer cancel()
		err := s.p.Start(rctx, run)
		run.mu.Lock()
		cancelled, terminal := run.ended && !run.terminal, run.terminal
		run.ended = true
		run.mu.Unlock()
		switch {
		case cancelled:
		case err != nil:
			s.reportFatal(fmt.Errorf("provider: run %q failed: %w", run.ID, err))
		case !terminal:
			s.reportFatal(fmt.Errorf("provider: run %q returned without a terminal observation", run.ID))
		}
	}()
}

// endRun cancels the active run, if any, and waits for its Start to return:
// nothing the run emits can follow the answer to the request that ended it.
func (s *server) endRun(reason string) {
	run := s.run
	if run == nil {
		return
	}
	run.mu.Lock()
	run.ended = true
	run.mu.Unlock()
	run.cancel()
	<-run.done
	s.run = nil
}

func (s *server) reportFatal(err error) {
	select {
	case s.fatal <- err:
	default:
	}
}
