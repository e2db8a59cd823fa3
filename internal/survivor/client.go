package survivor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// ClientConfig configures the manager's side of the control channel.
type ClientConfig struct {
	// Socket is the survivor's control socket (<state-dir>/survivor.sock).
	Socket string
	// Lock is the manager's state-dir lock, held: hello carries it as the
	// fence proof.
	Lock *os.File
	// Log receives the client's log lines.
	Log logr.Logger
	// OnListener receives each gateway listener a survivor hands over (at
	// every welcome that carries one); the callee owns the file.
	OnListener func(*os.File)
	// OnOutcome receives outcomes of runs whose answer this client did not
	// get (they ended while it was away, or after a reconnect).
	OnOutcome func(Outcome)
	// OnCheckpoint is called when the survivor is about to stop (its
	// providers with it): checkpoint every Active generation and return.
	OnCheckpoint func(ctx context.Context)
	// RetryInterval is the first wait between connection attempts (default
	// 50ms, doubling to 1s).
	RetryInterval time.Duration
}

// ErrOwnerLost is what operations on a process return once its survivor
// went away (the process went with it).
var ErrOwnerLost = errors.New("the survivor that owned the process went away")

// Attachment is what a manager learns when it first attaches: the
// survivor's identity and what it holds.
type Attachment struct {
	// Instance is the survivor's random instance ID; Session the fencing
	// token of this manager's session.
	Instance string
	Session  uint64
	// Processes are the processes the survivor held (live and ended).
	Processes []*RemoteProcess
	// Outcomes are the runs that ended (Done) or are still running, with
	// their invocations.
	Outcomes []Outcome
}

// Client is a manager's connection to its node's survivor. It reconnects
// by itself; processes survive a reconnect to the same survivor instance
// and are lost (Done, ErrOwnerLost) when the survivor changed or is gone.
type Client struct {
	cfg ClientConfig

	mu        sync.Mutex
	c         *conn
	up        chan struct{} // closed while connected; replaced on disconnect
	instance  string
	session   uint64
	procs     map[uint64]*RemoteProcess
	pending   map[uint64]*pendingCall
	nextID    uint64
	acks      []string
	attached  chan struct{}
	first     *Attachment
	attachErr error
	closed    bool
	// superseded is set when a newer manager took over: no reconnecting.
	superseded string
	stop       chan struct{}
	done       chan struct{}
}

type pendingCall struct {
	reply   chan *frame
	observe func(observeBody, []byte)
}

// NewClient starts connecting to the survivor (in the background, retrying
// until Close).
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Socket == "" || cfg.Lock == nil {
		return nil, errors.New("survivor: ClientConfig needs Socket and Lock")
	}
	if len(cfg.Socket) > MaxSocketPath {
		return nil, &SocketError{Path: cfg.Socket, Why: fmt.Sprintf("is %d bytes; a unix socket path is at most %d", len(cfg.Socket), MaxSocketPath)}
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 50 * time.Millisecond
	}
	c := &Client{cfg: cfg, up: make(chan struct{}), procs: map[uint64]*RemoteProcess{}, pending: map[uint64]*pendingCall{},
		attached: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	go c.flushAcks()
	return c, nil
}

// Attached waits for the first session and returns what the survivor held
// then.
func (c *Client) Attached(ctx context.Context) (*Attachment, error) {
	select {
	case <-c.attached:
		return c.first, c.attachErr
	case <-ctx.Done():
		return nil, fmt.Errorf("survivor %s: not attached: %w", c.cfg.Socket, ctx.Err())
	}
}

// Connected reports whether a session with the survivor is up.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c != nil
}

// Instance is the survivor's instance ID of the current (or last) session.
func (c *Client) Instance() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.instance
}

// Close stops the client: pending operations fail, processes are left to
// the survivor (detached, never stopped).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closed = true
	close(c.stop)
	cc := c.c
	c.mu.Unlock()
	if cc != nil {
		// Flush the acknowledgements first: the next manager need not
		// be told again.
		c.sendAcks()
		cc.uc.Close()
	}
	<-c.done
	return nil
}

