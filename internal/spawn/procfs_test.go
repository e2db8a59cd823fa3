package spawn

import (
	"os"
	"testing"
)

func TestAStatLineIsReadAfterTheLastParenthesis(t *testing.T) {
	// A command name may hold parentheses and spaces: the fields start after
	// the last ')'.
	line := "4242 (evil) Z 1 2 (x) S 17 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n"
	st, err := parseStat(4242, []byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != 4242 || st.State != 'S' || st.PPID != 17 || st.PGID != 4242 || st.StartTime != 987654 {
		t.Fatalf("parsed %+v", st)
	}
	for _, bad := range []string{"4242 no-parenthesis S 1", "4242 (x) S 1 2 3"} {
		if _, err := parseStat(4242, []byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestThisProcessReadsAsRunningInItsOwnGroup(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != os.Getpid() || st.PPID != os.Getppid() || st.PGID <= 0 || st.StartTime == 0 {
		t.Fatalf("/proc/self/stat read as %+v", st)
	}
	if BootID() == "" {
		t.Fatal("no boot id")
	}
}
