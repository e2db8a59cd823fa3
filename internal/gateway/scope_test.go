package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	"iteron.dev/operator/internal/effects"
)

// streamsOf are the stream resources of a generation's scope.
func (h *harness) streamsOf(uid, generation string) []string {
	st, _ := h.coord.Status(uid)
	var out []string
	for _, r := range st.Generations[generation].Resources {
		if strings.HasPrefix(r.ID, "stream ") {
			out = append(out, r.String())
		}
	}
	return out
}

func TestAWatchIsAResourceOfTheGenerationThatRunsItUntilItEnds(t *testing.T) {
	h := newHarness(t)
	a, target := h.counterActivation("default", "stack")
	ctx := context.Background()
	stream, err := h.client.Watch(ctx, &gatewayv1.WatchRequest{
		Namespace: "default", Activation: "stack", Module: module, InvocationId: "bound",
		InputJson: `{"key":"x","add":1,"progress":1,"sleep_ms":20000}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.Terminal {
		t.Fatalf("first event %+v %v", ev, err)
	}
	streams := h.streamsOf(a.key.UID, target.GenerationName)
	st, _ := h.coord.Status(a.key.UID)
	fmt.Printf("scope of %s while a Watch runs: %s\n", target.GenerationName, effects.FormatResources(st.Generations[target.GenerationName].Resources))
	if len(streams) != 1 || !strings.HasSuffix(streams[0], "(cancelable)") {
		t.Fatalf("stream resources of %s while the Watch runs: %v; want one, cancelable", target.GenerationName, streams)
	}
	if _, err := h.client.CancelInvocation(ctx, &gatewayv1.InvocationControlRequest{Namespace: "default", InvocationId: "bound"}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the cancelled Watch went on")
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.streamsOf(a.key.UID, target.GenerationName)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the ended Watch is still a resource of %s: %v", target.GenerationName, h.streamsOf(a.key.UID, target.GenerationName))
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, _ = h.coord.Status(a.key.UID)
	got := st.Generations[target.GenerationName].Resources
	ids := make([]string, len(got))
	for i, r := range got {
		ids[i] = r.ID
	}
	if want := []string{"process", "route", "crash-watch"}; !slices.Equal(ids, want) {
		t.Fatalf("resources after the Watch ended: %v, want %v", ids, want)
	}
}
