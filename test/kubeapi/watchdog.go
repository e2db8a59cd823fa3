package kubeapi

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"iteron.dev/operator/test/childproc"
)

// A test binary that panics, or that its -timeout ends, runs no deferred
// function and no Stop: etcd and kube-apiserver, each in a process group of
// its own (envtest's Setpgid), would outlive it. A watchdog child told of
// this process's death (Pdeathsig) kills their groups then, each only if its
// pid still names the process started here (start time checked).

// watchdogScript says "armed" once its trap is set, then waits; on SIGTERM
// it kills each group given as "pid:start"
// whose leader still has that start time (field 22 of /proc/<pid>/stat; the
// names etcd and kube-apiserver hold no space, so fields split on spaces),
// then removes each directory given as "dir:<path>" (their data and
// certificates).
const watchdogScript = `cleanup() {
  for a in "$@"; do
    case $a in
    dir:*) rm -rf -- "${a#dir:}" ;;
    *) p=${a%%:*}; s=$(cut -d" " -f22 /proc/$p/stat 2>/dev/null)
       [ "$s" = "${a#*:}" ] && kill -s KILL -- -$p ;;
    esac
  done
}
trap 'cleanup "$@"; kill $! 2>/dev/null; exit 0' TERM
echo armed
exec >/dev/null
while :; do sleep 3600 & wait $!; done`

// startWatchdog finds this process's children named in names (the control
// plane envtest started) and starts the watchdog over their process groups
// and dirs.
func startWatchdog(names []string, dirs ...string) (*exec.Cmd, []string, error) {
	groups, err := childGroups(names)
	if err != nil {
		return nil, nil, err
	}
	if len(groups) != len(names) {
		return nil, groups, fmt.Errorf("found %d of the control plane's %d processes (%v) among this process's children: %v", len(groups), len(names), names, groups)
	}
	args := append([]string{"-c", watchdogScript, "kubeapi-watchdog"}, groups...)
	for _, d := range dirs {
		if d != "" {
			args = append(args, "dir:"+d)
		}
	}
	cmd := exec.Command("/bin/sh", args...)
	// A group of its own, so that Stop ends the shell and its sleep
	// together: killed alone, the shell left its sleep to init for up to an
	// hour (22 of them were found after a day's test runs).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	armed, err := cmd.StdoutPipe()
	if err != nil {
		return nil, groups, err
	}
	if err := childproc.Start(cmd, syscall.SIGTERM); err != nil {
		return nil, groups, fmt.Errorf("start the control plane's watchdog: %w", err)
	}
	// Not before its trap is set: a SIGTERM that came first (this process
	// dying at once, as a panicking test binary does) would end the shell
	// without its cleanup, and the control plane would outlive it (seen
	// once in 10 runs beside a CI run).
	line := make(chan string, 1)
	go func() {
		b, _ := bufio.NewReader(armed).ReadString('\n')
		line <- b
	}()
	select {
	case b := <-line:
		if b != "armed\n" {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			return nil, groups, fmt.Errorf("the control plane's watchdog did not start (it said %q)", b)
		}
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, groups, errors.New("the control plane's watchdog did not set its trap within 30 s")
	}
	return cmd, groups, nil
}

// childGroups lists "pid:start" of this process's children whose name is in
// names.
func childGroups(names []string) ([]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := strconv.Itoa(os.Getpid())
	var groups []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid … : the fields after the last ')' start at state.
		stat := string(data)
		lp, rp := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
		if lp < 0 || rp < lp {
			continue
		}
		comm, rest := stat[lp+1:rp], strings.Fields(stat[rp+1:])
		if len(rest) < 20 || rest[1] != self {
			continue
		}
		for _, n := range names {
			if comm == n {
				groups = append(groups, e.Name()+":"+rest[19])
			}
		}
	}
	return groups, nil
}
