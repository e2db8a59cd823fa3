package sandbox

import (
	"encoding/binary"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	seccompbpf "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/catalog"
)

var update = flag.Bool("update", false, "rewrite docs/security.md's rule table from Table")

func TestEveryCapabilityHasARowAndEachRowWidensOnlyItsRule(t *testing.T) {
	var rows []string
	for _, g := range Table {
		rows = append(rows, g.Capability)
	}
	if !slices.Equal(rows, catalog.Capabilities()) {
		t.Fatalf("the table's rows are %v; want one per capability, in the wire's order %v", rows, catalog.Capabilities())
	}
	for _, c := range []struct {
		name string
		caps []string
		want Rules
	}{
		{"nothing admitted is the baseline", nil, Rules{Network: NetworkNone}},
		{"read_only is the baseline", []string{catalog.CapabilityReadOnly}, Rules{Network: NetworkNone}},
		{"reversible_local adds a scratch directory", []string{catalog.CapabilityReadOnly, catalog.CapabilityReversibleLocal}, Rules{Network: NetworkNone, Scratch: true}},
		{"irreversible_external adds the node's network and nothing else", []string{catalog.CapabilityIrreversibleExternal}, Rules{Network: NetworkNode}},
		{"code_executing adds exec and nothing else", []string{catalog.CapabilityCodeExecuting}, Rules{Network: NetworkNone, Exec: true}},
		{"trust_mutating widens nothing", []string{catalog.CapabilityTrustMutating}, Rules{Network: NetworkNone}},
		{"all five", catalog.Capabilities(), Rules{Network: NetworkNode, Exec: true, Scratch: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Derive(c.caps); got != c.want {
				t.Errorf("Derive(%v) = %+v, want %+v", c.caps, got, c.want)
			}
		})
	}
}

// renderTable is the table as docs/security.md shows it.
func renderTable() string {
	var b strings.Builder
	b.WriteString("| capability | what the kernel is told | why |\n|---|---|---|\n")
	for _, g := range Table {
		b.WriteString("| `" + g.Capability + "` | " + g.Kernel + " | " + g.Why + " |\n")
	}
	b.WriteString("\nEvery provider, whatever it was admitted:\n\n")
	for _, line := range Baseline {
		b.WriteString("- " + line + "\n")
	}
	return b.String()
}

const (
	tableBegin = "<!-- BEGIN sandbox table: rendered by internal/sandbox (go test ./internal/sandbox -run TestTheSecurityDocShowsTheRuleTable -update) -->\n"
	tableEnd   = "<!-- END sandbox table -->"
)