func (c *Client) loop() {
	defer close(c.done)
	wait := c.cfg.RetryInterval
	for {
		select {
		case <-c.stop:
			c.disconnected(nil, false)
			return
		default:
		}
		cc, absent, err := c.connect()
		if err != nil {
			if absent {
				// Nothing listens: the survivor is gone, and its processes
				// with it (parent-death signal).
				c.loseAll(fmt.Sprintf("its control socket %s refuses: %v", c.cfg.Socket, err))
			}
			c.cfg.Log.V(1).Info("survivor not reachable yet", "socket", c.cfg.Socket, "error", err.Error())
			select {
			case <-c.stop:
				c.disconnected(nil, false)
				return
			case <-time.After(wait):
			}
			wait = min(wait*2, time.Second)
			continue
		}
		wait = c.cfg.RetryInterval
		err = c.serve(cc)
		c.disconnected(err, true)
		c.mu.Lock()
		superseded := c.superseded
		c.mu.Unlock()
		if superseded != "" {
			<-c.stop
			return
		}
	}
}

// connect dials, says hello and reads the welcome and the listing. absent
// reports a socket nobody listens on.
func (c *Client) connect() (*conn, bool, error) {
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: c.cfg.Socket, Net: "unix"})
	if err != nil {
		absent := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
		return nil, absent, err
	}
	cc := newConn(uc)
	if err := cc.write(&header{Op: opHello, Hello: &helloBody{Protocol: ProtocolVersion}}, nil, c.cfg.Lock); err != nil {
		cc.close()
		return nil, false, err
	}
	_ = uc.SetReadDeadline(time.Now().Add(30 * time.Second))
	f, err := cc.read()
	if err != nil {
		cc.close()
		return nil, false, fmt.Errorf("survivor %s: no welcome: %w", c.cfg.Socket, err)
	}
	if f.h.Op == opRefused {
		cc.close()
		err := fmt.Errorf("survivor %s refused this manager: %s", c.cfg.Socket, f.h.Refused)
		c.cfg.Log.Info("the survivor refused this manager", "why", f.h.Refused)
		return nil, false, err
	}
	if f.h.Op != opWelcome || f.h.Welcome == nil {
		f.closeFiles()
		cc.close()
		return nil, false, fmt.Errorf("survivor %s answered hello with %q", c.cfg.Socket, f.h.Op)
	}
	w := *f.h.Welcome
	if w.Listener && len(f.files) == 1 && c.cfg.OnListener != nil {
		c.cfg.OnListener(f.files[0])
		f.files = nil
	}
	f.closeFiles()
	c.mu.Lock()
	changed := c.instance != "" && c.instance != w.Instance
	prev := c.instance
	c.mu.Unlock()
	if changed {
		c.loseAll(fmt.Sprintf("a new survivor (instance %s) replaced instance %s", w.Instance, prev))
	}
	att := &Attachment{Instance: w.Instance, Session: w.Session}
	for {
		f, err := cc.read()
		if err != nil {
			cc.close()
			return nil, false, fmt.Errorf("survivor %s: the listing ended early: %w", c.cfg.Socket, err)
		}
		f.closeFiles()
		switch f.h.Op {
		case opProcess:
			if f.h.Process != nil {
				att.Processes = append(att.Processes, c.adoptInfo(w.Instance, *f.h.Process))
			}
			continue
		case opOutcome, opActive:
			if o := f.h.Outcome; o != nil {
				o.Body = f.payload
				att.Outcomes = append(att.Outcomes, *o)
			}
			continue
		case opListed:
		default:
			continue
		}
		break
	}
	_ = uc.SetReadDeadline(time.Time{})
	c.mu.Lock()
	c.c, c.instance, c.session = cc, w.Instance, w.Session
	close(c.up)
	first := c.first == nil
	if first {
		c.first = att
	}
	c.mu.Unlock()
	c.cfg.Log.Info("attached to the survivor", "instance", w.Instance, "session", w.Session, "processes", len(att.Processes), "outcomes", len(att.Outcomes), "survivorPid", w.Pid)
	if first {
		close(c.attached)
	} else if c.cfg.OnOutcome != nil {
		for _, o := range att.Outcomes {
			c.cfg.OnOutcome(o)
		}
	}
	var runs []string
	for _, o := range att.Outcomes {
		if o.Done {
			runs = append(runs, o.RunID)
		}
	}
	c.ack(runs...)
	return cc, false, nil
}

