// Package probe runs an activation's synthetic probes on the node: one call
// to a module through the node's own dispatcher, its answer checked by a
// CEL condition within a latency bound. The node's manager runs them once
// every module serves its desired generation and before it reports the
// activation Ready, and writes the outcomes in the status it writes anyway.
//
// What holds:
//
//   - A probe is admitted only on a module whose admitted capabilities are
//     read_only or none (Admit): a probe has no side effects and leaves no
//     receipts. A spec whose probe names any other module, or whose check
//     does not compile, is refused before anything changes on the node.
//   - A probe never waits longer than its timeout, the module's queue
//     included; a slower answer fails it with the time it took.
//   - What a probe records is bounded (the answer at most 256 bytes, the
//     message at most 512), whatever the module answers.
//
// The call path is the only thing this package needs of the node: an
// Invoke function (Dispatch makes one from the coordinator's dispatchers).
package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/fleet/analysis"
	"iteron.dev/operator/pkg/protocol"
)

// Bounds of a probe's status.
const (
	maxResult  = 256
	maxMessage = 512
	// DefaultTimeout is a probe's timeout when its spec gives none.
	DefaultTimeout = 5 * time.Second
)

// Answer is what a call answered: the terminal observation and the
// generation that served it.
type Answer struct {
	Body       []byte
	Generation string
}

// Invoke calls module once with input, the call (its wait included) bounded
// by deadline.
type Invoke func(ctx context.Context, module string, input []byte, deadline time.Time) (Answer, error)

// Admit checks probes against the modules' admitted capabilities
// (admitted returns them, or false while a module has no verified plan
// yet: its probes are checked once it has one). The error names the field.
func Admit(probes []iteronv1.ActivationProbe, admitted func(module string) ([]string, bool)) error {
	for i, p := range probes {
		field := fmt.Sprintf("spec.probes[%d]", i)
		if _, err := analysis.Compile(analysis.KindProbe, p.Check); err != nil {
			return fmt.Errorf("%s.check: %q %v", field, p.Check, err)
		}
		var in map[string]json.RawMessage
		if err := json.Unmarshal([]byte(p.Input), &in); err != nil {
			return fmt.Errorf("%s.input: not a JSON object: %v", field, err)
		}
		caps, known := admitted(p.Module)
		if !known {
			continue
		}
		if slices.ContainsFunc(caps, func(c string) bool { return c != "read_only" }) {
			return fmt.Errorf("%s.module: module %s is admitted with capabilities [%s]; a probe runs only on a module admitted read_only alone (it must have no side effects or receipts)",
				field, p.Module, strings.Join(caps, ", "))
		}
	}
	return nil
}

// Run runs one probe: the call within its timeout, then its check over the
// answer. The status it returns has no GenerationName or SpecGeneration
// (the caller's to fill) but for the generation that answered.
func Run(ctx context.Context, p iteronv1.ActivationProbe, invoke Invoke, now func() time.Time) iteronv1.ProbeStatus {
	timeout := DefaultTimeout
	if t := ptr.Deref(p.TimeoutMilliseconds, 0); t > 0 {
		timeout = time.Duration(t) * time.Millisecond
	}
	start := now()
	st := iteronv1.ProbeStatus{Name: p.Name, Module: p.Module, At: metav1.NewTime(start), Phase: iteronv1.ProbeFailed}
	fail := func(format string, args ...any) iteronv1.ProbeStatus {
		st.Message = analysis.Bounded(fmt.Sprintf(format, args...), maxMessage)
		return st
	}
	cond, err := analysis.Compile(analysis.KindProbe, p.Check)
	if err != nil {
		return fail("check %q %v", p.Check, err)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	ans, err := invoke(cctx, p.Module, []byte(p.Input), start.Add(timeout))
	cancel()
	took := now().Sub(start)
	st.LatencyMilliseconds, st.GenerationName = took.Milliseconds(), ans.Generation
	st.Result = analysis.Bounded(string(ans.Body), maxResult)
	switch {
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || took >= timeout):
		return fail("no answer within %s (timeoutMilliseconds %d): %v", timeout, timeout.Milliseconds(), err)
	case err != nil:
		return fail("the call failed: %v", err)
	case took > timeout:
		return fail("answered in %s, beyond its timeout of %s", took.Round(time.Millisecond), timeout)
	}
	var result any
	if err := json.Unmarshal(ans.Body, &result); err != nil {
		return fail("the answer is not JSON: %v", err)
	}
	ok, err := cond.Eval(map[string]any{"result": result})
	switch {
	case err != nil:
		return fail("check %s could not be evaluated over the answer: %v", p.Check, err)
	case !ok:
		return fail("check %s is false for the answer %s", p.Check, st.Result)
	}
	st.Phase, st.Message = iteronv1.ProbePassed, analysis.Bounded(fmt.Sprintf("check %s is true (%d ms)", p.Check, st.LatencyMilliseconds), maxMessage)
	return st
}

var probeCalls atomic.Uint64

// Dispatch is the Invoke of activation namespace/name on this node: each
// call goes through the module's dispatcher, as a gateway call does (its
// queue, its current generation), under a run ID of its own.
func Dispatch(lookup func(namespace, name, module string) (*dispatch.Dispatcher, error), namespace, name string) Invoke {
	return func(ctx context.Context, module string, input []byte, deadline time.Time) (Answer, error) {
		d, err := lookup(namespace, name, module)
		if err != nil {
			return Answer{}, err
		}
		payload, err := protocol.NewPayload(input)
		if err != nil {
			return Answer{}, fmt.Errorf("input: %w", err)
		}
		id := fmt.Sprintf("probe-%s-%d-%d", module, time.Now().UnixNano(), probeCalls.Add(1))
		res, err := d.Invoke(ctx, dispatch.Call{ID: id, Input: payload, Deadline: deadline})
		if err != nil {
			return Answer{Generation: res.Name}, err
		}
		return Answer{Body: res.Terminal.Body, Generation: res.Name}, nil
	}
}

// Due reports whether a probe must run (again) for the generation that
// serves its module now and the activation's spec generation: it has no
// outcome for them, or a retry was asked for since.
func Due(p iteronv1.ActivationProbe, last []iteronv1.ProbeStatus, generation string, specGeneration int64) bool {
	i := slices.IndexFunc(last, func(s iteronv1.ProbeStatus) bool { return s.Name == p.Name })
	return i < 0 || last[i].GenerationName != generation || last[i].SpecGeneration != specGeneration || last[i].Module != p.Module
}
