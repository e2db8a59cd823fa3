package procexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/protocol"
)

type pending struct {
	req   *protocol.Request
	reply chan *protocol.Response
}

// refuse checks, under p.mu, that op may be sent now.
func (p *Process) refuse(op protocol.Operation) error {
	if p.dying {
		return errDead
	}
	switch {
	case !op.SupportedBy(p.version):
		return &Fault{Kind: KindRefused, Op: string(op), Reason: reasons.UnsupportedVersion, Detail: fmt.Sprintf("%s is a state operation; a protocol-%d provider gets none", op, int(p.version))}
	case !p.loaded && op != protocol.OpLoad && op != protocol.OpStop:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: fmt.Sprintf("%s before load", op)}
	case p.loaded && op == protocol.OpLoad:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: "the provider is already loaded"}
	case op == protocol.OpStart && p.run != nil:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: fmt.Sprintf("run %q is active: one run at a time", p.run.ID)}
	case op.IsStateOperation() && p.run != nil:
		return &Fault{Kind: KindRefused, Op: string(op), Detail: fmt.Sprintf("run %q is active: quiesce before %s", p.run.ID, op)}
	}
	return nil
}

var errDead = errors.New("dead")

// deadErr is what a request to a dead process returns: its fault, or
// ErrClosed.
func (p *Process) deadErr() error {
	<-p.done
	if err := p.Err(); err != nil {
		return err
	}
	return ErrClosed
}

// exchange writes one request and waits for its correlated response. The
// response has been correlated (and its states' digests recomputed) by the
// reader; a failed result, a timeout or the caller giving up kill the group.
// run, for a start, becomes the active run as the request is written.
func (p *Process) exchange(ctx context.Context, payload protocol.RequestPayload, timeout time.Duration, run *Run) (*protocol.Response, error) {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	op := payload.Operation()
	p.mu.Lock()
	if err := p.refuse(op); err != nil {
		p.mu.Unlock()
		if err == errDead {
			return nil, p.deadErr()
		}
		return nil, err
	}
	p.nextID++
	req := &protocol.Request{
		Envelope: protocol.Envelope{Protocol: p.version.String(), RequestID: "host-" + strconv.FormatUint(p.nextID, 10),
			ImplementationID: p.plan.ImplementationID(), Module: p.plan.Module()},
		Payload: payload,
	}
	p.mu.Unlock()

	if err := req.Validate(p.version, &p.contracts); err != nil {
		return nil, &Fault{Kind: KindInvalidRequest, Op: string(op), Reason: invalidReason(err), Detail: "request refused before writing: " + err.Error(), Err: err}
	}
	// Encode into the process's buffer (requests are serialized by reqMu):
	// a 500 KiB input is not copied into a fresh allocation every time.
	line, err := protocol.AppendRequest(p.wbuf[:0], req)
	if err == nil && len(line) > protocol.MaxFrameBytes {
		err = fmt.Errorf("frame of %d bytes exceeds %d", len(line), protocol.MaxFrameBytes)
	}
	if err != nil {
		return nil, &Fault{Kind: KindInvalidRequest, Op: string(op), Reason: invalidReason(err), Detail: "request refused before writing: " + err.Error(), Err: err}
	}
	line = append(line, '\n')
	p.wbuf = line

	p.mu.Lock()
	if p.dying {
		p.mu.Unlock()
		return nil, p.deadErr()
	}
	if p.stdinBytes+int64(len(line)) > protocol.MaxStdinBytes {
		left := protocol.MaxStdinBytes - p.stdinBytes
		p.mu.Unlock()
		return nil, p.kill(&Fault{Kind: KindBudgetExhausted, Op: string(op), Detail: fmt.Sprintf("a %d-byte request exceeds the %d bytes of stdin left (8 MiB per process)", len(line), left)})
	}
	if op.IsStateOperation() {
		if p.stateOps >= protocol.MaxStateOperations {
			p.mu.Unlock()
			return nil, p.kill(&Fault{Kind: KindBudgetExhausted, Op: string(op), Detail: fmt.Sprintf("the process has had its %d state operations", protocol.MaxStateOperations)})
		}
		p.stateOps++
	}
	p.stdinBytes += int64(len(line))
	pend := &pending{req: req, reply: make(chan *protocol.Response, 1)}
	p.pending = pend
	if run != nil {
		run.deadline = time.Now().Add(timeout)
		p.run = run
	}
	p.mu.Unlock()

	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p.stdin.SetWriteDeadline(deadline)
	if trace := p.ex.cfg.Trace; trace != nil {
		trace(true, line[:len(line)-1])
	}
	if _, err := p.stdin.Write(line); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(op), Detail: fmt.Sprintf("the provider did not read the request within %v", timeout), Err: err})
		}
		if p.isDying() {
			return nil, p.deadErr()
		}
		return nil, p.kill(&Fault{Kind: KindExited, Op: string(op), Detail: "writing the request: " + err.Error(), Err: err})
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case resp := <-pend.reply:
		if run != nil {
			p.armRun(run)
		}
		return resp, nil
	case <-p.done:
		select {
		case resp := <-pend.reply:
			return resp, nil // answered, then died: the answer stands
		default:
		}
		return nil, p.deadErr()
	case <-timer.C:
		return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(op), Detail: fmt.Sprintf("no %s response within %v", op.Success(), timeout)})
	case <-ctx.Done():
		return nil, p.kill(&Fault{Kind: KindTimeout, Op: string(op), Detail: "the caller gave up waiting for the response: " + ctx.Err().Error(), Err: ctx.Err()})
	}
}