// adoptInfo returns the RemoteProcess of a listed process (the same object
// for a process already known).
func (c *Client) adoptInfo(instance string, info ProcessInfo) *RemoteProcess {
	c.mu.Lock()
	defer c.mu.Unlock()
	rp, ok := c.procs[info.Proc]
	if !ok || rp.instance != instance {
		rp = newRemote(c, instance, info)
		c.procs[info.Proc] = rp
	}
	rp.setInfo(info)
	if !info.Alive {
		delete(c.procs, info.Proc)
		rp.end(info.Err.err(), "")
	}
	return rp
}

// serve reads frames until the connection ends.
func (c *Client) serve(cc *conn) error {
	// stopping is set once the survivor asked for a checkpoint: it is
	// stopping, and the processes it stops from then on end with it (not
	// through a fault of their own).
	stopping := false
	for {
		f, err := cc.read()
		if err != nil {
			return err
		}
		f.closeFiles()
		switch f.h.Op {
		case opReply, opObserve:
			c.mu.Lock()
			pc := c.pending[f.h.ID]
			if f.h.Op == opReply {
				delete(c.pending, f.h.ID)
			}
			c.mu.Unlock()
			if f.h.Op == opReply && f.h.RunID != "" {
				c.ack(f.h.RunID)
			}
			switch {
			case pc == nil:
			case f.h.Op == opObserve && pc.observe != nil && f.h.Observe != nil:
				pc.observe(*f.h.Observe, f.payload)
			case f.h.Op == opReply:
				pc.reply <- f
			}
		case opExited:
			c.mu.Lock()
			rp := c.procs[f.h.Proc]
			delete(c.procs, f.h.Proc)
			c.mu.Unlock()
			if rp != nil && f.h.Exited != nil {
				err := f.h.Exited.Err.err()
				if errors.Is(err, procexec.ErrClosed) {
					err = nil
				}
				if stopping {
					rp.mu.Lock()
					rp.lost = true
					rp.mu.Unlock()
				}
				rp.end(err, f.h.Exited.StderrTail)
			}
		case opOutcome:
			if o := f.h.Outcome; o != nil {
				o.Body = f.payload
				if c.cfg.OnOutcome != nil {
					c.cfg.OnOutcome(*o)
				}
				c.ack(o.RunID)
			}
		case opRefused:
			// A newer manager proved the lock: this one must not fight it.
			c.cfg.Log.Info("the survivor ended this session", "why", f.h.Refused)
			c.mu.Lock()
			c.superseded = f.h.Refused
			c.mu.Unlock()
			return &Error{Message: f.h.Refused}
		case opCkptAsk:
			stopping = true
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if c.cfg.OnCheckpoint != nil {
					c.cfg.Log.Info("the survivor is stopping: checkpointing every Active generation first")
					c.cfg.OnCheckpoint(ctx)
				}
				_ = cc.write(&header{Op: opCkptDone}, nil)
			}()
		}
	}
}

// disconnected fails the pending calls after a connection ended.
func (c *Client) disconnected(err error, wasUp bool) {
	c.mu.Lock()
	cc := c.c
	c.c = nil
	if wasUp {
		c.up = make(chan struct{})
	}
	pending := c.pending
	c.pending = map[uint64]*pendingCall{}
	closed := c.closed
	c.mu.Unlock()
	if cc != nil {
		cc.close()
	}
	for _, pc := range pending {
		close(pc.reply)
	}
	if wasUp && !closed {
		c.cfg.Log.Info("the connection to the survivor ended; reconnecting", "error", errString(err))
	}
}

// loseAll ends every known process: its survivor is gone.
func (c *Client) loseAll(why string) {
	c.mu.Lock()
	procs := c.procs
	c.procs = map[uint64]*RemoteProcess{}
	c.mu.Unlock()
	for _, rp := range procs {
		rp.lose(why)
	}
}

