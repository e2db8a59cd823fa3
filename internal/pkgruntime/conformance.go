package pkgruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	caminopb "iteron.dev/operator/api/quixos/camino"
)

// ConformanceCheck is one step of a conformance run and how it went.
type ConformanceCheck struct {
	// Name says what was checked ("invoke put", "watch watch: first event").
	Name string
	// Passed reports whether the runtime did what the contract says.
	Passed bool
	// Detail says what was wrong (or, when passed, what was seen).
	Detail string
	// Offending is the runtime's message that broke the contract, as JSON,
	// or "".
	Offending string
}

// ConformanceInput says how to exercise a runtime: the input of each export
// to invoke, and of each export to watch.
type ConformanceInput struct {
	// Invoke maps an export to the input object to invoke it with.
	Invoke map[string]map[string]*caminopb.Value
	// Watch maps an export to the input object to watch it with.
	Watch map[string]map[string]*caminopb.Value
	// Namespace is the caller namespace the grants name.
	Namespace string
}

// Conform drives a handshaken runtime through the contract: Invoke of each
// export in in.Invoke and GetInvocationStatus of it, Watch of each export in
// in.Watch to its first event and CancelInvocation of it (the stream must
// end within deadlines.cancel_ms), and the status of an invocation the
// runtime never saw. The handshake itself was checked by Dial.
func Conform(ctx context.Context, c *Conn, in ConformanceInput) []ConformanceCheck {
	checks := []ConformanceCheck{{Name: "handshake", Passed: true, Detail: "instance " + c.InstanceID() + ": revision, protocol, exports, capabilities and proof as pinned"}}
	add := func(name string, err error, offending proto.Message, passDetail string) {
		ch := ConformanceCheck{Name: name, Passed: err == nil, Detail: passDetail}
		if err != nil {
			ch.Detail = err.Error()
			if offending != nil && offending.ProtoReflect().IsValid() {
				ch.Offending = protojson.Format(offending)
			}
		}
		checks = append(checks, ch)
	}
	for _, export := range sortedKeys(in.Invoke) {
		call := Call{Export: export, Input: in.Invoke[export], Namespace: in.Namespace}
		resp, id, err := c.Invoke(ctx, call)
		detail := ""
		if err == nil {
			detail = fmt.Sprintf("ok=%v", resp.GetOk())
			if !resp.GetOk() {
				detail += ", error " + fmt.Sprintf("%q", resp.GetError())
			}
		}
		add("invoke "+export, err, resp, detail)
		if err != nil {
			continue
		}
		st, err := c.Status(ctx, id)
		want := "completed"
		if !resp.GetOk() {
			want = "failed"
		}
		if err == nil && st != want && st != "completed" && st != "failed" {
			err = fmt.Errorf("state %q after the call returned ok=%v; want %q", st, resp.GetOk(), want)
		}
		add("status of invoke "+export, err, nil, "state "+st)
	}
	for _, export := range sortedKeys(in.Watch) {
		conformWatch(ctx, c, export, in.Watch[export], in.Namespace, add)
	}
	st, err := c.Status(ctx, "inv-conformance-never-issued")
	if err == nil && st != "unknown" {
		err = fmt.Errorf("state %q for an invocation the runtime never saw; want unknown", st)
	}
	add("status of an unseen invocation", err, nil, "state "+st)
	return checks
}

func conformWatch(ctx context.Context, c *Conn, export string, input map[string]*caminopb.Value, ns string,
	add func(string, error, proto.Message, string)) {
	name := "watch " + export
	w, err := c.Watch(ctx, Call{Export: export, Input: input, Namespace: ns})
	if err != nil {
		add(name, err, nil, "")
		return
	}
	defer w.Close()
	wctx, cancel := context.WithTimeout(ctx, ms(c.pin.Manifest.Deadlines.InvokeMs))
	ev, err := w.Recv(wctx)
	cancel()
	switch {
	case errors.Is(err, io.EOF):
		err = errors.New("the stream ended before its first event")
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("no first event within deadlines.invoke_ms (%v)", ms(c.pin.Manifest.Deadlines.InvokeMs))
	case err == nil && ev.GetError() != "":
		err = fmt.Errorf("the first event carries error %q", ev.GetError())
	}
	add(name+": first event", err, ev, "initial event, watch_id "+w.ID())
	if err != nil {
		return
	}
	st, err := c.Cancel(ctx, w.ID())
	if err == nil && !slices.Contains([]string{"cancellation-requested", "completed"}, st) {
		err = fmt.Errorf("state %q right after cancelling an open watch; want cancellation-requested or completed", st)
	}
	add(name+": cancel", err, nil, "state "+st)
	add(name+": stream ends after cancel", w.Close(), nil, "ended within deadlines.cancel_ms")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
