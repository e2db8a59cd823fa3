package crash

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/doctor"
	"iteron.dev/operator/internal/gateway"
)

// The helpers of the compound-fault tests: what a caller gets from the
// gateway, what the ledger on disk holds, what the doctor says, and a dump
// of all of it when a test fails.

// cfAnswer is the outcome of one call through the gateway.
type cfAnswer struct {
	// ok: the call completed; count is the counter's cfAnswer.
	ok    bool
	count float64
	// gateway: the gateway itself answered (a failure carrying its Failure
	// detail), as opposed to a transport error (no socket yet, a manager
	// going away) that the gRPC library made up.
	gateway bool
	reason  string
	code    codes.Code
	message string
	elapsed time.Duration
}

func (r cfAnswer) String() string {
	switch {
	case r.ok:
		return fmt.Sprintf("ok count=%v in %v", r.count, r.elapsed.Round(time.Millisecond))
	case r.gateway:
		return fmt.Sprintf("gateway %s (gRPC %s) in %v: %s", r.reason, r.code, r.elapsed.Round(time.Millisecond), r.message)
	}
	return fmt.Sprintf("transport %s in %v: %s", r.code, r.elapsed.Round(time.Millisecond), r.message)
}

// cfCall adds add to key through the gateway with a call budget of
// deadline, on a fresh connection (a restarted manager listens on a new
// socket). Safe to call from any goroutine (it never stops the test).
func (n *nodeState) cfCall(t *testing.T, a *iteronv1.ImplementationActivation, key string, add int, deadline time.Duration) cfAnswer {
	t.Helper()
	c, err := gateway.Dial(n.socket)
	if err != nil {
		t.Errorf("dial the gateway: %v", err)
		return cfAnswer{message: err.Error()}
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), deadline+5*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := c.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: a.Namespace, Activation: a.Name, Module: "prompt_system",
		InputJson: fmt.Sprintf(`{"key":%q,"add":%d}`, key, add), DeadlineMs: uint64(deadline.Milliseconds())})
	r := cfAnswer{elapsed: time.Since(start)}
	if err == nil {
		var obs struct{ Count float64 }
		if err := json.Unmarshal([]byte(resp.ObservationJson), &obs); err != nil {
			t.Errorf("the gateway answered %q: %v", resp.ObservationJson, err)
		}
		r.ok, r.count = true, obs.Count
		return r
	}
	st, _ := status.FromError(err)
	r.code, r.message = st.Code(), st.Message()
	for _, d := range st.Details() {
		if f, ok := d.(*gatewayv1.Failure); ok {
			r.gateway, r.reason, r.message = true, f.Reason, f.Message
		}
	}
	return r
}

// cfRecord is the part of a ledger record these tests read.
type cfRecord struct {
	Sequence      uint64  `json:"sequence"`
	TransactionID string  `json:"transaction_id"`
	Module        string  `json:"module"`
	Phase         string  `json:"phase"`
	Outcome       string  `json:"outcome"`
	Reason        *string `json:"reason"`
}

func (r cfRecord) String() string {
	s := fmt.Sprintf("#%d %s %s %s", r.Sequence, r.TransactionID, r.Phase, r.Outcome)
	if r.Reason != nil {
		s += ": " + *r.Reason
	}
	return s
}

// cfLedger reads the activation's ledger segments as they are on disk
// (read-only; a line being appended right now is skipped).
func (n *nodeState) cfLedger(t *testing.T, a *iteronv1.ImplementationActivation) []cfRecord {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(n.stateDir, "ledgers", string(a.UID), "ledger-*.jsonl"))
	slices.Sort(segs)
	var out []cfRecord
	for _, seg := range segs {
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			var r cfRecord
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// cfTransactions lists the distinct transactions of the records match
// accepts, in ledger order.
func cfTransactions(records []cfRecord, match func(cfRecord) bool) []string {
	var ids []string
	for _, r := range records {
		if match(r) && !slices.Contains(ids, r.TransactionID) {
			ids = append(ids, r.TransactionID)
		}
	}
	return ids
}

// cfDoctor runs `kubectl iteron doctor` on a, as text and as JSON.
func cfDoctor(t *testing.T, a *iteronv1.ImplementationActivation) (string, doctor.Report) {
	t.Helper()
	args := []string{"doctor", a.Name, "--kubeconfig", kubeconfig, "-n", a.Namespace}
	text, _ := exec.Command(pluginBin, args...).Output() // exit 1: not healthy
	js, _ := exec.Command(pluginBin, append(args, "-o", "json")...).Output()
	var rep doctor.Report
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatalf("kubectl iteron doctor -o json printed %q: %v", js, err)
	}
	return string(text), rep
}

// headline is the doctor's first line: the verdict on what serves.
func cfHeadline(text string) string {
	first, _, _ := strings.Cut(text, "\n")
	return first
}

// condition returns the activation's condition of type ct ("" fields when
// it is missing).
func cfCondition(a *iteronv1.ImplementationActivation, ct string) metav1.Condition {
	if c := meta.FindStatusCondition(a.Status.Conditions, ct); c != nil {
		return *c
	}
	return metav1.Condition{Type: ct}
}

// cfConditions is the activation's conditions in one line.
func cfConditions(a *iteronv1.ImplementationActivation) string {
	var parts []string
	for _, ct := range []string{iteronv1.ConditionReady, iteronv1.ConditionStalled, iteronv1.ConditionDegraded, iteronv1.ConditionReconciling} {
		c := cfCondition(a, ct)
		parts = append(parts, fmt.Sprintf("%s=%s/%s", ct, c.Status, c.Reason))
	}
	return strings.Join(parts, " ")
}

// cfModules is status.modules in one line.
func cfModules(a *iteronv1.ImplementationActivation) string {
	var parts []string
	for _, m := range a.Status.Modules {
		parts = append(parts, fmt.Sprintf("%s %s %s reason=%q", m.Module, m.Phase, m.GenerationName, m.Reason))
	}
	return strings.Join(parts, "; ")
}

// generation reads a Generation object.
func cfGeneration(t *testing.T, name string) *iteronv1.Generation {
	t.Helper()
	var g iteronv1.Generation
	if err := env.Client.Get(context.Background(), keyOf(ns, name), &g); err != nil {
		t.Fatal(err)
	}
	return &g
}

// cfDump registers a cleanup that, when the test failed, logs what
// a reader needs: the activation's status, its Generations, the ledger.
// Registered after the manager's start, it runs before the manager's
// cleanup (which logs the manager's output tail).
func (n *nodeState) cfDump(t *testing.T, a *iteronv1.ImplementationActivation) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var cur iteronv1.ImplementationActivation
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(a), &cur); err == nil {
			b, _ := json.MarshalIndent(cur.Status, "", "  ")
			t.Logf("status of %s:\n%s", a.Name, b)
		}
		var list iteronv1.GenerationList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err == nil {
			for _, g := range list.Items {
				if g.Spec.ActivationName == a.Name {
					t.Logf("Generation %s: %s at %s pid %d reason %q: %s; receipts %+v", g.Name, g.Status.Phase, g.Status.Step, g.Status.Pid, g.Status.Reason, g.Status.Message, g.Status.Receipts)
				}
			}
		}
		var lines []string
		for _, r := range n.cfLedger(t, a) {
			lines = append(lines, r.String())
		}
		t.Logf("ledger of %s:\n%s", a.Name, strings.Join(lines, "\n"))
	})
}