// ack queues acknowledgements; they ride on the next frame (or a flush).
func (c *Client) ack(runIDs ...string) {
	if len(runIDs) == 0 {
		return
	}
	c.mu.Lock()
	c.acks = append(c.acks, runIDs...)
	c.mu.Unlock()
}

func (c *Client) takeAcks() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.acks
	c.acks = nil
	return a
}

func (c *Client) sendAcks() {
	acks := c.takeAcks()
	if len(acks) == 0 {
		return
	}
	c.mu.Lock()
	cc := c.c
	c.mu.Unlock()
	if cc == nil || cc.write(&header{Op: opAck, Acks: acks}, nil) != nil {
		c.mu.Lock()
		c.acks = append(acks, c.acks...)
		c.mu.Unlock()
	}
}

func (c *Client) flushAcks() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			c.sendAcks()
		}
	}
}

// NotStartedError is a run that never reached its provider: the survivor
// that owned the process went away, or was replaced, before the run's frame
// was written whole (a torn frame is never acted on). The provider did
// nothing with it, so the caller may run it again once the process is
// relaunched (the dispatcher queues it again).
type NotStartedError struct{ Err error }

func (e *NotStartedError) Error() string {
	return "the run never reached its provider: " + e.Err.Error()
}

func (e *NotStartedError) Unwrap() error { return e.Err }

// NotStarted reports true: see NotStartedError.
func (e *NotStartedError) NotStarted() bool { return true }

// errInstanceChanged: the request was for a process of another survivor
// instance than the one connected now.
var errInstanceChanged = errors.New("the survivor was replaced")

// sendError is a request whose frame could not be written.
type sendError struct{ err error }

