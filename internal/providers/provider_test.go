package providers

import (
	"errors"
	"testing"

	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/reasons"
)

// The engine moves state only between providers that hold it: a package
// runtime is refused by the type system's answer, not by a stub that fails
// at run time.
func TestOnlyProviderProcessesHoldStateTheHostMoves(t *testing.T) {
	for name, p := range map[string]Provider{"own process": &processProvider{}, "survivor-held": &remoteProvider{}} {
		if _, err := StateOf(p); err != nil {
			t.Errorf("%s: stateOf = %v, want its state operations", name, err)
		}
	}
	_, err := StateOf(&packageProvider{})
	var ce *dispatch.CallError
	if !errors.As(err, &ce) || ce.Code != reasons.UnsupportedVersion {
		t.Fatalf("package runtime: stateOf = %v, want an unsupported_version CallError", err)
	}
}
