// Command kv is an example package runtime: a key-value store served as the
// quixos.runtime.PackageRuntime service, written with pkg/packageruntime.
// Its exports:
//
//   - get   {"key": K}            → the value stored at K, or null
//   - put   {"key": K, "value": V} → V, after storing it
//   - watch {"key": K}            → a stream: an initial event with the
//     current value, then one event per put to K
//
// The store lives in the process: a package runtime has no state operations,
// so a new version starts empty.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	caminopb "iteron.dev/operator/api/quixos/camino"
	"iteron.dev/operator/pkg/packageruntime"
)

// Revision is the package_revision_id this build answers the handshake with;
// the manifest pins it.
var Revision = "kv-1.0.0"

func main() {
	s := newStore()
	err := packageruntime.Serve(packageruntime.Runtime{
		PackageRevisionID: Revision,
		ExportIDs:         []string{"get", "put", "watch"},
		Invoke:            s.invoke,
		Watch:             s.watch,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kv:", err)
		os.Exit(1)
	}
}

// store is the key-value map and, per key, a channel closed at its next put.
type store struct {
	mu      sync.Mutex
	values  map[string]*caminopb.Value
	changed map[string]chan struct{}
}

func newStore() *store {
	return &store{values: map[string]*caminopb.Value{}, changed: map[string]chan struct{}{}}
}

func keyOf(call *packageruntime.Call) (string, error) {
	k, ok := call.Input["key"].GetKind().(*caminopb.Value_StringValue)
	if !ok {
		return "", errors.New(`input.key: a string is required`)
	}
	return k.StringValue, nil
}

func (s *store) invoke(_ context.Context, call *packageruntime.Call) (*packageruntime.Result, error) {
	key, err := keyOf(call)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch call.Export {
	case "get":
		return &packageruntime.Result{Value: s.values[key]}, nil
	case "put":
		v, ok := call.Input["value"]
		if !ok {
			return nil, errors.New("input.value: required")
		}
		s.values[key] = v
		if ch, ok := s.changed[key]; ok {
			close(ch)
			delete(s.changed, key)
		}
		return &packageruntime.Result{Value: v}, nil
	}
	return nil, fmt.Errorf("export %q is not invocable (watch it)", call.Export)
}

// current returns the value at key and a channel closed at its next change.
func (s *store) current(key string) (*caminopb.Value, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.changed[key]
	if !ok {
		ch = make(chan struct{})
		s.changed[key] = ch
	}
	return s.values[key], ch
}

func (s *store) watch(ctx context.Context, call *packageruntime.Call, send func(packageruntime.Event) error) error {
	if call.Export != "watch" {
		return fmt.Errorf("export %q cannot be watched", call.Export)
	}
	key, err := keyOf(call)
	if err != nil {
		return err
	}
	for {
		v, changed := s.current(key)
		if err := send(packageruntime.Event{Value: v}); err != nil {
			return nil // the stream is gone
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