func (e *sendError) Error() string { return e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// call sends a request and waits for its reply.
func (c *Client) call(ctx context.Context, h *header, payload []byte, observe func(observeBody, []byte), files ...*os.File) (*frame, error) {
	return c.callOn(ctx, "", h, payload, observe, files...)
}

// callOn is call for a process of survivor instance (any, when empty): it
// is never sent to another instance.
func (c *Client) callOn(ctx context.Context, instance string, h *header, payload []byte, observe func(observeBody, []byte), files ...*os.File) (*frame, error) {
	for {
		c.mu.Lock()
		cc, up, closed, superseded := c.c, c.up, c.closed, c.superseded
		c.mu.Unlock()
		switch {
		case closed:
			return nil, &Error{Message: "the client is closed"}
		case superseded != "":
			return nil, &Error{Message: superseded}
		}
		if cc == nil {
			select {
			case <-up:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("survivor %s is not connected: %w", c.cfg.Socket, ctx.Err())
			}
		}
		pc := &pendingCall{reply: make(chan *frame, 1), observe: observe}
		c.mu.Lock()
		if c.c != cc {
			c.mu.Unlock()
			continue
		}
		if instance != "" && c.instance != instance {
			c.mu.Unlock()
			return nil, errInstanceChanged
		}
		c.nextID++
		h.ID = c.nextID
		c.pending[h.ID] = pc
		h.Acks = c.acks
		c.acks = nil
		c.mu.Unlock()
		if err := cc.write(h, payload, files...); err != nil {
			c.mu.Lock()
			delete(c.pending, h.ID)
			c.acks = append(h.Acks, c.acks...)
			c.mu.Unlock()
			return nil, &sendError{fmt.Errorf("survivor: sending %s: %w", h.Op, err)}
		}
		select {
		case f, ok := <-pc.reply:
			if !ok {
				return nil, fmt.Errorf("survivor: the connection ended before the answer to %s", h.Op)
			}
			return f, nil
		case <-ctx.Done():
			c.mu.Lock()
			delete(c.pending, h.ID)
			c.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// Launch hands the survivor the sealed executable (SCM_RIGHTS, never a
// path) and the plan, and returns the started (not yet loaded) process.
func (c *Client) Launch(ctx context.Context, plan verifier.LaunchPlan, exe *procexec.Sealed, tag Tag) (*RemoteProcess, error) {
	if exe.Digest() != plan.ArtifactSHA256() {
		return nil, fmt.Errorf("survivor: the sealed executable has digest %s, the plan %s", exe.Digest(), plan.ArtifactSHA256())
	}
	w, err := planToWire(plan)
	if err != nil {
		return nil, err
	}
	f, err := c.call(ctx, &header{Op: opLaunch, Launch: &launchBody{Plan: w, Tag: tag}}, nil, nil, exe.File())
	if err != nil {
		return nil, err
	}
	r := f.h.Reply
	if r == nil {
		return nil, &Error{Message: "launch answered without a reply"}
	}
	if err := r.Err.err(); err != nil {
		return nil, err
	}
	if r.Process == nil {
		return nil, &Error{Message: "launch answered without the process"}
	}
	c.mu.Lock()
	rp := newRemote(c, c.instance, *r.Process)
	rp.plan = plan
	c.procs[rp.info.Proc] = rp
	c.mu.Unlock()
	rp.refresh(r)
	return rp, nil
}

// RemoteProcess is one provider process held by the survivor, as the
// manager drives it: the operations of a procexec.Process, each one
// control frame.
type RemoteProcess struct {
	cl       *Client
	instance string
	plan     verifier.LaunchPlan

	mu          sync.Mutex
	info        ProcessInfo
	budget      Budget
	budgetAt    time.Time
	stderrTotal int64
	tailTotal   int64
	tail        string
	dropped     int64
	refreshing  bool
	// The violations under --sandbox=audit: the total the survivor last
	// reported, and the copy by syscall as of violationsAt.
	violationsTotal int64
	violationsSeen  int64
	violations      map[string]int64
	violationsAt    time.Time
	refreshingV     bool
	done            chan struct{}
	err             error
	lost            bool
}

func newRemote(c *Client, instance string, info ProcessInfo) *RemoteProcess {
	rp := &RemoteProcess{cl: c, instance: instance, info: info, done: make(chan struct{}), budgetAt: time.Now()}
	if info.Budget != nil {
		rp.budget = *info.Budget
	}
	return rp
}

func (rp *RemoteProcess) setInfo(info ProcessInfo) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.info = info
	if info.Budget != nil {
		rp.budget, rp.budgetAt = *info.Budget, time.Now()
	}
}

// Info is the process as the survivor last described it.
func (rp *RemoteProcess) Info() ProcessInfo {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.info
}

// SetPlan gives an adopted process the verified plan the manager holds for
// it (a listed process arrives without one).
func (rp *RemoteProcess) SetPlan(p verifier.LaunchPlan) {
	rp.mu.Lock()
	rp.plan = p
	rp.mu.Unlock()
}

// Plan is the launch plan (the one this manager launched or adopted it with).
func (rp *RemoteProcess) Plan() verifier.LaunchPlan {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.plan
}

// Pid is the provider's pid in the survivor's PID namespace.
func (rp *RemoteProcess) Pid() int { return rp.Info().Pid }

// StartedAt is when the process was spawned.
func (rp *RemoteProcess) StartedAt() time.Time { return time.Unix(0, rp.Info().StartedAtNs) }

// Done is closed when the process has ended (or its survivor went away).
func (rp *RemoteProcess) Done() <-chan struct{} { return rp.done }

// Err is the fault that ended the process (nil for a clean stop or close).
func (rp *RemoteProcess) Err() error {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.err
}

// OwnerLost reports whether the process ended because its survivor went
// away (not through any fault of the provider).
func (rp *RemoteProcess) OwnerLost() bool {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.lost
}

func (rp *RemoteProcess) end(err error, tail string) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	select {
	case <-rp.done:
		return
	default:
	}
	rp.err = err
	if tail != "" {
		rp.tail = tail
	}
	rp.info.Alive = false
	close(rp.done)
}

func (rp *RemoteProcess) lose(why string) {
	rp.mu.Lock()
	select {
	case <-rp.done:
		rp.mu.Unlock()
		return
	default:
	}
	rp.lost = true
	rp.mu.Unlock()
	rp.end(&procexec.Fault{Kind: procexec.KindExited, Op: procexec.OpIdle, At: time.Now(), Err: ErrOwnerLost,
		Detail: fmt.Sprintf("the survivor that owned process %d went away (%s): the process went with it", rp.Pid(), why)}, "")
}

// refresh takes the budget and stderr counters of a reply.
func (rp *RemoteProcess) refresh(r *replyBody) {
	if r == nil {
		return
	}
	rp.mu.Lock()
	if r.Budget != nil {
		rp.budget, rp.budgetAt = *r.Budget, time.Now()
	}
	if r.StderrTotal > rp.stderrTotal {
		rp.stderrTotal = r.StderrTotal
	}
	if r.ViolationsTotal > rp.violationsTotal {
		rp.violationsTotal = r.ViolationsTotal
	}
	rp.mu.Unlock()
}

// deadErr is what an operation on an ended process returns.
func (rp *RemoteProcess) deadErr() error {
	if err := rp.Err(); err != nil {
		return err
	}
	return procexec.ErrClosed
}

// op sends one operation on this process and returns its reply.
func (rp *RemoteProcess) op(ctx context.Context, h *header, payload []byte, observe func(observeBody, []byte)) (*frame, error) {
	select {
	case <-rp.done:
		if h.Op == opRun && rp.OwnerLost() {
			return nil, &NotStartedError{Err: rp.deadErr()}
		}
		return nil, rp.deadErr()
	default:
	}
	h.Proc = rp.info.Proc
	f, err := rp.cl.callOn(ctx, rp.instance, h, payload, observe)
	if err != nil {
		var se *sendError
		if errors.Is(err, errInstanceChanged) || errors.As(err, &se) {
			// Not sent whole: the provider never saw it.
			if h.Op == opRun {
				why := err
				if rp.OwnerLost() {
					why = rp.deadErr()
				}
				return nil, &NotStartedError{Err: why}
			}
		}
		select {
		case <-rp.done:
			return nil, rp.deadErr()
		default:
		}
		return nil, &procexec.Fault{Kind: procexec.KindTimeout, Op: h.Op, At: time.Now(), Err: err,
			Detail: "no answer from the survivor: " + err.Error(), Reason: reasonOfCallErr(err)}
	}
	rp.refresh(f.h.Reply)
	if f.h.Reply == nil {
		return nil, &Error{Message: h.Op + " answered without a reply"}
	}
	if err := f.h.Reply.Err.err(); err != nil {
		return f, err
	}
	return f, nil
}

func reasonOfCallErr(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return reasons.DeadlineExceeded
	}
	return reasons.ProviderFailed
}

// Load sends load and waits for loaded (and the survivor's durable record
// and re-hash of the executable).
func (rp *RemoteProcess) Load(ctx context.Context) error {
	h := &header{Op: opLoad}
	if d, ok := ctx.Deadline(); ok {
		h.TimeoutMs = max(time.Until(d).Milliseconds(), 1)
	}
	_, err := rp.op(ctx, h, nil, nil)
	return err
}

// Run starts a run and waits for its terminal observation. call, when set,
// is the invocation the survivor keeps the outcome under; observe, when
// set, receives every observation in order. ctx ends the wait only: the
// run goes on in the survivor and its outcome is kept.
func (rp *RemoteProcess) Run(ctx context.Context, runID string, input []byte, deadline time.Duration, call *Invocation, observe func(seq uint64, terminal bool, body []byte)) (uint64, []byte, error) {
	h := &header{Op: opRun, RunID: runID, Run: &runBody{DeadlineMs: max(deadline.Milliseconds(), 1), Observe: observe != nil, Call: call}}
	var ob func(observeBody, []byte)
	if observe != nil {
		ob = func(o observeBody, body []byte) { observe(o.Sequence, o.Terminal, body) }
	}
	f, err := rp.op(ctx, h, input, ob)
	if err != nil {
		return 0, nil, err
	}
	return f.h.Reply.Sequence, f.payload, nil
}

// Cancel asks the provider to cancel a run.
func (rp *RemoteProcess) Cancel(ctx context.Context, runID, reason string) error {
	_, err := rp.op(ctx, &header{Op: opCancel, RunID: runID, Reason: reason}, nil, nil)
	return err
}

// Snapshot asks for the state at lineage generation.
func (rp *RemoteProcess) Snapshot(ctx context.Context, generation uint64, deadline time.Duration) (protocol.State, error) {
	f, err := rp.op(ctx, &header{Op: opSnapshot, Generation: generation, TimeoutMs: max(deadline.Milliseconds(), 1)}, nil, nil)
	if err != nil {
		return protocol.State{}, err
	}
	if f.h.Reply.State == nil {
		return protocol.State{}, &Error{Message: "snapshot answered without a state"}
	}
	return f.h.Reply.State.state(f.payload), nil
}

// Migrate asks this provider to convert source to lineage source.Generation+1.
func (rp *RemoteProcess) Migrate(ctx context.Context, source protocol.State, deadline time.Duration) (protocol.State, error) {
	w := stateToWire(source)
	f, err := rp.op(ctx, &header{Op: opMigrate, State: &w, TimeoutMs: max(deadline.Milliseconds(), 1)}, source.State, nil)
	if err != nil {
		return protocol.State{}, err
	}
	if f.h.Reply.State == nil {
		return protocol.State{}, &Error{Message: "migrate answered without a state"}
	}
	return f.h.Reply.State.state(f.payload), nil
}

// Restore imports state.
func (rp *RemoteProcess) Restore(ctx context.Context, st protocol.State, deadline time.Duration) error {
	w := stateToWire(st)
	_, err := rp.op(ctx, &header{Op: opRestore, State: &w, TimeoutMs: max(deadline.Milliseconds(), 1)}, st.State, nil)
	return err
}

// Readiness asks the provider to prove it holds the state with digest.
func (rp *RemoteProcess) Readiness(ctx context.Context, generation uint64, digest string, deadline time.Duration) error {
	_, err := rp.op(ctx, &header{Op: opReadiness, Generation: generation, Digest: digest, TimeoutMs: max(deadline.Milliseconds(), 1)}, nil, nil)
	return err
}

// Stop asks the provider to stop (the survivor escalates to killing its
// group after the cancellation deadline) and waits until it is gone.
func (rp *RemoteProcess) Stop(ctx context.Context, reason string) error {
	_, err := rp.op(ctx, &header{Op: opStop, Reason: reason}, nil, nil)
	rp.waitDone(ctx)
	if errors.Is(err, procexec.ErrClosed) {
		return nil
	}
	return err
}

// Close kills the process group and waits until the survivor reaped it.
// Idempotent.
func (rp *RemoteProcess) Close() error {
	select {
	case <-rp.done:
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = rp.op(ctx, &header{Op: opClose}, nil, nil)
	rp.waitDone(ctx)
	return nil
}

// waitDone waits for the survivor's word that the process ended (bounded
// by ctx).
func (rp *RemoteProcess) waitDone(ctx context.Context) {
	select {
	case <-rp.done:
	case <-ctx.Done():
	}
}

// Budget is the process's remaining budget as of the last answer, its
// lifetime counted down since.
func (rp *RemoteProcess) Budget() procexec.Budget {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	select {
	case <-rp.done:
		return procexec.Budget{}
	default:
	}
	life := time.Duration(rp.budget.LifetimeMs)*time.Millisecond - time.Since(rp.budgetAt)
	return procexec.Budget{Lifetime: max(life, 0), StdinBytes: rp.budget.StdinBytes, StateOperations: rp.budget.StateOperations}
}

// Refresh asks the survivor how the process is now (alive, identity
// re-checked, active run, budget) and updates Info.
func (rp *RemoteProcess) Refresh(ctx context.Context) error {
	f, err := rp.op(ctx, &header{Op: opStatus}, nil, nil)
	if err != nil {
		return err
	}
	r := f.h.Reply
	rp.mu.Lock()
	if r.Process != nil {
		budget := rp.info.Budget
		rp.info = *r.Process
		if rp.info.Budget == nil {
			rp.info.Budget = budget
		}
	}
	rp.tail, rp.dropped, rp.tailTotal = r.StderrTail, r.StderrDropped, r.StderrTotal
	rp.setViolations(r)
	rp.mu.Unlock()
	return nil
}

// setViolations takes a status reply's violations (under rp.mu).
func (rp *RemoteProcess) setViolations(r *replyBody) {
	rp.violations, rp.violationsSeen, rp.violationsAt = r.Violations, r.ViolationsTotal, time.Now()
	if r.ViolationsTotal > rp.violationsTotal {
		rp.violationsTotal = r.ViolationsTotal
	}
}

// violationsRefresh bounds how often SandboxViolations asks the survivor
// when no answer said they changed: a violation the launcher reports after
// the answer of the run that made it is seen at the next ask.
const violationsRefresh = 5 * time.Second

// SandboxViolations are what the process did under --sandbox=audit that
// the enforced sandbox refuses, by syscall, as the survivor last said
// (asked again in the background when an answer says they changed, and
// every violationsRefresh while the process runs audited).
func (rp *RemoteProcess) SandboxViolations() map[string]int64 {
	rp.mu.Lock()
	ev, err := sandbox.ParseEvidence(rp.info.Sandbox)
	audited := err == nil && ev.Mode == sandbox.ModeAudit
	stale := audited && !rp.refreshingV && (rp.violationsTotal > rp.violationsSeen || time.Since(rp.violationsAt) > violationsRefresh)
	select {
	case <-rp.done:
		stale = false
	default:
	}
	if stale {
		rp.refreshingV = true
	}
	out := maps.Clone(rp.violations)
	rp.mu.Unlock()
	if stale {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			f, err := rp.op(ctx, &header{Op: opStatus}, nil, nil)
			rp.mu.Lock()
			rp.refreshingV = false
			if err == nil && f.h.Reply != nil {
				rp.setViolations(f.h.Reply)
			} else {
				rp.violationsAt = time.Now()
			}
			rp.mu.Unlock()
		}()
	}
	return out
}

// StderrTail returns the newest stderr bytes the manager has (refreshed
// from the survivor in the background when the provider wrote more).
func (rp *RemoteProcess) StderrTail() (string, int64) {
	rp.mu.Lock()
	stale := rp.stderrTotal > rp.tailTotal && !rp.refreshing
	if stale {
		rp.refreshing = true
	}
	tail, dropped := rp.tail, rp.dropped
	rp.mu.Unlock()
	if stale {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			f, err := rp.op(ctx, &header{Op: opStatus}, nil, nil)
			rp.mu.Lock()
			rp.refreshing = false
			if err == nil && f.h.Reply != nil {
				rp.tail, rp.dropped, rp.tailTotal = f.h.Reply.StderrTail, f.h.Reply.StderrDropped, f.h.Reply.StderrTotal
			}
			rp.mu.Unlock()
		}()
	}
	return tail, dropped
}

