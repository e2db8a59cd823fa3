package doctor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/pkg/strictjson"
)

// ledgerWriter writes a real ledger for the fixture activation through the
// ledger package, as the coordinator does.
type ledgerWriter struct {
	t    *testing.T
	l    *ledger.Ledger
	uid  string
	base ledger.TxnSpec
}

func newLedger(t *testing.T, stateDir string, a *iteronv1.ImplementationActivation) *ledgerWriter {
	t.Helper()
	l, _, err := ledger.OpenActivation(stateDir, string(a.UID), ledger.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &ledgerWriter{t: t, l: l, uid: string(a.UID), base: ledger.TxnSpec{
		CandidateSHA256: "sha256:" + strings.Repeat("c", 64), AuthoritySHA256: "sha256:" + strings.Repeat("d", 64), DeadlineMs: 30000,
	}}
}

func (w *ledgerWriter) id(module string, lineage, attempt uint64) ledger.TransactionID {
	x, err := ledger.NewTransactionID(w.uid, module, lineage, attempt, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	return x
}

func ref(n uint64, impl string) ledger.GenerationRef {
	return ledger.GenerationRef{Generation: n, ImplementationID: impl, ArtifactSHA256: "sha256:" + strings.Repeat(impl[:1], 64)}
}

func (w *ledgerWriter) must(errs ...error) {
	w.t.Helper()
	for _, err := range errs {
		if err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *ledgerWriter) first(module, impl string) {
	s := w.base
	s.Kind, s.ID, s.New = ledger.KindFirstActivation, w.id(module, 1, 1), ref(1, impl)
	tx := w.begin(s)
	w.must(tx.Verify(), tx.ShadowLoad(), tx.AtomicSwitch(), tx.Commit())
}

func (w *ledgerWriter) begin(s ledger.TxnSpec) *ledger.Txn {
	w.t.Helper()
	tx, err := w.l.Begin(s)
	if err != nil {
		w.t.Fatal(err)
	}
	return tx
}

// swap writes attempt a of a hot swap from lineage n to n+1, blocked at
// migrate unless ok.
func (w *ledgerWriter) swap(module string, n, attempt uint64, from, to string, ok bool) {
	s := w.base
	s.Kind, s.ID, s.Old, s.New = ledger.KindHotSwap, w.id(module, n+1, attempt), ref(n, from), ref(n+1, to)
	tx := w.begin(s)
	w.must(tx.Verify(), tx.ShadowLoad(), tx.Quiesce(), tx.Snapshot("sha256:"+strings.Repeat("e", 64)))
	if !ok {
		w.must(tx.Block(ledger.PhaseMigrate, reasons.ProviderFailed, "faulty: crash at migrate"), tx.RollBack())
		return
	}
	w.must(tx.Migrate(), tx.Restore("sha256:"+strings.Repeat("f", 64)), tx.Readiness(), tx.AtomicSwitch(), tx.Drain(), tx.Commit())
}

// mirror copies the ledger's head into the activation's status, as the
// controller does.
func (w *ledgerWriter) mirror(a *iteronv1.ImplementationActivation) {
	s := w.l.Summary()
	a.Status.Ledger = &iteronv1.LedgerStatus{File: w.l.Dir(), HeadSHA256: s.HeadSHA256, Records: int64(s.Records), Verified: true}
}

func segment(t *testing.T, dir string) string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment in %s: %v", dir, err)
	}
	slices.Sort(segs)
	return segs[len(segs)-1]
}

func TestReadLocalLedger(t *testing.T) {
	tests := []struct {
		name  string
		write func(t *testing.T, w *ledgerWriter, a *iteronv1.ImplementationActivation, dir string)
		check func(t *testing.T, ll *LocalLedger)
	}{
		{
			name: "a ledger that verifies gives each module's last block and checks the head status mirrors",
			write: func(t *testing.T, w *ledgerWriter, a *iteronv1.ImplementationActivation, _ string) {
				w.first("prompt_system", "a")
				w.first("context_assembly", "c")
				w.swap("prompt_system", 1, 1, "a", "b", false)
				w.mirror(a)
			},
			check: func(t *testing.T, ll *LocalLedger) {
				if ll.State == nil || ll.Err != "" || !ll.Anchored || ll.State.NextSequence != 14 {
					t.Fatalf("ledger %+v", ll)
				}
				b, ok := ll.LastBlocks["prompt_system"]
				if !ok || b.Phase != "migrate" || b.BlockKind != "provider" || b.Reason != "provider_failed: faulty: crash at migrate" || b.Ending != "rolled_back" || b.Sequence != 12 || b.Source != "file" {
					t.Fatalf("prompt_system block %+v", b)
				}
				if _, ok := ll.LastBlocks["context_assembly"]; ok {
					t.Fatal("context_assembly never blocked")
				}
			},
		},
		{
			name: "a block that a later committed swap superseded is dropped",
			write: func(t *testing.T, w *ledgerWriter, a *iteronv1.ImplementationActivation, _ string) {
				w.first("prompt_system", "a")
				w.swap("prompt_system", 1, 1, "a", "b", false)
				w.swap("prompt_system", 1, 2, "a", "b", true)
			},
			check: func(t *testing.T, ll *LocalLedger) {
				if len(ll.LastBlocks) != 0 || ll.State == nil {
					t.Fatalf("blocks %+v err %q", ll.LastBlocks, ll.Err)
				}
			},
		},
		{
			name: "a tampered record breaks a rule at its sequence and the blocks before it are still read",
			write: func(t *testing.T, w *ledgerWriter, a *iteronv1.ImplementationActivation, dir string) {
				w.first("prompt_system", "a")
				w.swap("prompt_system", 1, 1, "a", "b", false)
				w.first("context_assembly", "c")
				w.l.Close()
				seg := segment(t, dir)
				b, err := os.ReadFile(seg)
				if err != nil {
					t.Fatal(err)
				}
				// Record 12 is context_assembly's shadow_load: change its
				// module name's first letter, keeping the JSON valid.
				lines := strings.SplitAfter(string(b), "\n")
				lines[12] = strings.Replace(lines[12], `"module":"context_assembly"`, `"module":"dontext_assembly"`, 1)
				if err := os.WriteFile(seg, []byte(strings.Join(lines, "")), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, ll *LocalLedger) {
				if ll.Broken == nil || ll.State != nil {
					t.Fatalf("a tampered ledger verified: %+v", ll)
				}
				if ll.Broken.Sequence != 12 || ll.Broken.Line != 13 {
					t.Fatalf("broken rule %s at sequence %d line %d: %v", ll.Broken.Rule, ll.Broken.Sequence, ll.Broken.Line, ll.Broken)
				}
				if _, ok := ll.LastBlocks["prompt_system"]; !ok {
					t.Fatal("the block before the broken record was lost")
				}
			},
		},
		{
			name: "a head in status that is not in the chain breaks the anchor rule",
			write: func(t *testing.T, w *ledgerWriter, a *iteronv1.ImplementationActivation, _ string) {
				w.first("prompt_system", "a")
				w.mirror(a)
				a.Status.Ledger.HeadSHA256 = "sha256:" + strings.Repeat("9", 64)
			},
			check: func(t *testing.T, ll *LocalLedger) {
				if ll.Broken == nil || ll.Broken.Rule != ledger.RuleAnchor || ll.Broken.Sequence != 3 {
					t.Fatalf("want the anchor rule at sequence 3: %+v", ll)
				}
			},
		},
		{
			name: "a ledger directory that does not exist is missing",
			write: func(t *testing.T, w *ledgerWriter, a *iteronv1.ImplementationActivation, dir string) {
				w.l.Close()
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, ll *LocalLedger) {
				if !ll.Missing || ll.State != nil {
					t.Fatalf("%+v", ll)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stateDir := t.TempDir()
			a := activation("prompt_system", "context_assembly")
			a.Status.Ledger = nil
			w := newLedger(t, stateDir, a)
			dir, _ := ledger.ActivationDir(stateDir, string(a.UID))
			tt.write(t, w, a, dir)
			loc := ReadLocal(stateDir, a)
			if loc.Err != "" || loc.Ledger == nil {
				t.Fatalf("local %+v", loc)
			}
			tt.check(t, loc.Ledger)
		})
	}
}

// provider starts a real process in its own process group, as the executor
// does, and stops the whole group at the end of the test.
func provider(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

// record writes the executor's durable record of a process group.
func record(t *testing.T, stateDir string, r procexec.Record) string {
	t.Helper()
	dir := statedir.Dir(stateDir).ProcessRecords()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := strictjson.Canonical(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%d-%d.json", r.PID, r.StartTime))
	if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// recordOf is the record the executor writes for a live process.
func recordOf(t *testing.T, pid int, module string) procexec.Record {
	t.Helper()
	st, err := readStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	return procexec.Record{PID: pid, PGID: st.pgid, StartTime: st.startTime, BootID: bootID(), UID: os.Getuid(),
		Module: module, ImplementationID: module + "-impl", ArtifactSHA256: "sha256:" + strings.Repeat("a", 64)}
}

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func TestReadLocalProcesses(t *testing.T) {
	stateDir := t.TempDir()
	live := provider(t, "exec sleep 300")
	liveRec := recordOf(t, live.Process.Pid, "prompt_system")
	liveFile := record(t, stateDir, liveRec)

	dead := exec.Command("/bin/true")
	dead.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	deadRec := procexec.Record{PID: dead.Process.Pid, PGID: dead.Process.Pid, StartTime: 1, BootID: bootID(), Module: "context_assembly", ImplementationID: "x"}
	dead.Wait()
	deadFile := record(t, stateDir, deadRec)

	reused := liveRec
	reused.StartTime++
	reusedFile := record(t, stateDir, reused)

	otherBoot := liveRec
	otherBoot.BootID, otherBoot.StartTime = "00000000-0000-0000-0000-000000000000", liveRec.StartTime+2
	otherBootFile := record(t, stateDir, otherBoot)

	// A group whose leader exited and left a member behind.
	group := provider(t, "sleep 300 & echo $!; exit 0")
	groupRec := recordOf(t, group.Process.Pid, "memory_recall")
	group.Wait()
	groupFile := record(t, stateDir, groupRec)
	members, _ := groupMembers(groupRec.PGID, groupRec.StartTime, groupRec.UID)
	if len(members) != 1 {
		t.Fatalf("the group's member: %v", members)
	}
	t.Cleanup(func() { syscall.Kill(members[0], syscall.SIGKILL) })

	dup := filepath.Join(statedir.Dir(stateDir).ProcessRecords(), "1-1.json")
	if err := os.WriteFile(dup, []byte(`{"pid":1,"pid":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statedir.Dir(stateDir).ProcessRecords(), "9-9.json.tmp"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Ages are measured in clock ticks (10 ms) on both sides: let the live
	// one be measurably old.
	time.Sleep(150 * time.Millisecond)
	loc := ReadLocal(stateDir, activation("prompt_system"))
	if loc.Err != "" || loc.ProcessesErr != "" {
		t.Fatalf("local %+v", loc)
	}
	byFile := map[string]LocalProcess{}
	for _, p := range loc.Processes {
		byFile[p.File] = p
	}
	if len(byFile) != 6 {
		t.Fatalf("%d records read, want 6 (the .tmp file is skipped): %+v", len(byFile), loc.Processes)
	}
	tests := []struct {
		name  string
		file  string
		alive bool
		gone  string
	}{
		{"a live leader with matching pid, pgid, start time and boot is alive", liveFile, true, ""},
		{"a record of an exited process names no live process", deadFile, false, fmt.Sprintf("no process %d", deadRec.PID)},
		{"a record whose pid now has another start time names a reused pid", reusedFile, false, "now names another process"},
		{"a record from another boot names no live process", otherBootFile, false, "recorded in another boot"},
		{"a group whose leader exited is alive while a member runs", groupFile, true, fmt.Sprintf("member(s) of group %d run: [%d]", groupRec.PGID, members[0])},
		{"a record with a duplicate key is unreadable", dup, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := byFile[tt.file]
			if p.Alive != tt.alive || !strings.Contains(p.Gone, tt.gone) {
				t.Fatalf("alive %t gone %q; want alive %t gone ~%q", p.Alive, p.Gone, tt.alive, tt.gone)
			}
			if tt.file == dup && !strings.Contains(p.ReadErr, "duplicate") {
				t.Fatalf("read error %q", p.ReadErr)
			}
			if tt.file == liveFile && (p.Age < 100*time.Millisecond || p.Age > time.Minute) {
				t.Fatalf("age of a process started just now: %s", p.Age)
			}
		})
	}
}

func TestReadLocalOnAStateDirThatIsNotOne(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{file, filepath.Join(t.TempDir(), "absent")} {
		loc := ReadLocal(dir, activation("prompt_system"))
		if loc.Err == "" || loc.Ledger != nil {
			t.Fatalf("%s: %+v", dir, loc)
		}
		r := Diagnose(input(activation("prompt_system")), loc, Options{Now: now})
		if got := codes(r); !slices.Equal(got, []string{"problem state_dir_unreadable"}) {
			t.Fatalf("%s: findings %q", dir, got)
		}
	}
}

func TestDiagnoseSaysWhenTheStateDirLacksTheLedgerStatusMirrors(t *testing.T) {
	a := activation("prompt_system")
	r := Diagnose(input(a), ReadLocal(t.TempDir(), a), Options{Now: now})
	if got := codes(r); !slices.Equal(got, []string{"problem ledger_unreadable"}) {
		t.Fatalf("findings %q", got)
	}
	if f := r.Findings[0]; !strings.Contains(f.Summary, "status mirrors a ledger of 4 records but") || !strings.Contains(f.Hint, "--state-dir") {
		t.Fatalf("%+v", f)
	}
}

func TestDiagnoseProcesses(t *testing.T) {
	a := activation("prompt_system", "context_assembly")
	a.Status.Ledger = nil // no ledger yet: only the processes are judged
	active := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
	failed := generation(a, "prompt_system", 2, 1, "faulty", iteronv1.PhaseFailed, iteronv1.StepMigrate)
	shadow := generation(a, "context_assembly", 2, 1, "ctx-b", iteronv1.PhasePreparing, iteronv1.StepShadowLoad)
	stranger := generation(a, "memory_recall", 1, 1, "mem", iteronv1.PhaseActive, iteronv1.StepCommitted)
	stranger.OwnerReferences[0].UID = "0a1b2c3d-0000-4000-8000-00000000dead"

	tests := []struct {
		name    string
		claim   *iteronv1.Generation // its status.pid is set to the process's pid
		grace   time.Duration
		verdict string
		want    []string
		summary string
	}{
		{name: "a live group no status claims, past the grace period, is orphaned", grace: -1, verdict: VerdictOrphaned,
			want: []string{"problem orphaned_process prompt_system"}, summary: "is alive but no Generation's status shows its pid"},
		{name: "a live group no status claims yet, within the grace period, is unconfirmed", verdict: VerdictUnconfirmed,
			want: []string{"info unconfirmed_process prompt_system"}, summary: "no status shows it yet"},
		{name: "a group the active generation's status claims serves", claim: &active, grace: -1, verdict: VerdictServing},
		{name: "a group a Preparing generation claims is in a transaction", claim: &shadow, grace: -1, verdict: VerdictInTransaction},
		{name: "a group a Failed generation still claims is orphaned", claim: &failed, grace: -1, verdict: VerdictOrphaned,
			want:    []string{"problem orphaned_process prompt_system"},
			summary: "its Generation team/stack-prompt-system-g2-1 is Failed and activation team/stack does not show it serving module prompt_system"},
		{name: "a group claimed by a generation whose activation is gone is orphaned", claim: &stranger, grace: -1, verdict: VerdictOrphaned,
			want: []string{"problem orphaned_process prompt_system"}, summary: "is Active and its activation is gone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stateDir := t.TempDir()
			p := provider(t, "exec sleep 300")
			rec := recordOf(t, p.Process.Pid, "prompt_system")
			file := record(t, stateDir, rec)
			gens := []iteronv1.Generation{active, failed, shadow, stranger}
			for i := range gens {
				gens[i].Status.Pid = 0
				if tt.claim != nil && gens[i].Name == tt.claim.Name {
					gens[i].Status.Pid = int64(rec.PID)
				}
			}
			in := input(a, gens...)
			in.NodeView = &NodeView{Activations: []iteronv1.ImplementationActivation{*a}, Generations: gens, Scope: "cluster"}
			r := Diagnose(in, ReadLocal(stateDir, a), Options{Now: now, OrphanGrace: tt.grace})
			if len(r.Processes) != 1 || r.Processes[0].Verdict != tt.verdict {
				t.Fatalf("processes %+v, want verdict %s", r.Processes, tt.verdict)
			}
			if got := codes(r); !slices.Equal(got, tt.want) {
				t.Fatalf("findings %q, want %q", got, tt.want)
			}
			if len(tt.want) == 0 {
				return
			}
			f := r.Findings[0]
			if !strings.Contains(f.Summary, tt.summary) {
				t.Fatalf("summary %q does not say %q", f.Summary, tt.summary)
			}
			if f.Severity != SeverityProblem {
				return
			}
			want := []string{fmt.Sprintf("kill -- -%d", rec.PGID), "rm -f " + file}
			if !slices.Equal(f.Commands, want) {
				t.Fatalf("commands %q, want %q", f.Commands, want)
			}
			// The printed commands do what they say.
			for _, c := range f.Commands {
				if out, err := exec.Command("/bin/sh", "-c", c).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v\n%s", c, err, out)
				}
			}
			p.Wait()
			if alive(rec.PID) {
				t.Fatalf("process %d survived %q", rec.PID, f.Commands[0])
			}
			if _, err := os.Stat(file); !os.IsNotExist(err) {
				t.Fatalf("record %s survived: %v", file, err)
			}
		})
	}
}

func TestDiagnoseReportsAStaleRecordAsInformation(t *testing.T) {
	stateDir := t.TempDir()
	file := record(t, stateDir, procexec.Record{PID: 1 << 22, PGID: 1 << 22, StartTime: 7, BootID: bootID(), Module: "prompt_system"})
	a := activation("prompt_system")
	a.Status.Ledger = nil
	r := Diagnose(input(a), ReadLocal(stateDir, a), Options{Now: now})
	if got := codes(r); !slices.Equal(got, []string{"info stale_process_record"}) || !r.Healthy {
		t.Fatalf("findings %q healthy %t", got, r.Healthy)
	}
	if !strings.Contains(r.Findings[0].Summary, file) || r.Processes[0].Verdict != VerdictStale {
		t.Fatalf("%+v %+v", r.Findings[0], r.Processes)
	}
}
