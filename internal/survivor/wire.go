package survivor

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// ProtocolVersion is the control protocol this package speaks, sent in
// hello. A survivor refuses a manager that speaks another version, naming
// both. Version 2 carries each launch's sandbox request (planWire.Sandbox)
// and the sandbox a launch applied (ProcessInfo.Sandbox): a version-1
// survivor would ignore the request and start the provider unsandboxed, so
// it must refuse the manager instead, and does (the versions differ).
const ProtocolVersion = "iteron-survivor/2"

// A control frame is
//
//	u32 header length | u32 payload length | header (JSON) | payload (raw bytes)
//
// big-endian. The header says what the frame is; the payload carries bytes
// that are never re-encoded (a run's input, an observation, a state). File
// descriptors ride on the frame that declares them (header.FDs) as
// SCM_RIGHTS. A frame is acted on only once all of it has arrived: a writer
// killed mid-frame leaves a torn frame that dies with its connection.
const (
	maxHeaderBytes  = 256 << 10
	maxPayloadBytes = 2 << 20
	maxFramesFDs    = 4
)

// Operations (header.Op).
const (
	opHello     = "hello"     // manager → survivor: the fence proof (1 fd: the state-dir lock)
	opWelcome   = "welcome"   // survivor → manager: accepted (1 fd: the gateway listener, when it has one)
	opRefused   = "refused"   // survivor → peer: not accepted, and why; the connection closes
	opLaunch    = "launch"    // 1 fd: the sealed executable
	opLoad      = "load"      //
	opRun       = "run"       // payload: the input
	opCancel    = "cancel"    //
	opSnapshot  = "snapshot"  //
	opMigrate   = "migrate"   // payload: the source state
	opRestore   = "restore"   // payload: the state
	opReadiness = "readiness" //
	opStop      = "stop"      //
	opClose     = "close"     //
	opStatus    = "status"    // budget, stderr tail, liveness
	opAck       = "ack"       // acknowledgements only
	opReply     = "reply"     // survivor → manager: the answer to header.ID
	opObserve   = "observe"   // survivor → manager: one observation of run header.ID (payload: its body)
	opProcess   = "process"   // survivor → manager: one live or dead process (the listing after welcome)
	opOutcome   = "outcome"   // survivor → manager: one run's outcome (payload: the terminal body)
	opActive    = "active"    // survivor → manager: a run still in progress (the listing after welcome)
	opListed    = "listed"    // survivor → manager: the listing is complete
	opExited    = "exited"    // survivor → manager: a process ended
	opCkptAsk   = "checkpoint"
	opCkptDone  = "checkpointed"
)

