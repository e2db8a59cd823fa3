package doctor

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/reasons"
)

func TestWriteTextEscapesWhatProvidersWrote(t *testing.T) {
	a := activation("prompt_system")
	ms := module(a, "prompt_system")
	ms.Phase, ms.GenerationName, ms.Reason, ms.Message = iteronv1.PhaseFailed, "", reasons.ProviderFailed, "exited\x1b]0;owned\x07 (status 2)"
	setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProviderFailed, "module prompt_system: exited\x1b[2J")
	g := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseFailed, iteronv1.StepShadowLoad)
	g.Status.StderrTail = "panic: boom\n\x1b[31mred\x1b[0m\n\xff\xfe bytes\n"
	r := Diagnose(input(a, g), nil, Options{Now: now})

	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, c := range []string{"\x1b", "\x07", "\xff"} {
		if strings.Contains(out, c) {
			t.Fatalf("the text carries the raw byte %q:\n%s", c, out)
		}
	}
	for _, want := range []string{`| \u001b[31mred\u001b[0m`, `| \xff\xfe bytes`, `exited\u001b]0;owned\u0007 (status 2)`, "| panic: boom"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the text does not say %q:\n%s", want, out)
		}
	}

	var js bytes.Buffer
	if err := WriteJSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Modules[0].Active != nil || back.Modules[0].Target == nil || back.Modules[0].Target.StderrTail != strings.ReplaceAll(g.Status.StderrTail, "\xff\xfe", "\uFFFD\uFFFD") {
		t.Fatalf("json round trip lost the stderr tail: %+v", back.Modules[0].Target)
	}
}

func TestWriteTextSaysWhenThereIsNoLedgerYet(t *testing.T) {
	a := activation("prompt_system")
	a.Status.Ledger = nil
	r := Diagnose(input(a), ReadLocal(t.TempDir(), a), Options{Now: now})
	if !r.Healthy || r.Ledger == nil || !r.Ledger.Missing || len(r.Findings) != 0 {
		t.Fatalf("healthy %t, ledger %+v, findings %q", r.Healthy, r.Ledger, codes(r))
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "does not exist (no transaction has run yet)") || !strings.Contains(text.String(), "on node worker-1: healthy") {
		t.Fatalf("%s", text.String())
	}
}

func TestWriteTextShowsWhatTheSandboxAppliedAndWhatAuditCounted(t *testing.T) {
	a := activation("prompt_system")
	ms := module(a, "prompt_system")
	ms.Phase, ms.GenerationName, ms.Reason, ms.Message = iteronv1.PhaseFailed, "", reasons.MemoryExceeded, "exited (killed by signal 9); the kernel killed it for exceeding its memory bound of 67108864 bytes"
	g := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseFailed, iteronv1.StepShadowLoad)
	g.Status.Sandbox = &iteronv1.SandboxStatus{Mode: "audit", Level: "limits", Network: "node", Exec: true, MemoryBytes: 64 << 20, CPUMillis: 1000, Tasks: 256,
		Cgroups: "v1", Seccomp: "sha256:ab", Violations: map[string]int64{"socket": 3, "execve": 1}}
	r := Diagnose(input(a, g), nil, Options{Now: now})
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"sandbox of " + g.Name + ": mode=audit level=limits ns=none network=node exec=yes memory=67108864 cpu=1000m tasks=256 tmp=unbounded cgroups=v1 seccomp=sha256:ab landlock=unavailable",
		"audit: " + g.Name + " did what --sandbox=enforce refuses: execve 1, socket 3",
	} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("the text does not say %q:\n%s", want, text.String())
		}
	}
}

func TestWriteTextShowsTheSandboxOfAHealthyModuleAndWhatAuditCounted(t *testing.T) {
	// Audit mode is run on a node whose providers all serve: what they did
	// that enforce refuses is shown for healthy modules too.
	a := activation("prompt_system", "context_assembly")
	audited := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
	audited.Status.Sandbox = &iteronv1.SandboxStatus{Mode: "audit", Level: "limits", Network: "node", Exec: true, MemoryBytes: 512 << 20, CPUMillis: 500, Tasks: 256,
		Cgroups: "v1", Seccomp: "sha256:ab", Violations: map[string]int64{"socket": 1}}
	plain := generation(a, "context_assembly", 1, 1, "context_assembly-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
	r := Diagnose(input(a, audited, plain), nil, Options{Now: now})
	if !r.Healthy || len(r.Modules) != 0 {
		t.Fatalf("healthy %t, modules %+v", r.Healthy, r.Modules)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Sandboxes of the active generations:\n  prompt_system: " + audited.Name + ": mode=audit level=limits ns=none network=node exec=yes memory=536870912 cpu=500m tasks=256 tmp=unbounded cgroups=v1 seccomp=sha256:ab landlock=unavailable\n",
		"    audit: " + audited.Name + " did what --sandbox=enforce refuses: socket 1\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("the text does not say %q:\n%s", want, text.String())
		}
	}
	// A generation that shows no sandbox (an unsandboxed node) has no line.
	if strings.Contains(text.String(), "context_assembly: "+plain.Name) {
		t.Fatalf("a line for a generation without a sandbox:\n%s", text.String())
	}
	if len(r.Sandboxes) != 1 || r.Sandboxes[0].Violations["socket"] != 1 {
		t.Fatalf("report.sandboxes %+v", r.Sandboxes)
	}
}
