// Command faulty is counter v2.0.0 with faults that its argv arms at named
// operations; with no fault armed (or before one fires) it behaves exactly
// like counter v2, so a test can use it as a hot-swap target that fails at a
// chosen phase, or as an old provider that fails at snapshot.
//
// Usage:
//
//	faulty [--fault KIND --at OP [--skip N] [--always] [--size N] [--children N] [--hold-pipes] [--once-marker PATH] [--if-request-contains TEXT]]...
//
// OP is load, start, cancel, stop, snapshot, migrate, restore or readiness.
// A fault fires at the first request for OP (after skipping N of them), or
// at every one with --always; with --once-marker it fires only if PATH does
// not exist, and creates it (so a relaunched provider behaves); with
// --if-request-contains only requests whose frame contains TEXT count (a
// migrate whose state holds a given key: the same bytes fail on one node and
// not on another). KIND:
//
//	crash                exit 2 as the request arrives, answering nothing
//	hang                 stop reading and answering at the request
//	exit                 answer the request, then exit 3
//	malformed            answer with a truncated, unparseable frame
//	oversized            answer with the frame padded to --size bytes (default 1 MiB + 1)
//	miscorrelate         answer with another request ID
//	wrong-schema         answer (or, at start, observe) with a wrong schema
//	wrong-run            at start: observe for another run ID
//	sequence-regression  at start: an observation whose sequence goes backwards
//	stderr-flood         write --size bytes (default 1 MiB) to stderr, then answer normally
//	fork-grandchild      fork --children grandchildren (default 1) in the group that ignore
//	                     SIGTERM and hold stdout and stderr, then answer normally
//	escape               fork a grandchild that leaves the group (setsid) holding no pipe (or,
//	                     with --hold-pipes, holding stdout and stderr), then answer normally
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"iteron.dev/operator/examples/providers/internal/counter"
	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/provider"
)

type fault struct {
	kind       string
	at         protocol.Operation
	skip       int
	always     bool
	size       int
	children   int
	holdPipes  bool
	onceMarker string
	ifContains string
	seen       int
	fired      bool
}

var kinds = map[string]bool{
	"crash": true, "hang": true, "exit": true, "malformed": true, "oversized": true, "miscorrelate": true,
	"wrong-schema": true, "wrong-run": true, "sequence-regression": true, "stderr-flood": true,
	"fork-grandchild": true, "escape": true,
}

func parse(args []string) ([]*fault, error) {
	var faults []*fault
	var cur *fault
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", a)
			}
			i++
			return args[i], nil
		}
		num := func() (int, error) {
			v, err := val()
			if err != nil {
				return 0, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("%s: %q is not a non-negative integer", a, v)
			}
			return n, nil
		}
		if a == "--fault" {
			v, err := val()
			if err != nil {
				return nil, err
			}
			if !kinds[v] {
				return nil, fmt.Errorf("unknown fault %q", v)
			}
			cur = &fault{kind: v, children: 1}
			faults = append(faults, cur)
			continue
		}
		if cur == nil {
			return nil, fmt.Errorf("%s before --fault", a)
		}
		var err error
		switch a {
		case "--at":
			var v string
			v, err = val()
			cur.at = protocol.Operation(v)
			if cur.at.Success() == "" {
				err = fmt.Errorf("unknown operation %q", v)
			}
		case "--skip":
			cur.skip, err = num()
		case "--always":
			cur.always = true
		case "--size":
			cur.size, err = num()
		case "--children":
			cur.children, err = num()
		case "--hold-pipes":
			cur.holdPipes = true
		case "--once-marker":
			cur.onceMarker, err = val()
		case "--if-request-contains":
			cur.ifContains, err = val()
			if err == nil && cur.ifContains == "" {
				err = fmt.Errorf("--if-request-contains needs a non-empty text")
			}
		default:
			err = fmt.Errorf("unknown argument %q", a)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, f := range faults {
		if f.at == "" {
			return nil, fmt.Errorf("--fault %s needs --at", f.kind)
		}
		if f.holdPipes && f.kind != "escape" {
			return nil, fmt.Errorf("--hold-pipes is for --fault escape, not %s", f.kind)
		}
	}
	return faults, nil
}