// Matches reports why the process is not the one described (nil when it
// is): the tag and the plan's identity.
func (info ProcessInfo) Matches(tag Tag, plan verifier.LaunchPlan) error {
	var diffs []string
	if info.Tag != tag {
		diffs = append(diffs, fmt.Sprintf("tag %+v, want %+v", info.Tag, tag))
	}
	for _, d := range []struct{ name, got, want string }{
		{"implementation", info.ImplementationID, plan.ImplementationID()},
		{"manifest", info.ManifestSHA256, plan.ManifestSHA256()},
		{"artifact", info.ArtifactSHA256, plan.ArtifactSHA256()},
		{"authority", info.AuthoritySHA256, plan.AuthoritySHA256()},
	} {
		if d.got != d.want {
			diffs = append(diffs, fmt.Sprintf("%s %s, want %s", d.name, d.got, d.want))
		}
	}
	if !info.Alive {
		diffs = append(diffs, "it has ended: "+errString(info.Err.err()))
	}
	if info.IdentityErr != "" {
		diffs = append(diffs, "its identity: "+info.IdentityErr)
	}
	if len(diffs) == 0 {
		return nil
	}
	slices.Sort(diffs)
	return fmt.Errorf("process %d (pid %d): %v", info.Proc, info.Pid, diffs)
}
