package pkgruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	caminopb "iteron.dev/operator/api/quixos/camino"
	quixospb "iteron.dev/operator/api/quixos/quixos"
	runtimepb "iteron.dev/operator/api/quixos/quixos/runtime"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/reasons"
)

// WatchWindowBytes is the flow-control window of each Watch stream (and, as
// WatchWindowBytes × max_watches, of the connection): a caller that reads
// slowly stops the runtime's sends once this much is unread, so a watch can
// never make the manager buffer more. The window is static (no BDP growth).
const WatchWindowBytes = 64 << 10

// Conn is the host's connection to one runtime process, after a handshake
// that passed CheckHandshake.
type Conn struct {
	pin        Pin
	key        []byte
	cc         *grpc.ClientConn
	client     runtimepb.PackageRuntimeClient
	instanceID string
	invokes    chan struct{} // one token per Invoke in flight
	watches    chan struct{} // one token per open Watch
	next       atomic.Uint64
}

// Call is what a caller asks of a runtime; the host fills the rest.
type Call struct {
	// InvocationID is the host's ID of the call, unique per runtime process
	// (the gateway's run ID); empty: the connection numbers it.
	InvocationID string
	// Export is one of the manifest's export IDs.
	Export string
	// ObjectID is the object the call is about, or "".
	ObjectID string
	// Input is the input object's members.
	Input map[string]*caminopb.Value
	// Dependencies are the caller's injected dependencies.
	Dependencies []*quixospb.InjectedDependency
	// Namespace is the caller's namespace (SO_PEERCRED → namespace).
	Namespace string
	// SessionID is the caller's session, or "".
	SessionID string
}

func ms(n uint64) time.Duration { return time.Duration(n) * time.Millisecond }

// Dial connects to the runtime listening on socket and runs the handshake
// within the manifest's deadlines.handshake_ms. seen reports whether an
// instance ID was answered by an earlier process of this runtime. On any
// failure the connection is closed; the caller kills the process.
func Dial(ctx context.Context, socket string, key []byte, pin Pin, seen func(string) bool) (*Conn, error) {
	lim := pin.Manifest.Limits
	window := int32(WatchWindowBytes)
	cc, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(lim.MaxMessageBytes)), grpc.MaxCallSendMsgSize(int(lim.MaxMessageBytes))),
		grpc.WithStaticStreamWindowSize(window),
		grpc.WithStaticConnWindowSize(window*int32(min(lim.MaxWatches+1, 1024))),
	)
	if err != nil {
		return nil, &Error{Code: reasons.ActivationFailed, Field: "socket", Detail: err.Error(), Err: err}
	}
	c := &Conn{
		pin: pin, key: key, cc: cc, client: runtimepb.NewPackageRuntimeClient(cc),
		invokes: make(chan struct{}, lim.MaxConcurrentInvocations),
		watches: make(chan struct{}, lim.MaxWatches),
	}
	if err := c.handshake(ctx, seen); err != nil {
		cc.Close()
		return nil, err
	}
	return c, nil
}

func (c *Conn) handshake(ctx context.Context, seen func(string) bool) error {
	nonce, err := NewNonce()
	if err != nil {
		return err
	}
	d := ms(c.pin.Manifest.Deadlines.HandshakeMs)
	hctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	resp, err := c.client.Handshake(hctx, &runtimepb.HandshakeRequest{OrchProtocolVersion: catalog.PackageRuntimeProtocol, Nonce: nonce}, grpc.WaitForReady(true))
	if err != nil {
		if status.Code(err) == codes.DeadlineExceeded {
			return &Error{Code: reasons.ActivationFailed, Field: "handshake", Detail: fmt.Sprintf("no answer within deadlines.handshake_ms (%v)", d), Err: err}
		}
		return &Error{Code: reasons.ActivationFailed, Field: "handshake", Detail: err.Error(), Err: err}
	}
	if err := CheckHandshake(c.pin, c.key, nonce, resp, seen); err != nil {
		return err
	}
	c.instanceID = resp.GetInstanceId()
	return nil
}

// InstanceID is the handshake's instance ID.
func (c *Conn) InstanceID() string { return c.instanceID }

// closed reports whether the host closed the connection.
func (c *Conn) closed() bool { return c.cc.GetState() == connectivity.Shutdown }

// Close closes the connection (not the process).
func (c *Conn) Close() error { return c.cc.Close() }

// newInvocationID returns an ID unique on this connection, so unique per
// runtime process.
func (c *Conn) newInvocationID() string { return "inv-" + strconv.FormatUint(c.next.Add(1), 10) }

// invocationID is the call's own ID, or a new one.
func (c *Conn) invocationID(call Call) string {
	if call.InvocationID != "" {
		return call.InvocationID
	}
	return c.newInvocationID()
}

