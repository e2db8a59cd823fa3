package childproc

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const childEnv = "ITERON_CHILDPROC_CHILD"

// TestMain lets this test binary be a parent that starts a sleeper and is
// killed.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		sleeper := exec.Command("sleep", "300")
		if err := Start(sleeper, syscall.SIGKILL); err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(2)
		}
		os.Stdout.WriteString("pid " + strconv.Itoa(sleeper.Process.Pid) + "\n")
		select {} // until killed
	}
	os.Exit(m.Run())
}

func TestAChildEndsWithTheTestBinaryThatStartedItWhenThatIsKilled(t *testing.T) {
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), childEnv+"=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "pid "))
	if err != nil {
		_ = parent.Process.Kill()
		_ = parent.Wait()
		t.Fatalf("the parent printed %q, want its child's pid", line)
	}
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Fields(string(st))[2] == "Z" {
			t.Logf("the parent SIGKILLed, its child %d ended with it", pid)
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("30 s after its parent was SIGKILLed, child %d still runs (killed now)", pid)
		}
	}
}
