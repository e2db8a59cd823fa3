package ledger

import (
	"path/filepath"
	"testing"
)

func TestAShadowLoadCarriesWhatItsSandboxApplied(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l := openNew(t, dir, Options{})
	tx, err := l.Begin(spec(t, KindFirstActivation, "prompt_system", GenerationRef{}, gen(1, "a"), 1, 0))
	must(t, err)
	must(t, tx.Verify())
	const evidence = "mode=enforce level=isolated ns=cgroup,ipc,mnt,net,pid,uts network=none exec=no memory=536870912 cpu=1000m tasks=256 tmp=67108864 cgroups=v1 seccomp=sha256:00 landlock=7"
	must(t, tx.ShadowLoadSandboxed(evidence))
	must(t, tx.AtomicSwitch())
	must(t, tx.Commit())
	must(t, l.Close())
	st, err := Verify(dir, VerifyOptions{})
	must(t, err)
	var found bool
	for _, r := range st.Recent {
		if r.Phase == PhaseShadowLoad {
			found = r.Reason == SandboxNotePrefix+evidence
		}
	}
	if !found {
		t.Fatalf("no shadow_load record carries the sandbox note: %+v", st.Recent)
	}
	l2, _, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("the ledger does not replay: %v", err)
	}
	l2.Close()
}