func invalidReason(err error) string {
	if protocol.KindOf(err) == protocol.ErrMismatch {
		return reasons.VerificationFailed
	}
	return reasons.SchemaMismatch
}

// armRun starts the run's deadline timer once the provider has answered
// started.
func (p *Process) armRun(run *Run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.run != run {
		return // already over
	}
	run.timer = time.AfterFunc(time.Until(run.deadline), func() {
		p.mu.Lock()
		active := p.run == run
		p.mu.Unlock()
		if active {
			p.fail(&Fault{Kind: KindTimeout, Op: OpRun, Detail: fmt.Sprintf("run %q: no terminal observation within its deadline", run.ID)})
		}
	})
}

// currentOp names what the process was doing, for faults found by the
// reader and the exit watcher.
func (p *Process) currentOp() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pending != nil:
		return string(p.pending.req.Payload.Operation())
	case p.run != nil:
		return OpRun
	default:
		return OpIdle
	}
}

// readStdout reads frames until EOF or the first fault.
func (p *Process) readStdout() {
	defer close(p.stdoutDone)
	lr := protocol.NewLineReader(p.stdout, protocol.MaxFrameBytes)
	for {
		line, err := lr.Next()
		if err != nil {
			p.mu.Lock()
			expected := p.stopping || p.dying
			p.mu.Unlock()
			switch {
			case expected:
			case errors.Is(err, io.EOF):
				p.fail(&Fault{Kind: KindExited, Op: p.currentOp(), Detail: "the provider closed stdout"})
			case protocol.KindOf(err) == protocol.ErrTooLarge:
				p.fail(&Fault{Kind: KindOversized, Op: p.currentOp(), Detail: err.Error(), Err: err})
			case protocol.KindOf(err) == protocol.ErrMalformed:
				p.fail(&Fault{Kind: KindMalformedFrame, Op: p.currentOp(), Detail: err.Error(), Err: err})
			case errors.Is(err, os.ErrClosed):
			default:
				p.fail(&Fault{Kind: KindExited, Op: p.currentOp(), Detail: "reading stdout: " + err.Error(), Err: err})
			}
			return
		}
		if trace := p.ex.cfg.Trace; trace != nil {
			trace(false, line)
		}
		if f := p.handleLine(line); f != nil {
			if f.At.IsZero() {
				f.At = time.Now()
			}
			p.fail(f)
			return
		}
	}
}