// state is shared by the request tap and the response filter: the faults
// armed for the request being answered.
type state struct {
	mu      sync.Mutex
	faults  []*fault
	current []*fault // faults firing for the request being answered
	lastOp  protocol.Operation
}

// arm is called with each request (its operation and frame) as it arrives
// and returns the faults that fire for it.
func (s *state) arm(op protocol.Operation, frame []byte) []*fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	var firing []*fault
	for _, f := range s.faults {
		if f.at != op || f.ifContains != "" && !bytes.Contains(frame, []byte(f.ifContains)) {
			continue
		}
		f.seen++
		if f.seen <= f.skip || (f.fired && !f.always) {
			continue
		}
		if f.onceMarker != "" {
			mf, err := os.OpenFile(f.onceMarker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				continue // fired in an earlier process (or cannot tell): behave
			}
			mf.Close()
		}
		f.fired = true
		firing = append(firing, f)
	}
	s.current, s.lastOp = firing, op
	return firing
}

func (s *state) firing(kind string) *fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.current {
		if f.kind == kind {
			return f
		}
	}
	return nil
}

// tap passes requests through to the SDK, acting on those a fault is armed
// for as they arrive.
type tap struct {
	lr      *protocol.LineReader
	s       *state
	pending []byte
}

func (t *tap) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		line, err := t.lr.Next()
		if err != nil {
			return 0, err
		}
		op := operationOf(line)
		for _, f := range t.s.arm(op, line) {
			act(f, op)
		}
		t.pending = append(line, '\n')
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

func operationOf(line []byte) protocol.Operation {
	req, err := protocol.DecodeRequest(line)
	if err != nil || req.Payload == nil {
		return ""
	}
	return req.Payload.Operation()
}

// act performs the faults that happen as a request arrives.
func act(f *fault, op protocol.Operation) {
	switch f.kind {
	case "crash":
		fmt.Fprintf(os.Stderr, "faulty: crash at %s\n", op)
		os.Exit(2)
	case "hang":
		fmt.Fprintf(os.Stderr, "faulty: hang at %s\n", op)
		for {
			time.Sleep(time.Hour)
		}
	case "stderr-flood":
		n := f.size
		if n == 0 {
			n = 1 << 20
		}
		chunk := bytes.Repeat([]byte("faulty: stderr flood\n"), 1024)
		for n > 0 {
			w := min(n, len(chunk))
			os.Stderr.Write(chunk[:w])
			n -= w
		}
	case "fork-grandchild":
		for range f.children {
			cmd := exec.Command("/proc/self/exe", "--grandchild")
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.Env = []string{}
			if err := cmd.Start(); err != nil {
				fmt.Fprintf(os.Stderr, "faulty: fork grandchild: %v\n", err)
				os.Exit(4)
			}
			fmt.Fprintf(os.Stderr, "faulty: grandchild %d\n", cmd.Process.Pid)
		}
	case "escape":
		cmd := exec.Command("/proc/self/exe", "--grandchild")
		cmd.Env = []string{}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if f.holdPipes {
			// The host's ends then see no EOF until the escapee dies,
			// whatever happens to the group.
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "faulty: escape: %v\n", err)
			os.Exit(4)
		}
		fmt.Fprintf(os.Stderr, "faulty: escaped grandchild %d\n", cmd.Process.Pid)
	}
}

// filter rewrites the frames the SDK writes when a fault fires for the
// request being answered.
type filter struct {
	out io.Writer
	s   *state
	// obsSeen counts observations of the current run (sequence-regression).
	obsSeen int
}