func (c *Conn) context(id string, call Call) *runtimepb.InvocationContext {
	return &runtimepb.InvocationContext{
		WorkspaceEpoch:     c.pin.WorkspaceEpoch,
		InstanceId:         c.instanceID,
		BindingDigest:      c.pin.BindingDigest,
		Grant:              Grant(c.key, id, call.Namespace, call.Export),
		SessionId:          call.SessionID,
		OwnerConformanceId: c.pin.Owner,
	}
}

func (c *Conn) checkExport(call Call) error {
	if !c.pin.Manifest.HasExport(call.Export) {
		return errorf(reasons.NotFound, "export", "%q is not one of the runtime's exports %v", call.Export, c.pin.Manifest.ExportIDs)
	}
	return nil
}

// acquire takes a token of sem without waiting: a runtime at its bound
// answers queue_full rather than queueing callers without limit.
func acquire(sem chan struct{}, what string, bound int) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
		return errorf(reasons.QueueFull, what, "the runtime's bound of %d is reached", bound)
	}
}

// callError turns a gRPC failure of a call on c into the host's error. d is
// the call's own deadline; 0 for a Watch, which has none but the caller's.
func (c *Conn) callError(op string, d time.Duration, err error) error {
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		if d == 0 {
			return &Error{Code: reasons.DeadlineExceeded, Field: op, Detail: "the caller's deadline passed", Err: err}
		}
		return &Error{Code: reasons.DeadlineExceeded, Field: op, Detail: fmt.Sprintf("no answer within %v", d), Err: err}
	case codes.Canceled:
		if c.closed() {
			// Not the caller's nor the runtime's doing: the connection was
			// closed under the call (the runtime exited and its teardown
			// closed it).
			return &Error{Code: reasons.ProviderFailed, Field: op, Detail: "the runtime is unreachable: the connection to it was closed", Err: err}
		}
		return &Error{Code: reasons.Cancelled, Field: op, Detail: "the caller went away", Err: err}
	case codes.ResourceExhausted:
		return &Error{Code: reasons.ProviderFailed, Field: op, Detail: "a message over limits.max_message_bytes: " + status.Convert(err).Message(), Err: err}
	case codes.Unavailable:
		return &Error{Code: reasons.ProviderFailed, Field: op, Detail: "the runtime is unreachable: " + status.Convert(err).Message(), Err: err}
	}
	return &Error{Code: reasons.ProviderFailed, Field: op, Detail: err.Error(), Err: err}
}

// Invoke runs one call within deadlines.invoke_ms. A call that overruns is
// cancelled on the runtime (CancelInvocation, within deadlines.cancel_ms)
// before deadline_exceeded is returned.
func (c *Conn) Invoke(ctx context.Context, call Call) (*runtimepb.InvokeResponse, string, error) {
	if err := c.checkExport(call); err != nil {
		return nil, "", err
	}
	if err := acquire(c.invokes, "invocations", cap(c.invokes)); err != nil {
		return nil, "", err
	}
	defer func() { <-c.invokes }()
	id := c.invocationID(call)
	d := ms(c.pin.Manifest.Deadlines.InvokeMs)
	ictx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	resp, err := c.client.Invoke(ictx, &runtimepb.InvokeRequest{
		InvocationId: id, Export: &quixospb.PackageExportRef{PackageRevisionId: c.pin.Manifest.PackageRevisionID, ExportId: call.Export},
		ObjectId: call.ObjectID, Input: call.Input, Dependencies: call.Dependencies, Context: c.context(id, call),
	})
	if err != nil {
		if status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Canceled {
			c.cancelQuietly(id)
		}
		return nil, id, c.callError("invoke", d, err)
	}
	return resp, id, nil
}

// cancelQuietly asks the runtime to cancel an invocation the host gave up
// on; its answer changes nothing for the caller.
func (c *Conn) cancelQuietly(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), ms(c.pin.Manifest.Deadlines.CancelMs))
	defer cancel()
	c.client.CancelInvocation(ctx, &runtimepb.InvocationControlRequest{InvocationId: id})
}

// Status asks for an invocation's state, within deadlines.invoke_ms, and
// refuses a state outside the five.
func (c *Conn) Status(ctx context.Context, id string) (string, error) {
	d := ms(c.pin.Manifest.Deadlines.InvokeMs)
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	st, err := c.client.GetInvocationStatus(sctx, &runtimepb.InvocationControlRequest{InvocationId: id})
	if err != nil {
		return "", c.callError("status", d, err)
	}
	if err := CheckState(id, st); err != nil {
		return "", err
	}
	return st.GetState(), nil
}

