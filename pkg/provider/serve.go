package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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
	// Requests are read and handled by one goroutine at a time, with no
	// hand-off between reading and answering; a start runs the run itself,
	// at once, and hands reading over to a new goroutine once "started" is
	// written (the host sends nothing before that). Serve only waits for
	// the reading to end, a fatal run error or ctx. (After a fatal error or
	// ctx, the reader ends when in does: a provider process exits.)
	loop := make(chan error, 1)
	go s.readLoop(ctx, protocol.NewLineReader(in, protocol.MaxFrameBytes), loop)
	select {
	case err := <-loop:
		return err
	case err := <-s.fatal:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readLoop reads and handles requests until the provider stops, in ends, or
// a start hands the reading to a new readLoop (this goroutine then runs the
// run).
func (s *server) readLoop(ctx context.Context, lr *protocol.LineReader, loop chan<- error) {
	for {
		line, err := lr.Next()
		if err != nil {
			s.endRun("provider shutting down")
			if errors.Is(err, io.EOF) {
				loop <- io.ErrUnexpectedEOF
			} else {
				loop <- fmt.Errorf("provider: reading a request: %w", err)
			}
			return
		}
		if ctx.Err() != nil {
			s.endRun("provider shutting down")
			loop <- ctx.Err()
			return
		}
		s.nextReader = func() { go s.readLoop(ctx, lr, loop) }
		stop, run, err := s.handle(ctx, line)
		if run != nil {
			run()
			return
		}
		if err != nil || stop {
			s.endRun("provider shutting down")
			loop <- err
			return
		}
	}
}

type server struct {
	p       Provider
	sp      StatefulProvider
	version protocol.Version
	out     io.Writer
	fatal   chan error

	// wmu guards wbuf, the frames not yet written. A start's "started" is
	// held there (holdNext) until the next frame is written (the run's
	// first observation, usually) or a short timer: a quick run then
	// crosses the pipe in one write and wakes the host once.
	wmu      sync.Mutex
	wbuf     []byte
	holdNext bool
	// afterFlush, for a start, starts the next reader once "started" is
	// written: the host sends nothing before it has read "started", and
	// the run's first frame is not delayed by starting a goroutine.
	afterFlush func()
	// nextReader starts a reader that continues where the current one
	// stopped (set before each request is handled).
	nextReader func()

	loaded            bool
	module, impl      string
	observationSchema protocol.ContractRef

	run *Run
}

// handle answers one request; stop is true once "stopped" has been written;
// run, for a start, is the run to perform (by the caller, at once).
func (s *server) handle(ctx context.Context, line []byte) (stop bool, run func(), err error) {
	req, err := protocol.DecodeRequest(line)
	if err != nil {
		// Without a decodable envelope there is nothing to correlate a
		// failure with: the host wrote a frame no host should write.
		return false, nil, fmt.Errorf("provider: undecodable request: %w", err)
	}
	env := req.Envelope
	fail := func(code, format string, args ...any) (bool, func(), error) {
		return false, nil, s.respond(env, &protocol.Failed{Code: code, Message: fmt.Sprintf(format, args...)})
	}
	if err := req.Validate(s.version, nil); err != nil {
		var pe *protocol.Error
		errors.As(err, &pe)
		switch {
		case req.Payload != nil && !req.Payload.Operation().SupportedBy(s.version):
			return fail("unsupported_operation", "%v", err)
		case pe != nil && (strings.HasPrefix(pe.Pointer, "/payload/state") || strings.HasPrefix(pe.Pointer, "/payload/source")):
			// A state whose digest, lineage or size is wrong never reaches
			// the provider.
			return fail("invalid_state", "%v", err)
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
			return false, nil, s.respondError(env, err)
		}
		s.loaded, s.module, s.impl, s.observationSchema = true, env.Module, env.ImplementationID, r.ObservationSchema
		return false, nil, s.respond(env, &protocol.Loaded{ProviderContract: r.ProviderContract, ObservationSchema: r.ObservationSchema})
	case *protocol.StartRequest:
		if s.run != nil && !s.run.finished() {
			return fail("run_active", "run %q is active", s.run.ID)
		}
		return false, s.startRun(ctx, env, r), nil
	case *protocol.CancelRequest:
		if s.run != nil && s.run.ID == r.RunID {
			s.endRun(r.Reason)
		}
		if err := s.p.Cancel(ctx, r.RunID, r.Reason); err != nil {
			return false, nil, s.respondError(env, err)
		}
		return false, nil, s.respond(env, &protocol.Cancelled{RunID: r.RunID})
	case *protocol.StopRequest:
		s.endRun(r.Reason)
		if st, ok := s.p.(Stopper); ok {
			if err := st.Stop(ctx, r.Reason); err != nil {
				return false, nil, s.respondError(env, err)
			}
		}
		return true, nil, s.respond(env, &protocol.Stopped{})
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
			return false, nil, s.respondError(env, err)
		}
		st, err := s.state(raw, lineage)
		if err != nil {
			return false, nil, s.respondError(env, err)
		}
		return false, nil, s.respond(env, &protocol.Snapshotted{State: st})
	case *protocol.MigrateRequest:
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		target := Lineage{Module: s.module, RunID: r.Source.RunID, Generation: r.TargetGeneration, Schema: r.Source.StateSchema}
		raw, err := s.sp.Migrate(sctx, &r.Source, target)
		if err != nil {
			return false, nil, s.respondError(env, err)
		}
		st, err := s.state(raw, target)
		if err != nil {
			return false, nil, s.respondError(env, err)
		}
		return false, nil, s.respond(env, &protocol.Migrated{State: st})
	case *protocol.RestoreRequest:
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		if err := s.sp.Restore(sctx, &r.State); err != nil {
			return false, nil, s.respondError(env, err)
		}
		return false, nil, s.respond(env, &protocol.Restored{RunID: r.State.RunID, Generation: r.State.Generation, StateSchema: r.State.StateSchema, StateSHA256: r.State.StateSHA256})
	case *protocol.ReadinessRequest:
		sctx, cancel := withDeadlineMs(ctx, r.DeadlineMs)
		defer cancel()
		lineage := Lineage{Module: s.module, RunID: r.RunID, Generation: r.Generation, Schema: r.StateSchema}
		if err := s.sp.Readiness(sctx, lineage, r.StateSHA256); err != nil {
			return false, nil, s.respondError(env, err)
		}
		return false, nil, s.respond(env, &protocol.Ready{RunID: r.RunID, Generation: r.Generation, StateSchema: r.StateSchema, StateSHA256: r.StateSHA256})
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

// write encodes one frame and writes it, newline included, in one call
// (with the frames held before it, if any).
func (s *server) write(encode func([]byte) ([]byte, error)) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	n := len(s.wbuf)
	b, err := encode(s.wbuf)
	if err != nil {
		s.wbuf = s.wbuf[:n]
		return err
	}
	if len(b)-n > protocol.MaxFrameBytes {
		s.wbuf = s.wbuf[:n]
		return fmt.Errorf("provider: frame of %d bytes exceeds %d", len(b)-n, protocol.MaxFrameBytes)
	}
	s.wbuf = append(b, '\n')
	if s.holdNext {
		// This is a "started": keep it for the run's first frame.
		s.holdNext = false
		return nil
	}
	return s.flushLocked()
}

func (s *server) flushLocked() error {
	if f := s.afterFlush; f != nil {
		// Whether or not the write succeeds: a reader that finds in
		// closed ends Serve.
		s.afterFlush = nil
		defer f()
	}
	if len(s.wbuf) == 0 {
		return nil
	}
	_, err := s.out.Write(s.wbuf)
	s.wbuf = s.wbuf[:0] // kept: frames are bounded (a held one and one more)
	return err
}

// release writes a held frame, if any.
func (s *server) release() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.flushLocked()
}

