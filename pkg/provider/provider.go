// Package provider is the Go SDK for writing iteron providers: it speaks the
// provider side of iteron-implementation/1 and /2 (framing, strict decoding,
// correlation, sequence numbers, state digests and limits), so that a
// provider is an implementation of an interface and one call to Serve.
//
// A provider that implements StatefulProvider speaks protocol 2 (it can move
// its state in a hot swap); one that implements only Provider speaks
// protocol 1 and answers every state operation with a failure.
//
// A complete protocol-1 provider that upper-cases its input's "text":
//
//	package main
//
//	import (
//		"context"
//		"os"
//		"strings"
//
//		"github.com/go-json-experiment/json"
//
//		"iteron.dev/operator/pkg/provider"
//	)
//
//	type upper struct{}
//
//	func (upper) Load(ctx context.Context, load *provider.Load) error { return nil }
//
//	func (upper) Start(ctx context.Context, run *provider.Run) error {
//		var in struct {
//			Text string `json:"text"`
//		}
//		if err := json.Unmarshal(run.Input, &in); err != nil {
//			return run.EmitValue(map[string]string{"error": err.Error()}, true)
//		}
//		return run.EmitValue(map[string]string{"text": strings.ToUpper(in.Text)}, true)
//	}
//
//	func (upper) Cancel(ctx context.Context, runID, reason string) error { return nil }
//
//	func main() {
//		if err := provider.Serve(context.Background(), os.Stdin, os.Stdout, upper{}); err != nil {
//			os.Stderr.WriteString(err.Error() + "\n")
//			os.Exit(1)
//		}
//	}
//
// Its catalog manifest says "protocol_version": 1. Serve returns nil after a
// stop request has been answered, and the process should then exit 0.
//
// Runs: Serve answers "started" before it calls Start, in a goroutine of its
// own, so that a cancel can arrive while the run works. A run reports its
// outcome, failures included, as observations in the module's observation
// schema, the last one terminal. Start returning an error, or returning
// without a terminal observation (and without being cancelled), is a provider
// bug the protocol has no frame for: Serve then returns that error, and the
// process should exit non-zero so that the host sees it.
package provider

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-json-experiment/json/jsontext"

	"iteron.dev/operator/pkg/protocol"
)

// Provider is a protocol-1 provider: load, runs, cancellation.
type Provider interface {
	// Load prepares the provider for the module and contracts in load. It is
	// called once, before anything else.
	Load(ctx context.Context, load *Load) error
	// Start performs one run, reporting through run.Emit; ctx ends at the
	// run's deadline or when the host cancels the run.
	Start(ctx context.Context, run *Run) error
	// Cancel is called after a cancelled run's Start has returned, to release
	// anything the run left behind. It is also called for a run that had
	// already finished (cancel is idempotent).
	Cancel(ctx context.Context, runID, reason string) error
}

// StatefulProvider is a protocol-2 provider: a Provider whose state can be
// snapshotted, migrated to the next lineage, restored and proven ready.
// States are raw JSON; the SDK builds the State envelopes and computes every
// digest.
type StatefulProvider interface {
	Provider
	// Snapshot returns the provider's state for lineage (no run is active).
	Snapshot(ctx context.Context, lineage Lineage) (jsontext.Value, error)
	// Migrate converts source (its digest already checked, possibly another
	// implementation's layout) into this provider's layout for target, whose
	// Generation is source.Generation + 1.
	Migrate(ctx context.Context, source *protocol.State, target Lineage) (jsontext.Value, error)
	// Restore replaces the provider's state with state (its digest already
	// checked, its implementation this one).
	Restore(ctx context.Context, state *protocol.State) error
	// Readiness proves the provider holds exactly the state whose digest is
	// stateSHA256 at lineage.
	Readiness(ctx context.Context, lineage Lineage, stateSHA256 string) error
}

// Stopper is implemented by providers that need to release resources when
// the host stops them; Serve calls Stop before it answers "stopped".
type Stopper interface {
	Stop(ctx context.Context, reason string) error
}

// Load is what the host binds at load: the module and implementation the
// provider fills (providers are module-agnostic until now) and the request.
type Load struct {
	Version          protocol.Version
	Module           string
	ImplementationID string
	Request          *protocol.LoadRequest
}

// Lineage identifies the state a state operation is about.
type Lineage struct {
	Module string
	// RunID is "lineage-<module>".
	RunID string
	// Generation is the lineage number.
	Generation uint64
	// Schema is the module's state schema (its lifecycle/snapshot contract).
	Schema protocol.ContractRef
}

// Error is a failure the provider reports to the host as a failed result with
// a code of its own choosing; any other error is reported with the code
// "provider_error".
type Error struct {
	// Code is at most 128 bytes (longer codes are truncated).
	Code string
	// Message is at most 4096 bytes (longer messages are truncated).
	Message string
}

// Error is "code: message".
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Failf returns an *Error with code and a formatted message.
func Failf(code, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrRunEnded is returned by Emit after the run's terminal observation or
// after the host cancelled the run.
var ErrRunEnded = errors.New("provider: the run has ended")
