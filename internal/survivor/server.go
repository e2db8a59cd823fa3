package survivor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/protocol"
)

// Superseded starts the refusal a session gets when a newer manager proved
// the lock.
const Superseded = "superseded by a newer manager session"

// ServerConfig configures a survivor.
type ServerConfig struct {
	// StateDir is the manager's state dir: the survivor takes its own lock
	// there, listens on <state-dir>/survivor.sock, records provider groups
	// in <state-dir>/procs and checks the manager's lock proof against
	// <state-dir>/lock.
	StateDir string
	// GatewaySocket, when set, is the gateway's socket: the survivor makes
	// it (mode 0660, group GatewayGroup) and hands it to each manager.
	GatewaySocket string
	GatewayGroup  int
	// ManagerUID is the uid a manager must connect as (its SO_PEERCRED).
	ManagerUID uint32
	// Executor configures the providers (uid, gid, interpreters);
	// RecordDir is set to <state-dir>/procs.
	Executor procexec.Config
	// CheckpointTimeout bounds how long Shutdown waits for the manager to
	// checkpoint before the providers are stopped (default 30s).
	CheckpointTimeout time.Duration
	// Log receives the survivor's log lines.
	Log logr.Logger
	// Now is the clock (time.Now if nil).
	Now func() time.Time
}

// Server is the survivor: it owns the provider processes of one node (one
// state dir) across manager restarts.
type Server struct {
	cfg      ServerConfig
	lock     *os.File
	ex       *procexec.Executor
	control  *net.UnixListener
	gw       *SocketListener
	instance string
	outcomes *outcomeTable
	log      logr.Logger

	mu       sync.Mutex
	session  *session
	sessions uint64
	procs    map[uint64]*entry
	nextProc uint64
	closing  bool
	ckpt     chan struct{} // closed when the manager answered a checkpoint request

	wg sync.WaitGroup
}

type entry struct {
	id   uint64
	p    *procexec.Process
	tag  Tag
	info ProcessInfo // identity, filled at launch
	// reported is set once a manager was told the process ended.
	reported bool
}

type session struct {
	n    uint64
	c    *conn
	done chan struct{}
}

// NewServer takes the survivor's lock, starts the executor (killing the
// provider groups an earlier survivor left behind), makes the gateway
// socket and listens on the control socket.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("survivor: state dir %q must be an absolute path", cfg.StateDir)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CheckpointTimeout <= 0 {
		cfg.CheckpointTimeout = 30 * time.Second
	}
	lock, err := lockOwn(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, lock: lock, outcomes: newOutcomeTable(cfg.Now), log: cfg.Log, procs: map[uint64]*entry{}}
	fail := func(err error) (*Server, error) {
		s.closeAll()
		return nil, err
	}
	cfg.Executor.RecordDir = statedir.Dir(cfg.StateDir).ProcessRecords()
	if s.ex, err = procexec.NewExecutor(cfg.Executor); err != nil {
		return fail(fmt.Errorf("survivor: process executor: %w", err))
	}
	swept, err := s.ex.Sweep()
	if err != nil {
		return fail(fmt.Errorf("survivor: sweep leftover providers: %w", err))
	}
	if len(swept.Killed) > 0 || swept.Stale > 0 {
		s.log.Info("swept provider groups left by an earlier survivor or manager", "killed", len(swept.Killed), "stale", swept.Stale)
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return fail(err)
	}
	s.instance = hex.EncodeToString(id[:])
	if cfg.GatewaySocket != "" {
		if s.gw, err = ListenSocket(cfg.GatewaySocket, cfg.GatewayGroup); err != nil {
			return fail(err)
		}
		// The socket file outlives the survivor: a manager may hold a copy
		// and keep serving it; the next survivor replaces it.
		s.gw.Detach()
	}
	path := statedir.Dir(cfg.StateDir).SurvivorSocket()
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return fail(fmt.Errorf("survivor: %s exists and is not a socket; refusing to replace it", path))
		}
		os.Remove(path) // a stale one: the survivor lock is held
	}
	old := unix.Umask(0o077)
	s.control, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return fail(fmt.Errorf("survivor: listen on %s: %w", path, err))
	}
	return s, nil
}

// Instance is the survivor's random instance ID (new at every start).
func (s *Server) Instance() string { return s.instance }

// Serve accepts manager connections until Shutdown.
func (s *Server) Serve() error {
	for {
		uc, err := s.control.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return nil
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(uc)
		}()
	}
}