// holdStarted bounds how long "started" waits for the run's first
// observation.
const holdStarted = 200 * time.Microsecond

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
//
// The observation's bytes are sent as they are (compacted only if they span
// lines); they are not parsed here: the host parses every observation
// strictly, and one that is not a single strict JSON value is a protocol
// fault that ends the provider. EmitValue cannot produce one.
func (r *Run) Emit(observation jsontext.Value, terminal bool) error {
	if len(observation) == 0 {
		return fmt.Errorf("provider: observation: empty")
	}
	if len(observation) > protocol.MaxPayloadBytes {
		return fmt.Errorf("provider: observation of %d bytes exceeds %d", len(observation), protocol.MaxPayloadBytes)
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

// finished reports whether the run is over for the protocol: its terminal
// observation is written (its Start may still be returning), or its Start
// has returned.
func (r *Run) finished() bool {
	r.mu.Lock()
	terminal := r.terminal
	r.mu.Unlock()
	if terminal {
		return true
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// startRun answers started (held for the run's first frame) and returns
// the run's body, for the caller to run.
func (s *server) startRun(ctx context.Context, env protocol.Envelope, req *protocol.StartRequest) func() {
	deadline := time.Now().Add(time.Duration(req.DeadlineMs) * time.Millisecond)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	run := &Run{
		ID: req.RunID, CandidateSHA256: req.CandidateSHA256, Input: req.Input, Deadline: deadline,
		s: s, env: env, cancel: cancel, done: make(chan struct{}),
	}
	s.run = run
	s.wmu.Lock()
	s.holdNext, s.afterFlush = true, s.nextReader
	s.wmu.Unlock()
	if err := s.respond(env, &protocol.Started{RunID: req.RunID}); err != nil {
		s.wmu.Lock()
		s.holdNext, s.afterFlush = false, nil // the caller goes on reading
		s.wmu.Unlock()
		s.release()
		cancel()
		close(run.done)
		s.reportFatal(err)
		return nil
	}
	// "started" waits in the buffer for the run's first observation (which
	// writes both at once), or for this timer, whichever comes first.
	hold := time.AfterFunc(holdStarted, func() {
		if err := s.release(); err != nil {
			s.reportFatal(err)
		}
	})
	return func() {
		defer close(run.done)
		defer s.release() // a run that ends without emitting
		defer hold.Stop()
		defer cancel()
		err := s.p.Start(rctx, run)
		run.mu.Lock()
		cancelled, terminal := run.ended && !run.terminal, run.terminal
		run.ended = true
		run.mu.Unlock()
		// A held "started" is written before Serve can return below: the
		// host then sees the run start and the provider end, in that order.
		s.release()
		switch {
		case cancelled, terminal:
			// Over for the host: what Start returns afterwards changes
			// nothing it has seen.
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			// The run outlived its deadline: the host times it out (and
			// stops this provider); exiting first would only blur why.
		case err != nil:
			s.reportFatal(fmt.Errorf("provider: run %q failed: %w", run.ID, err))
		case !terminal:
			s.reportFatal(fmt.Errorf("provider: run %q returned without a terminal observation", run.ID))
		}
	}
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
