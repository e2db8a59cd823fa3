package docs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// session is one bash process that runs a guide's commands one after the
// other, as a reader's terminal would: variables, the working directory and
// background jobs carry over from command to command.
type session struct {
	dir    string // where commands, their output and the shell's log go
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	status *bufio.Reader // "<exit status>\n" after each command (fd 3)
	n      int
	exited chan struct{}
}

// startSession starts bash in workdir with env. Its process group is its
// own, so that whatever a guide leaves running can be found and stopped.
func startSession(dir, workdir string, env []string) (*session, error) {
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "shell.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir, cmd.Env = workdir, env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{statusW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	statusW.Close()
	s := &session{dir: dir, cmd: cmd, stdin: stdin, status: bufio.NewReader(statusR), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(s.exited) }()
	return s, nil
}

// run runs one command and returns its combined stdout and stderr and its
// exit status. The command's own stdin is /dev/null (a here-document
// still feeds it), and it does not see the status descriptor, so that a
// background job it starts cannot hold it open.
func (s *session) run(text string, timeout time.Duration) (string, int, error) {
	s.n++
	script := filepath.Join(s.dir, fmt.Sprintf("cmd-%03d.sh", s.n))
	out := filepath.Join(s.dir, fmt.Sprintf("out-%03d.txt", s.n))
	if err := os.WriteFile(script, []byte(text+"\n"), 0o644); err != nil {
		return "", 0, err
	}
	line := fmt.Sprintf("{ . %s; } >%s 2>&1 </dev/null 3>&-; echo $? >&3\n", shellQuote(script), shellQuote(out))
	if _, err := io.WriteString(s.stdin, line); err != nil {
		return "", 0, fmt.Errorf("the shell is gone: %w", err)
	}
	type result struct {
		line string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		l, err := s.status.ReadString('\n')
		done <- result{l, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(timeout):
		data, _ := os.ReadFile(out)
		return string(data), 0, fmt.Errorf("no exit within %v", timeout)
	}
	data, _ := os.ReadFile(out)
	if r.err != nil {
		return string(data), 0, fmt.Errorf("the shell exited (its log: %s)", filepath.Join(s.dir, "shell.log"))
	}
	code, err := strconv.Atoi(strings.TrimSpace(r.line))
	if err != nil {
		return string(data), 0, fmt.Errorf("bad status %q", r.line)
	}
	return string(data), code, nil
}

// pwd is the session's working directory.
func (s *session) pwd() (string, error) {
	out, code, err := s.run("pwd", time.Minute)
	if err != nil || code != 0 {
		return "", fmt.Errorf("pwd: exit %d, %v", code, err)
	}
	return strings.TrimSpace(out), nil
}

// close ends the shell and returns what the guide left running in its
// process group (after stopping it: SIGTERM, then SIGKILL after grace).
func (s *session) close(grace time.Duration) []string {
	_, _ = io.WriteString(s.stdin, "exit\n")
	s.stdin.Close()
	select {
	case <-s.exited:
	case <-time.After(grace):
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.exited
	}
	pgid := s.cmd.Process.Pid
	left := groupMembers(pgid)
	if len(left) == 0 {
		return nil
	}
	// The group still has members, so its id is still ours: signal it.
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for len(groupMembers(pgid)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if len(groupMembers(pgid)) > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return left
}

// groupMembers lists the live (not zombie) processes of process group
// pgid, as "pid comm".
func groupMembers(pgid int) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(data)
		name := st[strings.IndexByte(st, '(')+1 : strings.LastIndexByte(st, ')')]
		f := strings.Fields(st[strings.LastIndexByte(st, ')')+1:])
		// After the name: state, ppid, pgrp.
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, fmt.Sprintf("%d %s", pid, name))
		}
	}
	return out
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