// header is every frame's header; each operation uses its part.
type header struct {
	Op string `json:"op"`
	// ID correlates a request with its reply (and a run with its
	// observations); chosen by the manager, unique per session.
	ID uint64 `json:"id,omitempty"`
	// Proc is the survivor's handle of a process (unique for the survivor's
	// lifetime).
	Proc uint64 `json:"proc,omitempty"`
	// FDs is the number of descriptors that ride on this frame.
	FDs int `json:"fds,omitempty"`
	// Acks are outcomes the manager has received (by run ID).
	Acks []string `json:"acks,omitempty"`

	Hello   *helloBody   `json:"hello,omitempty"`
	Welcome *welcomeBody `json:"welcome,omitempty"`
	Refused string       `json:"refused,omitempty"`
	Launch  *launchBody  `json:"launch,omitempty"`
	Run     *runBody     `json:"run,omitempty"`
	// TimeoutMs bounds an operation (load, stop) or is the deadline a state
	// operation is given.
	TimeoutMs  int64  `json:"timeout_ms,omitempty"`
	RunID      string `json:"run_id,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Digest     string `json:"digest,omitempty"`
	// State is a state operation's state (its bytes are the payload).
	State *stateW `json:"state,omitempty"`

	Reply   *replyBody   `json:"reply,omitempty"`
	Observe *observeBody `json:"observe,omitempty"`
	Process *ProcessInfo `json:"process,omitempty"`
	Outcome *Outcome     `json:"outcome,omitempty"`
	Exited  *exitedBody  `json:"exited,omitempty"`
}

type helloBody struct {
	Protocol string `json:"protocol"`
	// Listener says the manager holds a gateway listener (the device and
	// inode of its socket), which the survivor may adopt when it has none.
	ListenerIno uint64 `json:"listener_ino,omitempty"`
}

type welcomeBody struct {
	Protocol string `json:"protocol"`
	// Instance is random per survivor start: the invocation outcomes (and
	// the processes) survive exactly as long as it does not change.
	Instance string `json:"instance"`
	// Session is the fencing token: it grows with every accepted hello.
	Session uint64 `json:"session"`
	// Listener is set when a gateway listener rides on the frame.
	Listener bool `json:"listener,omitempty"`
	// Pid is the survivor's pid (in its own PID namespace).
	Pid int `json:"pid"`
}

// Tag names what a process is for; the manager sets it at launch and reads
// it back after a restart to re-attach (docs/survivor.md).
type Tag struct {
	// ActivationUID, Module and Generation (the Generation object's name).
	ActivationUID string `json:"activation_uid"`
	Module        string `json:"module"`
	Generation    string `json:"generation"`
	// Transaction is the ledger transaction that launched the process.
	Transaction string `json:"transaction"`
}

// ScratchKey names the scratch directory of a tagged launch: one per
// activation and generation, kept across the generation's processes.
func ScratchKey(t Tag) string {
	if t.ActivationUID == "" || t.Generation == "" {
		return ""
	}
	return t.ActivationUID + "/" + t.Generation
}

type launchBody struct {
	Plan planWire `json:"plan"`
	Tag  Tag      `json:"tag"`
}

// planWire is verifier.LaunchPlanFields on the wire.
type planWire struct {
	Module               string                  `json:"module"`
	ImplementationID     string                  `json:"implementation_id"`
	Version              [3]uint64               `json:"version"`
	ProtocolVersion      int                     `json:"protocol_version"`
	ManifestSHA256       string                  `json:"manifest_sha256"`
	ArtifactSHA256       string                  `json:"artifact_sha256"`
	ArtifactRoot         string                  `json:"artifact_root"`
	Executable           string                  `json:"executable"`
	Argv                 []string                `json:"argv"`
	CandidateSHA256      string                  `json:"candidate_sha256"`
	AdmittedCapabilities []string                `json:"admitted_capabilities"`
	AuthoritySHA256      string                  `json:"authority_sha256"`
	RuntimeDeadlineMs    int64                   `json:"runtime_deadline_ms"`
	CancellationMs       int64                   `json:"cancellation_deadline_ms"`
	EvidenceLimits       verifier.EvidenceLimits `json:"evidence_limits"`
	Contracts            json.RawMessage         `json:"contracts"`
	FailurePolicy        string                  `json:"failure_policy"`
	// Sandbox is what the source asks of the survivor's sandbox (always
	// sent).
	Sandbox verifier.SandboxRequest `json:"sandbox"`
}

func planToWire(p verifier.LaunchPlan) (planWire, error) {
	f := p.Fields()
	c, err := json.Marshal(f.Contracts)
	if err != nil {
		return planWire{}, err
	}
	return planWire{
		Module: f.Module, ImplementationID: f.ImplementationID, Version: f.Version, ProtocolVersion: f.ProtocolVersion,
		ManifestSHA256: f.ManifestSHA256, ArtifactSHA256: f.ArtifactSHA256, ArtifactRoot: f.ArtifactRoot,
		Executable: f.Executable, Argv: f.Argv, CandidateSHA256: f.CandidateSHA256,
		AdmittedCapabilities: f.AdmittedCapabilities, AuthoritySHA256: f.AuthoritySHA256,
		RuntimeDeadlineMs: f.RuntimeDeadline.Milliseconds(), CancellationMs: f.CancellationDeadline.Milliseconds(),
		EvidenceLimits: f.EvidenceLimits, Contracts: c, FailurePolicy: f.FailurePolicy, Sandbox: f.Sandbox,
	}, nil
}

func (w planWire) plan() (verifier.LaunchPlan, error) {
	f := verifier.LaunchPlanFields{
		Module: w.Module, ImplementationID: w.ImplementationID, Version: w.Version, ProtocolVersion: w.ProtocolVersion,
		ManifestSHA256: w.ManifestSHA256, ArtifactSHA256: w.ArtifactSHA256, ArtifactRoot: w.ArtifactRoot,
		Executable: w.Executable, Argv: w.Argv, CandidateSHA256: w.CandidateSHA256,
		AdmittedCapabilities: w.AdmittedCapabilities, AuthoritySHA256: w.AuthoritySHA256,
		RuntimeDeadline:      time.Duration(w.RuntimeDeadlineMs) * time.Millisecond,
		CancellationDeadline: time.Duration(w.CancellationMs) * time.Millisecond,
		EvidenceLimits:       w.EvidenceLimits, FailurePolicy: w.FailurePolicy, Sandbox: w.Sandbox,
	}
	if err := json.Unmarshal(w.Contracts, &f.Contracts); err != nil {
		return verifier.LaunchPlan{}, fmt.Errorf("relayed plan: contracts: %v", err)
	}
	return verifier.RelayedPlan(f)
}

// Invocation is what the gateway knows of the call a run serves: its
// outcome is kept under it (docs/survivor.md, "Outcomes").
type Invocation struct {
	Namespace    string `json:"namespace"`
	InvocationID string `json:"invocation_id"`
	// Fingerprint identifies what the call asked for (hex), so that a
	// reused invocation ID with another call is refused after a restart
	// too.
	Fingerprint    string `json:"fingerprint"`
	Activation     string `json:"activation"`
	Module         string `json:"module"`
	Generation     int64  `json:"generation"`
	GenerationName string `json:"generation_name"`
}

type runBody struct {
	DeadlineMs int64 `json:"deadline_ms"`
	// Observe asks for every observation (a Watch); otherwise only the
	// terminal one comes back, in the reply.
	Observe bool        `json:"observe,omitempty"`
	Call    *Invocation `json:"call,omitempty"`
}

// Budget is what remains of a process's per-process bounds, as the
// survivor's Process counts them.
type Budget struct {
	LifetimeMs      int64 `json:"lifetime_ms"`
	StdinBytes      int64 `json:"stdin_bytes"`
	StateOperations int   `json:"state_operations"`
}

type replyBody struct {
	Err *wireError `json:"err,omitempty"`
	// Launch: the process.
	Process *ProcessInfo `json:"process,omitempty"`
	// Budget after the operation.
	Budget *Budget `json:"budget,omitempty"`
	// StderrTotal counts the stderr bytes the process ever wrote (the
	// manager refreshes its copy of the tail when it changes).
	StderrTotal int64 `json:"stderr_total,omitempty"`
	// Run: the terminal observation's sequence (its body is the payload).
	Sequence uint64 `json:"sequence,omitempty"`
	// Status: the stderr tail and how many bytes were dropped.
	StderrTail    string `json:"stderr_tail,omitempty"`
	StderrDropped int64  `json:"stderr_dropped,omitempty"`
	// ViolationsTotal counts what the process did under --sandbox=audit
	// that the enforced sandbox refuses (the manager refreshes its copy
	// when it changes); Status: Violations, by syscall.
	ViolationsTotal int64            `json:"violations_total,omitempty"`
	Violations      map[string]int64 `json:"violations,omitempty"`
	// State is a snapshot's or migration's result (its bytes are the
	// payload).
	State *stateW `json:"state,omitempty"`
}

type observeBody struct {
	Sequence uint64 `json:"sequence"`
	Terminal bool   `json:"terminal,omitempty"`
}

// ProcessInfo is one process as the survivor knows it.
type ProcessInfo struct {
	Proc uint64 `json:"proc"`
	Tag  Tag    `json:"tag"`
	// Pid, Pgid and StartTime (clock ticks since boot, from
	// /proc/<pid>/stat) with BootID name the process for the life of the
	// machine; the survivor re-reads /proc and checks its pidfd each time it
	// lists the process (IdentityErr says what failed).
	Pid         int    `json:"pid"`
	Pgid        int    `json:"pgid"`
	StartTime   uint64 `json:"start_time"`
	BootID      string `json:"boot_id"`
	StartedAtNs int64  `json:"started_at_ns"`
	// The plan's identity.
	ImplementationID string `json:"implementation_id"`
	ManifestSHA256   string `json:"manifest_sha256"`
	ArtifactSHA256   string `json:"artifact_sha256"`
	AuthoritySHA256  string `json:"authority_sha256"`
	Interpreter      string `json:"interpreter,omitempty"`
	Loaded           bool   `json:"loaded,omitempty"`
	// Sandbox is what the process's sandbox applied (the evidence line of
	// internal/sandbox), "" when the survivor runs none.
	Sandbox string `json:"sandbox,omitempty"`
	// Alive is false once the process has ended; Err says how.
	Alive       bool       `json:"alive"`
	IdentityErr string     `json:"identity_err,omitempty"`
	Err         *wireError `json:"err,omitempty"`
	// ActiveRun is the run in progress, if any.
	ActiveRun string  `json:"active_run,omitempty"`
	Budget    *Budget `json:"budget,omitempty"`
}

// Outcome is one run's end, kept by the survivor until the manager
// acknowledges it (and for the idempotency window after).
type Outcome struct {
	RunID string      `json:"run_id"`
	Call  *Invocation `json:"call,omitempty"`
	// Done is false for a run still in progress (listed at hello).
	Done     bool       `json:"done"`
	Sequence uint64     `json:"sequence,omitempty"`
	Err      *wireError `json:"err,omitempty"`
	EndedNs  int64      `json:"ended_ns,omitempty"`
	Acked    bool       `json:"acked,omitempty"`
	// Body is the terminal observation (the frame's payload on the wire).
	Body []byte `json:"-"`
}

// Failure is the error that ended the run (nil for a terminal
// observation): a *procexec.Fault, procexec.ErrRunCancelled,
// procexec.ErrClosed, or an *Error.
func (o Outcome) Failure() error { return o.Err.err() }

type exitedBody struct {
	Err        *wireError `json:"err,omitempty"`
	Exit       string     `json:"exit,omitempty"`
	StderrTail string     `json:"stderr_tail,omitempty"`
}

// wireError is an error crossing the control socket: a provider fault
// (rebuilt as a *procexec.Fault), a cancelled or closed run, or anything
// else (a message).
type wireError struct {
	Kind    string    `json:"kind"` // fault, cancelled, closed, error
	Fault   *faultW   `json:"fault,omitempty"`
	Message string    `json:"message,omitempty"`
	At      time.Time `json:"-"`
}

type faultW struct {
	Kind    int    `json:"kind"`
	Op      string `json:"op"`
	Detail  string `json:"detail"`
	Frame   []byte `json:"frame,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Reason  string `json:"reason,omitempty"`
	AtNs    int64  `json:"at_ns,omitempty"`
}

