package gateway

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
)

// stubCoordinator answers with one activation's status snapshot.
type stubCoordinator struct {
	key hotswap.ActivationKey
	st  hotswap.ActivationStatus
}

func (s *stubCoordinator) Lookup(namespace, name, module string) (*hotswap.Dispatcher, error) {
	return hotswap.NewDispatcher(module, 8), nil
}
func (s *stubCoordinator) Activations() []hotswap.ActivationKey {
	return []hotswap.ActivationKey{s.key}
}
func (s *stubCoordinator) Status(uid string) (hotswap.ActivationStatus, bool) {
	return s.st, uid == s.key.UID
}

// TestAModuleWithoutARouteIsExplainedByWhatKeepsItFromServing: a module
// that has a dispatcher but no route is explained at once by the reason
// that keeps it from serving; one known only from the ledger's replay after
// a restart, not yet handed its plan, is recovering (retry), not failed.
func TestAModuleWithoutARouteIsExplainedByWhatKeepsItFromServing(t *testing.T) {
	key := hotswap.ActivationKey{Namespace: "team", Name: "stack", UID: "0a1b2c3d-0000-4000-8000-000000000001"}
	committed := &hotswap.CommittedGeneration{Name: "stack-prompt-system-g1-1", Lineage: 1, Attempt: 1, ImplementationID: "counter"}
	tests := []struct {
		name   string
		st     hotswap.ActivationStatus
		reason string // "" when the call waits
		code   codes.Code
	}{
		{name: "replayed after a restart and not yet handed its plan: recovering",
			st:     hotswap.ActivationStatus{Modules: map[string]hotswap.ModuleStatus{"prompt_system": {Module: "prompt_system", Phase: iteronv1.PhaseInactive, Committed: committed}}},
			reason: reasons.Recovering, code: codes.Unavailable},
		{name: "a transaction of the applied plan runs: the call waits",
			st: hotswap.ActivationStatus{AppliedSpecGeneration: 1, Busy: true, Modules: map[string]hotswap.ModuleStatus{"prompt_system": {Module: "prompt_system", Committed: committed}}}},
		{name: "a refused relaunch: its reason",
			st: hotswap.ActivationStatus{AppliedSpecGeneration: 2, Modules: map[string]hotswap.ModuleStatus{"prompt_system": {Module: "prompt_system", Active: "g1",
				Phase: iteronv1.PhaseFailed, Reason: reasons.VerificationFailed, Message: "relaunch refused"}}},
			reason: reasons.VerificationFailed, code: codes.FailedPrecondition},
		{name: "a corrupt ledger: ledger_corrupt",
			st:     hotswap.ActivationStatus{LedgerError: "rule record_hash at sequence 0"},
			reason: reasons.LedgerCorrupt, code: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.st.Key = key
			s, err := New(Config{NodeName: "worker-1", Coordinator: &stubCoordinator{key: key, st: tt.st}})
			if err != nil {
				t.Fatal(err)
			}
			err = s.moduleUnavailable(key.Namespace, key.Name, "prompt_system")
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("the call should wait; got %v", err)
				}
				return
			}
			f, ok := ReasonOf(err)
			if st, _ := status.FromError(err); !ok || f.Reason != tt.reason || st.Code() != tt.code {
				t.Fatalf("got %v; want reason %s (gRPC %s)", err, tt.reason, tt.code)
			}
		})
	}
}
