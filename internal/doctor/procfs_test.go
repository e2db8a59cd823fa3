package doctor

import (
	"os/exec"
	"strings"
	"testing"
)

// statTail is a real stat line's fields after the command name, with pgid
// 77 and start time 12345.
const statTail = " S 1 77 77 0 -1 4194304 102 0 0 0 0 0 0 0 20 0 1 0 12345 3133440 393 18446744073709551615 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"

func TestParseStat(t *testing.T) {
	tests := []struct {
		name      string
		line      string
		pgid      int
		startTime uint64
		err       string
	}{
		{name: "a plain command name", line: "123 (sleep)" + statTail, pgid: 77, startTime: 12345},
		{name: "a command name that imitates the fields after it is skipped whole", line: "123 (x) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 999)" + statTail, pgid: 77, startTime: 12345},
		{name: "a command name with spaces, parentheses and a newline", line: "123 (a (b) c\n)" + statTail, pgid: 77, startTime: 12345},
		{name: "no command name is refused", line: "123 sleep S 1 77", err: "no command name"},
		{name: "too few fields are refused", line: "123 (sleep) S 1 77 77", err: "fields after the command name"},
		{name: "a process group that is not a positive number is refused", line: "123 (sleep) S 1 0 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", err: "process group"},
		{name: "a start time that is not a number is refused", line: "123 (sleep) S 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 x", err: "start time"},
		{name: "a line longer than any stat line is refused", line: "1 (" + strings.Repeat("x", maxStatBytes) + ")" + statTail, err: "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := parseStat([]byte(tt.line))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil || st.pgid != tt.pgid || st.startTime != tt.startTime {
				t.Fatalf("got %+v, %v; want pgid %d start %d", st, err, tt.pgid, tt.startTime)
			}
		})
	}
}

// FuzzParseStat feeds stat lines whose command name (chosen by the process
// itself, so untrusted) is arbitrary: the fields after it must always be
// the real ones, and arbitrary bytes must never panic or yield a
// non-positive process group.
func FuzzParseStat(f *testing.F) {
	f.Add("sleep", []byte("3857 (cat) R 3855 3855 15020 0 -1 4194304 102 0 0 0 0 0 0 0 20 0 1 0 416517 3133440 393"))
	f.Add(") R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 999", []byte("1 ())"))
	f.Add("a (b) c", []byte(""))
	f.Fuzz(func(t *testing.T, comm string, raw []byte) {
		if st, err := parseStat(raw); err == nil && st.pgid <= 0 {
			t.Fatalf("%q parsed to pgid %d", raw, st.pgid)
		}
		if len(comm) > 64 {
			comm = comm[:64]
		}
		st, err := parseStat([]byte("123 (" + comm + ")" + statTail))
		if err != nil || st.pgid != 77 || st.startTime != 12345 {
			t.Fatalf("command name %q: got %+v, %v", comm, st, err)
		}
	})
}

func TestShellQuote(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/var/lib/iteron/state/procs/123-456.json", "/var/lib/iteron/state/procs/123-456.json"},
		{"/state/procs/a b.json", "'/state/procs/a b.json'"},
		{"/state/procs/$(reboot).json", "'/state/procs/$(reboot).json'"},
		{"/state/it's.json", `'/state/it'\''s.json'`},
		{"", "''"},
	}
	for _, tt := range tests {
		if got := shellQuote(tt.in); got != tt.want {
			t.Errorf("shellQuote(%q) = %s, want %s", tt.in, got, tt.want)
		}
		if out, err := exec.Command("/bin/sh", "-c", "printf %s "+shellQuote(tt.in)).Output(); err != nil || string(out) != tt.in {
			t.Errorf("the shell read %s back as %q (%v), want %q", shellQuote(tt.in), out, err, tt.in)
		}
	}
}
