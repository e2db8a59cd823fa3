package gitops_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/test/kubeapi"
)

var env *kubeapi.Environment

func TestMain(m *testing.M) {
	var err error
	env, err = kubeapi.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		os.Exit(1)
	}
	fmt.Printf("gitops tests run against kube-apiserver %s\n", env.ServerVersion)
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the local control plane:", err)
	}
	os.Exit(code)
}

const (
	testNamespace = "default"
	testNode      = "worker-1"
	digestA       = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB       = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

var objectSeq atomic.Int64

// uniqueName gives every object of a run its own name, so table rows never
// see each other's objects.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, objectSeq.Add(1))
}

func newActivation(name string) *iteronv1.ImplementationActivation {
	return &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Spec: iteronv1.ImplementationActivationSpec{
			NodeName:        testNode,
			CandidateSHA256: digestA,
			Sources: []iteronv1.ActivationSource{{
				Module: "prompt_system", ImplementationID: "counter-v1",
				CatalogPath:    "/var/lib/iteron/providers/counter/catalog.json",
				ArtifactRoot:   "/var/lib/iteron/providers/counter/v1",
				ManifestSHA256: digestA, ArtifactSHA256: digestB,
			}},
		},
	}
}

func newGeneration(name string) *iteronv1.Generation {
	return &iteronv1.Generation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Spec: iteronv1.GenerationSpec{
			ActivationName: "stack", NodeName: testNode, Module: "prompt_system",
			Generation: 1, Attempt: 1, CandidateSHA256: digestA,
			Implementation: iteronv1.Implementation{
				ID: "counter-v1", Version: "1.0.0", ManifestSHA256: digestA, ArtifactSHA256: digestB,
				ArtifactRoot: "/var/lib/iteron/providers/counter/v1", Executable: "/var/lib/iteron/providers/counter/v1/counter",
				ProtocolVersion: 2,
			},
			AuthoritySHA256: digestA,
			Deadlines:       iteronv1.Deadlines{RuntimeMs: 60000, CancellationMs: 2000},
			EvidenceLimits:  iteronv1.EvidenceLimits{StdoutBytes: 1 << 20, StderrBytes: 2048, Observations: 64},
		},
	}
}

// cond builds a condition as the manager writes it.
func cond(kind string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{
		Type: kind, Status: status, Reason: reason, Message: message,
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second)),
	}
}

// readBack fetches obj from the API server as unstructured content, the form
// Argo CD and kstatus both work on (integers arrive as int64, as from JSON).
func readBack(t *testing.T, obj client.Object, kind string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: iteronv1.GroupVersion.Group, Version: iteronv1.GroupVersion.Version, Kind: kind})
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), u); err != nil {
		t.Fatalf("read %s %s back: %v", kind, obj.GetName(), err)
	}
	return u
}

func deleteAfterTest(t *testing.T, obj client.Object) {
	t.Cleanup(func() {
		ctx := context.Background()
		if len(obj.GetFinalizers()) > 0 {
			_ = env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			obj.SetFinalizers(nil)
			_ = env.Client.Update(ctx, obj)
		}
		_ = env.Client.Delete(ctx, obj)
	})
}