// serveConn authenticates a connection and serves its session.
func (s *Server) serveConn(uc *net.UnixConn) {
	c := newConn(uc)
	defer c.close()
	refuse := func(why string) {
		s.log.Info("refused a connection", "why", why)
		_ = c.write(&header{Op: opRefused, Refused: why}, nil)
	}
	cred, err := peerCred(uc)
	if err != nil {
		refuse("no peer credentials: " + err.Error())
		return
	}
	if cred.Uid != s.cfg.ManagerUID {
		refuse(fmt.Sprintf("peer uid %d (pid %d) is not the manager's uid %d", cred.Uid, cred.Pid, s.cfg.ManagerUID))
		return
	}
	_ = uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := c.read()
	if err != nil {
		refuse("no hello: " + err.Error())
		return
	}
	_ = uc.SetReadDeadline(time.Time{})
	defer f.closeFiles()
	switch {
	case f.h.Op != opHello || f.h.Hello == nil:
		refuse(fmt.Sprintf("the first frame is %q; a manager says hello first", f.h.Op))
		return
	case f.h.Hello.Protocol != ProtocolVersion:
		refuse(fmt.Sprintf("protocol %q; this survivor speaks %s", f.h.Hello.Protocol, ProtocolVersion))
		return
	case len(f.files) != 1:
		refuse(fmt.Sprintf("hello carries %d descriptors; it carries the state-dir lock", len(f.files)))
		return
	}
	proof := checkLockProof(s.cfg.StateDir, f.files[0])
	f.closeFiles() // never keep the manager's lock
	if proof != nil {
		refuse(proof.Error())
		return
	}

	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		refuse("the survivor is stopping")
		return
	}
	s.sessions++
	sess := &session{n: s.sessions, c: c, done: make(chan struct{})}
	old := s.session
	s.session = sess
	s.mu.Unlock()
	defer close(sess.done)
	if old != nil {
		// The old owner cannot hold the lock any more: it died (or is
		// dying) and its connection is stale.
		s.log.Info("a new manager session supersedes the previous one", "session", sess.n, "previous", old.n)
		_ = old.c.write(&header{Op: opRefused, Refused: fmt.Sprintf("%s: session %d", Superseded, sess.n)}, nil)
		old.c.uc.Close()
	}
	s.log.Info("manager session started", "session", sess.n, "peerPid", cred.Pid)

	welcome := &header{Op: opWelcome, Welcome: &welcomeBody{Protocol: ProtocolVersion, Instance: s.instance, Session: sess.n, Pid: os.Getpid()}}
	var files []*os.File
	if s.gw != nil {
		if lf, err := s.gw.File(); err == nil {
			files = append(files, lf)
			welcome.Welcome.Listener = true
			defer lf.Close()
		} else {
			s.log.Error(err, "cannot hand over the gateway listener")
		}
	}
	if err := c.write(welcome, nil, files...); err != nil {
		return
	}
	if err := s.writeListing(sess); err != nil {
		return
	}
	for {
		f, err := c.read()
		if err != nil {
			break
		}
		if !s.current(sess) {
			f.closeFiles()
			_ = c.write(&header{Op: opReply, ID: f.h.ID, Reply: &replyBody{Err: &wireError{Kind: "error", Message: fmt.Sprintf("session %d was superseded by a newer manager", sess.n)}}}, nil)
			break
		}
		s.outcomes.ack(f.h.Acks)
		if f.h.Op == opAck {
			continue
		}
		if f.h.Op == opCkptDone {
			s.mu.Lock()
			if s.ckpt != nil {
				close(s.ckpt)
				s.ckpt = nil
			}
			s.mu.Unlock()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer f.closeFiles()
			s.do(sess, f)
		}()
	}
	s.mu.Lock()
	if s.session == sess {
		s.session = nil
		s.log.Info("manager session ended; the providers keep running", "session", sess.n, "processes", len(s.procs))
	}
	s.mu.Unlock()
}

func (s *Server) current(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session == sess
}

// send writes a frame to the current session, if any.
func (s *Server) send(h *header, payload []byte) bool {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess == nil {
		return false
	}
	return sess.c.write(h, payload) == nil
}

