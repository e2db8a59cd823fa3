// Package conformance drives one provider executable through the whole
// protocol, exactly as the executor runs a verified provider, and reports
// every violation with the operation and the offending frame. It is the
// logic of `kubectl iteron conformance`.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// Options tune a conformance run.
type Options struct {
	// Timeout bounds each operation (and each run). Default 5s.
	Timeout time.Duration
	// Input is the input of the observed run; default {}.
	Input jsontext.Value
	// CancelInput is the input of the cancelled run; default Input.
	CancelInput jsontext.Value
}

// Step is one operation that was performed.
type Step struct {
	Op       string
	OK       bool
	Detail   string
	Duration time.Duration
}

// Violation is one way the provider broke the protocol.
type Violation struct {
	// Op is the operation during which it was found.
	Op string
	// Kind names the violation: mis-correlation, malformed frame, wrong
	// schema, sequence regression, wrong run, timeout, non-zero exit,
	// process left behind, provider failed, oversized, output overflow,
	// stderr overflow, exited, …
	Kind string
	// Detail says what was wrong, with the JSON field path where there is one.
	Detail string
	// Frame is the offending frame (at most 1 KiB), if any.
	Frame []byte
}

// Report is the outcome of a conformance run.
type Report struct {
	Steps      []Step
	Violations []Violation
	// Exit is how the provider process ended.
	Exit procexec.Exit
	// StderrTail is the newest stderr the provider wrote.
	StderrTail []byte
	// Sandbox is what the provider's sandbox applied ("" without one).
	Sandbox string
}

// Conformant reports whether no violation was found.
func (r *Report) Conformant() bool { return len(r.Violations) == 0 }

// Run launches plan with ex and drives it: load; start with Input and
// observe to the terminal observation; start a second run and cancel it; for
// protocol 2 snapshot, migrate (its own state, to the next lineage),
// restore and readiness; then stop. A fault ends the run (the process is
// gone); everything else is checked to the end.
func Run(ctx context.Context, ex *procexec.Executor, plan verifier.LaunchPlan, opts Options) *Report {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if len(opts.Input) == 0 {
		opts.Input = jsontext.Value(`{}`)
	}
	if len(opts.CancelInput) == 0 {
		opts.CancelInput = opts.Input
	}
	rep := &Report{}
	p, err := ex.Launch(plan)
	if err != nil {
		rep.violation("spawn", err)
		return rep
	}
	defer p.Close()
	if ev, ok := p.Sandbox(); ok {
		rep.Sandbox = ev.String()
	}
	c := &conformer{rep: rep, p: p, timeout: opts.Timeout}
	ok := c.step(ctx, "load", func(ctx context.Context) (string, error) {
		l, err := p.Load(ctx)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("provider %s, observations %s", l.ProviderContract.ID, l.ObservationSchema.ID), nil
	}) && c.step(ctx, "start", func(ctx context.Context) (string, error) {
		run, err := p.Start(ctx, "conformance-1", opts.Input, opts.Timeout)
		if err != nil {
			return "", err
		}
		n := 0
		for range run.Observations() {
			n++
		}
		last, err := run.Result()
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("run conformance-1: %d observation(s), terminal at sequence %d", n, last.Sequence), nil
	}) && c.step(ctx, "cancel", func(ctx context.Context) (string, error) {
		run, err := p.Start(ctx, "conformance-2", opts.CancelInput, opts.Timeout)
		if err != nil {
			return "", err
		}
		if err := p.Cancel(ctx, "conformance-2", "conformance check"); err != nil {
			return "", err
		}
		if _, err := run.Result(); errors.Is(err, procexec.ErrRunCancelled) {
			return "run conformance-2 cancelled", nil
		} else if err != nil {
			return "", err
		}
		return "run conformance-2 had already ended; cancel answered", nil
	})
	if ok && p.Version() == protocol.V2 {
		var snap, migrated protocol.State
		ok = c.step(ctx, "snapshot", func(ctx context.Context) (string, error) {
			snap, err = p.Snapshot(ctx, 1, opts.Timeout)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("lineage %d, %d bytes, %s", snap.Generation, len(snap.State), snap.StateSHA256), nil
		}) && c.step(ctx, "migrate", func(ctx context.Context) (string, error) {
			migrated, err = p.Migrate(ctx, snap, opts.Timeout)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("lineage %d → %d, %s", snap.Generation, migrated.Generation, migrated.StateSHA256), nil
		}) && c.step(ctx, "restore", func(ctx context.Context) (string, error) {
			r, err := p.Restore(ctx, migrated, opts.Timeout)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("lineage %d, %s", r.Generation, r.StateSHA256), nil
		}) && c.step(ctx, "readiness", func(ctx context.Context) (string, error) {
			r, err := p.Readiness(ctx, migrated.Generation, migrated.StateSHA256, opts.Timeout)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("ready at lineage %d, %s", r.Generation, r.StateSHA256), nil
		})
	}
	if ok {
		c.step(ctx, "stop", func(ctx context.Context) (string, error) {
			if err := p.Stop(ctx, "conformance check done"); err != nil {
				return "", err
			}
			return p.Teardown().Exit.String(), nil
		})
	}
	p.Close()
	td := p.Teardown()
	rep.Exit = td.Exit
	rep.StderrTail = p.StderrTail()
	if len(td.LeftBehind) > 0 {
		rep.Violations = append(rep.Violations, Violation{Op: "stop", Kind: "process left behind",
			Detail: fmt.Sprintf("the provider exited but left %d process(es) in its group: %v (killed)", len(td.LeftBehind), td.LeftBehind)})
	}
	if left := p.Remaining(); len(left) > 0 {
		rep.Violations = append(rep.Violations, Violation{Op: "stop", Kind: "process left behind",
			Detail: fmt.Sprintf("processes %v are still in the group after the teardown", left)})
	}
	if escaped := procexec.ReapOrphans(); len(escaped) > 0 {
		rep.Violations = append(rep.Violations, Violation{Op: "stop", Kind: "process left behind",
			Detail: fmt.Sprintf("%d descendant(s) left the provider's process group (setsid) and outlived it: %v (killed)", len(escaped), escaped)})
	}
	if d := p.StderrDropped(); d > 0 {
		rep.Violations = append(rep.Violations, Violation{Op: "stderr", Kind: "stderr overflow",
			Detail: fmt.Sprintf("the provider wrote %d stderr bytes more than evidence_limits.stderr_bytes (%d) keeps", d, plan.EvidenceLimits().StderrBytes)})
	}
	return rep
}