func TestTheSecurityDocShowsTheRuleTable(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "security.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, tableBegin), strings.Index(s, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no sandbox table between %q and %q", path, strings.TrimSpace(tableBegin), tableEnd)
	}
	want := renderTable()
	if got := s[i+len(tableBegin) : j]; got != want {
		if *update {
			if err := os.WriteFile(path, []byte(s[:i+len(tableBegin)]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s's sandbox table differs from Table; run with -update. It should read:\n%s", path, want)
	}
}

// seccompData lays out struct seccomp_data for the BPF interpreter of
// golang.org/x/net/bpf, which loads 32-bit words in network byte order:
// each word is written big-endian at the offset the kernel's little-endian
// layout gives it.
func seccompData(nr int, args ...uint64) []byte {
	b := make([]byte, 64)
	info, _ := arch.GetInfo("")
	binary.BigEndian.PutUint32(b[0:], uint32(nr))
	binary.BigEndian.PutUint32(b[4:], uint32(info.ID))
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
	}
	return b
}

// verdict runs a compiled filter on one call.
func verdict(t *testing.T, c *compiled, name string, args ...uint64) uint32 {
	t.Helper()
	raw := make([]bpf.RawInstruction, len(c.raw)/8)
	for i := range raw {
		b := c.raw[i*8:]
		raw[i] = bpf.RawInstruction{Op: binary.LittleEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.LittleEndian.Uint32(b[4:])}
	}
	insts, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatalf("the filter does not disassemble")
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := arch.GetInfo("")
	nr, ok2 := info.SyscallNames[name]
	if !ok2 {
		t.Fatalf("no syscall %s", name)
	}
	v, err := vm.Run(seccompData(nr, args...))
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

func TestTheProviderProfileAllowsWhatProvidersUseAndRefusesWhatTheyNeverNeed(t *testing.T) {
	enforce, err := compileProfile(filterKind{})
	if err != nil {
		t.Fatal(err)
	}
	audit, err := compileProfile(filterKind{audit: true})
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow = uint32(seccompbpf.ActionAllow)
		eperm = uint32(seccompbpf.ActionErrno) | uint32(unix.EPERM)
		enos  = uint32(seccompbpf.ActionErrno) | uint32(unix.ENOSYS)
		note  = uint32(seccompbpf.ActionUserNotify)
	)
	for _, c := range []struct {
		name           string
		call           string
		args           []uint64
		enforce, audit uint32
	}{
		{"read is allowed", "read", nil, allow, allow},
		{"a thread (clone without namespace flags) is allowed", "clone", []uint64{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND}, allow, allow},
		{"clone with a new user namespace is refused", "clone", []uint64{unix.CLONE_NEWUSER}, eperm, note},
		{"clone3 answers ENOSYS (its flags cannot be inspected)", "clone3", nil, enos, enos},
		{"a unix socket is allowed", "socket", []uint64{unix.AF_UNIX}, allow, allow},
		{"an internet socket is allowed (the network namespace decides)", "socket", []uint64{unix.AF_INET}, allow, note},
		{"execve is allowed (Landlock decides)", "execve", nil, allow, note},
		{"ptrace is refused", "ptrace", nil, eperm, note},
		{"mount is refused", "mount", nil, eperm, note},
		{"unshare is refused", "unshare", nil, eperm, note},
		{"setns is refused", "setns", nil, eperm, note},
		{"keyctl is refused", "keyctl", nil, eperm, note},
		{"bpf is refused", "bpf", nil, eperm, note},
		{"perf_event_open is refused", "perf_event_open", nil, eperm, note},
		{"userfaultfd is refused", "userfaultfd", nil, eperm, note},
		{"io_uring_setup is refused", "io_uring_setup", nil, eperm, note},
		{"kexec_load is refused", "kexec_load", nil, eperm, note},
		{"init_module is refused", "init_module", nil, eperm, note},
		{"a personality the default profile does not list is refused", "personality", []uint64{0x0400000}, eperm, note},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := verdict(t, enforce, c.call, c.args...); got != c.enforce {
				t.Errorf("enforce: %s(%#x) → %#x, want %#x", c.call, c.args, got, c.enforce)
			}
			if got := verdict(t, audit, c.call, c.args...); got != c.audit {
				t.Errorf("audit without network or exec: %s(%#x) → %#x, want %#x", c.call, c.args, got, c.audit)
			}
		})
	}
	if enforce.digest == audit.digest || !strings.HasPrefix(enforce.digest, "sha256:") {
		t.Errorf("digests %s and %s", enforce.digest, audit.digest)
	}
	again, _ := compileProfile(filterKind{})
	if again.digest != enforce.digest {
		t.Errorf("compiling twice gave %s then %s: the digest is not evidence of anything", enforce.digest, again.digest)
	}
	for _, name := range RemovedSyscalls() {
		info, _ := arch.GetInfo("")
		if _, ok := info.SyscallNames[name]; !ok {
			continue // not on this architecture
		}
		if got := verdict(t, enforce, name); got == allow {
			t.Errorf("%s, removed from the profile, is allowed", name)
		}
	}
}