func toWire(err error) *wireError {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, procexec.ErrRunCancelled):
		return &wireError{Kind: "cancelled"}
	case errors.Is(err, procexec.ErrClosed):
		return &wireError{Kind: "closed"}
	}
	var se *Error
	if errors.As(err, &se) {
		return &wireError{Kind: "error", Message: se.Message}
	}
	if f, ok := procexec.AsFault(err); ok {
		w := &faultW{Kind: int(f.Kind), Op: f.Op, Detail: f.Detail, Frame: f.Frame, Code: f.Code, Message: f.Message, Reason: f.Reason}
		if !f.At.IsZero() {
			w.AtNs = f.At.UnixNano()
		}
		return &wireError{Kind: "fault", Fault: w}
	}
	return &wireError{Kind: "error", Message: err.Error()}
}

// err rebuilds the error: ErrRunCancelled, ErrClosed, a *procexec.Fault,
// or an *Error.
func (w *wireError) err() error {
	if w == nil {
		return nil
	}
	switch w.Kind {
	case "cancelled":
		return procexec.ErrRunCancelled
	case "closed":
		return procexec.ErrClosed
	case "fault":
		if f := w.Fault; f != nil {
			pf := &procexec.Fault{Kind: procexec.FaultKind(f.Kind), Op: f.Op, Detail: f.Detail, Frame: f.Frame, Code: f.Code, Message: f.Message, Reason: f.Reason}
			if f.AtNs != 0 {
				pf.At = time.Unix(0, f.AtNs)
			}
			return pf
		}
	}
	return &Error{Message: w.Message}
}