// writeListing sends a new session every process, every outcome and every
// active run, then listed.
func (s *Server) writeListing(sess *session) error {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.procs))
	for _, e := range s.procs {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].id < entries[j].id })
	for _, e := range entries {
		info := s.describe(e)
		if err := sess.c.write(&header{Op: opProcess, Process: &info}, nil); err != nil {
			return err
		}
		if !info.Alive {
			s.mu.Lock()
			e.reported = true
			delete(s.procs, e.id)
			s.mu.Unlock()
		}
	}
	for _, o := range s.outcomes.list() {
		op := opOutcome
		if !o.Done {
			op = opActive
		}
		if err := sess.c.write(&header{Op: op, Outcome: &o}, o.Body); err != nil {
			return err
		}
	}
	return sess.c.write(&header{Op: opListed}, nil)
}

// describe is a process's ProcessInfo now: identity re-checked against
// /proc and its pidfd, liveness, active run and budget.
func (s *Server) describe(e *entry) ProcessInfo {
	info := e.info
	select {
	case <-e.p.Done():
		info.Alive = false
		info.Err = toWire(e.p.Err())
		if info.Err == nil {
			info.Err = &wireError{Kind: "closed"}
		}
	default:
		info.Alive = true
		if err := e.p.CheckIdentity(); err != nil {
			info.IdentityErr = err.Error()
		}
		if run, ok := e.p.ActiveRun(); ok {
			info.ActiveRun = run.ID
		}
		b := budgetOf(e.p)
		info.Budget = &b
	}
	return info
}

func budgetOf(p *procexec.Process) Budget {
	b := p.Budget()
	return Budget{LifetimeMs: b.Lifetime.Milliseconds(), StdinBytes: b.StdinBytes, StateOperations: b.StateOperations}
}

// reply answers request id of sess; it reports whether sess got it.
func (s *Server) reply(sess *session, id uint64, body *replyBody, payload []byte) bool {
	return s.replyRun(sess, id, "", body, payload)
}

// replyRun answers a run (its ID tells the manager which outcome to
// acknowledge).
func (s *Server) replyRun(sess *session, id uint64, runID string, body *replyBody, payload []byte) bool {
	if !s.current(sess) {
		return false
	}
	return sess.c.write(&header{Op: opReply, ID: id, RunID: runID, Reply: body}, payload) == nil
}

func (s *Server) entry(id uint64) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.procs[id]
	if !ok {
		return nil, fmt.Errorf("no process %d in this survivor (instance %s)", id, s.instance)
	}
	return e, nil
}

func timeoutOf(h *header, def time.Duration) time.Duration {
	if h.TimeoutMs > 0 {
		return time.Duration(h.TimeoutMs) * time.Millisecond
	}
	return def
}

// do performs one operation. Operations are never bound to the
// connection: a manager that goes away does not end them; their answers
// are dropped (a run's outcome is kept).
func (s *Server) do(sess *session, f *frame) {
	h := &f.h
	fail := func(err error) { s.reply(sess, h.ID, &replyBody{Err: toWire(err)}, nil) }
	if h.Op == opLaunch {
		s.launch(sess, f)
		return
	}
	e, err := s.entry(h.Proc)
	if err != nil {
		fail(&Error{Message: err.Error()})
		return
	}
	p := e.p
	bg := context.Background()
	switch h.Op {
	case opLoad:
		ctx, cancel := context.WithTimeout(bg, timeoutOf(h, time.Minute))
		_, err := p.Load(ctx)
		cancel()
		if err == nil {
			s.mu.Lock()
			e.info.Loaded = true
			s.mu.Unlock()
		}
		s.answer(sess, h.ID, p, err)
	case opRun:
		s.run(sess, e, f)
	case opCancel:
		s.answer(sess, h.ID, p, p.Cancel(bg, h.RunID, h.Reason))
	case opSnapshot:
		st, err := p.Snapshot(bg, h.Generation, timeoutOf(h, time.Minute))
		s.answerState(sess, h.ID, p, st, err)
	case opMigrate:
		src, err := stateFrom(h, f.payload)
		if err != nil {
			fail(err)
			return
		}
		st, err := p.Migrate(bg, src, timeoutOf(h, time.Minute))
		s.answerState(sess, h.ID, p, st, err)
	case opRestore:
		st, err := stateFrom(h, f.payload)
		if err != nil {
			fail(err)
			return
		}
		_, err = p.Restore(bg, st, timeoutOf(h, time.Minute))
		s.answer(sess, h.ID, p, err)
	case opReadiness:
		_, err := p.Readiness(bg, h.Generation, h.Digest, timeoutOf(h, time.Minute))
		s.answer(sess, h.ID, p, err)
	case opStop:
		s.answer(sess, h.ID, p, p.Stop(bg, h.Reason))
	case opClose:
		s.answer(sess, h.ID, p, p.Close())
	case opStatus:
		info := s.describe(e)
		v := p.SandboxViolations()
		s.reply(sess, h.ID, &replyBody{Budget: info.Budget, Process: &info, StderrTail: string(p.StderrTail()), StderrDropped: p.StderrDropped(), StderrTotal: stderrTotal(p),
			Violations: v, ViolationsTotal: total(v)}, nil)
	default:
		fail(&Error{Message: fmt.Sprintf("unknown operation %q", h.Op)})
	}
}