func (w *filter) Write(b []byte) (int, error) {
	// The SDK writes whole frames, several at once when it holds "started"
	// for the run's first observation.
	var out []byte
	exitAfter := false
	for _, frame := range bytes.SplitAfter(b, []byte("\n")) {
		if len(frame) == 0 {
			continue
		}
		rewritten, exit := w.rewrite(bytes.TrimSuffix(frame, []byte("\n")))
		out = append(out, rewritten...)
		exitAfter = exitAfter || exit
	}
	if _, err := w.out.Write(out); err != nil {
		return 0, err
	}
	if exitAfter {
		os.Exit(3)
	}
	return len(b), nil
}

func (w *filter) rewrite(frame []byte) ([]byte, bool) {
	f, err := protocol.DecodeFrame(frame)
	if err != nil {
		return append(frame, '\n'), false
	}
	if o := f.Observation; o != nil {
		switch {
		case w.s.firing("wrong-schema") != nil:
			o.Schema.ID = "iteron/wrong/observation@v1"
		case w.s.firing("wrong-run") != nil:
			o.RunID = "run-of-another"
		case w.s.firing("sequence-regression") != nil:
			w.obsSeen++
			if w.obsSeen == 1 {
				ahead := *o
				ahead.Sequence += 10
				ahead.Terminal = false
				b, _ := protocol.AppendObservation(nil, &ahead)
				b = append(b, '\n')
				b, _ = protocol.AppendObservation(b, o)
				return append(b, '\n'), false
			}
		default:
			return append(frame, '\n'), false
		}
		b, _ := protocol.AppendObservation(nil, o)
		return append(b, '\n'), false
	}
	r := f.Response
	w.obsSeen = 0
	switch {
	case w.s.firing("malformed") != nil:
		return []byte(`{"protocol":"` + r.Protocol + `","request_id":"` + r.RequestID + `","payload":{` + "\n"), false
	case w.s.firing("oversized") != nil:
		size := w.s.firing("oversized").size
		if size == 0 {
			size = protocol.MaxFrameBytes + 1
		}
		if size <= len(frame) {
			return append(frame, '\n'), false
		}
		padded := make([]byte, 0, size+1)
		padded = append(padded, '{')
		padded = append(padded, bytes.Repeat([]byte(" "), size-len(frame))...)
		padded = append(padded, frame[1:]...)
		return append(padded, '\n'), false
	case w.s.firing("miscorrelate") != nil:
		r.RequestID = "host-999999"
	case w.s.firing("wrong-schema") != nil:
		switch p := r.Payload.(type) {
		case *protocol.Loaded:
			p.ObservationSchema.ID = "iteron/wrong/observation@v1"
		case *protocol.Snapshotted:
			p.State.StateSchema.ID = "iteron/wrong/snapshot@v1"
		case *protocol.Migrated:
			p.State.StateSchema.ID = "iteron/wrong/snapshot@v1"
		case *protocol.Restored:
			p.StateSchema.ID = "iteron/wrong/snapshot@v1"
		case *protocol.Ready:
			p.StateSchema.ID = "iteron/wrong/snapshot@v1"
		default:
			return append(frame, '\n'), false
		}
	case w.s.firing("exit") != nil:
		return append(frame, '\n'), true
	default:
		return append(frame, '\n'), false
	}
	b, _ := protocol.AppendResponse(nil, r)
	return append(b, '\n'), false
}

// grandchild ignores SIGTERM and sleeps until killed.
func grandchild() {
	signal.Ignore(syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	time.Sleep(time.Duration(math.MaxInt64))
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--grandchild" {
		grandchild()
		return
	}
	faults, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "faulty: %v\n", err)
		os.Exit(64)
	}
	s := &state{faults: faults}
	in := &tap{lr: protocol.NewLineReader(os.Stdin, protocol.MaxFrameBytes), s: s}
	out := &filter{out: os.Stdout, s: s}
	if err := provider.Serve(context.Background(), in, out, counter.New(2, "2.0.0")); err != nil {
		fmt.Fprintf(os.Stderr, "faulty: %v\n", err)
		os.Exit(1)
	}
}
