// Command hostile is the provider of the sandbox's hostile-provider suite
// (test/sandbox): a protocol-1 provider whose run input names one thing a
// provider should not be able to do — {"act":"connect","arg":"127.0.0.1:8080"}
// — and whose terminal observation says what happened:
// {"act":"connect","ok":false,"error":"…"}. Some acts never answer: a
// memory hog is killed by the kernel, a fork bomb keeps its tasks.
//
// Run with arguments (hostile <act> [arg [after-a-line]]) it does the act
// once (after reading a line from stdin, with after-a-line) and prints the
// same JSON on stdout, without the protocol: the sandbox package's own
// tests drive it that way.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/pkg/protocol"
	"iteron.dev/operator/pkg/provider"
	"iteron.dev/operator/pkg/strictjson"
)

// Result is what an act did.
type Result struct {
	Act    string `json:"act"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
}

type input struct {
	Act string `json:"act"`
	Arg string `json:"arg,omitzero"`
}

type hostile struct{}

func (hostile) Load(context.Context, *provider.Load) error { return nil }

func (hostile) Start(ctx context.Context, run *provider.Run) error {
	var in input
	if err := strictjson.Decode(run.Input, &in, protocol.MaxPayloadBytes); err != nil {
		return run.EmitValue(Result{Act: "?", Error: "input: " + err.Error()}, true)
	}
	return run.EmitValue(do(in.Act, in.Arg), true)
}

func (hostile) Cancel(context.Context, string, string) error { return nil }

func main() {
	if len(os.Args) > 1 {
		arg := ""
		if len(os.Args) > 2 {
			arg = os.Args[2]
		}
		if len(os.Args) > 3 && os.Args[3] == "after-a-line" {
			// The test starts what it does beside the act first.
			var line string
			fmt.Scanln(&line)
		}
		b, _ := json.Marshal(do(os.Args[1], arg))
		fmt.Println(string(b))
		return
	}
	if err := provider.Serve(context.Background(), os.Stdin, os.Stdout, hostile{}); err != nil {
		fmt.Fprintf(os.Stderr, "hostile: %v\n", err)
		os.Exit(1)
	}
}

func result(act string, err error, detail string) Result {
	r := Result{Act: act, OK: err == nil, Detail: detail}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

func do(act, arg string) Result {
	switch act {
	case "ok":
		return result(act, nil, "")
	case "connect":
		c, err := net.DialTimeout("tcp", arg, 2*time.Second)
		if err == nil {
			_, err = c.Write([]byte("hostile was here\n"))
			c.Close()
		}
		return result(act, err, arg)
	case "sockets":
		// arg internet sockets, opened and closed one after the other.
		n, _ := strconv.Atoi(arg)
		for i := 0; i < n; i++ {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return result(act, err, strconv.Itoa(i))
			}
			unix.Close(fd)
		}
		return result(act, nil, arg)
	case "read":
		b, err := os.ReadFile(arg)
		return result(act, err, fmt.Sprintf("%d bytes", len(b)))
	case "list":
		ents, err := os.ReadDir(arg)
		return result(act, err, fmt.Sprintf("%d entries", len(ents)))
	case "write":
		return result(act, os.WriteFile(arg, []byte("hostile was here\n"), 0o644), arg)
	case "fill":
		return fill(arg)
	case "procs":
		ents, err := os.ReadDir("/proc")
		n := 0
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				n++
			}
		}
		return result(act, err, strconv.Itoa(n))
	case "exec":
		out, err := exec.Command(arg, "-c", "echo ran").CombinedOutput()
		return result(act, err, strings.TrimSpace(string(out)))
	case "exec-memfd":
		return execMemfd()
	case "exec-written":
		return execWritten(arg)
	case "ptrace":
		pid, _ := strconv.Atoi(arg)
		_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, uintptr(pid), 0, 0, 0, 0)
		return result(act, errnoErr(errno), arg)
	case "signal":
		pid, _ := strconv.Atoi(arg)
		return result(act, unix.Kill(pid, unix.SIGTERM), arg)
	case "mount":
		return result(act, unix.Mount("none", "/tmp", "tmpfs", 0, ""), "")
	case "unshare":
		runtime.LockOSThread()
		return result(act, unix.Unshare(unix.CLONE_NEWUSER|unix.CLONE_NEWNS), "")
	case "keyctl":
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 1, 0, 0)
		return result(act, err, "")
	case "bpf":
		var attr [64]byte
		_, _, errno := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
		return result(act, errnoErr(errno), "")
	case "memhog":
		return memhog()
	case "forkbomb":
		return forkbomb(arg)
	case "spin":
		return spin(arg)
	}
	return Result{Act: act, Error: "unknown act"}
}

func errnoErr(errno syscall.Errno) error {
	if errno == 0 {
		return nil
	}
	return errno
}

// fill writes into the file arg until the write fails (a full /tmp).
func fill(path string) Result {
	f, err := os.Create(path)
	if err != nil {
		return result("fill", err, "")
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < 8<<30 {
		m, err := f.Write(buf)
		n += int64(m)
		if err != nil {
			return result("fill", err, strconv.FormatInt(n, 10))
		}
	}
	return result("fill", nil, strconv.FormatInt(n, 10))
}

// execMemfd copies this executable into a memfd and executes it.
func execMemfd() Result {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return result("exec-memfd", err, "reading itself")
	}
	fd, err := unix.MemfdCreate("hostile", unix.MFD_EXEC)
	detail := "memfd_create(MFD_EXEC)"
	if err != nil {
		fd, err = unix.MemfdCreate("hostile", 0)
		detail = "memfd_create(MFD_EXEC) refused; memfd_create(0)"
		if err != nil {
			return result("exec-memfd", err, detail)
		}
	}
	unix.Write(fd, self)
	if err := unix.Fchmod(fd, 0o755); err != nil {
		detail += "; fchmod: " + err.Error()
	}
	out, err := exec.Command(fmt.Sprintf("/proc/self/fd/%d", fd), "ok").CombinedOutput()
	return result("exec-memfd", err, detail+"; "+strings.TrimSpace(string(out)))
}

// execWritten copies this executable into the file arg and executes it.
func execWritten(path string) Result {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return result("exec-written", err, "reading itself")
	}
	if err := os.WriteFile(path, self, 0o755); err != nil {
		return result("exec-written", err, "writing "+path)
	}
	out, err := exec.Command(path, "ok").CombinedOutput()
	return result("exec-written", err, strings.TrimSpace(string(out)))
}

// memhog touches memory until the kernel stops it.
func memhog() Result {
	var keep [][]byte
	for i := 0; i < 64<<10; i++ { // up to 64 GiB: the bound stops it long before
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		keep = append(keep, b)
	}
	return result("memhog", nil, fmt.Sprintf("%d MiB touched", len(keep)))
}

// forkbomb forks processes that fork until the kernel refuses, then reports
// how many processes its PID namespace holds after arg (a duration, default
// 2s). The processes stay until the provider's group is killed.
func forkbomb(arg string) Result {
	d, err := time.ParseDuration(arg)
	if err != nil {
		d = 2 * time.Second
	}
	pid, _, errno := syscall.RawSyscall(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0)
	if errno != 0 {
		return result("forkbomb", errno, "")
	}
	if pid == 0 {
		bomb() // never returns
	}
	time.Sleep(d)
	n, _ := os.ReadDir("/proc")
	count := 0
	for _, e := range n {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			count++
		}
	}
	return result("forkbomb", nil, strconv.Itoa(count))
}

// bomb runs in a forked copy of the process with one thread: raw syscalls
// only, no allocation, no scheduler. Every copy forks again; a refused fork
// sleeps a little and tries again.
//
//go:nosplit
//go:norace
func bomb() {
	ts := syscall.Timespec{Nsec: 10e6}
	for {
		_, _, errno := syscall.RawSyscall(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0)
		if errno != 0 {
			syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
		}
	}
}

// spin burns CPU on every thread it can for arg (default 2s) and reports
// the CPU time it got per second of wall time.
func spin(arg string) Result {
	d, err := time.ParseDuration(arg)
	if err != nil {
		d = 2 * time.Second
	}
	var r0 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &r0)
	start := time.Now()
	done := make(chan struct{})
	for i := 0; i < runtime.GOMAXPROCS(0); i++ {
		go func() {
			x := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				for j := 0; j < 1e6; j++ {
					x += j
				}
			}
		}()
	}
	time.Sleep(d)
	close(done)
	var r1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano()+r1.Stime.Nano()-r0.Utime.Nano()-r0.Stime.Nano()) * time.Nanosecond
	return result("spin", nil, fmt.Sprintf("%.2f", cpu.Seconds()/time.Since(start).Seconds()))
}
