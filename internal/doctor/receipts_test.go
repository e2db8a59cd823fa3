package doctor

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/effects"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/statedir"
)

// failedSwap is an activation whose swap of prompt_system to "faulty"
// failed after the new generation had recorded receipts.
func failedSwap() (*Input, iteronv1.Generation) {
	a := activation("prompt_system")
	a.Generation, a.Status.ObservedGeneration = 2, 2
	a.Status.Conditions = readyConditions(2)
	a.Spec.Sources[0].ImplementationID = "faulty"
	ms := module(a, "prompt_system")
	ms.Reason, ms.Message = reasons.ProviderFailed, "drain: the new process exited after the switch"
	setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonProviderFailed, "module prompt_system: …")
	setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProviderFailed, "module prompt_system: …")
	old := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
	bad := generation(a, "prompt_system", 2, 1, "faulty", iteronv1.PhaseFailed, iteronv1.StepRolledBack)
	bad.Status.Reason, bad.Status.Message = reasons.ProviderFailed, "failed after the switch"
	bad.Status.Receipts = &iteronv1.ReceiptSummary{Total: 2, Irreversible: 2, Truncated: true, IncompleteReason: "the manager stopped without closing the receipts file"}
	return input(a, old, bad), bad
}

func TestTheDoctorCitesTheReceiptsOfAFailedGeneration(t *testing.T) {
	t.Run("from status, without the state dir", func(t *testing.T) {
		in, bad := failedSwap()
		r := Diagnose(in, nil, Options{Now: now})
		c := r.Modules[0].Target.Receipts
		if r.Modules[0].Target.Name != bad.Name || c == nil || c.Total != 2 || c.Irreversible != 2 || !c.Incomplete || c.Source != "status" ||
			c.Command != "kubectl iteron receipts stack -n team --module prompt_system" {
			t.Fatalf("citation %+v", c)
		}
		if r.Modules[0].Active.Receipts != nil {
			t.Fatalf("the Active generation's receipts are cited: %+v", r.Modules[0].Active.Receipts)
		}
	})
	t.Run("from the receipts file, with the state dir", func(t *testing.T) {
		in, bad := failedSwap()
		stateDir := t.TempDir()
		path, err := statedir.Dir(stateDir).Receipts(string(in.Activation.UID))
		if err != nil {
			t.Fatal(err)
		}
		s, err := effects.OpenReceiptStore(path, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"run-1", "run-2"} {
			if err := s.Record(effects.Receipt{ID: id, Owner: "team/stack", Generation: bad.Name, Component: "prompt_system", Kind: effects.ReceiptRun,
				Class: effects.Irreversible, StartedAt: now, FinishedAt: now, Detail: "completed"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		local := ReadLocal(stateDir, in.Activation)
		if local.ReceiptsErr != "" {
			t.Fatal(local.ReceiptsErr)
		}
		r := Diagnose(in, local, Options{Now: now})
		c := r.Modules[0].Target.Receipts
		if c == nil || c.Source != "file" || c.Total != 2 || c.Incomplete || len(c.Recent) != 2 || !strings.HasPrefix(c.Recent[1], "run-2 run irreversible") {
			t.Fatalf("citation %+v", c)
		}
		var text bytes.Buffer
		if err := WriteText(&text, r); err != nil {
			t.Fatal(err)
		}
		want := "receipts of " + bad.Name + ": 2, 2 irreversible (never rolled back); evidence complete [from file]"
		if !strings.Contains(text.String(), want) || !strings.Contains(text.String(), "--state-dir "+stateDir) {
			t.Fatalf("the text report does not cite the receipts (%q):\n%s", want, text.String())
		}
		t.Logf("doctor text:\n%s", text.String())
	})
}

// TestTheDoctorNamesAnUnreadableReceiptsLineAndStillCitesTheOthers: a
// line of the receipts file that cannot be read is a problem finding naming
// the file, the line and why; the failed generation's receipts on the other
// lines are still cited.
func TestTheDoctorNamesAnUnreadableReceiptsLineAndStillCitesTheOthers(t *testing.T) {
	in, bad := failedSwap()
	stateDir := t.TempDir()
	path, err := statedir.Dir(stateDir).Receipts(string(in.Activation.UID))
	if err != nil {
		t.Fatal(err)
	}
	s, err := effects.OpenReceiptStore(path, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	record := func(id string) {
		if err := s.Record(effects.Receipt{ID: id, Owner: "team/stack", Generation: bad.Name, Component: "prompt_system", Kind: effects.ReceiptRun,
			Class: effects.Irreversible, StartedAt: now, FinishedAt: now, Detail: "completed"}); err != nil {
			t.Fatal(err)
		}
	}
	record("run-1")
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("{\"type\":\"receipt\",\"id\":\"run-x\",\"class\":\"refundable\"}\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	record("run-2")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := Diagnose(in, ReadLocal(stateDir, in.Activation), Options{Now: now})
	var found *Finding
	for i := range r.Findings {
		if r.Findings[i].Code == FindingReceiptsUnreadable {
			found = &r.Findings[i]
		}
	}
	if found == nil || found.Severity != SeverityProblem || !strings.Contains(found.Summary, path) ||
		!strings.Contains(found.Summary, "line 4 (byte ") || !strings.Contains(found.Summary, `unknown class "refundable"`) {
		t.Fatalf("finding %+v; want a problem naming %s, line 4 and why", found, path)
	}
	c := r.Modules[0].Target.Receipts
	if c == nil || c.Total != 2 || len(c.Recent) != 2 {
		t.Fatalf("citation %+v; want both readable receipts", c)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "receipts_unreadable") || !strings.Contains(text.String(), "line 4") {
		t.Fatalf("the text report does not name the unreadable line:\n%s", text.String())
	}
	t.Logf("doctor text:\n%s", text.String())
}