// Cancel asks the runtime to cancel an invocation, within
// deadlines.cancel_ms, and refuses a state outside the five.
func (c *Conn) Cancel(ctx context.Context, id string) (string, error) {
	d := ms(c.pin.Manifest.Deadlines.CancelMs)
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	st, err := c.client.CancelInvocation(cctx, &runtimepb.InvocationControlRequest{InvocationId: id})
	if err != nil {
		return "", c.callError("cancel", d, err)
	}
	if err := CheckState(id, st); err != nil {
		return "", err
	}
	return st.GetState(), nil
}

// Watch is one open Watch stream. One goroutine reads the stream and hands
// each checked event to Recv through an unbuffered channel: at most one event
// waits in the manager, and beyond the stream's flow-control window a slow
// reader stops the runtime's sends.
type Watch struct {
	c        *Conn
	id       string
	cancel   context.CancelFunc
	events   chan watchResult
	closing  chan struct{} // closed by Close: events are discarded from then on
	done     chan struct{} // closed when the reader has stopped
	closeOne sync.Once
}

type watchResult struct {
	ev  *runtimepb.WatchEvent
	err error
}

// Watch opens a watch; Recv reads its events and Close ends it.
func (c *Conn) Watch(ctx context.Context, call Call) (*Watch, error) {
	if err := c.checkExport(call); err != nil {
		return nil, err
	}
	if err := acquire(c.watches, "watches", cap(c.watches)); err != nil {
		return nil, err
	}
	id := c.invocationID(call)
	wctx, cancel := context.WithCancel(ctx)
	stream, err := c.client.Watch(wctx, &runtimepb.WatchRequest{
		InvocationId: id, Export: &quixospb.PackageExportRef{PackageRevisionId: c.pin.Manifest.PackageRevisionID, ExportId: call.Export},
		ObjectId: call.ObjectID, Input: call.Input, Dependencies: call.Dependencies, Context: c.context(id, call),
	})
	if err != nil {
		cancel()
		<-c.watches
		return nil, c.callError("watch", 0, err)
	}
	w := &Watch{c: c, id: id, cancel: cancel, events: make(chan watchResult), closing: make(chan struct{}), done: make(chan struct{})}
	go w.read(stream)
	return w, nil
}

// ID is the watch's invocation ID (its watch_id).
func (w *Watch) ID() string { return w.id }

// read checks each event (the first is initial and no other is, every
// watch_id is this watch's) and stops at the stream's end, at an event with
// error set (which ends a watch), or at a violation, which cuts the stream.
func (w *Watch) read(stream grpc.ServerStreamingClient[runtimepb.WatchEvent]) {
	defer func() {
		w.cancel()
		<-w.c.watches
		close(w.done)
	}()
	first := true
	for {
		ev, err := stream.Recv()
		r := watchResult{ev: ev} // a violation keeps its event: it is the evidence
		switch {
		case errors.Is(err, io.EOF):
			return
		case err != nil:
			r.err = w.c.callError("watch", 0, err)
		case ev.GetWatchId() != w.id:
			r.err = errorf(reasons.ProviderFailed, "watch.watch_id", "%q, but this watch is %q", ev.GetWatchId(), w.id)
		case first && !ev.GetInitial():
			r.err = errorf(reasons.ProviderFailed, "watch.initial", "the first event of a watch must have initial set")
		case !first && ev.GetInitial():
			r.err = errorf(reasons.ProviderFailed, "watch.initial", "only the first event of a watch may have initial set")
		}
		first = false
		select {
		case w.events <- r:
		case <-w.closing:
		}
		if r.err != nil || r.ev.GetError() != "" {
			return
		}
	}
}

// Recv returns the next event, or io.EOF once the watch has ended. An event
// with error set is the last; a violation is returned as an error (with the
// offending event, if there was one) and ends the watch.
func (w *Watch) Recv(ctx context.Context) (*runtimepb.WatchEvent, error) {
	select {
	case r := <-w.events:
		return r.ev, r.err
	case <-w.done:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close ends the watch: CancelInvocation on the runtime, then the stream's
// end within deadlines.cancel_ms (events that arrive meanwhile are
// discarded). A runtime that has not ended the stream by then has it cut, and
// Close reports that as provider_failed. Close is idempotent and never waits
// longer than deadlines.cancel_ms twice.
func (w *Watch) Close() error {
	first := false
	w.closeOne.Do(func() { close(w.closing); first = true })
	select {
	case <-w.done:
		return nil
	default:
	}
	d := ms(w.c.pin.Manifest.Deadlines.CancelMs)
	if first {
		w.c.cancelQuietly(w.id)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.done:
		return nil
	case <-t.C:
		w.cancel()
		<-w.done
		return errorf(reasons.ProviderFailed, "watch", "the runtime did not end watch %s within deadlines.cancel_ms (%v) of its cancellation; the stream was cut", w.id, d)
	}
}
