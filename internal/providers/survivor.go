package providers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/pkg/strictjson"
)

// SurvivorOwner is the node's survivor (docs/survivor.md) as the
// coordinator's process owner: providers are launched there (from
// executables this manager sealed), survive this manager, and are
// re-attached by the next one.
type SurvivorOwner struct {
	client   *survivor.Client
	seals    *procexec.SealCache
	stateDir string
	log      logr.Logger

	mu sync.Mutex
	// unclaimed are the processes the survivor held when this manager
	// attached that are neither adopted nor released yet.
	unclaimed map[*survivor.RemoteProcess]bool
	fileMu    sync.Mutex
}

// NewSurvivorOwner makes the survivor behind client the owner of the
// providers; att is what it held when this manager attached.
func NewSurvivorOwner(client *survivor.Client, att *survivor.Attachment, stateDir string, log logr.Logger) *SurvivorOwner {
	o := &SurvivorOwner{client: client, seals: procexec.NewSealCache(procexec.DefaultExecutableCacheBytes), stateDir: stateDir, log: log,
		unclaimed: map[*survivor.RemoteProcess]bool{}}
	for _, rp := range att.Processes {
		o.unclaimed[rp] = true
	}
	return o
}

// Client is the survivor's client.
func (o *SurvivorOwner) Client() *survivor.Client { return o.client }

// Launch is the coordinator's Launcher: it seals the verified executable
// here and hands the survivor the sealed memfd (never a path), tagged with
// the transaction that launches it.
func (o *SurvivorOwner) Launch(ctx context.Context, req LaunchRequest) (Provider, error) {
	plan := req.Plan
	exe, err := o.seals.Seal(plan.Executable(), plan.ArtifactSHA256())
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	rp, err := o.client.Launch(ctx, plan, exe, req.Tag)
	if err != nil {
		return nil, err
	}
	return &remoteProvider{rp: rp}, nil
}

// ReleaseModule releases every unclaimed process of one module of an
// activation (nothing of it is to be re-attached).
func (o *SurvivorOwner) ReleaseModule(uid, module, why string) {
	for _, rp := range o.Candidates(uid, module) {
		o.Release(rp, why)
	}
}

// Candidates are the unclaimed processes of one module of an activation.
func (o *SurvivorOwner) Candidates(uid, module string) []*survivor.RemoteProcess {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*survivor.RemoteProcess
	for rp := range o.unclaimed {
		if t := rp.Info().Tag; t.ActivationUID == uid && t.Module == module {
			out = append(out, rp)
		}
	}
	return out
}

// Claim takes rp out of the unclaimed ones; false if it was not there.
func (o *SurvivorOwner) Claim(rp *survivor.RemoteProcess) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.unclaimed[rp] {
		return false
	}
	delete(o.unclaimed, rp)
	return true
}

// Release ends an unclaimed process nobody will adopt (the survivor kills
// and reaps its group).
func (o *SurvivorOwner) Release(rp *survivor.RemoteProcess, why string) {
	if !o.Claim(rp) {
		return
	}
	info := rp.Info()
	o.log.Info("releasing a provider process no generation re-attached", "pid", info.Pid, "module", info.Tag.Module, "generation", info.Tag.Generation, "transaction", info.Tag.Transaction, "why", why)
	go rp.Close()
}

// ReleaseUnknown releases the unclaimed processes of activations for
// which known reports false (deleted while no manager ran).
func (o *SurvivorOwner) ReleaseUnknown(known func(uid string) bool) {
	o.mu.Lock()
	var gone []*survivor.RemoteProcess
	for rp := range o.unclaimed {
		if !known(rp.Info().Tag.ActivationUID) {
			gone = append(gone, rp)
		}
	}
	o.mu.Unlock()
	for _, rp := range gone {
		o.Release(rp, "its activation no longer exists on this node")
	}
}

// Unclaimed counts the processes not yet adopted nor released.
func (o *SurvivorOwner) Unclaimed() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.unclaimed)
}

// AttachedRecord is the manager's own durable record of the process that
// became a module's active one (written when its switch was durable): what
// a restarted manager checks a survivor's process against before it
// adopts it — never a reused pid.
type AttachedRecord struct {
	Transaction      string `json:"transaction"`
	Generation       string `json:"generation"`
	Pid              int    `json:"pid"`
	StartTime        uint64 `json:"start_time"`
	BootID           string `json:"boot_id"`
	ImplementationID string `json:"implementation_id"`
	ManifestSHA256   string `json:"manifest_sha256"`
	ArtifactSHA256   string `json:"artifact_sha256"`
	AuthoritySHA256  string `json:"authority_sha256"`
}

// maxAttachedBytes bounds an attachment file (64 modules).
const maxAttachedBytes = 256 << 10

func attachedPath(stateDir, uid string) string {
	return statedir.Dir(stateDir).Attached(uid)
}

// ReadAttached reads an activation's attachment records by module.
func ReadAttached(stateDir, uid string) (map[string]AttachedRecord, error) {
	f, err := os.Open(attachedPath(stateDir, uid))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]AttachedRecord{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := strictjson.ReadBounded(f, maxAttachedBytes)
	if err != nil {
		return nil, err
	}
	recs := map[string]AttachedRecord{}
	if err := json.Unmarshal(b, &recs); err != nil {
		return nil, fmt.Errorf("%s: %w", attachedPath(stateDir, uid), err)
	}
	return recs, nil
}