func stderrTotal(p *procexec.Process) int64 {
	return int64(len(p.StderrTail())) + p.StderrDropped()
}

// total is the sum of a violation count.
func total(v map[string]int64) int64 {
	var n int64
	for _, c := range v {
		n += c
	}
	return n
}

func (s *Server) answer(sess *session, id uint64, p *procexec.Process, err error) {
	b := budgetOf(p)
	s.reply(sess, id, &replyBody{Err: toWire(err), Budget: &b, StderrTotal: stderrTotal(p), ViolationsTotal: total(p.SandboxViolations())}, nil)
}

func (s *Server) answerState(sess *session, id uint64, p *procexec.Process, st protocol.State, err error) {
	if err != nil {
		s.answer(sess, id, p, err)
		return
	}
	b := budgetOf(p)
	w := stateToWire(st)
	s.reply(sess, id, &replyBody{Budget: &b, StderrTotal: stderrTotal(p), ViolationsTotal: total(p.SandboxViolations()), State: &w}, st.State)
}

// launch checks the handed executable and the relayed plan and starts the
// provider.
func (s *Server) launch(sess *session, f *frame) {
	h := &f.h
	fail := func(err error) { s.reply(sess, h.ID, &replyBody{Err: toWire(err)}, nil) }
	if h.Launch == nil || len(f.files) != 1 {
		fail(&Error{Message: fmt.Sprintf("launch carries %d descriptors; it carries exactly the sealed executable (a path is never run)", len(f.files))})
		return
	}
	plan, err := h.Launch.Plan.plan()
	if err != nil {
		fail(&Error{Message: err.Error()})
		return
	}
	file := f.files[0]
	f.files = nil // OpenSealed owns it now
	sealed, err := procexec.OpenSealed(file, plan.ArtifactSHA256())
	if err != nil {
		fail(err)
		return
	}
	defer sealed.Close()
	p, err := s.ex.LaunchSealedIn(plan, sealed, ScratchKey(h.Launch.Tag))
	if err != nil {
		fail(err)
		return
	}
	s.mu.Lock()
	s.nextProc++
	e := &entry{id: s.nextProc, p: p, tag: h.Launch.Tag}
	e.info = ProcessInfo{
		Proc: e.id, Tag: e.tag, Pid: p.Pid(), Pgid: p.Pgid(), StartTime: p.StartTime(), BootID: procexec.BootID(),
		StartedAtNs: p.StartedAt().UnixNano(), ImplementationID: plan.ImplementationID(), ManifestSHA256: plan.ManifestSHA256(),
		ArtifactSHA256: plan.ArtifactSHA256(), AuthoritySHA256: plan.AuthoritySHA256(), Interpreter: p.Interpreter(),
	}
	if ev, ok := p.Sandbox(); ok {
		e.info.Sandbox = ev.String()
	}
	s.procs[e.id] = e
	s.mu.Unlock()
	s.log.Info("provider launched", "proc", e.id, "pid", p.Pid(), "module", e.tag.Module, "generation", e.tag.Generation, "transaction", e.tag.Transaction)
	go s.watch(e)
	info := s.describe(e)
	if !s.reply(sess, h.ID, &replyBody{Process: &info, Budget: info.Budget}, nil) {
		// Nobody will ever know this process: it would run unowned.
		s.log.Info("the manager went away during a launch; closing the new provider", "proc", e.id, "pid", p.Pid())
		p.Close()
	}
}