func TestEvidenceReadsBackAsWritten(t *testing.T) {
	for _, e := range []Evidence{
		Off(),
		{Mode: ModeEnforce, Level: LevelIsolated, Namespaces: []string{"cgroup", "ipc", "mnt", "net", "pid", "uts"}, Network: NetworkNone,
			Limits: Limits{MemoryBytes: 512 << 20, CPUMillis: 1000, Tasks: 256, TmpBytes: 64 << 20}, Cgroups: "v1",
			Seccomp: "sha256:" + strings.Repeat("a", 64), Landlock: 7, Launcher: "sha256:" + strings.Repeat("b", 64)},
		{Mode: ModeAudit, Level: LevelLimits, Network: NetworkNode, Exec: true, Limits: Limits{MemoryBytes: 1, CPUMillis: 2, Tasks: 3}, Cgroups: "v2", Seccomp: "sha256:x", Landlock: 0},
	} {
		s := e.String()
		got, err := ParseEvidence(s)
		if err != nil {
			t.Fatalf("ParseEvidence(%q): %v", s, err)
		}
		if got.String() != s {
			t.Errorf("%q read back as %q", s, got.String())
		}
		if len(NotePrefix+s) > 1024 {
			t.Errorf("the note of %q is %d bytes: more than a ledger reason holds", s, len(NotePrefix+s))
		}
	}
}

func TestMalformedEvidenceIsRefusedNamingTheKey(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"mode=enforce level=isolated network=none", "seccomp is missing"},
		{"mode=enforce level=isolated network=none seccomp=off mode=audit", "mode is given twice"},
		{"mode=strict level=isolated network=none seccomp=off", "mode=strict"},
		{"mode=enforce level=isolated network=none seccomp=off memory=-1", "memory=-1"},
		{"mode=enforce level=isolated network=none seccomp=off cpu=100", "cpu=100"},
		{"mode=enforce level=isolated network=none seccomp=off color=blue", "color=blue: unknown key"},
		{"mode=enforce level=isolated network=none seccomp=off landlock=0", "landlock=0"},
		{"mode", "is not key=value"},
	} {
		if _, err := ParseEvidence(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseEvidence(%q) = %v, want an error containing %q", c.in, err, c.want)
		}
	}
}

func FuzzParseEvidence(f *testing.F) {
	f.Add(Off().String())
	f.Add("mode=enforce level=isolated ns=cgroup,ipc,mnt,net,pid,uts network=none exec=no memory=536870912 cpu=1000m tasks=256 tmp=67108864 cgroups=v1 seccomp=sha256:00 landlock=7 launcher=sha256:11")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEvidence(s)
		if err != nil {
			return
		}
		again, err := ParseEvidence(e.String())
		if err != nil {
			t.Fatalf("%q parsed, and its rendering %q does not: %v", s, e.String(), err)
		}
		if again.String() != e.String() {
			t.Fatalf("%q renders as %q then %q", s, e.String(), again.String())
		}
	})
}

func TestASourcesRequestIsResolvedAgainstTheNodesDefaultsAndCeiling(t *testing.T) {
	p := Policy{Ceiling: Limits{MemoryBytes: 1 << 30}}.withDefaults()
	got, err := p.limitsFor(Limits{CPUMillis: 250})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Limits{MemoryBytes: DefaultMemoryBytes, CPUMillis: 250, Tasks: DefaultTasks, TmpBytes: DefaultTmpBytes}); got != want {
		t.Errorf("limits %+v, want %+v", got, want)
	}
	_, err = p.limitsFor(Limits{MemoryBytes: 2 << 30})
	var se *Error
	if !errors.As(err, &se) || se.Field != "sandbox.memory" || !strings.Contains(se.Detail, "--sandbox-max-memory") {
		t.Errorf("a request above the ceiling: %v; want a refusal naming sandbox.memory and the flag", err)
	}
	if err := (Policy{Defaults: Limits{Tasks: 9000}}).Check(); err == nil || !strings.Contains(err.Error(), "tasks") {
		t.Errorf("defaults above the ceiling: %v", err)
	}
	if err := (Policy{ReadOnlyPaths: []string{"etc"}}).Check(); err == nil {
		t.Errorf("a relative read-only path was accepted")
	}
	for _, s := range []string{"none", "limits", "isolated", "Isolated"} {
		if _, err := ParseLevel(s); err != nil {
			t.Errorf("ParseLevel(%q): %v", s, err)
		}
	}
	if _, err := ParseLevel("strict"); err == nil {
		t.Errorf("ParseLevel accepted strict")
	}
	if _, err := ParseMode("warn"); err == nil {
		t.Errorf("ParseMode accepted warn")
	}
}