// NoteAttached records durably that module's active process is now rec
// (nil: the module has none).
func (o *SurvivorOwner) NoteAttached(uid, module string, rec *AttachedRecord) error {
	o.fileMu.Lock()
	defer o.fileMu.Unlock()
	recs, err := ReadAttached(o.stateDir, uid)
	if err != nil {
		recs = map[string]AttachedRecord{}
	}
	if rec == nil {
		if _, ok := recs[module]; !ok {
			return nil
		}
		delete(recs, module)
	} else {
		recs[module] = *rec
	}
	if err := statedir.MkdirAll(statedir.Dir(o.stateDir).Attachments()); err != nil {
		return err
	}
	path := attachedPath(o.stateDir, uid)
	if len(recs) == 0 {
		return statedir.Remove(path)
	}
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return statedir.WriteFile(path, b, 0o600)
}

// RemoveAttached removes an activation's attachment file.
func RemoveAttached(stateDir, uid string) error {
	return statedir.Remove(attachedPath(stateDir, uid))
}

// remoteProvider is a survivor's process as a Provider.
type remoteProvider struct {
	rp *survivor.RemoteProcess
	runAllowance
}

func (p *remoteProvider) Pid() int                       { return p.rp.Pid() }
func (p *remoteProvider) StartedAt() time.Time           { return p.rp.StartedAt() }
func (p *remoteProvider) Exited() <-chan struct{}        { return p.rp.Done() }
func (p *remoteProvider) Close() error                   { return p.rp.Close() }
func (p *remoteProvider) StderrTail() (string, int64)    { return p.rp.StderrTail() }
func (p *remoteProvider) Load(ctx context.Context) error { return p.rp.Load(ctx) }

// OwnerLost reports whether the process ended with its survivor.
func (p *remoteProvider) OwnerLost() bool { return p.rp.OwnerLost() }

// Remote is the survivor's process.
func (p *remoteProvider) Remote() *survivor.RemoteProcess { return p.rp }

// SurvivorHeld is a provider process the survivor holds.
type SurvivorHeld interface {
	// Remote is the survivor's process.
	Remote() *survivor.RemoteProcess
}

// Adopt makes a survivor's process, claimed for re-attachment, a Provider.
func (o *SurvivorOwner) Adopt(rp *survivor.RemoteProcess) Provider { return &remoteProvider{rp: rp} }

func (p *remoteProvider) Budget() Budget {
	b := p.rp.Budget()
	return Budget{Lifetime: b.Lifetime, StdinBytes: b.StdinBytes, StateOperations: b.StateOperations}
}

func (p *remoteProvider) Fits(deadline time.Duration, requestBytes int) bool {
	return p.runAllowance.fits(p.rp.Budget(), p.rp.Plan().RuntimeDeadline(), deadline, requestBytes)
}

func (p *remoteProvider) Run(ctx context.Context, req dispatch.RunRequest, observe func(dispatch.Observation)) (dispatch.Observation, error) {
	deadline := p.start(p.rp.Budget(), p.rp.Plan().RuntimeDeadline(), req.Deadline)
	var ob func(uint64, bool, []byte)
	if observe != nil {
		ob = func(seq uint64, terminal bool, body []byte) {
			observe(dispatch.Observation{Sequence: seq, Terminal: terminal, Body: body})
		}
	}
	if req.Hop != nil {
		// The survivor exports nothing: the manager times the hop.
		req.Hop.Start = time.Now()
	}
	seq, body, err := p.rp.Run(ctx, req.ID, req.Input.Raw(), deadline, req.Invocation, ob)
	if req.Hop != nil {
		req.Hop.End = time.Now()
	}
	if err != nil {
		return dispatch.Observation{}, err
	}
	return dispatch.Observation{Sequence: seq, Terminal: true, Body: body}, nil
}

func (p *remoteProvider) Cancel(ctx context.Context, runID, reason string) error {
	return p.rp.Cancel(ctx, runID, reason)
}

func (p *remoteProvider) Stop(ctx context.Context, reason string) error {
	return p.rp.Stop(ctx, reason)
}

func (p *remoteProvider) Snapshot(ctx context.Context, lineage int64) (State, error) {
	return p.rp.Snapshot(ctx, uint64(lineage), stateDeadline(ctx))
}

func (p *remoteProvider) Migrate(ctx context.Context, from State) (State, error) {
	return p.rp.Migrate(ctx, from, stateDeadline(ctx))
}

func (p *remoteProvider) Restore(ctx context.Context, st State) error {
	return p.rp.Restore(ctx, st, stateDeadline(ctx))
}

func (p *remoteProvider) Readiness(ctx context.Context, lineage int64, digest string) error {
	return p.rp.Readiness(ctx, uint64(lineage), digest, stateDeadline(ctx))
}

// ownerLoser is a Provider that can tell that its process ended with its
// owner (the survivor) rather than by a fault of its own.
type ownerLoser interface{ OwnerLost() bool }

// OwnerLost reports whether proc ended with its owner (a survivor that
// went away) rather than by a fault of its own.
func OwnerLost(proc Provider) bool {
	ol, ok := proc.(ownerLoser)
	return ok && ol.OwnerLost()
}