// watch tells the current manager when a process ends.
func (s *Server) watch(e *entry) {
	<-e.p.Done()
	info := s.describe(e)
	ok := s.send(&header{Op: opExited, Proc: e.id, Exited: &exitedBody{Err: info.Err, Exit: e.p.Teardown().Exit.String(), StderrTail: string(e.p.StderrTail())}}, nil)
	s.mu.Lock()
	if ok {
		e.reported = true
		delete(s.procs, e.id)
	}
	s.mu.Unlock()
	s.log.Info("provider ended", "proc", e.id, "pid", e.info.Pid, "module", e.tag.Module, "exit", e.p.Teardown().Exit.String(), "error", errString(e.p.Err()), "managerTold", ok)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// run runs one call's run; its outcome is recorded before the answer.
func (s *Server) run(sess *session, e *entry, f *frame) {
	h := &f.h
	if h.Run == nil || h.RunID == "" {
		s.reply(sess, h.ID, &replyBody{Err: &wireError{Kind: "error", Message: "run without a run ID"}}, nil)
		return
	}
	deadline := time.Duration(h.Run.DeadlineMs) * time.Millisecond
	record := h.Run.Call != nil
	if record {
		s.outcomes.begin(h.RunID, h.Run.Call)
	}
	run, err := e.p.Start(context.Background(), h.RunID, jsontext.Value(f.payload), deadline)
	var seq uint64
	var body []byte
	if err == nil {
		if h.Run.Observe {
			for o := range run.Observations() {
				if s.current(sess) {
					_ = sess.c.write(&header{Op: opObserve, ID: h.ID, Observe: &observeBody{Sequence: o.Sequence, Terminal: o.Terminal}}, o.Observation)
				}
			}
		}
		var terminal protocol.Observation
		terminal, err = run.Result()
		seq, body = terminal.Sequence, terminal.Observation
	}
	werr := toWire(err)
	if record {
		o, dropped := s.outcomes.end(h.RunID, h.Run.Call, seq, body, werr)
		for _, id := range dropped {
			s.log.Info("an unacknowledged outcome was dropped: more than MaxOutcomes unacknowledged", "run", id)
		}
		b := budgetOf(e.p)
		if !s.replyRun(sess, h.ID, h.RunID, &replyBody{Err: werr, Sequence: seq, Budget: &b, StderrTotal: stderrTotal(e.p), ViolationsTotal: total(e.p.SandboxViolations())}, body) {
			// The manager that asked is gone: the next one gets the outcome.
			s.send(&header{Op: opOutcome, Outcome: &o}, body)
		}
		return
	}
	b := budgetOf(e.p)
	s.reply(sess, h.ID, &replyBody{Err: werr, Sequence: seq, Budget: &b, StderrTotal: stderrTotal(e.p), ViolationsTotal: total(e.p.SandboxViolations())}, body)
}

// Shutdown stops the survivor: it asks the connected manager to checkpoint
// every Active generation (bounded by CheckpointTimeout), stops every
// provider (each within its cancellation deadline), and closes the
// sockets. The gateway socket file stays: the manager may still serve its
// copy, and the next survivor replaces it.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	ckpt := make(chan struct{})
	s.ckpt = ckpt
	sess := s.session
	n := len(s.procs)
	s.mu.Unlock()
	s.control.Close()
	if sess != nil && n > 0 {
		s.log.Info("stopping: asking the manager to checkpoint first", "session", sess.n, "processes", n)
		if sess.c.write(&header{Op: opCkptAsk}, nil) == nil {
			timer := time.NewTimer(s.cfg.CheckpointTimeout)
			select {
			case <-ckpt:
				s.log.Info("the manager checkpointed")
			case <-timer.C:
				s.log.Info("the manager did not answer the checkpoint request in time", "timeout", s.cfg.CheckpointTimeout)
			case <-ctx.Done():
			case <-sess.done:
			}
			timer.Stop()
		}
	}
	s.mu.Lock()
	var all []*entry
	for _, e := range s.procs {
		all = append(all, e)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = e.p.Stop(ctx, "the survivor is stopping")
			e.p.Close()
		}()
	}
	wg.Wait()
	s.closeAll()
	return nil
}

func (s *Server) closeAll() {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		sess.c.uc.Close()
	}
	if s.control != nil {
		s.control.Close()
	}
	if s.gw != nil {
		s.gw.Close()
	}
	if s.lock != nil {
		s.lock.Close()
	}
}

// Processes lists the processes (for the survivor's own log and tests).
func (s *Server) Processes() []ProcessInfo {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.procs))
	for _, e := range s.procs {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	out := make([]ProcessInfo, 0, len(entries))
	for _, e := range entries {
		out = append(out, s.describe(e))
	}
	slices.SortFunc(out, func(a, b ProcessInfo) int { return int(a.Proc) - int(b.Proc) })
	return out
}

// OutcomeCounts reports the outcome table: unacknowledged, acknowledged,
// active.
func (s *Server) OutcomeCounts() (unacked, acked, active int) { return s.outcomes.counts() }
