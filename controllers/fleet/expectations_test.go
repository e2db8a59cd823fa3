package fleet

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// TestARetryIsExpectedUntilTheCacheShowsItsAnnotation: a Retry changes an
// annotation, not metadata.generation; a cached copy from before it must
// not count as caught up (its Stalled condition would halt the rollout the
// resume just lifted).
func TestARetryIsExpectedUntilTheCacheShowsItsAnnotation(t *testing.T) {
	now := time.Now()
	act := func(gen int64, retry string) map[string]*iteronv1.ImplementationActivation {
		a := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Name: "a", Generation: gen}}
		if retry != "" {
			a.Annotations = map[string]string{iteronv1.AnnotationRetry: retry}
		}
		return map[string]*iteronv1.ImplementationActivation{"a": a}
	}
	for _, tc := range []struct {
		name   string
		x      expectation
		cached map[string]*iteronv1.ImplementationActivation
		at     time.Time
		unmet  bool
	}{
		{"an update whose generation shows is met", expectation{generation: 2, at: now}, act(2, ""), now, false},
		{"an update whose generation does not show yet waits", expectation{generation: 2, at: now}, act(1, ""), now, true},
		{"a retry whose annotation does not show yet waits, whatever the generation", expectation{generation: 2, retry: "t1", at: now}, act(2, ""), now, true},
		{"a retry whose cached annotation is an older one waits", expectation{generation: 2, retry: "t2", at: now}, act(2, "t1"), now, true},
		{"a retry whose annotation shows is met", expectation{generation: 2, retry: "t1", at: now}, act(2, "t1"), now, false},
		{"a retry of an activation gone from the cache is met", expectation{generation: 2, retry: "t1", at: now}, nil, now, false},
		{"an expectation older than its TTL is dropped", expectation{generation: 2, retry: "t1", at: now}, act(2, ""), now.Add(expectationTTL + time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newExpectations()
			e.expect("ns/set", "a", tc.x)
			if got := e.unmet("ns/set", tc.cached, tc.at) != ""; got != tc.unmet {
				t.Fatalf("unmet = %v; want %v", got, tc.unmet)
			}
		})
	}
}