// handleLine accounts, decodes and dispatches one stdout frame.
func (p *Process) handleLine(line []byte) *Fault {
	p.mu.Lock()
	if run := p.run; run != nil {
		run.stdoutBytes += int64(len(line)) + 1
		if run.stdoutBytes > p.limits.StdoutBytes {
			p.mu.Unlock()
			return &Fault{Kind: KindOutputOverflow, Op: OpRun, Frame: evidence(line),
				Detail: fmt.Sprintf("run %q wrote %d stdout bytes, more than evidence_limits.stdout_bytes %d", run.ID, run.stdoutBytes, p.limits.StdoutBytes)}
		}
	}
	p.mu.Unlock()
	frame, err := protocol.DecodeFrame(line)
	if err != nil {
		kind := KindMalformedFrame
		if protocol.KindOf(err) == protocol.ErrTooLarge {
			kind = KindOversized
		}
		return &Fault{Kind: kind, Op: p.currentOp(), Frame: evidence(line), Detail: err.Error(), Err: err}
	}
	if frame.Response != nil {
		return p.onResponse(frame.Response, line)
	}
	return p.onObservation(frame.Observation, line)
}

func (p *Process) onResponse(resp *protocol.Response, line []byte) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	pend := p.pending
	if pend == nil {
		return &Fault{Kind: KindMiscorrelated, Op: OpIdle, Frame: evidence(line), Detail: "a response while no request is outstanding"}
	}
	op := pend.req.Payload.Operation()
	if err := protocol.Correlate(pend.req, resp, &p.contracts); err != nil {
		kind := KindMiscorrelated
		switch protocol.KindOf(err) {
		case protocol.ErrTooLarge:
			kind = KindOversized
		case protocol.ErrMalformed:
			kind = KindMalformedFrame
		}
		return &Fault{Kind: kind, Op: string(op), Frame: evidence(line), Detail: err.Error(), Err: err}
	}
	if f, ok := resp.Payload.(*protocol.Failed); ok {
		return &Fault{Kind: KindProviderFailed, Op: string(op), Code: f.Code, Message: f.Message, Frame: evidence(line),
			Detail: f.Code + ": " + f.Message}
	}
	p.pending = nil
	switch r := pend.req.Payload.(type) {
	case *protocol.LoadRequest:
		p.loaded = true
	case *protocol.CancelRequest:
		if p.run != nil && p.run.ID == r.RunID {
			p.run.finish(nil, ErrRunCancelled)
			p.run = nil
		}
	case *protocol.StopRequest:
		p.stopping = true
		if p.run != nil {
			p.run.finish(nil, ErrRunCancelled)
			p.run = nil
		}
	}
	pend.reply <- resp
	return nil
}

func (p *Process) onObservation(o *protocol.Observation, line []byte) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	run := p.run
	want := protocol.ObservationExpectation{
		Protocol: p.version.String(), ImplementationID: p.plan.ImplementationID(), Module: p.plan.Module(),
		Schema: p.contracts.Observation,
	}
	if run != nil {
		want.RunID, want.LastSequence, want.HaveLast = run.ID, run.lastSeq, run.count > 0
	}
	if err := protocol.CheckObservation(o, want); err != nil {
		kind := KindBadObservation
		if protocol.KindOf(err) == protocol.ErrTooLarge {
			kind = KindOversized
		}
		return &Fault{Kind: kind, Op: OpRun, Frame: evidence(line), Detail: err.Error(), Err: err}
	}
	run.count++
	if run.count > p.limits.Observations {
		return &Fault{Kind: KindOutputOverflow, Op: OpRun, Frame: evidence(line),
			Detail: fmt.Sprintf("run %q sent %d observations, more than evidence_limits.observations %d", run.ID, run.count, p.limits.Observations)}
	}
	run.lastSeq = o.Sequence
	run.deliver(o)
	if o.Terminal {
		run.finish(o, nil)
		p.run = nil
	}
	return nil
}