type conformer struct {
	rep     *Report
	p       *procexec.Process
	timeout time.Duration
}

// step runs one operation under the per-operation timeout and records it;
// it returns false when the operation failed (the process is then gone).
func (c *conformer) step(ctx context.Context, op string, fn func(context.Context) (string, error)) bool {
	ctx, cancel := context.WithTimeout(ctx, c.timeout+c.timeout/2)
	defer cancel()
	t0 := time.Now()
	detail, err := fn(ctx)
	s := Step{Op: op, OK: err == nil, Detail: detail, Duration: time.Since(t0)}
	c.rep.Steps = append(c.rep.Steps, s)
	if err != nil {
		c.rep.violation(op, err)
		return false
	}
	return true
}

func (r *Report) violation(op string, err error) {
	v := Violation{Op: op, Kind: "error", Detail: err.Error()}
	if f, ok := procexec.AsFault(err); ok {
		v.Kind, v.Detail, v.Frame = classify(f), f.Detail, f.Frame
		if f.Op != "" && f.Op != op {
			v.Detail = f.Op + ": " + v.Detail
		}
	}
	r.Violations = append(r.Violations, v)
}

// classify names a fault the way a provider author thinks of it.
func classify(f *procexec.Fault) string {
	var pe *protocol.Error
	pointer := ""
	if errors.As(f.Err, &pe) {
		pointer = pe.Pointer
	}
	switch f.Kind {
	case procexec.KindMiscorrelated:
		if strings.HasSuffix(pointer, "schema") {
			return "wrong schema"
		}
		return "mis-correlation"
	case procexec.KindBadObservation:
		switch {
		case strings.HasSuffix(pointer, "/sequence"):
			return "sequence regression"
		case strings.HasSuffix(pointer, "/schema"):
			return "wrong schema"
		case strings.HasSuffix(pointer, "/run_id"):
			return "wrong run"
		}
		return "bad observation"
	case procexec.KindExited:
		if f.Op == string(protocol.OpStop) {
			return "non-zero exit"
		}
		return "exited"
	}
	return f.Kind.String()
}