// Error is an error the survivor reported that is not a provider fault.
type Error struct{ Message string }

func (e *Error) Error() string { return "survivor: " + e.Message }

// frame is one decoded frame.
type frame struct {
	h       header
	payload []byte
	files   []*os.File
}

func (f *frame) closeFiles() {
	for _, x := range f.files {
		if x != nil {
			x.Close()
		}
	}
	f.files = nil
}

// conn frames a unix stream connection, with descriptors.
type conn struct {
	uc *net.UnixConn

	wmu  sync.Mutex
	wbuf []byte

	// Read side (one reader).
	rbuf []byte // unread bytes
	fds  []int  // received descriptors not yet claimed by a frame
	tmp  []byte
	oob  []byte
}

func newConn(uc *net.UnixConn) *conn {
	// Socket buffers that hold a whole run's frame (a 512 KiB input or
	// observation and its header) let it cross in one write and a few
	// reads instead of a wake-up of the other side per 200 KiB (the
	// kernel's default); the kernel caps them at net.core.{w,r}mem_max.
	_ = uc.SetWriteBuffer(socketBufferBytes)
	_ = uc.SetReadBuffer(socketBufferBytes)
	return &conn{uc: uc, tmp: make([]byte, 256<<10), oob: make([]byte, syscall.CmsgSpace(4*maxFramesFDs))}
}

// socketBufferBytes is the control socket's buffer size asked for.
const socketBufferBytes = 1 << 20

// write sends one frame; files ride on it.
func (c *conn) write(h *header, payload []byte, files ...*os.File) error {
	if len(payload) > maxPayloadBytes {
		return fmt.Errorf("survivor: a %d-byte payload exceeds %d", len(payload), maxPayloadBytes)
	}
	h.FDs = len(files)
	hb, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if len(hb) > maxHeaderBytes {
		return fmt.Errorf("survivor: a %d-byte header exceeds %d", len(hb), maxHeaderBytes)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := c.wbuf[:0]
	b = binary.BigEndian.AppendUint32(b, uint32(len(hb)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, hb...)
	b = append(b, payload...)
	c.wbuf = b
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		// The descriptors go with the first bytes of the frame.
		n, _, err := c.uc.WriteMsgUnix(b[:1], syscall.UnixRights(fds...), nil)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	_, err = c.uc.Write(b)
	if len(c.wbuf) > 1<<20 {
		c.wbuf = nil // do not keep a large buffer
	}
	return err
}

// read returns the next whole frame.
func (c *conn) read() (*frame, error) {
	if err := c.fill(8); err != nil {
		return nil, err
	}
	hl, pl := binary.BigEndian.Uint32(c.rbuf[0:4]), binary.BigEndian.Uint32(c.rbuf[4:8])
	if hl > maxHeaderBytes || pl > maxPayloadBytes {
		return nil, fmt.Errorf("survivor: a frame of %d header and %d payload bytes exceeds the bounds (%d, %d)", hl, pl, maxHeaderBytes, maxPayloadBytes)
	}
	n := 8 + int(hl) + int(pl)
	if err := c.fill(n); err != nil {
		return nil, err
	}
	f := &frame{}
	if err := json.Unmarshal(c.rbuf[8:8+hl], &f.h); err != nil {
		return nil, fmt.Errorf("survivor: a frame header that is not JSON: %v", err)
	}
	if pl > 0 {
		f.payload = append([]byte(nil), c.rbuf[8+hl:n]...)
	}
	c.rbuf = c.rbuf[n:]
	if f.h.FDs < 0 || f.h.FDs > maxFramesFDs || f.h.FDs > len(c.fds) {
		return nil, fmt.Errorf("survivor: a frame declares %d descriptors, %d arrived", f.h.FDs, len(c.fds))
	}
	for _, fd := range c.fds[:f.h.FDs] {
		f.files = append(f.files, os.NewFile(uintptr(fd), "received"))
	}
	c.fds = c.fds[f.h.FDs:]
	return f, nil
}

// fill reads until n bytes are buffered, collecting descriptors.
func (c *conn) fill(n int) error {
	for len(c.rbuf) < n {
		k, oobn, _, _, err := c.uc.ReadMsgUnix(c.tmp, c.oob)
		if oobn > 0 {
			msgs, perr := syscall.ParseSocketControlMessage(c.oob[:oobn])
			if perr == nil {
				for _, m := range msgs {
					if fds, err := syscall.ParseUnixRights(&m); err == nil {
						for _, fd := range fds {
							syscall.CloseOnExec(fd)
						}
						c.fds = append(c.fds, fds...)
					}
				}
			}
			if len(c.fds) > 4*maxFramesFDs {
				return errors.New("survivor: too many descriptors received")
			}
		}
		if k > 0 {
			if len(c.rbuf) == 0 {
				c.rbuf = append(c.rbuf[:0:0], c.tmp[:k]...)
			} else {
				c.rbuf = append(c.rbuf, c.tmp[:k]...)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(c.rbuf) > 0 {
				return fmt.Errorf("survivor: the connection ended inside a frame (%d of %d bytes): a torn frame, dropped", len(c.rbuf), n)
			}
			return err
		}
		if k == 0 && oobn == 0 {
			if len(c.rbuf) > 0 {
				return fmt.Errorf("survivor: the connection ended inside a frame (%d of %d bytes): a torn frame, dropped", len(c.rbuf), n)
			}
			return io.EOF
		}
	}
	return nil
}

// close closes the connection and every descriptor received but unclaimed.
func (c *conn) close() error {
	for _, fd := range c.fds {
		syscall.Close(fd)
	}
	c.fds = nil
	return c.uc.Close()
}

// stateW is a protocol.State on the wire; its state bytes are the payload.
type stateW struct {
	Module           string               `json:"module"`
	ImplementationID string               `json:"implementation_id"`
	RunID            string               `json:"run_id"`
	Generation       uint64               `json:"generation"`
	StateSchema      protocol.ContractRef `json:"state_schema"`
	StateSHA256      string               `json:"state_sha256"`
}

func stateToWire(st protocol.State) stateW {
	return stateW{Module: st.Module, ImplementationID: st.ImplementationID, RunID: st.RunID, Generation: st.Generation, StateSchema: st.StateSchema, StateSHA256: st.StateSHA256}
}

func (w *stateW) state(payload []byte) protocol.State {
	return protocol.State{Module: w.Module, ImplementationID: w.ImplementationID, RunID: w.RunID, Generation: w.Generation,
		StateSchema: w.StateSchema, StateSHA256: w.StateSHA256, State: jsontext.Value(payload)}
}

func stateFrom(h *header, payload []byte) (protocol.State, error) {
	if h.State == nil {
		return protocol.State{}, &Error{Message: h.Op + " without a state"}
	}
	return h.State.state(payload), nil
}
